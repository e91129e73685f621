"""``load(path)``: a run directory, a folder of torch.profiler traces or one trace file -> ``Run``.

Ranks are decoded in parallel worker processes (one rank per task, all its spans together) when there is
enough JSON for that to pay (``parallel_min_bytes``: 4 MB where workers can be forked with the decoder already
imported, else 256 MB); otherwise, and for a single rank, in-process. A file
that cannot be read is skipped and listed in ``Run.skipped`` as long as another file can be read; otherwise
``TraceError`` names the file and the problem.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddpdoctor import ranklist, rundir, runfiles
from ddpdoctor._version import __version__
from ddpdoctor.errors import TraceError
from ddpdoctor.load.discover import group_by_worker, rank_from_name, shown, trace_files
from ddpdoctor.load.frames import optimizer_steps_per_step, repeated_steps, steps_told_by_optimizer
from ddpdoctor.load.model import TABLES, EventTables, RankFacts, RankTrace, Run
from ddpdoctor.load.schema import valid_rank, valid_world_size
from ddpdoctor.rundir import is_run_dir

if TYPE_CHECKING:
    from ddpdoctor.load.cluster import DaskCluster
    from ddpdoctor.load.columns import FileColumns

# The trace decoder, its tables and the checks across trace files are imported where traces are read: a run read
# from its per-rank summaries needs none of them (start-up time of `diagnose`).

Progress = Callable[[int, int, str], None]


def load(
    path: str | os.PathLike[str],
    *,
    workers: int | None = None,
    progress: Progress | None = None,
    use_summaries: bool = False,
    summarize: bool = False,
    steps: tuple[int, int | None] | None = None,
    cluster: DaskCluster | None = None,
) -> Run:
    """Load every rank's traces under ``path``.

    ``workers``: processes decoding ranks in parallel; 1 decodes in-process. Default: min(cpu count, ranks)
    when the traces hold at least ``parallel_min_bytes()`` of JSON in all, else in-process.
    ``progress``: called as ``progress(done, total, label)`` after each rank.
    ``use_summaries``: in a run directory where every rank left ``ranks/rank<R>.summary.json``, return ranks
    that carry those summaries (``RankTrace.summary``) without decoding any trace (no tables).
    ``summarize``: summarise each rank (``metrics.summary.summarize_rank`` over ``steps``) as soon as it is
    decoded, in the process that decoded it, and keep only the summary and ``RankTrace.facts``, not the tables:
    memory stays bounded by the largest rank instead of growing with the run. A rank that must be put together
    from several workers' files, or whose rank is only known once every file is read and whose capture file
    then differs, keeps its tables (or the run is read again without summarising).
    ``cluster``: a started ``load.cluster.DaskCluster`` (default: the one ``cluster.using`` set, if any): each
    rank is decoded (and summarised) by a task on its workers, which read the files where they lie; the result is
    the same as in-process.
    """
    root = Path(path)
    if not root.exists():
        raise TraceError(f"{shown(root)}: no such file or directory")
    run_dir = root.is_dir() and is_run_dir(root)
    capture, manifest, file_notes = runfiles.read_run_files(root) if run_dir else ({}, {}, [])

    if use_summaries and run_dir:
        summarized, summary_notes = _summaries(root, capture)
        if summarized is not None:
            file_notes += _without_capture(root, summarized, capture, file_notes)
            return _make_run(root, summarized, "distributedInfo", capture, manifest, file_notes)
        file_notes += summary_notes

    if cluster is None:
        from ddpdoctor.load.cluster import current

        cluster = current()
    groups = group_by_worker(trace_files(root))
    plan = _Summarize(capture, steps, frozenset(capture)) if summarize else None
    results = _decode_groups(groups, workers, progress, plan, cluster)
    skipped = [s for _, _, errs in results for s in errs]
    trace_skipped = len(skipped)
    loaded = [(key, rt) for key, traces, _ in results for rt in traces]
    if not loaded:
        raise TraceError(
            skipped[0]
            if trace_skipped == 1
            else f"{shown(root)}: none of its {trace_skipped} trace files could be read; first: {skipped[0]}"
        )
    from ddpdoctor.load.consistency import check_one_run

    check_one_run(root, [rt for _, rt in loaded])
    try:
        ranks, source = _assign_ranks(loaded, groups, skipped)
        if plan is not None:
            _settle_ranks(ranks, plan)
    except _NeedTables:  # rare: spans of one rank in several workers' files, or a rank told by file order
        return load(root, workers=workers, progress=progress, cluster=cluster)
    if run_dir:
        file_notes += _without_capture(root, ranks, capture, file_notes)
    return _make_run(root, ranks, source, capture, manifest, skipped + file_notes)


def _without_capture(
    root: Path, ranks: list[RankTrace], capture: dict[int, dict[str, Any]], notes: list[str]
) -> list[str]:
    """Notes on the ranks of a run directory read from their traces without a capture file (``ranks/rank<R>.json``
    missing, left out, or stating another rank): their step times, set-up and memory records are not in the
    analysis."""
    alone = [rt for rt in ranks if rt.rank not in capture]
    out = []
    for rt in alone[:8]:
        name = f"{rundir.RANKS_DIR}/{rundir.rank_file(root, rt.rank).name}"
        if any(n.startswith(f"{name}: ") for n in notes):
            why = f"{name} was left out (above)"
        elif rundir.rank_file(root, rt.rank).exists():
            why = f"{name} states {_stated_rank(rundir.rank_file(root, rt.rank))}"
        else:
            why = f"{name} is missing"
        files = ", ".join(shown(Path(f).name) for f in rt.files[:3]) + (", ..." if len(rt.files) > 3 else "")
        out.append(f"rank {rt.rank} is read from its trace alone ({files}), without its capture file: {why}")
    if len(alone) > 8:
        out.append(f"{len(alone) - 8} more ranks are read from their traces alone, without a capture file")
    return out


def _stated_rank(path: Path) -> str:
    try:
        return f"rank {int(rundir.read_json(path)['rank'])}"
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        return "another rank"


def _trace_ranks(root: Path) -> set[int]:
    """The ranks the run directory's own trace files name (``rank<R>.<span>.pt.trace.json[.gz]``)."""
    try:
        names = os.listdir(root)
    except OSError:
        return set()
    return {int(m.group("rank")) for name in names if (m := rundir.TRACE_FILE_RE.match(name))}


@dataclass(frozen=True)
class _Summarize:
    """What a rank's summary needs besides its trace: the capture files (by rank) and the step range."""

    capture: dict[int, dict[str, Any]]
    steps: tuple[int, int | None] | None
    captured: frozenset[int] = frozenset()  # every rank with a capture file (``capture`` may hold only some)

    def for_files(self, paths: list[Path]) -> _Summarize:
        """The plan for a worker process: only the capture of the rank its file names say (a run of 1,000
        ranks would otherwise send every rank's capture to every worker)."""
        rank = rank_from_name(paths[0]) if paths else None
        capture = {rank: self.capture[rank]} if rank in self.capture else {}
        return _Summarize(capture, self.steps, frozenset(self.capture))


class _NeedTables(Exception):
    """A rank was summarised before its final rank or its other spans were known."""


def _summarize(rt: RankTrace, paths: list[Path], plan: _Summarize) -> None:
    """Replace ``rt``'s tables by its summary and the facts the run-level checks need."""
    from ddpdoctor.load.consistency import rank_range
    from ddpdoctor.metrics.summary import summarize_rank

    assert rt.tables is not None
    rank = valid_rank((rt.distributed_info or {}).get("rank"))
    if rank is None and paths:
        rank = rank_from_name(paths[0])
    rt.rank = rank if rank is not None else -1
    if rt.rank in plan.captured and rt.rank not in plan.capture:
        return  # a worker sent only the capture its file names pointed at: leave this rank to analyze()
    facts = RankFacts(
        range_us=rank_range(rt),
        names=list(rt.tables.ops["name"].categories),
        has_steps=len(rt.tables.steps) > 0,
        steps=plan.steps,
        optimizer_steps=steps_told_by_optimizer(rt.tables.steps),
        repeated_steps=repeated_steps(rt.tables.steps),
        optimizer_steps_per_step=optimizer_steps_per_step(rt.tables.ops, rt.tables.steps),
    )
    rt.summary = summarize_rank(rt, plan.capture.get(rt.rank), plan.steps)
    rt.facts = facts
    rt.set_tables(None)


def _settle_ranks(ranks: list[RankTrace], plan: _Summarize) -> None:
    """Ranks summarised under another rank number than the one they were given (numbered by file order): the
    summary holds for the new number when both numbers have the same capture file (none, for foreign traces)."""
    for rt in ranks:
        if rt.summary is None or rt.facts is None or rt.summary.get("rank") == rt.rank:
            continue
        if plan.capture.get(rt.summary.get("rank")) is not plan.capture.get(rt.rank):
            raise _NeedTables
        rt.summary = {**rt.summary, "rank": rt.rank, "metrics": {**rt.summary["metrics"], "rank": rt.rank}}


def load_rank_files(paths: list[Path], rank: int) -> RankTrace:
    """Decode the trace files of one rank in this process (used by a rank to summarise itself)."""
    _, traces, errors = _decode_group(f"rank{rank}", paths)
    if not traces:
        raise TraceError(errors[0] if errors else f"rank {rank}: no trace files")
    traces[0].rank = rank
    return traces[0]


def _decode_group(
    key: str, paths: list[Path], plan: _Summarize | None = None
) -> tuple[str, list[RankTrace], list[str]]:
    """The files of one worker name, decoded: one RankTrace (more when its files state different ranks, as
    with one ``worker_name`` for every rank; summarised with ``plan``), and why files were skipped."""
    from ddpdoctor.load.columns import RankTables
    from ddpdoctor.load.consistency import drop_copies
    from ddpdoctor.load.decode import decode_file
    from ddpdoctor.load.exported import split
    from ddpdoctor.load.frames import build_rank_trace

    tables = RankTables()
    by_rank: dict[int | None, list[FileColumns]] = {}
    errors = []
    for p in paths:
        try:
            f = decode_file(p, tables)
        except TraceError as exc:
            errors.append(str(exc))
            continue
        for part in split(f) or [f]:  # ddpdoctor's Perfetto export: a part per rank it holds
            errors += part.notes()  # events left out of a file that is read (bad timestamps)
            by_rank.setdefault(valid_rank((part.distributed_info or {}).get("rank")), []).append(part)
    traces = []
    for files in by_rank.values():
        kept, copies = drop_copies(files)
        errors += copies
        traces.append(build_rank_trace(-1, kept, tables))
    if plan is not None:
        for rt in traces:
            _summarize(rt, paths, plan)
    return key, traces, errors


# Where workers cannot be forked (``_fork_context``): below this much JSON in all, ranks are decoded (and
# summarised) in this process: starting worker processes, which then import the decoder and the metrics each,
# costs about what decoding in parallel saves. Measured on 2 cores, cold `diagnose`: 8 ranks of 4 MB 0.40 s in two
# workers vs 0.42 s in-process (medians of 5); 2 ranks of 35 MB 0.29 s vs 0.25 s (load() alone); 2 ranks of
# 315 MB decode in parallel at 250-266 MB/s.
PARALLEL_MIN_BYTES = 256 << 20


# Forked workers start with the decoder and the metrics this process imported first (``_import_decoder``), so
# they pay from far less JSON. Measured on 2 cores (diagnose, imports done, medians of 7): 8 ranks of 4 MB
# (31 MB) 0.33 s in two forked workers vs 0.53 s in-process; 2 of them (7.5 MB) 0.135 vs 0.157 s; the 2 ranks of
# the bundled sample (2 MB) 0.099 vs 0.088 s.
FORK_MIN_BYTES = 4 << 20


def parallel_min_bytes() -> int:
    """How much JSON a run of more than one rank needs in all for ``load`` to decode its ranks in workers."""
    return _min_bytes(_fork_context())


def _min_bytes(context: Any) -> int:
    return FORK_MIN_BYTES if context is not None else PARALLEL_MIN_BYTES


def _fork_context() -> Any:
    from ddpdoctor.load.forked import fork_context

    return fork_context()


def _import_decoder() -> None:
    """What ``_decode_group`` imports, imported here."""
    import ddpdoctor.load.columns  # noqa: F401
    import ddpdoctor.load.consistency  # noqa: F401
    import ddpdoctor.load.decode  # noqa: F401
    import ddpdoctor.load.exported  # noqa: F401
    import ddpdoctor.load.frames  # noqa: F401
    import ddpdoctor.metrics.summary  # noqa: F401


def json_bytes(path: Path) -> int:
    """About how many bytes of JSON ``path`` holds: the gzip trailer's size field (mod 4 GiB), or the size."""
    try:
        with rundir.open_regular(path) as f:  # never waits on a FIFO
            if f.read(2) != b"\x1f\x8b":
                return os.fstat(f.fileno()).st_size
            f.seek(-4, 2)
            return int.from_bytes(f.read(4), "little")
    except OSError:
        return 0


def _decode_groups(
    groups: dict[str, list[Path]],
    workers: int | None,
    progress: Progress | None,
    plan: _Summarize | None = None,
    cluster: DaskCluster | None = None,
) -> list[tuple[str, list[RankTrace], list[str]]]:
    total = len(groups)
    if cluster is not None:
        from ddpdoctor.load.cluster import absolute

        def failed(key: str, exc: BaseException) -> tuple[str, list[RankTrace], list[str]]:
            files = ", ".join(shown(Path(p).name) for p in groups[key][:3])
            why = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            return key, [], [f"{files}: its task failed on {cluster.label} ({why}); the other ranks are analysed"]

        tasks = [
            (key, (key, absolute(paths), plan.for_files(paths) if plan else None)) for key, paths in groups.items()
        ]
        results = cluster.run_each(_decode_group, tasks, failed, progress)
        # the paths as this process was given them (relative ones stay relative): the same run as in-process
        given = {str(a): str(p) for paths in groups.values() for a, p in zip(absolute(paths), paths, strict=True)}
        for _, traces, errors in results:
            for rt in traces:
                rt.files = [given.get(str(f), f) for f in rt.files]
            for i, text in enumerate(errors):
                for a, p in given.items():
                    text = text.replace(a, p)
                errors[i] = text
        return results
    context = _fork_context() if total > 1 else None
    if workers is None and total > 1:
        size = sum(json_bytes(p) for paths in groups.values() for p in paths)
        workers = None if size >= _min_bytes(context) else 1
    if not workers:
        from ddpdoctor.load.forked import cores

        workers = cores()
    n = min(workers, total)
    results = []
    if n <= 1:
        for key, paths in groups.items():
            results.append(_decode_group(key, paths, plan))
            if progress:
                progress(len(results), total, key)
        return results
    from concurrent.futures import ProcessPoolExecutor

    if context is not None:
        _import_decoder()  # before the fork: the workers start with it
    with ProcessPoolExecutor(max_workers=n, mp_context=context) as pool:
        futures = [
            pool.submit(_decode_group, key, paths, plan.for_files(paths) if plan else None)
            for key, paths in groups.items()
        ]
        for fut in futures:
            results.append(fut.result())
            if progress:
                progress(len(results), total, results[-1][0])
    return results


def _assign_ranks(
    loaded: list[tuple[str, RankTrace]], groups: dict[str, list[Path]], skipped: list[str]
) -> tuple[list[RankTrace], str]:
    """Rank of each worker: distributedInfo.rank, else the rank in its file name, else its order. A second
    worker with the same rank recorded at the same time is skipped (and listed in ``skipped``); at another
    time it is a later span of that rank."""
    from ddpdoctor.load.consistency import duplicate_rank_reason, recorded_together

    info = [valid_rank((rt.distributed_info or {}).get("rank")) for _, rt in loaded]
    named = [rank_from_name(groups[key][0]) for key, _ in loaded]
    if all(r is not None for r in info):
        ranks, source = info, "distributedInfo"
    elif all(r is not None or n is not None for r, n in zip(info, named, strict=True)):
        ranks = [r if r is not None else n for r, n in zip(info, named, strict=True)]
        source = "filename"
    else:
        ranks, source = list(range(len(loaded))), "order"
    by_rank: dict[int, RankTrace] = {}
    for rank, (_, rt) in zip(ranks, loaded, strict=True):
        assert rank is not None
        rt.rank = int(rank)
        if rt.rank not in by_rank:
            by_rank[rt.rank] = rt
            continue
        kept = by_rank[rt.rank]
        if not recorded_together(kept, rt):
            by_rank[rt.rank] = _merge(kept, rt)
            continue
        # the same rank twice at the same time: keep the worker whose file name says so (not a stray copy)
        if rank_from_name(Path(rt.files[0])) == rt.rank != rank_from_name(Path(kept.files[0])):
            by_rank[rt.rank], rt = rt, kept
        skipped.append(duplicate_rank_reason(rt.rank, by_rank[rt.rank], rt))
    return [by_rank[r] for r in sorted(by_rank)], source


def _merge(a: RankTrace, b: RankTrace) -> RankTrace:
    """Two workers that report the same rank: their files are spans of one rank."""
    if a.tables is None or b.tables is None:
        raise _NeedTables
    from ddpdoctor.table import Table

    assert a.tables is not None and b.tables is not None
    spans = len(a.files)
    merged = {}
    for attr in TABLES:
        ta, tb = getattr(a.tables, attr), getattr(b.tables, attr)
        merged[attr] = Table.concat([ta, tb.assign(span=tb["span"] + spans)])
    merged["steps"] = merged["steps"].sort("ts_us")
    a.set_tables(EventTables(**merged))
    a.files += b.files
    a.windows += b.windows
    a.thread_names.update(b.thread_names)
    a.process_labels.update(b.process_labels)
    return a


def _make_run(
    root: Path,
    ranks: list[RankTrace],
    source: str,
    capture: dict[int, dict[str, Any]],
    manifest: dict[str, Any] | None,
    skipped: list[str],
) -> Run:
    world_sizes = [rt.distributed_info.get("world_size") for rt in ranks if rt.distributed_info]
    world_sizes += [c.get("world_size") for c in capture.values()]
    if isinstance(manifest, dict):
        world_sizes.append(manifest.get("world_size"))
    world_size = max([w for w in map(valid_world_size, world_sizes) if w is not None] or [len(ranks)])
    per_step, run_per_step = _optimizer_steps_per_step(ranks, capture)
    return Run(
        path=root,
        ranks=ranks,
        world_size=world_size,
        mode=_mode(ranks, capture, world_size),
        backend=_backend(ranks, capture),
        rank_source=source,
        capture=capture,
        manifest=manifest if isinstance(manifest, dict) else None,
        skipped=skipped,
        notes=_run_notes(ranks, world_size, source, per_step) if all(rt.has_trace or rt.facts for rt in ranks) else [],
        optimizer_steps_per_step=run_per_step,
    )


def _optimizer_steps_per_step(
    ranks: list[RankTrace], capture: dict[int, dict[str, Any]]
) -> tuple[dict[int, float], float | None]:
    """``consistency.optimizer_steps_per_step_by_rank``; a run whose every rank ``ddpdoctor trace`` recorded (read
    from its summaries, say) is one step an iteration without importing the trace checks."""
    captured = frozenset(capture)
    if ranks and all(rt.rank in captured for rt in ranks):
        return {}, 1.0
    from ddpdoctor.load.consistency import optimizer_steps_per_step_by_rank

    return optimizer_steps_per_step_by_rank(ranks, captured)


def _run_notes(ranks: list[RankTrace], world_size: int, source: str, per_step: dict[int, float]) -> list[str]:
    from ddpdoctor.load.consistency import run_notes

    return run_notes(ranks, world_size, source, per_step)


def _names(rt: RankTrace) -> list[str]:
    if rt.tables is None:
        return rt.facts.names if rt.facts is not None else []
    return list(rt.tables.ops["name"].categories)


def _mode(ranks: list[RankTrace], capture: dict[int, dict[str, Any]], world_size: int) -> str:
    names = {n for rt in ranks for n in _names(rt)}
    if any(c.get("dp") for c in capture.values()) or any(n.startswith("DataParallel.") for n in names):
        return "dp"
    if (
        world_size > 1
        or any(c.get("ddp") for c in capture.values())
        or any(n.startswith("DistributedDataParallel.") for n in names)
    ):
        return "ddp"
    return "single"


def _backend(ranks: list[RankTrace], capture: dict[int, dict[str, Any]]) -> str | None:
    for rt in ranks:
        backend = (rt.distributed_info or {}).get("backend")
        if isinstance(backend, str) and backend:
            return backend
    for c in capture.values():
        if isinstance(c.get("backend"), str):
            return c["backend"]
    names = {n for rt in ranks for n in _names(rt)}
    if any(n.startswith("nccl:") for n in names):
        return "nccl"
    if any(n.startswith("gloo:") for n in names):
        return "gloo"
    return None


def _summaries(root: Path, capture: dict[int, dict[str, Any]]) -> tuple[list[RankTrace] | None, list[str]]:
    """Ranks from ``ranks/rank<R>.summary.json`` (None unless every rank with a capture file or a trace file
    has one this version wrote),
    and notes on summary files that could not be used."""
    from ddpdoctor.load.kept import keeper

    found, notes = runfiles.read_summaries(root, __version__, keeper())
    if not found or (capture and set(capture) - set(found)) or _trace_ranks(root) - set(found):
        return None, notes  # a rank with a capture file or a trace but no summary: the traces are read
    return _summary_ranks(found, root, lambda r: f"{rundir.RANKS_DIR}/rank{r}.summary.json"), notes


def _summary_ranks(found: dict[int, dict[str, Any]], root: Path, where: Callable[[int], str]) -> list[RankTrace]:
    """Ranks that carry their summaries (no tables), their trace names in ``root``; ``where(rank)`` names the file
    in an error about its process groups."""
    shared: dict[Any, Any] = {}
    in_root = _in_folder(root)
    return [
        RankTrace(
            rank=r,
            files=[in_root(f) for f in s.get("files", [])],
            distributed_info=_read_groups(s.get("distributed_info"), where(r), shared),
            summary=s,
        )
        for r, s in sorted(found.items())
    ]


def window_from_summaries(run: Run, summaries: dict[int, dict[str, Any]]) -> Run:
    """``run``'s ranks as the summaries of one of its windows (each covering that window's steps only: a window
    ``trace --keep`` removed, summarised before its trace went: ``capture.window_summary``), with ``run``'s
    capture files and manifest."""
    ranks = _summary_ranks(summaries, run.path, lambda r: f"the window summary of rank {r}")
    return _make_run(run.path, ranks, "distributedInfo", run.capture, run.manifest, [])


def _in_folder(root: Path) -> Callable[[str], str]:
    """``f -> str(root / Path(f).name)``, without two Path objects a file where the name is a plain one (131,072
    ranks' files)."""
    text = str(root)
    prefix = "" if text == "." else text if text.endswith("/") else text + "/"

    def in_root(f: str) -> str:
        name = os.path.basename(f)
        return prefix + name if name not in ("", ".") else str(root / Path(f).name)

    return in_root


def _read_groups(info: dict[str, Any] | None, where: str, shared: dict[Any, Any]) -> dict[str, Any] | None:
    """``distributed_info`` with each process group's ranks as written back (``ranklist.read``): ranges become
    one ``RankRanges`` shared by the ranks that state the same ones (never a list of every rank per rank); a plain
    list (older summaries, torch's own form) is kept as it is. Ranges that are not ranges: one line, exit 2."""
    groups = (info or {}).get("pg_config")
    if isinstance(groups, dict):
        items = list(groups.items())
    elif isinstance(groups, list):
        items = list(enumerate(groups))
    else:
        return info
    if not any(
        isinstance(g, dict) and isinstance(g.get("ranks"), list) and g["ranks"] and isinstance(g["ranks"][0], list)
        for _, g in items
    ):
        return info
    out: Any = {} if isinstance(groups, dict) else []
    for key, g in items:
        ranks = g.get("ranks") if isinstance(g, dict) else None
        if isinstance(ranks, list) and ranks and isinstance(ranks[0], list):
            text = repr(ranks)
            if text not in shared:
                try:
                    shared[text] = ranklist.read(ranks, f"{where}: distributed_info.pg_config[{key!r}].ranks")
                except ranklist.BadRankList as e:
                    raise TraceError(str(e)) from None
            g = {**g, "ranks": shared[text]}
        if isinstance(out, dict):
            out[key] = g
        else:
            out.append(g)
    return {**info, "pg_config": out}  # type: ignore[dict-item]
