"""Scale: a 16,384-rank run diagnosed from its per-rank summary files (< 10 s on 2 cores), growth from 8 ranks.

``diagnose`` of runs of 8 to 16,384 ranks, each timed in a fresh process; the target is on the largest.

The runs are synthetic-from-real: a real 2-rank run of ``samples/ddp_train.py`` (traced here once and cached)
gives ``ranks/rank<R>.summary.json`` and ``ranks/rank<R>.json``; rank R of the N-rank run is a copy of real
rank R % 2 with its rank ids rewritten (rank, local rank, node, world size, process-group ranks, file names; 8
ranks per host) and its data-order digests made distinct per rank (else the copies would look like ranks that
all read the same batches). Every rank's summary lists the default process group with all N ranks, as a real
job's do (1.8 GB of files at 16,384 ranks). No trace is copied: the run is read the way a large job's should be,
``load(RUN, use_summaries=True)`` -> analyze -> rules -> text report (``diagnose_child.py summaries``), each time
in a fresh process, so the time includes interpreter start-up and imports. The largest runs are made once and
cached (about a minute for 16,384 ranks); ``--quick`` stops at 1,024 ranks."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench_common import CACHE, CHILD, REPO, Report, median, run_child

NAME = "scale"
SIZES = (8, 64, 256, 1024, 4096, 16384)
QUICK_SIZES = (8, 64, 256, 1024)
TARGET_RANKS = 16384
TARGET_S = 10.0
SOURCE = CACHE / "scale-source"
RANKS_PER_HOST = 8
DIGESTS = ("first_indices_digest", "first_batch_digest", "first_labels_digest")


def source_run() -> Path:
    """A real 2-rank run with per-rank summaries (traced once, then reused from the cache)."""
    ok = all((SOURCE / "ranks" / f"rank{r}{s}").exists() for r in (0, 1) for s in (".json", ".summary.json"))
    if not ok:
        cmd = [
            sys.executable,
            "-m",
            "ddpdoctor",
            "trace",
            "-q",
            "--out",
            str(SOURCE),
            "--force",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(REPO / "samples" / "ddp_train.py"),
        ]
        subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    return SOURCE


def synthesize(n: int, source: Path, dest: Path) -> Path:
    """An ``n``-rank run directory made of the source run's per-rank files, rank ids rewritten."""
    marker = dest / ".synthetic-from-real"
    if marker.exists() and marker.read_text() == _fingerprint(source):
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    (dest / "ranks").mkdir(parents=True)
    src = {r: _read(source / "ranks" / f"rank{r}.json") for r in (0, 1)}
    src_summary = {r: _read(source / "ranks" / f"rank{r}.summary.json") for r in (0, 1)}
    manifest = _read(source / "manifest.json")
    entries = manifest.get("ranks") or []
    entries = [e for e in (entries.values() if isinstance(entries, dict) else entries) if isinstance(e, dict)]
    rank_entries = []
    for rank in range(n):
        real = rank % 2
        capture = _rank_capture(src[real], rank, n)
        summary = _rank_summary(src_summary[real], rank, n)
        _write(dest / "ranks" / f"rank{rank}.json", capture)
        _write(dest / "ranks" / f"rank{rank}.summary.json", summary)
        entry = next((e for e in entries if e.get("rank") == real), {})
        rank_entries.append(
            {
                **entry,
                "rank": rank,
                "hostname": capture["hostname"],
                "local_rank": capture["local_rank"],
                "node_rank": capture["node_rank"],
                "trace_files": capture["trace_files"],
            }
        )
    nodes = (n + RANKS_PER_HOST - 1) // RANKS_PER_HOST
    manifest.update(
        world_size=n,
        nnodes=nodes,
        ranks=rank_entries,
        nodes=[
            {
                **(manifest.get("nodes") or [{}])[0],
                "node_rank": k,
                "hostname": f"node{k}",
                "expected_ranks": list(range(k * RANKS_PER_HOST, min(n, (k + 1) * RANKS_PER_HOST))),
            }
            for k in range(nodes)
        ],
        notes=[f"synthetic-from-real: {n} ranks made of the 2 real ranks of {source.name} (bench_scale.py)"],
    )
    _write(dest / "manifest.json", manifest)
    marker.write_text(_fingerprint(source))
    return dest


def _rank_capture(data: dict[str, Any], rank: int, n: int) -> dict[str, Any]:
    out = json.loads(json.dumps(data))
    node = rank // RANKS_PER_HOST
    out.update(
        rank=rank,
        local_rank=rank % RANKS_PER_HOST,
        world_size=n,
        node_rank=node,
        hostname=f"node{node}",
        local_world_size=min(RANKS_PER_HOST, n),
        pid=100000 + rank,
        trace_files=[_renamed(f, rank) for f in out.get("trace_files", [])],
    )
    for ddp in out.get("ddp", []):
        ddp.get("logging_data", {}).update(rank=rank, world_size=n)
    for loader in (out.get("setup") or {}).get("data_loaders", []):
        loader["sampler_num_replicas"] = n if loader.get("distributed_sampler") else loader.get("sampler_num_replicas")
        for key in DIGESTS:
            if loader.get(key):
                loader[key] = hashlib.sha1(f"{loader[key]}:{rank}".encode()).hexdigest()[:16]
    return out


def _rank_summary(data: dict[str, Any], rank: int, n: int) -> dict[str, Any]:
    out = json.loads(json.dumps(data))
    node = rank // RANKS_PER_HOST
    out.update(
        rank=rank,
        world_size=n,
        hostname=f"node{node}",
        files=[str(Path(f).with_name(_renamed(Path(f).name, rank))) for f in out.get("files", [])],
    )
    out["metrics"]["rank"] = rank
    info = out.get("distributed_info") or {}
    info.update(rank=rank, world_size=n)
    for pg in info.get("pg_config", []):
        if pg.get("pg_size") == 2:
            pg.update(pg_size=n, ranks=list(range(n)))
    return out


def _renamed(name: str, rank: int) -> str:
    head, _, rest = name.partition(".")
    return f"rank{rank}.{rest}" if head.startswith("rank") else name


def _fingerprint(source: Path) -> str:
    return "\n".join(
        f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in sorted((source / "ranks").iterdir())
    )


def _read(path: Path) -> Any:
    return json.loads(path.read_text())


def _write(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data))


def run(report: Report, quick: bool) -> None:
    reps = 1 if quick else 3
    sizes = QUICK_SIZES if quick else SIZES
    source = source_run()
    runs = {n: synthesize(n, source, CACHE / f"scale-{n}") for n in sizes}
    report.say(
        f"  synthetic-from-real: {', '.join(map(str, sizes))} ranks made of the 2 ranks of a real run "
        f"({source.relative_to(REPO)}); {reps} run(s) each, in a fresh process, median"
    )
    wall: dict[int, list[float]] = {n: [] for n in sizes}
    work: dict[int, list[float]] = {n: [] for n in sizes}
    cpu: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(reps):
        for n in sizes:  # interleaved: each round runs every size once
            child = run_child([str(CHILD), "summaries", str(runs[n])])
            wall[n].append(child["child_wall_s"])
            work[n].append(child["work_s"])
            cpu[n].append(child.get("work_cpu_s") or float("nan"))
    section: dict[str, Any] = {"sizes": {}}
    for n in sizes:
        w, a = median(wall[n]), median(work[n])
        section["sizes"][n] = {"wall_s": wall[n], "work_s": work[n], "work_cpu_s": cpu[n]}
        target = ("<", TARGET_S) if n == TARGET_RANKS else None
        report.add(
            f"scale_diagnose_{n}_ranks",
            w,
            unit="s",
            target=target,
            note=(
                f"whole process; load+analyze+rules+report {a:.2f} s, {median(cpu[n]):.2f} s CPU "
                f"({a / n * 1e3:.3f} ms/rank; synthetic-from-real)"
            ),
        )
    lo, hi = sizes[-2], sizes[-1]
    per_rank = (median(work[hi]) - median(work[lo])) / (hi - lo) * 1e3
    report.add(
        "scale_ms_per_added_rank",
        per_rank,
        unit="ms",
        note=f"slope of load+analyze+rules+report between {lo} and {hi} ranks",
    )
    report.add(
        f"scale_growth_{sizes[0]}_to_{hi}",
        median(work[hi]) / median(work[sizes[0]]),
        unit="x",
        note=f"load+analyze+rules+report time, {hi:,} ranks / {sizes[0]} ranks ({hi // sizes[0]:,}x the ranks)",
    )
    report.sections[NAME] = section
