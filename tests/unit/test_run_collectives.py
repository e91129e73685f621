"""flight.run_collectives: the collectives a process issued in its whole run, read from the Flight Recorder where the
run ends (after destroy_process_group), barriers left out; None where the recorder is off. And of them, those created
after the end of the first step (``training_collectives``, and their bytes): None where the buffer holds nothing or
its times are on another clock (the bytes also where the buffer is full). Real one-rank gloo groups, each in a fresh
process (the recorder's size is read when torch starts it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json, os, sys, time
import torch, torch.distributed as dist
from ddpdoctor.capture import flight
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
started = time.time_ns()
dist.init_process_group("gloo", rank=0, world_size=1)
t = torch.ones(4)
before, after = int(sys.argv[2]), int(sys.argv[3])
for _ in range(before):  # before the first step: DDP's start-up broadcasts, say
    dist.all_reduce(t)
first_step = time.time_ns()
for _ in range(after):
    dist.all_reduce(t)
dist.barrier()
dist.destroy_process_group()
shift = int(sys.argv[4]) * 10**9  # the process's start on another clock than the recorder's
print(json.dumps(flight.run_collectives("gloo", first_step, started + shift)))
"""


def _count(
    all_reduces: int, port: int, recorder: bool, after: int = 0, shift_s: int = 0, buffer: int = 2000
) -> tuple[int | None, int | None, int | None]:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")}
    if recorder:
        env["TORCH_FR_BUFFER_SIZE"] = str(buffer)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(port), str(all_reduces), str(after), str(shift_s)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return tuple(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.timeout(300)
def test_the_runs_collectives_are_counted_barriers_left_out_and_none_without_the_recorder():
    assert _count(3, 29711, recorder=True) == (3, 0, 0)  # none after the first step
    assert _count(0, 29712, recorder=True) == (0, None, None)  # a barrier alone: no data exchanged, no clock to read
    assert _count(3, 29713, recorder=False) == (None, None, None)  # the recorder off: unknown, not 0


@pytest.mark.timeout(300)
def test_those_after_the_first_step_are_counted_apart_on_the_same_clock():
    assert _count(2, 29714, recorder=True, after=3) == (5, 3, 3 * 16)  # 4 float32 each
    # the recorder's times earlier than the process's start: another clock (a monotonic one), no count
    assert _count(2, 29715, recorder=True, after=3, shift_s=3600) == (5, None, None)
    # a full buffer (5 entries: the barrier's among them) may have dropped some: counted, but no bytes of the whole
    assert _count(2, 29716, recorder=True, after=3, buffer=5) == (4, 3, None)
