"""`ddpdoctor trace SCRIPT` behaves like `python SCRIPT` for the script: argv, __name__, __file__, sys.path[0], cwd,
output and exit status (memray's and pyinstrument's wrapping tests do the same)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import run_cli, write_script

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PROBE = """
import json, os, sys
print("PROBE " + json.dumps({"argv": sys.argv, "name": __name__, "file": __file__, "path0": sys.path[0],
                             "cwd": os.getcwd()}))
mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
if mode == "exit3":
    sys.exit(3)
if mode == "exitmsg":
    sys.exit("custom message from the script")
if mode == "raise":
    def inner():
        raise ValueError("boom from the script")
    inner()
"""


def _probe(stdout: str) -> dict:
    line = next(line for line in stdout.splitlines() if line.startswith("PROBE "))
    return json.loads(line[len("PROBE ") :])


def _bare(args, cwd):
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("mode, code", [("ok", 0), ("exit3", 3), ("exitmsg", 1), ("raise", 1)])
def test_script_parity(tmp_path, mode, code):
    work = tmp_path / "work"
    script = write_script(work / "sub" / "train.py", PROBE)
    bare = _bare(["sub/train.py", mode, "--lr", "0.1"], work)
    wrapped = run_cli("trace", "--out", str(tmp_path / "run"), "sub/train.py", mode, "--lr", "0.1", cwd=work)
    assert bare.returncode == code
    assert wrapped.returncode == bare.returncode, wrapped.stderr
    assert _probe(wrapped.stdout) == _probe(bare.stdout)
    probe = _probe(bare.stdout)
    assert probe["argv"] == ["sub/train.py", mode, "--lr", "0.1"]
    assert probe["file"] == str(script) and probe["name"] == "__main__"
    if mode == "exitmsg":
        assert "custom message from the script" in wrapped.stderr
    if mode == "raise":
        # the script's own traceback, as Python shows it, without ddpdoctor's or runpy's frames
        tb = wrapped.stderr[wrapped.stderr.index("Traceback") :]
        assert "ValueError: boom from the script" in tb
        assert "in inner" in tb and "train.py" in tb
        assert "ddpdoctor" not in tb.split("ValueError")[0] and "runpy" not in tb
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["exit_code"] == code
    assert manifest["ranks"][0]["status"] == ("ok" if code == 0 else "failed")


def test_module_parity(tmp_path):
    work = tmp_path / "work"
    write_script(work / "mypkg" / "__init__.py", "")
    write_script(work / "mypkg" / "train.py", PROBE)
    bare = _bare(["-m", "mypkg.train", "exit3", "x"], work)
    wrapped = run_cli("trace", "--out", str(tmp_path / "run"), "-m", "mypkg.train", "exit3", "x", cwd=work)
    assert bare.returncode == 3
    assert wrapped.returncode == 3, wrapped.stderr
    assert _probe(wrapped.stdout) == _probe(bare.stdout)


def test_no_step_script_still_traced(tmp_path):
    """A script with no optimizer and no ddpdoctor.step(): the run is still traced, and the manifest says so."""
    script = write_script(
        tmp_path / "nostep.py", "import torch\nx = torch.randn(64, 64)\nfor _ in range(5): x = x @ x.T / 64\n"
    )
    result = run_cli("trace", "--out", str(tmp_path / "run"), str(script))
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["steps_detected"] is False and manifest["notes"]
    assert manifest["ranks"][0]["trace_files"], "the whole (short) run should be in a trace"
    assert "ddpdoctor.step()" in result.stderr


def test_manual_steps(tmp_path):
    script = write_script(
        tmp_path / "manual.py",
        """
        import torch, ddpdoctor
        w = torch.randn(32, 32, requires_grad=True)
        for i in range(8):
            loss = (torch.randn(16, 32) @ w).square().mean()
            loss.backward()
            with torch.no_grad():
                w -= 0.01 * w.grad
                w.grad = None
            ddpdoctor.step()
        """,
    )
    result = run_cli(
        "trace", "--out", str(tmp_path / "run"), "--wait", "1", "--warmup", "1", "--active", "3", str(script)
    )
    assert result.returncode == 0, result.stderr
    rank0 = json.loads((tmp_path / "run" / "ranks" / "rank0.json").read_text())
    assert rank0["steps"]["source"] == "manual"
    assert rank0["steps"]["count"] == 8
    assert rank0["steps"]["profiled"] == [[3, 5]]
    assert len(rank0["steps"]["wall_ms"]) == 7


def test_sigint_single_process(tmp_path):
    """Ctrl-C in a one-process run: what was captured is written, exit status as Python's (killed by SIGINT)."""
    import os
    import signal
    import time

    script = write_script(
        tmp_path / "loop.py",
        """
        import time, torch
        w = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(w.parameters(), lr=0.1)
        while True:
            w(torch.randn(4, 8)).sum().backward()
            opt.step()
            time.sleep(0.01)
        """,
    )
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddpdoctor",
            "trace",
            "--out",
            str(out),
            "--wait",
            "1",
            "--warmup",
            "1",
            "--active",
            "2",
            str(script),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 60
    while time.time() < deadline and not list(out.glob("rank0.*.pt.trace.json.gz")):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGINT, stderr
    assert "KeyboardInterrupt" in stderr
    rank0 = json.loads((out / "ranks" / "rank0.json").read_text())
    assert rank0["status"] == "interrupted" and rank0["trace_files"]
    assert json.loads((out / "manifest.json").read_text())["ranks"][0]["status"] == "interrupted"
    assert os.path.exists(out / rank0["trace_files"][0])
