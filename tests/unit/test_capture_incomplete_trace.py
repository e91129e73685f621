"""A profiled window whose export did not complete (issue 23, item 11): the profiler's exporter swallows a write
error (a full disk) and leaves a short file, or none. Nothing incomplete is renamed into place, the window is
reported as lost with the cause, the rank file's ``capture_errors`` says so, and no temporary file is left. A
gzip step that fails part-way leaves the good ``.json`` and no ``.json.gz``. Faults injected into the exporter
and into the gzip writer; ``tests/integration/test_trace_disk_incomplete.py`` does it on a real full disk."""

from __future__ import annotations

import errno
import gzip
import json
import os
from pathlib import Path

import pytest

from ddpdoctor import rundir
from ddpdoctor.capture.config import CaptureConfig
from ddpdoctor.capture.session import Session

COMPLETE = (
    '{"schemaVersion": 1, "traceEvents": [\n  {"name": "x", "ph": "X", "ts": 1, "dur": 2}\n],\n  "traceName": "t"\n}'
)


COMPLETE_ONES = {
    "complete": COMPLETE,
    "a name with brackets": COMPLETE.replace('"t"', '"/runs/a]b [c]}/t.json"'),
    "another layout": COMPLETE[:-1] + ', "distributedInfo": {"rank": 0, "dims": [1, 2]}}',
}


class Exporter:
    """Stands in for torch.profiler.profile: ``export_chrome_trace(path)`` as Kineto does it, with a fault."""

    def __init__(self, how: str) -> None:
        self.how = how

    def export_chrome_trace(self, path: str) -> None:
        if self.how in COMPLETE_ONES:
            Path(path + ".tmp").write_text(COMPLETE_ONES[self.how])
            os.replace(path + ".tmp", path)
        elif self.how == "kineto-enospc":  # Kineto: <path>.tmp written until the disk filled, error logged, no rename
            Path(path + ".tmp").write_text(COMPLETE[:40])
        elif self.how == "short":  # an exporter that renames a short file into place
            Path(path).write_text(COMPLETE[:-30])
        elif self.how == "cut-after-an-event":  # ends with "}", the array and the document still open
            Path(path).write_text(COMPLETE[: COMPLETE.index("}") + 1])
        elif self.how == "empty":
            Path(path).write_bytes(b"")
        elif self.how == "raises":
            raise OSError(errno.ENOSPC, "No space left on device", path)


def _session(out: Path) -> Session:
    out.mkdir(exist_ok=True)
    return Session(CaptureConfig(out=str(out), quiet=False))


def _run_files(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.is_file())


@pytest.mark.parametrize("how", ["kineto-enospc", "short", "cut-after-an-event", "empty", "raises"])
def test_an_incomplete_export_is_not_renamed_into_place(tmp_path, capsys, how) -> None:
    out = tmp_path / "run"
    session = _session(out)
    session._on_trace_ready(Exporter(how))
    session._compressor.wait()
    assert _run_files(out) == []  # no trace, no temporary file
    assert session.trace_files == []
    err = capsys.readouterr().err
    assert "window 1 written" not in err, err
    lost = [line for line in err.splitlines() if line.startswith("ddpdoctor: warning: rank 0: profiled window 1")]
    assert lost and "not written" in lost[0] and str(out) in lost[0], err
    data = json.loads(rundir.rank_file(out, 0).read_text())
    assert data["trace_files"] == []
    errors = [e for e in data["capture_errors"] if "profiled window 1" in e]
    assert errors and "not written" in errors[0], data["capture_errors"]


@pytest.mark.parametrize("how", COMPLETE_ONES)
def test_a_complete_export_is_kept_and_gzipped(tmp_path, capsys, how) -> None:
    out = tmp_path / "run"
    session = _session(out)
    session._on_trace_ready(Exporter(how))
    session._compressor.wait()
    session._apply_compressed()
    (name,) = session.trace_files
    assert name.endswith(".pt.trace.json.gz") and _run_files(out) == [name]
    assert gzip.decompress((out / name).read_bytes()).decode() == COMPLETE_ONES[how]
    assert "profiled window 1 written" in capsys.readouterr().err
    assert json.loads(rundir.rank_file(out, 0).read_text())["capture_errors"] == []


def test_the_cause_is_named_when_the_disk_is_full(tmp_path, capsys, monkeypatch) -> None:
    """Kineto gives no error code; on a disk that is still full the cause is found and named (ENOSPC)."""
    out = tmp_path / "run"
    session = _session(out)
    real_open = open

    def full_disk_open(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax") and Path(file).parent == out:
            raise OSError(errno.ENOSPC, "No space left on device", str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", full_disk_open)
    session._on_trace_ready(Exporter("kineto-enospc"))
    monkeypatch.undo()
    lost = [e for e in session.capture_errors if "profiled window 1" in e]
    assert lost and "[Errno 28] No space left on device" in lost[0], session.capture_errors
    assert "No space left on device" in capsys.readouterr().err
    assert [p.name for p in out.iterdir() if p.is_file()] == []


class FillsUp:
    """A file on a disk with ``room`` bytes left: writes past it stop part-way with ENOSPC, as a real one does."""

    def __init__(self, f, room: int) -> None:
        self._f, self._room = f, room

    def write(self, data) -> int:
        if len(data) > self._room:
            self._f.write(bytes(data[: self._room]))
            self._room = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self._room -= len(data)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()


def test_a_gzip_that_fails_part_way_keeps_the_json(tmp_path, monkeypatch) -> None:
    out = tmp_path / "run"
    session = _session(out)
    big = COMPLETE.replace('"t"', json.dumps(os.urandom(200_000).hex()))  # compresses to ~200 KB
    real_open = open

    def small_disk_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        writes_gzip = "w" in mode and ".pt.trace.json.gz" in Path(file).name  # the gzip step's file, whatever its name
        return FillsUp(f, 4096) if writes_gzip else f

    monkeypatch.setattr("builtins.open", small_disk_open)

    class BigExporter(Exporter):
        def export_chrome_trace(self, path: str) -> None:
            Path(path).write_text(big)

    session._on_trace_ready(BigExporter("complete"))
    session._compressor.wait()
    monkeypatch.undo()
    session._apply_compressed()
    (name,) = session.trace_files
    assert name.endswith(".pt.trace.json") and _run_files(out) == [name]  # the good .json, no .gz, no temp file
    assert (out / name).read_text() == big
    assert any("compressing trace" in e and "No space left on device" in e for e in session.capture_errors), (
        session.capture_errors
    )


def test_the_gzip_is_on_disk_before_it_is_named_as_the_trace(tmp_path, monkeypatch) -> None:
    """The .json is removed once the rank file names the .json.gz: a crash (power loss) after the rename must
    not find a short .gz in its place, so the .gz's data is synced before it gets its name."""
    src = tmp_path / "a.pt.trace.json"
    src.write_text(COMPLETE)
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        return real_fsync(fd)

    def replace(a, b):
        events.append(("replace", os.path.basename(a)))
        return real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    rundir.atomic_gzip_file(src, tmp_path / "a.pt.trace.json.gz")
    monkeypatch.undo()
    (renamed,) = [name for what, name in events if what == "replace"]
    assert ("fsync", renamed) in events[: events.index(("replace", renamed))], events
    assert gzip.decompress((tmp_path / "a.pt.trace.json.gz").read_bytes()).decode() == COMPLETE
