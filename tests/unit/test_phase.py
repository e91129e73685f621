"""The phase tracker (capture/phase.py): which part of its iteration a rank's main thread is in, as the dumps say."""

from __future__ import annotations

import threading

import pytest
import torch

from ddpdoctor.capture.phase import PhaseTracker


@pytest.fixture
def tracked():
    tracker = PhaseTracker()
    tracker.install()
    yield tracker
    tracker.uninstall()


def _model():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def test_phases_of_one_training_iteration(tracked):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = {}

    class Probe(torch.nn.Module):  # runs inside the forward: records the phase there
        def forward(self, x):
            seen["in forward"] = tracked.phase
            return x

    model.append(Probe())
    assert tracked.phase == "outside"
    for step in range(1, 4):
        loss = model(torch.randn(2, 4)).sum()
        assert tracked.phase == "forward"
        loss.backward()
        assert tracked.phase == "backward"  # until the optimizer: a metric's all-reduce here counts as backward
        opt.step()
        tracked.step_ended(step)  # what the session does from the optimizer's post-hook
        assert (tracked.phase, tracked.step) == ("data", step)
        x = torch.randn(2, 4)  # the data phase lasts until the next forward
        assert tracked.phase == "data"
        del x
    assert seen["in forward"] == "forward"
    snap = tracked.snapshot()
    assert snap["step"] == 3 and snap["phase"] == "data" and snap["last_step_end"] == snap["phase_since"]


def test_the_optimizer_phase_is_seen_inside_the_optimizer_step(tracked):
    model = _model()
    seen = []

    class Watching(torch.optim.SGD):
        def step(self, closure=None):
            seen.append(tracked.phase)
            return super().step(closure)

    opt = Watching(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    assert seen == ["optimizer"]


def test_gradient_accumulation_enters_forward_again_for_each_micro_batch(tracked):
    model = _model()
    phases = []
    for _ in range(2):
        loss = model(torch.randn(2, 4)).sum()
        phases.append(tracked.phase)
        loss.backward()
        phases.append(tracked.phase)
    assert phases == ["forward", "backward", "forward", "backward"]


def test_forward_hook_is_removed_after_the_first_forward_of_a_step(tracked):
    from torch.nn.modules import module as module_mod

    model = _model()
    before = len(module_mod._global_forward_pre_hooks)
    assert before >= 1  # armed, waiting for the step's first forward
    model(torch.randn(2, 4))
    assert len(module_mod._global_forward_pre_hooks) == before - 1  # module calls take torch's fast path again
    tracked.step_ended(1)
    assert len(module_mod._global_forward_pre_hooks) == before


def test_forwards_of_other_threads_do_not_change_the_phase(tracked):
    model = _model()
    thread = threading.Thread(target=lambda: model(torch.randn(2, 4)))
    thread.start()
    thread.join()
    assert tracked.phase == "outside"


def test_uninstall_puts_torch_back():
    from torch.nn.modules import module as module_mod

    original = torch.autograd.backward
    hooks = len(module_mod._global_forward_pre_hooks)
    tracker = PhaseTracker()
    tracker.install()
    assert torch.autograd.backward is not original
    tracker.uninstall()
    assert torch.autograd.backward is original
    assert len(module_mod._global_forward_pre_hooks) == hooks
    assert tracker.phase == "outside"


def test_each_step_arms_the_hook_registered_once_no_new_handle(tracked):
    """Arming the first-forward hook each step puts the entry of the handle registered at install back into torch's
    dict (about 0.2 us), instead of registering anew (a handle, weak references: several us a step)."""
    from torch.nn.modules import module as module_mod
    from torch.utils.hooks import RemovableHandle

    model = _model()
    next_id = RemovableHandle.next_id
    keys = set()
    for step in range(1, 6):
        keys |= {k for k, h in module_mod._global_forward_pre_hooks.items() if h == tracked._on_forward_pre}
        model(torch.randn(2, 4)).sum().backward()
        tracked.step_ended(step)
        assert tracked.phase == "data"
    assert RemovableHandle.next_id == next_id and len(keys) == 1, (RemovableHandle.next_id, next_id, keys)


def test_the_where_buffer_follows_the_step_and_phase(tracked):
    from ddpdoctor.capture.phase import PHASE_WIDTH, STEP_WIDTH

    where = bytearray(b" " * 40)
    tracked.attach_where(memoryview(where), 2, 20)
    assert (where[2 : 2 + STEP_WIDTH].strip(), where[20 : 20 + PHASE_WIDTH].strip()) == (b"0", b"outside")
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    for step in range(1, 3):
        loss = model(torch.randn(2, 4)).sum()
        seen.append(bytes(where[20 : 20 + PHASE_WIDTH]).strip())
        loss.backward()
        seen.append(bytes(where[20 : 20 + PHASE_WIDTH]).strip())
        opt.step()
        tracked.step_ended(step)
        seen.append((bytes(where[2 : 2 + STEP_WIDTH]).strip(), bytes(where[20 : 20 + PHASE_WIDTH]).strip()))
    assert seen[:3] == [b"forward", b"backward", (b"1", b"data")], seen
    assert seen[-1] == (b"2", b"data")
    tracked.attach_where(None, 0, 0)
    tracked.step_ended(3)
    assert bytes(where[2 : 2 + STEP_WIDTH]).strip() == b"2"  # let go of: a forked child writes nothing
