"""The compressing thread of a rank (ddpdoctor.capture.compress): gzip at the lowest CPU priority while the
training runs, its own priority back once the run ends (where the process may raise it), a failure reported."""

from __future__ import annotations

import gzip
import os
import sys
import threading
import time

import pytest

from ddpdoctor.capture import compress

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")


def test_lowest_priority_while_training_and_back_at_the_end(tmp_path, monkeypatch) -> None:
    (tmp_path / "a.json").write_bytes(b'{"traceEvents": []}' * 1000)
    started, release = threading.Event(), threading.Event()
    seen: dict[str, object] = {}
    real = compress.rundir.atomic_gzip_file

    def held(src, dest, **kwargs):
        seen["tid"] = threading.get_native_id()
        seen["during"] = os.getpriority(os.PRIO_PROCESS, seen["tid"])
        started.set()
        assert release.wait(30)
        seen["ending"] = os.getpriority(os.PRIO_PROCESS, seen["tid"])
        return real(src, dest, **kwargs)

    monkeypatch.setattr(compress.rundir, "atomic_gzip_file", held)
    done: list[tuple[str, object]] = []
    before = os.getpriority(os.PRIO_PROCESS, 0)
    compressor = compress.Compressor(tmp_path, lambda name, error: done.append((name, error)))
    compressor.submit("a.json")
    assert started.wait(30)
    assert seen["during"] == 19
    waiter = threading.Thread(target=compressor.wait)
    waiter.start()
    deadline = time.monotonic() + 10
    while compressor._ending is False and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    release.set()
    waiter.join(30)
    assert not waiter.is_alive()
    assert done == [("a.json", None)]
    assert gzip.decompress((tmp_path / "a.json.gz").read_bytes()) == (tmp_path / "a.json").read_bytes()
    if os.geteuid() == 0:  # raising a priority needs root (or RLIMIT_NICE): elsewhere it stays at 19
        assert seen["ending"] == before


def test_a_failure_is_reported_and_leaves_no_file(tmp_path, monkeypatch) -> None:
    (tmp_path / "a.json").write_bytes(b"{}")

    def full(src, dest, **kwargs):
        raise OSError(28, "No space left on device", str(dest))

    monkeypatch.setattr(compress.rundir, "atomic_gzip_file", full)
    done: list[tuple[str, object]] = []
    compressor = compress.Compressor(tmp_path, lambda name, error: done.append((name, error)))
    compressor.submit("a.json")
    compressor.wait()
    ((name, error),) = done
    assert name == "a.json" and isinstance(error, OSError) and error.errno == 28
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_wait_without_anything_submitted_returns_at_once(tmp_path) -> None:
    compress.Compressor(tmp_path, lambda name, error: None).wait()
