"""The start-up hook (ddpdoctor/capture/_startup/sitecustomize.py): it costs nothing outside a traced job, little
in a job process that is not a rank, and never stops a process from running when ddpdoctor fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.capture.launcher import startup_hook_env

pytestmark = pytest.mark.timeout(120)

HOOK_DIR = str(Path(__import__("ddpdoctor.capture", fromlist=["x"]).__file__).parent / "_startup")
# Modules the hook loads in a job process that never becomes a rank (the import hook only).
PROBE = (
    "import sys, json; print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('ddpdoctor', 'torch'))))"
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DDPDOCTOR_CAPTURE")}
    env.update(extra)
    return env


def _python(*args: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def _hook_import_time_us(stderr: str) -> int:
    """Time (µs) spent importing ddpdoctor modules, from ``-X importtime`` output."""
    total = 0
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        own, _cumulative, name = (part.strip() for part in line[len("import time:") :].split("|"))
        if name.split(".")[0] == "ddpdoctor":
            total += int(own)
    return total


def test_installed_ddpdoctor_adds_nothing_to_other_processes():
    """A Python process outside a traced job imports no ddpdoctor module and runs no hook of ours."""
    probe = PROBE + "; print(getattr(sys.modules.get('sitecustomize'), '__file__', None))"
    result = _python("-X", "importtime", "-c", probe, env=_env())
    assert result.returncode == 0, result.stderr
    modules, sitecustomize = result.stdout.strip().splitlines()
    assert modules == "[]"
    assert not sitecustomize.startswith(HOOK_DIR)
    assert _hook_import_time_us(result.stderr) == 0


def test_hook_folder_without_a_traced_job_does_nothing():
    """The hook folder left on PYTHONPATH (no DDPDOCTOR_CAPTURE): nothing of ddpdoctor is imported."""
    result = _python("-c", PROBE, env=_env(PYTHONPATH=HOOK_DIR))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_non_rank_process_in_a_traced_job_is_cheap(tmp_path):
    """A helper, launcher or DataLoader worker of a traced job loads one small module (no torch, nothing else of
    ddpdoctor's) and pays a few ms."""
    env = _env(**startup_hook_env({}), DDPDOCTOR_CAPTURE=f'{{"out": "{tmp_path}"}}')
    result = _python("-X", "importtime", "-c", PROBE, env=env)
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout))
    assert "ddpdoctor.capture.autostart" in loaded
    assert loaded <= {"ddpdoctor", "ddpdoctor._version", "ddpdoctor.capture", "ddpdoctor.capture.autostart"}
    cost_us = _hook_import_time_us(result.stderr)
    assert 0 < cost_us < 30_000, f"the start-up hook imported ddpdoctor in {cost_us} us"
    assert not list(tmp_path.iterdir())  # nothing written by a process that never became a rank


def test_hook_leaves_sys_path_and_runs_the_shadowed_sitecustomize(tmp_path):
    """The user's own sitecustomize still runs, and sys.path is what a bare start-up gives."""
    user = tmp_path / "user_site"
    user.mkdir()
    (user / "sitecustomize.py").write_text("print('user sitecustomize ran')\n")
    env = _env(PYTHONPATH=os.pathsep.join([HOOK_DIR, str(user)]), DDPDOCTOR_CAPTURE='{"out": "/nonexistent"}')
    result = _python("-c", "import sys; print(sys.path)", env=env)
    assert result.returncode == 0, result.stderr
    first, path_line = result.stdout.strip().splitlines()
    assert first == "user sitecustomize ran"
    assert HOOK_DIR not in path_line and str(user) in path_line


def test_broken_ddpdoctor_never_breaks_the_process(tmp_path):
    """ddpdoctor failing to import in a job process: one warning line, and the process runs as it would have."""
    broken = tmp_path / "broken"
    (broken / "ddpdoctor").mkdir(parents=True)
    (broken / "ddpdoctor" / "__init__.py").write_text("raise RuntimeError('simulated broken install')\n")
    env = _env(PYTHONPATH=os.pathsep.join([HOOK_DIR, str(broken)]), DDPDOCTOR_CAPTURE='{"out": "/tmp"}')
    result = _python("-c", "print(6 * 7)", env=env)
    assert result.returncode == 0 and result.stdout == "42\n"
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("ddpdoctor: warning: process ") and "simulated broken install" in line


def test_capture_failing_in_a_rank_never_breaks_training(tmp_path):
    """A rank whose capture cannot start (unreadable settings) warns once and trains to its normal end."""
    script = tmp_path / "one_rank.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        f"dist.init_process_group('gloo', init_method='file://{tmp_path}/rdzv', rank=0, world_size=1)\n"
        "model = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(3):\n"
        "    model(torch.randn(2, 4)).sum().backward(); opt.step()\n"
        "dist.destroy_process_group()\n"
        "print('trained')\n"
    )
    env = _env(**startup_hook_env({}), DDPDOCTOR_CAPTURE="{not json")
    result = _python(str(script), env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "trained\n"
    warnings = [line for line in result.stderr.splitlines() if line.startswith("ddpdoctor:")]
    assert len(warnings) == 1 and "capture not started" in warnings[0]
