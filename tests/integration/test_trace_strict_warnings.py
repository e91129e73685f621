"""A script that turns every warning into an error (``warnings.simplefilter("error")``, as strict scripts and
``pytest -W error`` do). torch's profiler warns while ddpdoctor steps it; under the script's filter that warning
raised inside the script's own ``optimizer.step()`` (a bare run ends well), and the profiler, left half-way, ended
the process with SIGSEGV at the end of the run. ~3 s."""

from __future__ import annotations

import pytest
from helpers import read_json, run_cli, write_script

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SCRIPT = """
import warnings

warnings.simplefilter("error")
import torch

model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(16):
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
print("strict done")
"""


def test_a_script_that_makes_warnings_errors_runs_to_its_end_traced(tmp_path):
    script = write_script(tmp_path / "strict.py", SCRIPT)
    out = tmp_path / "run"
    result = run_cli("trace", "-q", "--out", str(out), str(script))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "strict done" in result.stdout
    rank = read_json(out / "ranks" / "rank0.json")
    assert rank["status"] == "ok" and rank["steps"]["count"] == 16 and len(rank["trace_files"]) == 1, rank
