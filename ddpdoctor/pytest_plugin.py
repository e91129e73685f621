"""pytest fixtures to assert on ddpdoctor metrics in a training smoke test.

Enable it in a ``conftest.py`` (``pytest_plugins = ["ddpdoctor.pytest_plugin"]``) or with
``pytest -p ddpdoctor.pytest_plugin``. Then::

    def test_train_smoke(ddpdoctor_trace, ddpdoctor_gate):
        run = ddpdoctor_trace("train.py", "--steps", "30", nproc_per_node=2)   # a real traced run
        snap = ddpdoctor_gate.snapshot(run)
        assert snap.value("step_ms.median") < 200                      # any metric of `ddpdoctor compare`
        ddpdoctor_gate.check(run, "perf/baseline.json", thresholds=["step_ms.median=+15%"])

``check`` fails the test with the gate's report when the run regresses against the baseline (same rules and
statistics as ``ddpdoctor gate``). When the baseline file does not exist, or with
``--ddpdoctor-update-baseline``, it writes the baseline from this run instead and the check passes (commit
the file).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest


def pytest_addoption(parser: Any) -> None:
    parser.addoption(
        "--ddpdoctor-update-baseline",
        action="store_true",
        default=False,
        help="ddpdoctor_gate.check() writes the baseline files instead of checking against them",
    )


class GateHelper:
    """What the ``ddpdoctor_gate`` fixture gives a test."""

    def __init__(self, update: bool) -> None:
        self.update = update

    def snapshot(self, run: str | os.PathLike[str]) -> Any:
        """The run's metrics (``Snapshot``: ``.value(name)``, ``.samples``, ``.findings``,
        ``.environment``)."""
        from ddpdoctor.compare import read_input

        return read_input(str(run))

    def check(
        self,
        run: str | os.PathLike[str],
        baseline: str | os.PathLike[str],
        thresholds: Sequence[str] = (),
        fail_on: str | None = None,
        strict_env: bool = False,
    ) -> Any:
        """Gate ``run`` against ``baseline``; ``pytest.fail`` with the report on a regression. Returns the
        ``GateResult`` (or None when the baseline was written)."""
        from ddpdoctor.compare import gate, load_config
        from ddpdoctor.compare.baseline_file import dumps
        from ddpdoctor.report import gate_text
        from ddpdoctor.rundir import atomic_write_bytes

        path = Path(baseline)
        current = self.snapshot(run)
        if self.update or not path.exists():
            atomic_write_bytes(path, dumps(current).encode())
            return None
        config = load_config(None, thresholds, fail_on=fail_on, strict_env=strict_env)
        result = gate(current, self.snapshot(path), config)
        if result.failed:
            out = io.StringIO()
            gate_text.render(result, out)
            pytest.fail(out.getvalue(), pytrace=False)
        return result


@pytest.fixture
def ddpdoctor_gate(request: Any) -> GateHelper:
    return GateHelper(bool(request.config.getoption("--ddpdoctor-update-baseline")))


@pytest.fixture
def ddpdoctor_trace(tmp_path: Path) -> Callable[..., Path]:
    """``trace(script, *args, nproc_per_node=None, env=None, trace_args=(), timeout=600) -> run directory``:
    runs ``ddpdoctor trace`` (torchrun with ``--standalone`` when ``nproc_per_node`` is given) in a subprocess
    and fails the test when the script fails."""
    counter = iter(range(1_000_000))

    def trace(
        script: str | os.PathLike[str],
        *args: str,
        nproc_per_node: int | None = None,
        env: dict[str, str] | None = None,
        trace_args: Sequence[str] = (),
        timeout: float = 600,
    ) -> Path:
        out = tmp_path / f"ddpdoctor-run-{next(counter)}"
        launch = ["--standalone", "--nproc-per-node", str(nproc_per_node)] if nproc_per_node else []
        cmd = [
            sys.executable,
            "-m",
            "ddpdoctor",
            "trace",
            "-q",
            "--out",
            str(out),
            *trace_args,
            *launch,
            str(script),
            *args,
        ]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
        )
        if proc.returncode != 0:
            pytest.fail(f"ddpdoctor trace exited {proc.returncode}:\n{proc.stderr[-4000:]}", pytrace=False)
        return out

    return trace
