"""``ddpdoctor view`` of a run with one unreadable trace (issue 23, item 14): one warning line naming the file,
not the PyTorch Profiler plugin's chained tracebacks; the other ranks are still shown."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "ddp_gloo_2rank"
BROKEN = "rank1.1795974917997.pt.trace.json.gz"


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_one_unreadable_trace_is_one_warning_line(tmp_path):
    run_dir = Path(shutil.copytree(FIXTURE, tmp_path / "run"))
    data = (FIXTURE / BROKEN).read_bytes()
    (run_dir / BROKEN).write_bytes(data[: len(data) // 2])  # a truncated gzip file
    log = tmp_path / "view.err"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ddpdoctor", "view", str(run_dir), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            url = None
            for line in proc.stdout:
                match = re.search(r"TensorBoard at (http://\S+)", line)
                if match:
                    url = match.group(1)
                    break
            assert url, log.read_text()
            deadline = time.monotonic() + 150
            while time.monotonic() < deadline:  # the profiler plugin parses the traces in processes of its own
                with urllib.request.urlopen(url + "data/plugin/pytorch_profiler/runs", timeout=60) as response:
                    runs = json.loads(response.read())
                if runs["runs"] and not runs["loading"]:
                    break
                time.sleep(1)
            assert runs["runs"] == ["run"]  # the readable ranks are shown
            time.sleep(2)  # what the plugin's processes print reaches the log
        finally:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    stderr = log.read_text()
    assert "Traceback" not in stderr, stderr
    mentions = [line for line in stderr.splitlines() if BROKEN in line]
    assert len(mentions) == 1 and mentions[0].startswith("ddpdoctor: warning: "), stderr
    assert "truncated or corrupt" in mentions[0]
