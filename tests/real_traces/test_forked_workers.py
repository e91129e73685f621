"""Ranks decoded in forked worker processes (``load.loader``: from 4 MB of JSON in a process without another
thread or torch), and large files decoded in parts by forked processes (``load.decode``: from 16 MB), give the
report the one-process path gives, byte for byte: on the recorded multi-rank set, on a real 2-rank CPU run's
traces (read with ``--steps``, forked from any size here) and on the recorded sets of large files. Each side is a fresh
process (pytest itself has torch imported, where the loader does not fork)."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ddpdoctor.load import decode, loader

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ddp_gloo_2rank"

# Runs `ddpdoctor diagnose PATH --format json --output OUT [ARGS]` through the CLI's main, with the loader's fork
# threshold RANKS and the decoder's PARTS (bytes). Prints whether torch was imported, whether ranks were decoded
# in forked processes, the most parts a file was cut into, and the exit code.
_SCRIPT = """
import sys
from ddpdoctor.load import decode, loader
from ddpdoctor.cli import main
path, out, ranks, parts, *args = sys.argv[1:]
loader.FORK_MIN_BYTES, decode.PARTS_MIN_BYTES = int(ranks), int(parts)
forked, cut = [], [1]
_import, _bounds = loader._import_decoder, decode._part_bounds
loader._import_decoder = lambda: (forked.append(1), _import())
decode._part_bounds = lambda *a: (lambda b: (cut.append(len(b)), b)[1])(_bounds(*a))
rc = main(["diagnose", path, "--format", "json", "--output", out, *args])
print("torch" in sys.modules, "forked" if forked else "one", max(cut), rc)
"""
NEVER = str(1 << 62)


def _report(path: Path, out: Path, ranks: str, parts: str, *args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(path), str(out), ranks, parts, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def _same_report(path: Path, tmp_path: Path, ranks: int, parts: int, *args: str) -> list[str]:
    """The report with ranks forked from ``ranks`` bytes and files cut from ``parts`` bytes is the one-process
    report, byte for byte; what the parallel run printed."""
    parallel = _report(path, tmp_path / "parallel.json", str(ranks), str(parts), *args)
    one = _report(path, tmp_path / "one.json", NEVER, NEVER, *args)
    assert parallel[0] == one[0] == "False" and one[1:3] == ["one", "1"], (parallel, one)  # no torch; one process
    assert parallel[-1] == one[-1] in ("0", "1")  # the same exit code (1: with findings)
    assert (tmp_path / "parallel.json").read_bytes() == (tmp_path / "one.json").read_bytes()
    return parallel


def test_megatron_8_ranks_in_forked_workers(traces_dir: Path, tmp_path: Path) -> None:
    # 31 MB of JSON in 8 ranks: forked at the loader's own threshold
    said = _same_report(traces_dir / "astra-sim/megatron_tp8_a100_8ranks", tmp_path, loader.FORK_MIN_BYTES, 1 << 62)
    assert said[1] == "forked"


def test_a_cpu_run_with_captures_in_forked_workers(tmp_path: Path) -> None:
    assert _same_report(FIXTURE, tmp_path, 0, 1 << 62, "--steps", "0..")[1] == "forked"


@pytest.mark.parametrize("name", ["hta/df_index_resolver", "tb-profiler/resnet50_num_workers_0"])
def test_large_files_decoded_in_parts(traces_dir: Path, tmp_path: Path, name: str) -> None:
    # one rank: 54 MB in one file, 2 x 35 MB; cut at the decoder's own threshold
    said = _same_report(traces_dir / name, tmp_path, loader.FORK_MIN_BYTES, decode.PARTS_MIN_BYTES)
    assert said[1] == "one" and int(said[2]) >= 2


def test_no_fork_beside_another_thread_or_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    # this test session may hold other threads (an earlier test's pool) and has torch: each condition set here
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    assert loader._fork_context() is not None
    assert loader.parallel_min_bytes() == loader.FORK_MIN_BYTES
    monkeypatch.setattr(threading, "active_count", lambda: 2)  # another thread runs here
    assert loader._fork_context() is None
    assert loader.parallel_min_bytes() == loader.PARALLEL_MIN_BYTES
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setitem(sys.modules, "torch", sys)  # a training process, or a test session, that imported torch
    assert loader._fork_context() is None
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())  # a worker of another pool
    assert loader._fork_context() is None
