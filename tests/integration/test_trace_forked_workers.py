"""A traced script whose ``multiprocessing.Pool`` (fork) workers end by the SIGTERM that ``Pool.terminate()``
sends them (``with Pool(2) as pool:``). The workers are not the rank: they must die by it as in a bare run. With
the rank's handlers they raised ddpdoctor's ``_Terminated`` (a traceback per pool), their signal reached the rank's
watcher through its wakeup fd (a signal dump, the rank file "interrupted" while it ran), and under torchrun a rank
hung in the pool's ``__exit__``. One process (~5 s on 2 cores)."""

from __future__ import annotations

import pytest
from helpers import read_json, run_cli, write_script

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SCRIPT = """
import multiprocessing as mp
import torch


def prep(i):
    return float(torch.randn(8).sum()) * i


model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for round_ in range(6):
    with mp.get_context("fork").Pool(2) as pool:
        rows = pool.map(prep, range(64))
    for step in range(2):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
print("rounds done")
"""


def test_pool_workers_end_by_sigterm_as_in_a_bare_run(tmp_path):
    script = write_script(tmp_path / "pool_job.py", SCRIPT)
    out = tmp_path / "run"
    result = run_cli(
        "trace", "-q", "--out", str(out), "--wait", "1", "--warmup", "1", "--active", "2", str(script), timeout=120
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rounds done" in result.stdout
    assert "Traceback" not in result.stderr and "_Terminated" not in result.stderr, result.stderr[-3000:]
    rank = read_json(out / "ranks" / "rank0.json")
    assert rank["status"] == "ok" and rank["steps"]["count"] == 12, rank
    # no signal reached the rank: no dump of one (a run that ends well leaves no dumps at all)
    assert not (out / "dumps").exists() or not any((out / "dumps").glob("rank0.signal-*")), list(
        (out / "dumps").iterdir()
    )
