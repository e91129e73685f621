"""A disk that fills up under torchrun (issue 13, item 2): as in one-process mode, one clear line naming the run
directory and the error, and the job's own exit status (what a bare torchrun returns). Needs a small tmpfs
(root with CAP_SYS_ADMIN; skipped elsewhere). ~15 s."""

from __future__ import annotations

import pytest
from helpers import run_cli, write_script
from test_trace_disk import tmpfs  # noqa: F401 - the fixture

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

DDP = """
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(64, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(12):
    model(torch.randn(16, 64)).square().mean().backward()
    opt.step()
    opt.zero_grad()
dist.barrier()
dist.destroy_process_group()
print("trained", flush=True)
sys.exit(int(sys.argv[1]))
"""


@pytest.mark.parametrize("code", [0, 3])
def test_a_full_disk_under_torchrun_is_said_with_the_jobs_exit_code(tmp_path, tmpfs, code) -> None:  # noqa: F811
    disk = tmpfs("full", size="64k")  # room for the rank files, not for the traces
    script = write_script(tmp_path / "train.py", DDP)
    out = disk / "run"
    args = ["trace", "--out", str(out), "--wait", "1", "--warmup", "1", "--active", "2"]
    result = run_cli(*args, "--standalone", "--nproc-per-node", "2", str(script), str(code), timeout=200)
    assert result.stdout.count("trained") == 2  # the training ran to its end on both ranks
    assert result.returncode == (0 if code == 0 else 1), result.stderr  # as a bare torchrun returns
    errors = [line for line in result.stderr.splitlines() if line.startswith("ddpdoctor: error: ")]
    assert errors and f"cannot write the run directory {out}: No space left on device" in errors[0], result.stderr
    assert f"exited with code {result.returncode}" in errors[0]
