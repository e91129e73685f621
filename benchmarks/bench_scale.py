"""Scale: a 131,072-rank run diagnosed from its per-rank summary files (< 30 s on 2 cores, wall time and CPU time
alike; peak RSS < 8 GB, a third of this machine's memory), growth from 8 ranks: the slopes per added rank of the
time, the CPU time and the peak RSS between the two largest runs.

``diagnose`` of runs of 8 to 16,384 ranks, each timed in a fresh process; the target is on the largest.

The runs are synthetic-from-real: a real 2-rank run of ``samples/ddp_train.py`` (traced here once and cached)
gives ``ranks/rank<R>.summary.json`` and ``ranks/rank<R>.json``; rank R of the N-rank run is a copy of real
rank R % 2 with its rank ids rewritten (rank, local rank, node, world size, process-group ranks, file names; 8
ranks per host) and its data-order digests made distinct per rank (else the copies would look like ranks that
all read the same batches). Every rank's summary states the default process group as ddpdoctor writes it, its
ranks as ranges (``[[0, N-1]]``, ranklist.py; once every rank listed, 1.8 GB of files at 16,384 ranks).
No trace is copied: the run is read the way a large job's should be,
``load(RUN, use_summaries=True)`` -> analyze -> rules -> text report (``diagnose_child.py summaries``), each time
in a fresh process, so the time includes interpreter start-up and imports. The largest runs are made once and
cached (each file filled in from a text template: about 2 ms a rank); ``--quick`` stops at 1,024 ranks; sizes of
65,536 ranks and more are run once."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench_common import CACHE, CHILD, REPO, Report, median, run_child

NAME = "scale"
SIZES = (8, 64, 256, 1024, 4096, 16384, 131072)
QUICK_SIZES = (8, 64, 256, 1024)
TARGET_RANKS = 131072
TARGET_S = 30.0
TARGET_PEAK_MB = 8192.0  # bounded: a third of this 23 GB machine, shared with other jobs
ONCE_FROM = 65536  # sizes from here are run once a round of the others (each run is most of a minute)
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
    """An ``n``-rank run directory made of the source run's per-rank files, rank ids rewritten. Each of the two
    real ranks' files becomes one text template (``%``-format fields for the rank's ids) filled in per rank, so
    131,072 ranks take seconds, not the minutes a JSON round trip per rank took."""
    marker = dest / ".synthetic-from-real"
    if marker.exists() and marker.read_text() == _fingerprint(source):
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    (dest / "ranks").mkdir(parents=True)
    templates = {
        r: (
            _template(_rank_capture(_read(source / "ranks" / f"rank{r}.json"), n)),
            _template(_rank_summary(_read(source / "ranks" / f"rank{r}.summary.json"), n)),
        )
        for r in (0, 1)
    }
    digests = {r: _digests(_read(source / "ranks" / f"rank{r}.json")) for r in (0, 1)}
    manifest = _read(source / "manifest.json")
    entries = manifest.get("ranks") or []
    entries = [e for e in (entries.values() if isinstance(entries, dict) else entries) if isinstance(e, dict)]
    ranks_dir = dest / "ranks"
    rank_entries = []
    for rank in range(n):
        real = rank % 2
        node = rank // RANKS_PER_HOST
        fields = {"rank": rank, "local": rank % RANKS_PER_HOST, "node": node, "pid": 100000 + rank}
        for key, value in digests[real].items():
            fields[key] = hashlib.sha1(f"{value}:{rank}".encode()).hexdigest()[:16]
        capture, summary = templates[real]
        (ranks_dir / f"rank{rank}.json").write_text(capture % fields)
        (ranks_dir / f"rank{rank}.summary.json").write_text(summary % fields)
        entry = next((e for e in entries if e.get("rank") == real), {})
        names = [_renamed(f, rank) for f in _read_list(source, real)]
        rank_entries.append(
            {
                **entry,
                "rank": rank,
                "hostname": f"node{node}",
                "local_rank": rank % RANKS_PER_HOST,
                "node_rank": node,
                "trace_files": names,
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


_SOURCE_FILES: dict[int, list[str]] = {}


def _read_list(source: Path, real: int) -> list[str]:
    if real not in _SOURCE_FILES:
        _SOURCE_FILES[real] = list(_read(source / "ranks" / f"rank{real}.json").get("trace_files", []))
    return _SOURCE_FILES[real]


def _digests(data: dict[str, Any]) -> dict[str, str]:
    """The data-order digests of the source rank's loaders, by template field name."""
    out = {}
    for i, loader in enumerate((data.get("setup") or {}).get("data_loaders", [])):
        for key in DIGESTS:
            if loader.get(key):
                out[f"d{i}_{key}"] = loader[key]
    return out


# A field is a string "@@name@@" in the JSON (an int where the whole string is a field: quotes dropped)
_FIELD = re.compile(r'"@@(\w+)@@"|@@(\w+)@@')


def _template(data: dict[str, Any]) -> str:
    text = json.dumps(data).replace("%", "%%")

    def field(m: re.Match[str]) -> str:
        if m.group(1):
            name = m.group(1)
            return f'"%({name})s"' if name.startswith("d") and "_" in name else f"%({name})d"
        return f"%({m.group(2)})d"

    return _FIELD.sub(field, text)


def _rank_capture(data: dict[str, Any], n: int) -> dict[str, Any]:
    out = json.loads(json.dumps(data))
    out.update(
        rank="@@rank@@",
        local_rank="@@local@@",
        world_size=n,
        node_rank="@@node@@",
        hostname="node@@node@@",
        local_world_size=min(RANKS_PER_HOST, n),
        pid="@@pid@@",
        trace_files=[_renamed(f, "@@rank@@") for f in out.get("trace_files", [])],
    )
    for ddp in out.get("ddp", []):
        ddp.get("logging_data", {}).update(rank="@@rank@@", world_size=n)
    for i, loader in enumerate((out.get("setup") or {}).get("data_loaders", [])):
        loader["sampler_num_replicas"] = n if loader.get("distributed_sampler") else loader.get("sampler_num_replicas")
        for key in DIGESTS:
            if loader.get(key):
                loader[key] = f"@@d{i}_{key}@@"
    return out


def _rank_summary(data: dict[str, Any], n: int) -> dict[str, Any]:
    out = json.loads(json.dumps(data))
    out.update(
        rank="@@rank@@",
        world_size=n,
        hostname="node@@node@@",
        files=[str(Path(f).with_name(_renamed(Path(f).name, "@@rank@@"))) for f in out.get("files", [])],
    )
    out["metrics"]["rank"] = "@@rank@@"
    info = out.get("distributed_info") or {}
    info.update(rank="@@rank@@", world_size=n)
    for pg in info.get("pg_config", []):
        if pg.get("pg_size") == 2:  # the default group: every rank, as ranges (as ddpdoctor writes it: ranklist.py)
            pg.update(pg_size=n, ranks=[[0, n - 1]])
    return out


def _renamed(name: str, rank: int | str) -> str:
    head, _, rest = name.partition(".")
    return f"rank{rank}.{rest}" if head.startswith("rank") else name


def _fingerprint(source: Path) -> str:
    return "layout 2 (groups as ranges)\n" + "\n".join(
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
    peak: dict[int, list[float]] = {n: [] for n in sizes}
    for i in range(reps):
        for n in sizes:  # interleaved: each round runs every size once
            if n >= ONCE_FROM and i:
                continue
            child = run_child([str(CHILD), "summaries", str(runs[n])])
            wall[n].append(child["child_wall_s"])
            work[n].append(child["work_s"])
            cpu[n].append(child.get("work_cpu_s") or float("nan"))
            peak[n].append((child.get("peak_rss_kb") or 0) / 1024)
    section: dict[str, Any] = {"sizes": {}}
    for n in sizes:
        w, a = median(wall[n]), median(work[n])
        section["sizes"][n] = {"wall_s": wall[n], "work_s": work[n], "work_cpu_s": cpu[n], "peak_rss_mb": peak[n]}
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
        if n == TARGET_RANKS:  # on a shared machine the wall time waits for a core; the CPU time does not
            report.add(
                f"scale_diagnose_{n}_ranks_cpu",
                median(cpu[n]),
                unit="s",
                target=("<", TARGET_S),
                note="CPU time of load+analyze+rules+report (one core's worth; the work is not parallel)",
            )
        report.add(
            f"scale_peak_rss_{n}_ranks",
            max(peak[n]),
            unit="MB",
            target=("<", TARGET_PEAK_MB) if n == TARGET_RANKS else None,
            note="peak RSS of the diagnose process",
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
        "scale_cpu_ms_per_added_rank",
        (median(cpu[hi]) - median(cpu[lo])) / (hi - lo) * 1e3,
        unit="ms",
        note=f"slope of its CPU time between {lo} and {hi} ranks (what 30 s at {TARGET_RANKS:,} ranks needs: "
        f"{TARGET_S / TARGET_RANKS * 1e3:.2f} ms)",
    )
    report.add(
        "scale_peak_kb_per_added_rank",
        (max(peak[hi]) - max(peak[lo])) / (hi - lo) * 1e3,
        unit="kB",
        note=f"slope of the peak RSS between {lo} and {hi} ranks",
    )
    report.add(
        f"scale_growth_{sizes[0]}_to_{hi}",
        median(work[hi]) / median(work[sizes[0]]),
        unit="x",
        note=f"load+analyze+rules+report time, {hi:,} ranks / {sizes[0]} ranks ({hi // sizes[0]:,}x the ranks)",
    )
    report.sections[NAME] = section
