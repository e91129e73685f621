"""Run files are read only when they are regular files, and only up to a bound (issue 23, items 8 and 14): a FIFO
named ``manifest.json`` or ``ranks/rank0.summary.json`` no longer hangs ``diagnose``, ``ranks/rank0.json ->
/dev/zero`` no longer reads without end, and ``diagnose /dev/zero`` says what the path is. Each such file is left
out with a note naming it and why; the rest of the run is used."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor import rundir, runfiles

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "ddp_gloo_2rank"
pytestmark = pytest.mark.skipif(not FIXTURE.is_dir(), reason="recorded fixture ddp_gloo_2rank is missing")


def _limited() -> None:
    # a reader without a bound fails here quickly (MemoryError), instead of taking the shared machine's memory
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))


def _ddpdoctor(*args: str) -> subprocess.CompletedProcess:
    """``python -m ddpdoctor ARGS`` with its memory limited and a timeout (a hang fails the test, not the suite)."""
    return subprocess.run(
        [sys.executable, "-m", "ddpdoctor", *args],
        capture_output=True,
        text=True,
        timeout=90,
        preexec_fn=_limited,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _notes(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode in (0, 1), result.stderr[-3000:]
    doc = json.loads(result.stdout)
    return [*doc["run"]["notes"], *doc["run"]["skipped"]]


@pytest.fixture
def run_dir(tmp_path):
    return Path(shutil.copytree(FIXTURE, tmp_path / "run"))


@pytest.mark.timeout(120)
def test_a_fifo_named_manifest_json_is_left_out_with_a_note(run_dir):
    (run_dir / "manifest.json").unlink()
    os.mkfifo(run_dir / "manifest.json")
    notes = _notes(_ddpdoctor("diagnose", str(run_dir), "--format", "json"))
    assert any("manifest.json" in n and "FIFO" in n for n in notes), notes


@pytest.mark.timeout(120)
def test_a_fifo_named_like_a_summary_is_left_out_and_the_trace_read(run_dir):
    os.mkfifo(run_dir / "ranks" / "rank0.summary.json")
    result = _ddpdoctor("diagnose", str(run_dir), "--format", "json")
    notes = _notes(result)
    assert any("rank0.summary.json" in n and "FIFO" in n for n in notes), notes
    assert [r["rank"] for r in json.loads(result.stdout)["ranks"]] == [0, 1]


@pytest.mark.timeout(120)
def test_a_rank_file_linked_to_dev_zero_is_left_out_with_a_note(run_dir):
    (run_dir / "ranks" / "rank0.json").unlink()
    (run_dir / "ranks" / "rank0.json").symlink_to("/dev/zero")
    notes = _notes(_ddpdoctor("diagnose", str(run_dir), "--format", "json"))
    assert any("ranks/rank0.json" in n and "character device" in n for n in notes), notes


def test_a_rank_file_over_the_bound_is_left_out_unread(run_dir):
    path = run_dir / "ranks" / "rank0.json"
    with open(path, "r+b") as f:
        f.truncate(rundir.RUN_FILE_MAX_BYTES + 1)  # sparse: no disk used
    captures, notes = runfiles.read_rank_captures(run_dir)
    assert list(captures) == [1]
    assert any("rank0.json" in n and "larger than" in n for n in notes), notes


def test_the_bound_leaves_room_for_a_long_run():
    # a rank file grows by about 200 bytes per step (step time, five memory and five GIL figures, indented):
    # five million steps of a run must still be read
    assert rundir.RUN_FILE_MAX_BYTES >= 5_000_000 * 200


def test_a_regular_file_reads_as_before(run_dir):
    assert rundir.read_json(run_dir / "manifest.json") == json.loads((run_dir / "manifest.json").read_text())


@pytest.mark.parametrize(
    ("path", "what"), [("/dev/zero", "character device"), ("fifo", "FIFO")], ids=["char device", "fifo"]
)
@pytest.mark.timeout(120)
def test_diagnose_of_a_path_that_is_neither_a_file_nor_a_folder_says_what_it_is(tmp_path, path, what):
    if path == "fifo":
        path = str(tmp_path / "trace.json")
        os.mkfifo(path)
    result = _ddpdoctor("diagnose", path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert what in line and path in line and "no such file" not in line, line


def test_the_trace_reader_refuses_a_fifo_at_once(tmp_path):
    import threading

    from ddpdoctor.errors import TraceError
    from ddpdoctor.load.readfile import read_bytes

    fifo = tmp_path / "rank0.1.pt.trace.json"
    os.mkfifo(fifo)
    outcome: list[BaseException | bytes] = []

    def read() -> None:
        try:
            outcome.append(read_bytes(fifo))
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # it waits for a writer: give it one that closes at once, so the thread ends
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
        pytest.fail("reading a FIFO waited for a writer")
    (exc,) = outcome
    assert isinstance(exc, TraceError) and "FIFO" in str(exc) and str(fifo) in str(exc)
