"""A script that puts a writer of its own in ``sys.stderr`` (logging's, without ``flush()``: a common recipe).
ddpdoctor's lines during the run went through it and its missing ``flush()`` raised inside the script's optimizer
step: the training ended at the first window's line (8 of 20 steps). Now a line that cannot be written through
the script's writer goes to file descriptor 2, the run's summary goes to the real stderr, and the process ends
with a bare run's exit status (120 here: Python cannot flush that writer at exit). ~4 s."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import read_json, run_cli, write_script

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SCRIPT = """
import logging
import sys

import torch


class LoggerWriter:
    def __init__(self, log):
        self.log = log

    def write(self, msg):
        if msg.strip():
            self.log(msg.rstrip())


logging.basicConfig(filename="script.log", level=logging.INFO)
sys.stderr = LoggerWriter(logging.getLogger("stderr").error)
model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(20):
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
print("trained")
"""


def test_a_script_with_its_own_stderr_writer_trains_to_its_end(tmp_path):
    script = write_script(tmp_path / "logs_stderr.py", SCRIPT)
    bare = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    out = tmp_path / "run"
    result = run_cli("trace", "--out", str(out), "--wait", "1", "--warmup", "1", "--active", "2", str(script),
                     cwd=tmp_path)  # fmt: skip
    assert "trained" in bare.stdout and "trained" in result.stdout, result.stderr[-3000:]
    assert result.returncode == bare.returncode, (result.returncode, bare.returncode, result.stderr[-3000:])
    rank = read_json(out / "ranks" / "rank0.json")
    assert rank["status"] == "ok" and rank["steps"]["count"] == 20, rank
    assert "ddpdoctor: wrote" in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]
