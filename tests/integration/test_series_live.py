"""The always-on series of a real 2-rank job (torchrun + gloo), one job for every test here: while it runs, its
Prometheus endpoints (127.0.0.1, port + local rank) and node_exporter textfiles agree with the series files,
`diagnose` reads what is written, `view` shows the series as scalars that grow and its dashboard, in headless
Chromium, the steps recorded so far (and all of them once the job ended); once it ended, the series covers every step
the ranks counted, with the rank files' own step times, and ``ddpdoctor.summary()`` gave the last row."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from helpers import CHROMIUM, REPO, DashboardView, chromium, read_json, run_cli

from ddpdoctor.capture.series import read_series

pytestmark = [pytest.mark.integration]
prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

FAST = ["--wait", "1", "--warmup", "1", "--active", "3"]
SCRIPT = REPO / "tests" / "integration" / "series_job.py"


def _free_base_port() -> int:
    """A port p with p and p + 1 free on 127.0.0.1 (the two ranks' endpoints)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base >= 65535:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", base + 1))
            return base
        except OSError:
            continue
    raise AssertionError("no two consecutive free ports")


class Job:
    def __init__(self, root: Path) -> None:
        self.out = root / "run"
        self.stop_file = root / "stop"
        self.textfiles = root / "textfiles"
        self.textfiles.mkdir()
        self.port = _free_base_port()
        # MAX_STEPS: far more steps than the tests take (~30 ms each); the job ends when finish() asks
        env = {**os.environ, "STOP_FILE": str(self.stop_file), "SLEEP_MS": "20", "MAX_STEPS": "20000"}
        env["PYTHONUNBUFFERED"] = "1"
        cmd = [sys.executable, "-m", "ddpdoctor", "trace", "--out", str(self.out), *FAST, "-q"]
        cmd += ["--metrics-port", str(self.port), "--metrics-textfile", str(self.textfiles)]
        cmd += ["--standalone", "--nproc-per-node", "2", str(SCRIPT)]
        # files, not pipes: nobody reads them while the job runs, and a full pipe would stall it
        self._out, self._err = open(root / "stdout.txt", "w+"), open(root / "stderr.txt", "w+")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._out, stderr=self._err, start_new_session=True)
        self.stdout = self.stderr = ""

    def _collect(self) -> None:
        for f in (self._out, self._err):
            f.flush()
            f.seek(0)
        self.stdout, self.stderr = self._out.read(), self._err.read()

    def wait_running(self, timeout: float = 150) -> None:
        """Both ranks wrote their first profiled window and at least 10 series rows."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            series = read_series(self.out) if self.out.is_dir() else {}
            traces = list(self.out.glob("rank*.pt.trace.json.gz"))
            if len(traces) == 2 and len(series) == 2 and all(len(s.rows) >= 10 for s in series.values()):
                return
            time.sleep(0.3)
        self.kill()
        raise AssertionError(f"the job did not start in time: {self.stderr[-3000:]}")

    def finish(self, timeout: float = 120) -> int:
        self.stop_file.touch()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self._collect()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self._collect()


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    j = Job(tmp_path_factory.mktemp("series"))
    j.wait_running()
    yield j
    if j.proc.poll() is None:
        j.kill()


@pytest.fixture(scope="module")
def finished(job):
    """The same job, stopped (after the tests that need it running: pytest runs them in file order)."""
    assert job.finish() == 0, job.stderr[-3000:]
    return job


def _scrape(port: int) -> dict[str, list]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20) as response:
        text = response.read().decode()
    return _families(text)


def _families(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _one(families: dict[str, list], name: str, **labels: str):
    samples = [s for s in families[name] if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(samples) == 1, (name, labels, families.get(name))
    return samples[0]


@pytest.mark.timeout(400)
def test_prometheus_endpoint_of_each_rank_matches_its_series(job):
    node = socket.gethostname()
    for local_rank in (0, 1):
        fam = _scrape(job.port + local_rank)
        step = _one(fam, "ddpdoctor_step")
        assert step.labels == {"rank": str(local_rank), "node": node, "job": "run"}
        # counters are exposed as <name>_total, in seconds and bytes (Prometheus base units)
        assert {"ddpdoctor_steps", "ddpdoctor_step_time_seconds", "ddpdoctor_step_seconds"} <= set(fam)
        n = int(step.value)
        assert _one(fam, "ddpdoctor_steps", rank=str(local_rank)).name == "ddpdoctor_steps_total"
        assert _one(fam, "ddpdoctor_steps").value == n + 1  # steps 0..n
        # the same step in the series file (written within ~1 s): every number is that row's
        deadline = time.monotonic() + 30
        while True:
            rows = {r["step"]: r for r in read_series(job.out)[local_rank].rows}
            if n in rows or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        row = rows[n]
        assert _one(fam, "ddpdoctor_step_seconds").value == pytest.approx(row["wall_s"], rel=1e-9)
        assert _one(fam, "ddpdoctor_last_step_timestamp_seconds").value == pytest.approx(row["t"], rel=1e-12)
        for phase in ("data", "forward", "backward", "optimizer"):
            assert _one(fam, "ddpdoctor_phase_seconds", phase=phase).value == pytest.approx(row[f"{phase}_s"])
        mem = _one(fam, "ddpdoctor_memory_bytes", device="cpu")
        measured = [r["mem_bytes"] for s, r in sorted(rows.items()) if s <= n and r["mem_bytes"] is not None]
        assert mem.value == measured[-1] and mem.value > 10e6  # a process RSS, as last read
        total = sum(r["wall_s"] for s, r in rows.items() if s <= n and r["wall_s"] is not None)
        assert _one(fam, "ddpdoctor_step_time_seconds").value == pytest.approx(total, rel=1e-6)
        assert 0 < _one(fam, "ddpdoctor_ddp_comm_seconds").value < 10


@pytest.mark.timeout(120)
def test_endpoint_listens_on_loopback_only(job):
    tcp = Path("/proc/net/tcp")
    if not tcp.exists():
        pytest.skip("no /proc/net/tcp")
    listening = set()  # (address, port) of every listening IPv4 socket (state 0A)
    for line in tcp.read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A":
            address, port = local.split(":")
            listening.add((socket.inet_ntoa(bytes.fromhex(address)[::-1]), int(port, 16)))
    for local_rank in (0, 1):
        bound = {a for a, p in listening if p == job.port + local_rank}
        assert bound == {"127.0.0.1"}, bound


@pytest.mark.timeout(120)
def test_textfile_for_node_exporter_is_written_as_the_job_goes(job):
    for rank in (0, 1):
        path = job.textfiles / f"ddpdoctor_rank{rank}.prom"
        deadline = time.monotonic() + 30
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.3)
        fam = _families(path.read_text())
        step = _one(fam, "ddpdoctor_step")
        assert step.labels["rank"] == str(rank) and step.value >= 9
        assert _one(fam, "ddpdoctor_steps").value == step.value + 1
    assert not [p.name for p in job.textfiles.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.timeout(300)
def test_diagnose_reads_the_run_while_it_runs(job):
    result = run_cli("diagnose", str(job.out), timeout=240)
    assert result.returncode == 0, result.stderr
    assert "ddpdoctor diagnosis:" in result.stdout
    assert "still running: this is a run in progress, not a verdict" in result.stdout
    assert job.proc.poll() is None  # it was read while running


@pytest.mark.timeout(400)
def test_view_shows_the_series_as_scalars_that_follow_the_job(job, tmp_path):
    view = DashboardView(job.out, tmp_path / "view.log")
    try:
        assert any("followed live" in line for line in view.stdout)

        def wait_steps(minimum: int) -> list:
            deadline = time.monotonic() + 120
            while True:
                points = view.scalars("tensorboard/rank1", "series/step_ms")
                if (points and points[-1][1] >= minimum) or time.monotonic() > deadline:
                    return points
                time.sleep(1)

        first = wait_steps(1)
        assert first, "no series/step_ms scalars"
        later = wait_steps(first[-1][1] + 5)  # the job goes on: TensorBoard shows the new steps by itself
        assert later[-1][1] >= first[-1][1] + 5
        rows = {r["step"]: r for r in read_series(job.out)[1].rows}
        for _, step, value in later[-5:]:
            assert value == pytest.approx(rows[step]["wall_s"] * 1e3, rel=1e-6)  # float32 in the event file
        assert [p[1] for p in later] == sorted({p[1] for p in later})  # each step once
        deadline = time.monotonic() + 60
        while not view.scalars("tensorboard/rank0", "series/data_wait_ms") and time.monotonic() < deadline:
            time.sleep(1)  # TensorBoard loads one run after another
        waits = view.scalars("tensorboard/rank0", "series/data_wait_ms")
        assert waits and all(v >= 15 for _, s, v in waits[-5:])  # the job sleeps 20 ms before each forward
        assert view.scalars("tensorboard/rank0", "series/memory_bytes")
    finally:
        view.stop()


def _counts(run_dir: Path) -> dict[int, int]:
    """Steps in each rank's series file now (the rows of steps 0..n-1)."""
    return {rank: len(s.rows) for rank, s in read_series(run_dir).items()}


def _fmt_ms(v: float) -> str:
    """The dashboard's fmtMs (ddpdoctor/tensorboard/static/dom.js)."""
    return f"{v:.0f} ms" if v >= 100 else f"{v:.1f} ms" if v >= 10 else f"{v:.2f} ms"


def _series_table(dom: str) -> dict[int, tuple[int, list[str]]]:
    """The dashboard's table of the steps recorded: rank -> (data-steps, the row's cells as shown)."""
    found = {}
    for rank, steps, cells in re.findall(r'<tr data-rank="(\d+)" data-steps="(\d+)">(.*?)</tr>', dom):
        found[int(rank)] = (int(steps), re.findall(r"<td>(.*?)</td>", cells))
    return found


@pytest.mark.timeout(500)
@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed")
def test_dashboard_in_chromium_shows_the_steps_so_far_then_all(job, tmp_path, request):
    view = DashboardView(job.out, tmp_path / "dashboard-view.log")
    page = f"{view.url}data/plugin/ddpdoctor/dashboard.html?run=."
    try:
        assert view.url.startswith("http://127.0.0.1:")
        before = _counts(job.out)
        assert job.proc.poll() is None and len(before) == 2
        # 40 s of the page's own clock (virtual time: it runs ahead while the page waits on nothing): its reloads
        # every 15 s while the job runs, each a new report of what the ranks wrote by then
        dom = chromium(
            tmp_path / "profile", "--window-size=1400,1000", "--virtual-time-budget=40000", "--dump-dom", page
        )
        after = _counts(job.out)
        assert job.proc.poll() is None, "the job ended before the page was read: not a live view"
        assert 'data-state="ready"' in dom, dom[-3000:]
        assert int(re.search(r'data-loads="(\d+)"', dom).group(1)) >= 2  # it reloaded itself while the job ran
        assert "Step time (live)" in dom and "the job is running: this page reloads every 15 s" in dom
        shown = _series_table(dom)
        assert sorted(shown) == [0, 1], dom[-3000:]
        series = read_series(job.out)
        for rank, (steps, cells) in shown.items():
            # what the ranks had written when the page was last built: between the two reads of the files
            assert 0 < before[rank] <= steps <= after[rank], (rank, before, steps, after)
            row = series[rank].rows[steps - 1]  # steps 0..n-1: the last one shown is the row n-1
            assert cells[:4] == [f"rank {rank}", str(steps), str(row["step"]), _fmt_ms(row["wall_s"] * 1e3)], cells
        # the chart draws every step so far (one point per step below 600 steps, one per bucket above)
        chart = dom[dom.index('data-section="step-time"') :]
        polylines = re.findall(r'<polyline points="([^"]*)"[^>]*data-series="rank 0"', chart)
        assert polylines and len(polylines[0].split()) >= min(shown[0][0] - 1, 300)

        finished = request.getfixturevalue("finished")  # the job stopped (the tests after this one read it)
        total = _counts(job.out)
        assert all(total[r] > shown[r][0] for r in (0, 1)), (total, shown)  # it went on after the page was read
        dom = chromium(tmp_path / "profile", "--window-size=1400,1000", "--dump-dom", page)
        assert finished.proc.returncode == 0 and 'data-state="ready"' in dom, dom[-3000:]
        assert "Step time (live)" not in dom and "reloads every" not in dom
        series = read_series(job.out)
        for rank, (steps, cells) in _series_table(dom).items():
            last = series[rank].rows[-1]
            assert steps == total[rank] and cells[:4] == [
                f"rank {rank}",
                str(steps),
                str(last["step"]),
                _fmt_ms(last["wall_s"] * 1e3),
            ]
    finally:
        view.stop()
        if job.proc.poll() is None:
            job.kill()


@pytest.mark.timeout(300)
def test_series_covers_every_step_of_every_rank(finished):
    series = read_series(finished.out)
    assert sorted(series) == [0, 1]
    manifest = read_json(finished.out / "manifest.json")
    assert manifest["exit_code"] == 0
    for rank, s in series.items():
        capture = read_json(finished.out / "ranks" / f"rank{rank}.json")
        count = capture["steps"]["count"]
        assert count > 20
        assert [r["step"] for r in s.rows] == list(range(count)) and s.bad_lines == 0
        assert s.header["rank"] == rank and s.header["world_size"] == 2 and s.header["device"] == "cpu"
        assert s.rows[0]["wall_s"] is None
        assert [r["wall_s"] for r in s.rows[1:]] == pytest.approx(
            [ms / 1e3 for ms in capture["steps"]["wall_ms"]], abs=1e-6
        )
        in_phases = 0.0
        for r in s.rows[1:]:
            phases = [r[f"{p}_s"] for p in ("data", "forward", "backward", "optimizer")]
            assert None not in phases and min(phases) >= 0, r
            assert r["data_s"] >= 0.019  # the 20 ms sleep before the forward
            in_phases += sum(phases)
        # the phases split the steps: over the run they add up to the steps' wall time (the two clocks are read
        # microseconds apart at each step end, so per step they differ by that; the sum telescopes)
        walls = sum(r["wall_s"] for r in s.rows[1:])
        assert in_phases == pytest.approx(walls, abs=0.05)
        measured = [r for r in s.rows if r["mem_bytes"] is not None]  # the RSS: read at most every 50 ms
        assert len(measured) >= len(s.rows) // 4 and all(r["mem_bytes"] > 10e6 for r in measured)
        assert s.rows[0]["mem_bytes"] is not None
        ends = [r["t"] for r in s.rows]
        assert ends == sorted(ends)
        timed = [r for r in s.rows if r["ddp_comm_s"] is not None]
        assert len(timed) >= 2  # read at a rate that keeps its cost under 0.1% of the step time
        for r in timed:  # DDP's timing lands on the step it timed: its backward's all-reduce began in that step
            before = s.rows[r["step"] - 1]["t"] if r["step"] else s.header["started_at"]
            assert before <= r["ddp_comm_start_t"] <= r["t"]
    summary = json.loads(re.search(r"^SUMMARY (.*)$", finished.stdout, re.M).group(1))
    last = series[0].rows[-1]
    assert summary["ddpdoctor/rank"] == 0 and summary["ddpdoctor/step"] == last["step"]
    assert summary["ddpdoctor/step_seconds"] == last["wall_s"]
    assert summary["ddpdoctor/data_wait_seconds"] == last["data_s"]
    assert summary["ddpdoctor/cpu_seconds"] == last["cpu_s"] > 0  # the process's CPU time in that step
    assert summary["ddpdoctor/memory_bytes"] == [r["mem_bytes"] for r in series[0].rows if r["mem_bytes"]][-1]
    assert summary["ddpdoctor/steps_recorded"] == len(series[0].rows)
