"""``dataloader_ms`` is the training loop's wait on a torch DataLoader; where none handed out a batch in the analysed
steps, the wait for data is not measured (it was 0.0, and dataloader-bound "passed" on a job that loads its data
in a loop of its own, which may well be input-bound).

The traces are recorded for real: a plain profiler with a schedule around a small loop on CPU.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from ddpdoctor.diagnosis import evaluate, load_rules
from ddpdoctor.load import load
from ddpdoctor.metrics import analyze

STEPS = 5


def _record(folder: Path, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=STEPS, repeat=1)
    handler = torch.profiler.tensorboard_trace_handler(str(folder))
    with torch.profiler.profile(schedule=schedule, on_trace_ready=handler) as prof:
        for _ in range(2 + STEPS):
            x, y = next(batches)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            prof.step()
    return folder


def _own_loader() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches read by the script's own code (here: slowly, as from a file): no DataLoader range."""
    while True:
        time.sleep(0.01)
        yield torch.randn(32, 16), torch.randint(0, 4, (32,))


def _data_loader() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    data = TensorDataset(torch.randn(32 * 16, 16), torch.randint(0, 4, (32 * 16,)))
    return iter(DataLoader(data, batch_size=32))


def _dataloader_bound(path: Path) -> tuple[float | None, str]:
    metrics = analyze(load(path))
    result = evaluate(load_rules(), metrics)
    why = {n.name: n.reason for n in result.not_evaluated}.get("dataloader-bound", "")
    passed = {p.name for p in result.passed_reasons}
    found = {f.name for f in result.findings}
    state = "finding" if "dataloader-bound" in found else "passed" if "dataloader-bound" in passed else why
    return metrics.ranks[0]["dataloader_ms"], state


def test_data_loaded_by_the_scripts_own_code_is_not_measured(tmp_path: Path) -> None:
    wait, state = _dataloader_bound(_record(tmp_path / "own", _own_loader()))
    assert wait is None
    assert "not measured in this run: dataloader_ms" in state
    assert "no torch DataLoader handed out a batch in the analysed steps" in state


def test_a_dataloader_is_timed(tmp_path: Path) -> None:
    wait, state = _dataloader_bound(_record(tmp_path / "loader", _data_loader()))
    assert wait is not None and wait >= 0
    assert state in ("passed", "finding")
