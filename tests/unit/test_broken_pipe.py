"""``ddpdoctor ... | head -1``: when the reader goes away, ddpdoctor ends quietly (no traceback, no
"Exception ignored" line) with status 141, what a shell reports for a program ended by SIGPIPE, never 0 or 1
(the codes for "clean" and "findings found") (issue 13, item 11)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ddp_gloo_2rank"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "args",
    [
        ["diagnose", str(FIXTURE)],  # findings found: 1 when the output is read
        ["diagnose", str(FIXTURE), "--format", "html"],
        ["rules"],  # 0 when the output is read
    ],
    ids=["diagnose-text", "diagnose-html", "rules"],
)
def test_a_closed_pipe_ends_quietly_with_141(args):
    read, write = os.pipe()
    os.close(read)  # the reader is gone before ddpdoctor writes its first byte
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "ddpdoctor", *args], stdout=write, stderr=subprocess.PIPE, text=True, timeout=100
        )
    finally:
        os.close(write)
    assert proc.returncode == 141, proc.stderr
    assert proc.stderr == ""
