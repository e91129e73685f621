"""SIGTERM or Ctrl-C to ``ddpdoctor trace`` of a torchrun job (issue 13, item 10): ddpdoctor ends by the same signal
(a shell shows 143 / 130), as in one-process mode, with no torchrun or rank tracebacks; what was captured is kept.
~20 s each on 2 cores."""

from __future__ import annotations

import os
import signal

import pytest
from helpers import read_json, start_long_ddp_run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

FAST = ["--wait", "1", "--warmup", "1", "--active", "2"]


def _descendants(pid: int) -> list[int]:
    """ddpdoctor's launcher, torchrun's agent and the ranks (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(c) for c in f.read().split()]
    except OSError:
        return []
    return [c for child in children for c in (child, *_descendants(child))]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_ends_ddpdoctor_by_that_signal_without_tracebacks(tmp_path, signum):
    out = tmp_path / "run"
    launcher = start_long_ddp_run(out, *FAST)
    if signum == signal.SIGINT:  # Ctrl-C: the terminal signals every process of the foreground job
        for pid in [launcher.pid, *_descendants(launcher.pid)]:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
    else:
        launcher.send_signal(signum)
    _, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode == -signum, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    manifest = read_json(out / "manifest.json")
    assert all(entry["trace_files"] for entry in manifest["ranks"])
