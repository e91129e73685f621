"""Ranks decoded in forked worker processes (``load.loader``: from 4 MB of JSON in a process without another
thread or torch) give the report the one-process path gives, byte for byte: on the recorded multi-rank set and
on a real 2-rank CPU run's traces (read with ``--steps``, forked from any size here). Each side is a fresh
process (pytest itself has torch imported, where the loader does not fork)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ddpdoctor.load import loader

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ddp_gloo_2rank"

# Runs `ddpdoctor diagnose PATH --format json --output OUT [ARGS]` through the CLI's main; the fork threshold is
# set to MIN bytes. Prints whether torch was imported, which path the loader took and the exit code.
_SCRIPT = """
import sys
from ddpdoctor.load import loader
from ddpdoctor.cli import main
path, out, least, *args = sys.argv[1:]
loader.FORK_MIN_BYTES = int(least)
forked = []
_import = loader._import_decoder
loader._import_decoder = lambda: (forked.append(1), _import())
rc = main(["diagnose", path, "--format", "json", "--output", out, *args])
print("torch" in sys.modules, "forked" if forked else "one process", rc)
"""


def _same_report(path: Path, tmp_path: Path, least: int, *args: str) -> None:
    said = {}
    for mode, threshold in (("forked", least), ("one", 1 << 62)):
        done = subprocess.run(
            [sys.executable, "-c", _SCRIPT, str(path), str(tmp_path / f"{mode}.json"), str(threshold), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        said[mode] = done.stdout.split()
    # no torch, the path each was meant to take, and the same exit code (1: with findings)
    assert said["forked"][:2] == ["False", "forked"] and said["one"][:3] == ["False", "one", "process"], said
    assert said["forked"][-1] == said["one"][-1] in ("0", "1")
    assert (tmp_path / "forked.json").read_bytes() == (tmp_path / "one.json").read_bytes()


def test_megatron_8_ranks_in_forked_workers(traces_dir: Path, tmp_path: Path) -> None:
    # 31 MB of JSON in 8 ranks: forked at the loader's own threshold
    _same_report(traces_dir / "astra-sim/megatron_tp8_a100_8ranks", tmp_path, loader.FORK_MIN_BYTES)


def test_a_cpu_run_with_captures_in_forked_workers(tmp_path: Path) -> None:
    _same_report(FIXTURE, tmp_path, 0, "--steps", "0..")


def test_no_fork_beside_another_thread_or_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert loader._fork_context() is not None
    assert loader.parallel_min_bytes() == loader.FORK_MIN_BYTES
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert loader._fork_context() is None
        assert loader.parallel_min_bytes() == loader.PARALLEL_MIN_BYTES
    finally:
        stop.set()
        thread.join()
    monkeypatch.setitem(sys.modules, "torch", sys)  # a training process, or a test session, that imported torch
    assert loader._fork_context() is None
