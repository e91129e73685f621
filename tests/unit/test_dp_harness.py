"""The CPU harness runs DataParallel's real multi-device path and computes what the plain module does."""

from __future__ import annotations

import threading

import dp_harness  # tests/ is on sys.path: tests/conftest.py is a rootdir conftest
import pytest
import torch


class TwoHeads(torch.nn.Module):
    """Takes a keyword tensor and returns a tuple holding a dict: exercises scatter/gather of structures."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh())
        self.head = torch.nn.Linear(16, 3)
        self.aux = torch.nn.Linear(16, 2)
        # Shared by the replicas (replicate copies __dict__ shallowly). A barrier every replica must reach
        # proves they run at the same time; Thread objects, unlike idents, are never reused.
        self.threads: list[threading.Thread] = []
        self.rendezvous: threading.Barrier | None = None

    def forward(
        self, x: torch.Tensor, *, shift: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        self.threads.append(threading.current_thread())
        if self.rendezvous is not None:
            self.rendezvous.wait(timeout=10)
        h = self.body(x + shift)
        return self.head(h), {"aux": self.aux(h)}


def _loss(out: tuple[torch.Tensor, dict[str, torch.Tensor]]) -> torch.Tensor:
    logits, extra = out
    return logits.pow(2).mean() + extra["aux"].sin().sum()


@pytest.mark.parametrize("devices", [2, 4])
def test_outputs_and_gradients_match_the_plain_module(devices: int) -> None:
    torch.manual_seed(0)
    model = TwoHeads()
    x, shift = torch.randn(12, 8), torch.randn(12, 8)

    expected = model(x, shift=shift)
    _loss(expected).backward()
    expected_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.threads.clear()
    model.rendezvous = threading.Barrier(devices)

    with dp_harness.simulated_devices():
        out = dp_harness.data_parallel(model, devices)(x, shift=shift)
        _loss(out).backward()

    assert out[0].grad_fn is not None and type(out[0].grad_fn).__name__ == "GatherBackward"
    torch.testing.assert_close(out[0], expected[0])
    torch.testing.assert_close(out[1]["aux"], expected[1]["aux"])
    for grad, expected_grad in zip([p.grad for p in model.parameters()], expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad)
    # parallel_apply ran the replicas concurrently (all reached the barrier), each in its own thread
    assert len(model.threads) == devices
    assert len(set(model.threads)) == devices
    assert threading.current_thread() not in model.threads


def test_replica_zero_shares_buffers_with_the_module_like_on_gpus() -> None:
    # DataParallel documents that in-place buffer updates on device 0 (BatchNorm running stats) reach the
    # module: they come from replica 0's chunk only.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    reference = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    reference.load_state_dict(model.state_dict())
    x = torch.randn(8, 4)

    with dp_harness.simulated_devices():
        dp_harness.data_parallel(model, 2)(x)
    reference(x[:4])

    torch.testing.assert_close(model[1].running_mean, reference[1].running_mean)
    assert model[1].num_batches_tracked.item() == 1


def test_a_batch_smaller_than_the_devices_uses_fewer_replicas() -> None:
    model = TwoHeads()
    model.rendezvous = threading.Barrier(3)
    with dp_harness.simulated_devices():
        out = dp_harness.data_parallel(model, 4)(torch.randn(3, 8), shift=torch.zeros(3, 8))
    assert out[0].shape == (3, 3)
    assert len(set(model.threads)) == 3


def test_the_context_restores_torch() -> None:
    from torch.nn.parallel import _functions, comm

    parallel_apply_module = dp_harness.parallel_apply_module
    before = (
        comm.torch,
        comm.reduce_add,
        _functions.torch,
        parallel_apply_module.torch,
        _functions.Broadcast.__dict__["forward"],
        _functions.Gather.__dict__["forward"],
    )
    with dp_harness.simulated_devices():
        assert comm.torch is not torch
        with pytest.raises(RuntimeError, match="already active"):
            with dp_harness.simulated_devices():
                pass
    after = (
        comm.torch,
        comm.reduce_add,
        _functions.torch,
        parallel_apply_module.torch,
        _functions.Broadcast.__dict__["forward"],
        _functions.Gather.__dict__["forward"],
    )
    assert all(a is b for a, b in zip(before, after, strict=True))
    assert comm.torch is torch
