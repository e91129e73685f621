"""Issue 29: ``diagnose`` on a Dask cluster (``--workers N`` / ``--scheduler ADDRESS``) gives the same analysis as in
one process, on every shared GPU trace set; a worker killed mid-run costs no rank (Dask runs its task again) or is
named per rank, never aborting the others.

One local cluster of 2 worker processes on 127.0.0.1 serves the tests in this module (starting one costs seconds).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import signal
from pathlib import Path

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


def _many_ranks(dest: Path, n: int) -> Path:
    """``n`` ranks of foreign traces (no run directory): the straggler sample's two ranks, renumbered."""
    sources = sorted((SAMPLES / "recorded" / "ddp_straggler").glob("rank*.pt.trace.json.gz"))
    docs = [json.loads(gzip.decompress(p.read_bytes())) for p in sources]
    dest.mkdir()
    for rank in range(n):
        doc = docs[rank % 2]
        doc["distributedInfo"] = {**doc["distributedInfo"], "rank": rank, "world_size": n}
        (dest / f"rank{rank}.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode(), 1))
    return dest


@pytest.mark.timeout(600)
def test_a_worker_killed_mid_run_costs_no_rank_or_is_named(cluster, tmp_path):
    folder = _many_ranks(tmp_path / "ranks", 12)
    pids = list(cluster.client.run(os.getpid).values())
    state = {"killed_at": None}

    def progress(done: int, total: int, label: str) -> None:
        if state["killed_at"] is None:  # after the first rank came back, the others still running or queued
            state["killed_at"] = (done, total)
            os.kill(pids[0], signal.SIGKILL)

    from ddpdoctor.load import load

    with using(cluster):
        run = load(folder, summarize=True, progress=progress)
    done, total = state["killed_at"]
    assert done < total == 12
    have = sorted(rt.rank for rt in run.ranks)
    missing = sorted(set(range(12)) - set(have))
    # every rank analysed (its task ran again on a worker that lived), or each missing one named
    for rank in missing:
        assert any(f"rank{rank}.pt.trace" in s and "task failed" in s for s in run.skipped), (missing, run.skipped)
    assert len(have) >= 6, (have, run.skipped)


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
