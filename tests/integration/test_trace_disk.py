"""`ddpdoctor trace` when --out cannot be written: a disk that fills up, a read-only disk (at the start and in
the middle of the run), and two traces writing beside each other at the same time.

Running as root, permissions stop no write, so the disks are small or read-only tmpfs mounts (skipped where
``mount`` is not allowed: it needs root with CAP_SYS_ADMIN).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import read_json, run_cli, write_script

from ddpdoctor.cli import main

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

FAST = ["--wait", "1", "--warmup", "1", "--active", "2"]

# A single-process training run; exits with EXIT_CODE; remounts READ_ONLY_AT read-only at step READ_ONLY_STEP.
TRAIN = """
import os, subprocess, sys
import torch

model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(int(os.environ.get("STEPS", "12"))):
    if os.environ.get("READ_ONLY_AT") and step == int(os.environ["READ_ONLY_STEP"]):
        subprocess.run(["mount", "-o", "remount,ro", os.environ["READ_ONLY_AT"]], check=True)
    loss = model(torch.randn(16, 64)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("trained", flush=True)
sys.exit(int(os.environ.get("EXIT_CODE", "0")))
"""


@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs(name, size="64k", read_only=False)`` mounts a small tmpfs under tmp_path (unmounted after)."""
    mounted: list[Path] = []

    def mount(name: str, size: str = "64k", read_only: bool = False) -> Path:
        if shutil.which("mount") is None:
            pytest.skip("no mount command: cannot make a small or read-only disk")
        path = tmp_path / name
        path.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "ddpdoctor-test", str(path)],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            pytest.skip(
                f"cannot mount a tmpfs here ({result.stderr.strip()}); it needs root with CAP_SYS_ADMIN"
            )
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _ddpdoctor_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("ddpdoctor: ")]


def test_a_disk_that_fills_up_is_one_clear_error_and_the_script_exit_code(tmp_path, tmpfs) -> None:
    disk = tmpfs("full", size="64k")  # room for the rank file, not for a trace
    script = write_script(tmp_path / "train.py", TRAIN)
    out = disk / "run"
    result = run_cli("trace", "--out", str(out), *FAST, str(script), env={"EXIT_CODE": "3"})
    assert "trained" in result.stdout  # the training ran to its end
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 3, result.stderr  # the script's own exit status, not ddpdoctor's
    errors = [line for line in _ddpdoctor_lines(result.stderr) if "No space left on device" in line]
    assert errors and str(out) in errors[0], result.stderr
    assert not [p.name for p in out.rglob(".*") if p.is_file()]  # no temporary files left behind


def test_a_read_only_disk_is_refused_before_the_script_runs(tmp_path, tmpfs) -> None:
    disk = tmpfs("ro", read_only=True)
    script = write_script(tmp_path / "train.py", TRAIN)
    result = run_cli("trace", "--out", str(disk / "run"), *FAST, str(script))
    assert result.returncode == 2 and "trained" not in result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert (
        lines[0].startswith("ddpdoctor: error: cannot write to --out") and "Read-only file system" in lines[0]
    )


def test_a_disk_that_turns_read_only_during_the_run(tmp_path, tmpfs) -> None:
    disk = tmpfs("later-ro", size="16m")
    script = write_script(tmp_path / "train.py", TRAIN)
    out = disk / "run"
    env = {"READ_ONLY_AT": str(disk), "READ_ONLY_STEP": "2", "EXIT_CODE": "4"}
    result = run_cli("trace", "--out", str(out), *FAST, str(script), env=env)
    assert "trained" in result.stdout and "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 4, result.stderr
    assert [line for line in _ddpdoctor_lines(result.stderr) if "Read-only file system" in line], (
        result.stderr
    )


def test_two_traces_into_one_parent_folder_at_once(tmp_path, capsys) -> None:
    """Two runs trace into the same parent folder at the same time: both complete with their own exit
    codes, each run directory holds exactly its own files, and each diagnoses. (One-process runs: a 2-rank
    gloo job can hang in torch's own teardown on a loaded machine, which is not what this test is about.)"""
    parent = tmp_path / "runs"
    script = write_script(tmp_path / "train.py", TRAIN)
    runs = {"a": ("0", "20"), "b": ("5", "30")}  # name: (exit code, steps)
    procs = {}
    for name, (code, steps) in runs.items():
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "EXIT_CODE": code, "STEPS": steps}
        cmd = [sys.executable, "-m", "ddpdoctor", "trace", "--out", str(parent / name), *FAST, str(script)]
        procs[name] = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
    results = {}
    try:
        for name, proc in procs.items():
            results[name] = (*proc.communicate(timeout=180), proc.returncode)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    assert sorted(p.name for p in parent.iterdir()) == ["a", "b"]
    for name, (code, steps) in runs.items():
        out, err, returncode = results[name]
        assert returncode == int(code) and "trained" in out and "Traceback" not in err, err
        run = parent / name
        manifest = read_json(run / "manifest.json")
        assert manifest["exit_code"] == int(code) and str(run) in " ".join(manifest["command"])
        rank = read_json(run / "ranks" / "rank0.json")
        assert rank["steps"]["count"] == int(steps) and rank["pid"] == procs[name].pid
        listed = sorted(f for r in manifest["ranks"] for f in r["trace_files"])
        assert listed == sorted(p.name for p in run.glob("*.pt.trace.json.gz")) and len(listed) == 1
        assert not [p for p in run.rglob(".*") if p.is_file()]  # no temporary file left
        assert main(["diagnose", str(run), "--format", "json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert [r["rank"] for r in report["ranks"]] == [0] and report["run"]["skipped"] == []
