"""An FSDP2 job for tests/integration/test_fsdp2.py: samples/fsdp2_train.py's model (MLP blocks), wrapped at the
root only or per block with explicit prefetch, which times its own collectives with wall clocks: every call of
``dist.all_gather_into_tensor`` / ``dist.reduce_scatter_tensor`` (blocking on CPU: the call's duration is the
collective's), with the FSDP unit that issued it and the step, written to ``--timings`` as JSON lines. That is the
independent measurement ddpdoctor's per-unit numbers are checked against. Each step begins with a
``record_function("job_step_<i>")`` mark (around making the batch) so the test can tell which of the job's steps
ddpdoctor profiled.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "samples"))
from fsdp2_train import Net  # noqa: E402


class Embedded(Net):
    """``Net`` after a token embedding (``--embed``): a model whose largest tensor is most of its parameters."""

    def __init__(self, vocab: int, dim: int, depth: int) -> None:
        super().__init__(dim, depth)
        self.emb = torch.nn.Embedding(vocab, dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return super().forward(self.emb(tokens).mean(1))


CURRENT = {"unit": None, "step": -1}
RECORDS: list[dict] = []


def _run_delay_ms() -> float:
    """The time so far the calling thread spent runnable but kept off a CPU by the scheduler (Linux schedstat's
    run_delay), in ms; 0 where the kernel does not keep it."""
    try:
        return int(Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").read_text().split()[1]) / 1e6
    except (OSError, IndexError, ValueError):
        return 0.0


def _timed(kind: str, original):  # noqa: ANN001, ANN202
    """The collective, issued asynchronously and waited for here: ``wait_ms`` is the time the calling thread is
    blocked waiting for it to finish (what ddpdoctor calls exposed on CPU), ``ms`` the whole call (with the local
    copies gloo's reduce-scatter makes in the calling thread), ``held_ms`` how long, within ``wait_ms``, the
    calling thread was runnable but kept off a CPU by a loaded host: woken when the collective ended, it waits for a
    CPU. That time is in ``wait_ms`` but not in the collective's own span, which is what ddpdoctor measures. (Gloo's
    threads' run_delay is left out: most of it falls inside the collective's span.)"""

    def call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        start = time.perf_counter()
        delay = _run_delay_ms()
        if kwargs.get("async_op"):
            out, waited = original(*args, **kwargs), start
        else:
            work = original(*args, **{**kwargs, "async_op": True})
            waited = time.perf_counter()
            delay = _run_delay_ms()
            work.wait()
            out = None
        end = time.perf_counter()
        held = min(_run_delay_ms() - delay, (end - waited) * 1e3)
        RECORDS.append(
            {
                "step": CURRENT["step"],
                "unit": CURRENT["unit"] or "(root)",
                "kind": kind,
                "ms": (end - start) * 1e3,
                "wait_ms": (end - waited) * 1e3,
                "held_ms": held,
            }
        )
        return out

    return call


def _in_unit(original):  # noqa: ANN001, ANN202
    def method(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        before = CURRENT["unit"]
        CURRENT["unit"] = self._module_fqn
        try:
            return original(self, *args, **kwargs)
        finally:
            CURRENT["unit"] = before

    return method


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--wrap", choices=["root", "blocks"], default="blocks")
    parser.add_argument("--prefetch", action="store_true")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--timings", type=Path)
    parser.add_argument("--embed", type=int, default=0, help="a token embedding of this vocabulary, a unit of its own")
    args = parser.parse_args()

    for name, kind in (
        ("all_gather_single", "all_gather"),  # what FSDP2 calls in torch 2.13
        ("all_gather_into_tensor", "all_gather"),  # and in earlier versions
        ("reduce_scatter_single", "reduce"),
        ("reduce_scatter_tensor", "reduce"),
    ):
        if hasattr(dist, name):
            setattr(dist, name, _timed(kind, getattr(dist, name)))
    pg.FSDPParamGroup.unshard = _in_unit(pg.FSDPParamGroup.unshard)
    pg.FSDPParamGroup.post_backward = _in_unit(pg.FSDPParamGroup.post_backward)

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = Net(args.dim, args.depth) if not args.embed else Embedded(args.embed, args.dim, args.depth)
    if args.wrap == "blocks":
        if args.embed:
            fully_shard(model.emb)  # one tensor: no wrapping makes this unit smaller
        for block in model.blocks:
            fully_shard(block)
    fully_shard(model)
    if args.wrap == "blocks" and args.prefetch:
        blocks = list(model.blocks)
        for i, block in enumerate(blocks):
            if i + 1 < len(blocks):
                block.set_modules_to_forward_prefetch([blocks[i + 1]])
            if i > 0:
                block.set_modules_to_backward_prefetch([blocks[i - 1]])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        CURRENT["step"] = step
        with torch.profiler.record_function(f"job_step_{step}"):  # a mark inside the step, not across its end
            batch = torch.randint(0, args.embed, (64, 8)) if args.embed else torch.randn(64, args.dim)
        loss = model(batch).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    if args.timings is not None:
        path = args.timings.with_name(f"{args.timings.name}.rank{dist.get_rank()}")
        path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
