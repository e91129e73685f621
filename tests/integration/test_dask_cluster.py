"""Issue 29: ``diagnose`` on a Dask cluster (``--workers N`` / ``--scheduler ADDRESS``) gives the same analysis as in
one process, on every shared GPU trace set; a worker killed while it decodes a rank costs no rank (Dask runs its task
again) or, when the scheduler allows no more deaths, that rank is named with the reason and the others are analysed;
a rank file that fails to decode is named and the others analysed, as in one process.

One local cluster of 2 worker processes on 127.0.0.1 serves the tests in this module (starting one costs seconds).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import SAMPLES, run_cli

distributed = pytest.importorskip("distributed", reason="needs ddpdoctor[dask]")

from ddpdoctor.load.cluster import DaskCluster, using  # noqa: E402
from ddpdoctor.pipeline import analyze_run  # noqa: E402
from ddpdoctor.report import render  # noqa: E402

pytestmark = pytest.mark.integration
SHARED = Path(__file__).resolve().parents[3] / "shared" / "traces"
SETS = sorted(p.parent.relative_to(SHARED).as_posix() for p in SHARED.glob("*/*/*")) if SHARED.is_dir() else []
SETS = sorted(set(SETS))


@pytest.fixture(scope="module")
def cluster():
    with DaskCluster(workers=2) as c:
        yield c


def _json(path: Path) -> str:
    out = io.StringIO()
    render(analyze_run(path).diagnosis, "json", out)
    return out.getvalue()


@pytest.mark.timeout(600)
@pytest.mark.skipif(not SETS, reason="../shared/traces is absent")
def test_every_shared_trace_set_gives_the_same_json_on_the_cluster(cluster):
    for name in SETS:
        alone = _json(SHARED / name)
        with using(cluster):
            clustered = _json(SHARED / name)
        assert clustered == alone, name


def _gil_probe_of(dask_worker: Any = None, dask_scheduler: Any = None) -> bool:
    server = dask_worker if dask_worker is not None else dask_scheduler
    return getattr(server.monitor, "_gilknocker", None) is not None


def test_no_process_of_the_cluster_runs_dasks_gil_probe(cluster):
    """Dask's system monitor samples the GIL with gilknocker where it is installed (it is: ddpdoctor's fallback
    probe). Its native thread aborted the process ("FATAL: exception not rethrown", exit 134) when it took the GIL
    while the interpreter finalised: 1 ``diagnose --workers 2`` in ~60 beside busy CPUs, in the command itself or in
    a worker. The cluster turns it off in the scheduler and in every worker."""
    assert cluster.client.run(_gil_probe_of) == {w: False for w in cluster.client.scheduler_info()["workers"]}
    assert cluster.client.run_on_scheduler(_gil_probe_of) is False
    # the setting is this cluster's: the caller's Dask configuration is as it was outside the block
    import dask

    before = dask.config.get("distributed.admin.system-monitor.gil.enabled")
    with DaskCluster(workers=1) as one:
        assert one.client.run_on_scheduler(_gil_probe_of) is False
    assert dask.config.get("distributed.admin.system-monitor.gil.enabled") == before


def _many_ranks(dest: Path, n: int, grow: int = 1) -> Path:
    """``n`` ranks of foreign traces (no run directory): the straggler sample's two ranks, renumbered; ``grow``: each
    rank's events repeated that many times (shifted by whole windows, steps renumbered), for tasks that last."""
    sources = sorted((SAMPLES / "recorded" / "ddp_straggler").glob("rank*.pt.trace.json.gz"))
    docs = [json.loads(gzip.decompress(p.read_bytes())) for p in sources]
    for doc in docs:
        timed = [e for e in doc["traceEvents"] if "ts" in e and e.get("ph") != "M"]
        span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 1000
        for k in range(1, grow):
            for e in timed:
                e2 = dict(e, ts=e["ts"] + k * span)
                name = e2.get("name")
                if isinstance(name, str) and name.startswith("ProfilerStep#"):
                    e2["name"] = f"ProfilerStep#{int(name[13:]) + 100 * k}"
                doc["traceEvents"].append(e2)
    dest.mkdir()
    for rank in range(n):
        doc = docs[rank % 2]
        doc["distributedInfo"] = {**doc["distributedInfo"], "rank": rank, "world_size": n}
        (dest / f"rank{rank}.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode(), 1))
    return dest


N_GROWN = 8


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """8 ranks of ~10 MB of JSON each: a rank's task decodes for tens of milliseconds, long enough to be caught."""
    return _many_ranks(tmp_path_factory.mktemp("grown") / "ranks", N_GROWN, grow=10)


def _kill_plugin(target: str, marker: str) -> Any:
    """A worker plugin that SIGKILLs its own worker process while one of its threads is inside
    ``loader._decode_group`` for the group ``target`` (a rank's task, started and not finished), once: the first
    worker to get there creates ``marker`` (its pid, the time) and dies; the task's next runs are left alone.
    Defined in a function so that it is pickled by value (the workers cannot import this test module)."""
    from distributed import WorkerPlugin

    class KillWhileDecoding(WorkerPlugin):
        def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
            if finish != "executing" or not str(key).endswith(f"-{target}") or os.path.exists(marker):
                return
            import sys
            import threading
            import time

            def watch() -> None:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    for frame in sys._current_frames().values():
                        f = frame
                        while f is not None:
                            if f.f_code.co_name == "_decode_group" and f.f_locals.get("key") == target:
                                try:
                                    fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                                except FileExistsError:
                                    return
                                os.write(fd, f"{os.getpid()} {time.time()}".encode())
                                os.close(fd)
                                os.kill(os.getpid(), signal.SIGKILL)
                            f = f.f_back
                    time.sleep(0.001)

            threading.Thread(target=watch, daemon=True).start()

    return KillWhileDecoding()


@contextlib.contextmanager
def _killing_once(cluster: DaskCluster, target: str, marker: Path) -> Iterator[None]:
    name = f"ddpdoctor-test-kill-{marker.parent.name}"
    cluster.client.register_plugin(_kill_plugin(target, str(marker)), name=name)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            cluster.client.unregister_worker_plugin(name)


def _scheduler_saw_its_worker_die(cluster: DaskCluster, target: str, since: float) -> bool:
    """Whether the scheduler took ``target``'s task back from a worker that was running it (the transitions out of
    'processing' other than to 'memory' happen when its worker is removed)."""

    def transitions(dask_scheduler: Any) -> list[tuple[str, str, str, float]]:
        return [
            (str(t.key), t.start, t.finish, t.timestamp)
            for t in dask_scheduler.transition_log
            if str(t.key).endswith(f"-{target}")
        ]

    seen = cluster.client.run_on_scheduler(transitions)
    return any(
        start == "processing" and finish in ("released", "erred") and at >= since for _, start, finish, at in seen
    )


def _rendered(analysis: Any, fmt: str = "json") -> str:
    out = io.StringIO()
    render(analysis.diagnosis, fmt, out)
    return out.getvalue()


def _names(reason: str, rank: int) -> bool:
    """Whether a reason in ``run.skipped`` is about rank ``rank``'s file (named by its name or path)."""
    return re.match(rf"(.*/)?rank{rank}\.pt\.trace\.json\.gz: ", reason) is not None


def _every_rank_analysed_or_named(analysis: Any, n: int) -> tuple[list[int], list[str]]:
    have = sorted(r["rank"] for r in analysis.metrics.ranks)
    skipped = list(analysis.metrics.run["skipped"])
    for rank in sorted(set(range(n)) - set(have)):
        named = [s for s in skipped if _names(s, rank)]
        assert named, (rank, have, skipped)
    assert analysis.metrics.run["ranks_loaded"] == len(have)
    return have, skipped


@pytest.mark.timeout(300)
def test_a_worker_killed_while_decoding_a_rank_costs_no_rank(cluster, grown, tmp_path):
    """Dask runs the task of the rank whose worker died again on the worker left (and computes again the summaries
    the dead worker held): every rank comes back, and the report is the one-process report."""
    alone = _rendered(analyze_run(grown))
    marker = tmp_path / "killed"
    since = time.time()
    with _killing_once(cluster, "rank5", marker), using(cluster):
        analysis = analyze_run(grown)
    assert marker.exists(), "no worker was killed: rank5's task never ran on a worker with the plugin"
    assert _scheduler_saw_its_worker_die(cluster, "rank5", since)
    have, skipped = _every_rank_analysed_or_named(analysis, N_GROWN)
    assert have == list(range(N_GROWN)), skipped
    assert _rendered(analysis) == alone
    assert "straggler" in _rendered(analysis, "text").lower()


@pytest.mark.timeout(300)
def test_a_rank_whose_worker_died_more_than_allowed_is_named_and_the_others_analysed(grown, tmp_path):
    """With a scheduler that allows no worker death per task (allowed-failures 0; 3 by default), the killed rank's
    task fails with KilledWorker: that rank is named with the reason, the others are analysed and reported."""
    import dask

    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), DaskCluster(workers=2) as strict:
        marker = tmp_path / "killed"
        since = time.time()
        with _killing_once(strict, "rank5", marker), using(strict):
            analysis = analyze_run(grown)
        assert marker.exists()
        assert _scheduler_saw_its_worker_die(strict, "rank5", since)
    have, skipped = _every_rank_analysed_or_named(analysis, N_GROWN)
    assert 5 not in have and have, (have, skipped)
    (why,) = [s for s in skipped if _names(s, 5)]
    assert "its task failed on a local Dask cluster of 2 worker(s) (KilledWorker" in why, why
    report = json.loads(_rendered(analysis))
    assert sorted(r["rank"] for r in report["ranks"]) == have and why in report["run"]["skipped"]
    assert "rank5.pt.trace.json.gz" in _rendered(analysis, "text")


@pytest.mark.timeout(300)
def test_a_rank_file_that_fails_to_decode_is_named_and_the_others_analysed(cluster, tmp_path):
    folder = _many_ranks(tmp_path / "ranks", 6)
    (folder / "rank2.pt.trace.json.gz").write_bytes(b"\x1f\x8b" + b"not gzip" * 512)  # gzip magic, then garbage
    cut = gzip.compress(b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}')  # cut short
    (folder / "rank4.pt.trace.json.gz").write_bytes(cut)
    alone = analyze_run(folder)
    with using(cluster):
        clustered = analyze_run(folder)
    have, skipped = _every_rank_analysed_or_named(clustered, 6)
    assert have == [0, 1, 3, 5], skipped
    assert len(skipped) == 2 and "not valid JSON" in skipped[1], skipped
    assert _rendered(clustered) == _rendered(alone)


@pytest.mark.timeout(120)
def test_a_key_another_load_still_holds_is_not_taken_for_this_one(cluster):
    """Task keys are fresh per load: a future with the key a rank would get (held by another client of a shared
    scheduler, or by this process's previous load) does not stand in for the rank's own result."""
    stale = cluster.client.submit(str, "stale", key="ddpdoctor-0-rank0", pure=False)
    assert stale.result() == "stale"
    assert cluster.run_each(str, [("rank0", ("fresh",))], lambda key, exc: exc) == ["fresh"]
    del stale


@pytest.mark.timeout(300)
def test_the_command_line_options(tmp_path):
    sample = SAMPLES / "recorded" / "ddp_straggler"
    alone = run_cli("diagnose", str(sample), "--steps", "4..", "--format", "json", timeout=240)
    clustered = run_cli("diagnose", str(sample), "--steps", "4..", "--format", "json", "--workers", "2", timeout=240)
    assert alone.returncode == clustered.returncode == 0, clustered.stderr
    assert clustered.stdout == alone.stdout
    both = run_cli("diagnose", str(sample), "--workers", "2", "--scheduler", "tcp://127.0.0.1:1")
    assert both.returncode == 2 and "not allowed with" in both.stderr
    gone = run_cli("diagnose", str(sample), "--steps", "4..", "--scheduler", "tcp://127.0.0.1:9", timeout=120)
    assert gone.returncode == 2 and "cannot reach a Dask scheduler" in gone.stderr
    assert "Traceback" not in gone.stderr and gone.stderr.count("\n") == 1
