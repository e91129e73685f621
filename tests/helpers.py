"""Shared test helpers (import with `from helpers import ...`): run the real CLI in a subprocess, as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "samples"


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 120, env: dict | None = None):
    """Run ``python -m ddpdoctor ARGS`` and return the CompletedProcess (text mode)."""
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    return subprocess.run(
        [sys.executable, "-m", "ddpdoctor", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


def write_script(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def read_json(path: Path):
    return json.loads(Path(path).read_text())

