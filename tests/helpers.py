"""Shared test helpers (import with `from helpers import ...`): run the real CLI in a subprocess, as a user would."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "samples"


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 120, env: dict | None = None):
    """Run ``python -m ddpdoctor ARGS`` and return the CompletedProcess (text mode).

    The command runs in its own process group, and on a timeout the whole group is killed: a torchrun launch
    leaves no orphaned ranks behind to load the machine for the tests that follow.
    """
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    cmd = [sys.executable, "-m", "ddpdoctor", *args]
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def trace_and_diagnose(out: Path, *trace_args: str, timeout: float = 150) -> tuple[dict, str]:
    """``ddpdoctor trace -q --out OUT TRACE_ARGS`` then ``ddpdoctor diagnose OUT --format json``, each checked to
    exit 0: the report, and what the traced job printed (stdout and stderr)."""
    traced = run_cli("trace", "-q", "--out", str(out), *trace_args, timeout=timeout)
    assert traced.returncode == 0, traced.stderr[-3000:]
    diagnosed = run_cli("diagnose", str(out), "--format", "json", timeout=60)
    assert diagnosed.returncode == 0, diagnosed.stderr[-3000:]
    return json.loads(diagnosed.stdout), traced.stdout + traced.stderr


def trace_one_process(out: Path, script: Path, *window: str, timeout: float = 150) -> subprocess.CompletedProcess:
    """``ddpdoctor trace --out OUT WINDOW SCRIPT`` of a one-process script, with one intra-op thread."""
    return run_cli("trace", "--out", str(out), *window, str(script), env={"OMP_NUM_THREADS": "1"}, timeout=timeout)


def start_long_ddp_run(out: Path, *trace_args: str, env: dict | None = None) -> subprocess.Popen:
    """Start `ddpdoctor trace` of a long 2-rank run of tests/integration/ddp_script.py in the background and wait
    until both ranks have written their first profiled window (for tests that then signal or kill it)."""
    script = str(REPO / "tests" / "integration" / "ddp_script.py")
    full_env = {**os.environ, "STEPS": "3000", "SLEEP_MS": "20", "PYTHONUNBUFFERED": "1", **(env or {})}
    cmd = [sys.executable, "-m", "ddpdoctor", "trace", "--out", str(out), *trace_args]
    cmd += ["--standalone", "--nproc-per-node", "2", script]
    proc = subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 90
    while time.time() < deadline and len(list(out.glob("rank*.pt.trace.json.gz"))) < 2:
        time.sleep(0.2)
    assert len(list(out.glob("rank*.pt.trace.json.gz"))) == 2, "the profiled window never completed"
    return proc


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a rendezvous: --master-port, MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_script(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def read_json(path: Path):
    return json.loads(Path(path).read_text())


CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


def chromium(profile_dir: Path, *args: str) -> str:
    """Run headless Chromium (Debian's, as .ci/run installs it) with the flags this offline machine needs; return
    its stdout (e.g. the DOM with --dump-dom)."""
    result = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile_dir}",
            "--virtual-time-budget=10000",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@contextlib.contextmanager
def cpu_burner(n: int = 1):
    """Load the host as a busy neighbour would: ``n`` processes spinning ``while True: pass`` for the block's duration.

    Each burner runs in its own session and is killed (SIGKILL to its group) on leaving the block, even on failure.
    """
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(n)]
    try:
        yield hogs
    finally:
        for hog in hogs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(hog.pid, signal.SIGKILL)
            hog.wait(timeout=10)


def trace_jobs_beside_a_burner(
    base: Path, jobs: dict[str, str], window: tuple[str, ...] = ("--wait", "2", "--warmup", "1", "--active", "4")
) -> dict[str, Path]:
    """Each job (name -> script source) traced as a real 2-rank torchrun + gloo run into ``base/<name>``, two at a
    time beside one CPU burner (a busy neighbour); name -> run directory. A trace that fails fails the caller."""

    def trace(name: str) -> Path:
        script = write_script(base / f"{name}_train.py", jobs[name])
        out = base / name
        done = run_cli(
            "trace", "-q", "--out", str(out), *window, "--standalone", "--nproc-per-node", "2", str(script), timeout=200
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return out

    with cpu_burner(1), ThreadPoolExecutor(2) as pool:
        return dict(zip(jobs, pool.map(trace, jobs), strict=True))


def assert_overlap_finding_leaves_out(metrics, findings: dict, part: str, said: str) -> None:  # noqa: ANN001
    """Where ``poor-comm-compute-overlap`` fired, its estimated gain is the ranks' mean exposed transfer less the
    metric ``part`` (``optimizer_exposed_transfer_ms``, ``loop_exposed_transfer_ms``): DDP's share, the
    ``ddp_exposed_transfer_ms`` it reads, and its message names the part left out with ``said``."""
    for r in metrics.ranks:
        assert r["ddp_exposed_transfer_ms"] == pytest.approx(r["exposed_transfer_ms"] - r[part], abs=1e-9), r
    finding = findings.get("poor-comm-compute-overlap")
    if finding is not None:
        ddp = [r["exposed_transfer_ms"] - r[part] for r in metrics.ranks]
        assert finding.estimated_gain_ms == pytest.approx(sum(ddp) / len(ddp), abs=5e-4)  # gains are in µs
        assert said in finding.message


def step_snapshot(median: float, seed: int, spread: float = 0.15):
    """A run's compare/gate snapshot made of 30 step times around ``median`` (ms), scattered by ``spread``."""
    import numpy as np

    from ddpdoctor.compare.snapshot import Snapshot

    steps = (median * (1 + np.random.default_rng(seed).normal(0, spread, 30))).tolist()
    return Snapshot(
        source=f"runs/r{seed}",
        environment={"mode": "ddp", "world_size": 2, "backend": "gloo", "devices": ["cpu"], "torch_version": "2.13.0"},
        metrics={"step_ms.median": float(np.median(steps)), "step_ms.p90": float(np.percentile(steps, 90))},
        samples={"step_ms": steps},
        sample_notes={"step_ms": "21 steps outside the profiled windows, steps 2-29, slowest rank per step"},
        findings=[],
        rules_evaluated=[],
    )


class DashboardView:
    """`ddpdoctor view RUN --port 0` in its own process group (its URL once TensorBoard prints it); stopped like
    Ctrl-C in a terminal."""

    def __init__(self, run_dir: Path, log: Path) -> None:
        self.log = open(log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ddpdoctor", "view", str(run_dir), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.stdout: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.url = self._wait_for_url(180)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.stdout.append(line)
            self.lines.put(line)

    def _wait_for_url(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            m = re.search(r"TensorBoard at (http://\S+)", line)
            if m:
                return m.group(1)
        self.stop()
        raise AssertionError(f"view printed no URL: {self.stdout} {Path(self.log.name).read_text()}")

    def scalars(self, run: str, tag: str) -> list:
        query = urllib.parse.urlencode({"run": run, "tag": tag})
        try:
            with urllib.request.urlopen(f"{self.url}data/plugin/scalars/scalars?{query}", timeout=30) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError:
            return []  # not loaded yet

    def get(self, path: str, timeout: float = 60):
        """The JSON at ``path`` of the server (gunzipped where TensorBoard compressed it)."""
        import gzip

        with urllib.request.urlopen(self.url + path.lstrip("/"), timeout=timeout) as response:
            body = response.read()
            if response.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
        return json.loads(body)

    def status(self, path: str) -> int:
        try:
            with urllib.request.urlopen(self.url + path.lstrip("/"), timeout=60) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code

    def stop(self, timeout: float = 30) -> int | None:
        """Ctrl-C (SIGINT to its group); its exit status, None where it had to be killed."""
        code = None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends: the whole group
            try:
                code = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        else:
            code = self.proc.returncode
        self.log.close()
        return code
