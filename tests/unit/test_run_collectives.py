"""flight.run_collectives: the collectives a process issued in its whole run, read from the Flight Recorder where the
run ends (after destroy_process_group), barriers left out; None where the recorder is off. Real one-rank gloo groups,
each in a fresh process (the recorder's size is read when torch starts it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json, os, sys
import torch, torch.distributed as dist
from ddpdoctor.capture import flight
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
t = torch.ones(4)
for _ in range(int(sys.argv[2])):
    dist.all_reduce(t)
dist.barrier()
dist.destroy_process_group()
print(json.dumps(flight.run_collectives("gloo")))
"""


def _count(all_reduces: int, port: int, recorder: bool) -> int | None:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")}
    if recorder:
        env["TORCH_FR_BUFFER_SIZE"] = "2000"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(port), str(all_reduces)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_the_runs_collectives_are_counted_barriers_left_out_and_none_without_the_recorder():
    assert _count(3, 29711, recorder=True) == 3
    assert _count(0, 29712, recorder=True) == 0  # a barrier alone: the ranks never exchanged data
    assert _count(3, 29713, recorder=False) is None  # the recorder off: unknown, not 0
