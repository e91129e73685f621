"""The report as plain data: the ``--format json`` document, which the other renderers read too.

Shape (schema_version 1; keys are relied on by users, add but never rename)::

    {"schema_version": 1,
     "run": {"path", "mode", "world_size", "backend", "steps_analyzed",
             "skipped": ["<file>: <why it could not be used>", ...],
             "notes": ["<what else to know about the input: missing ranks, no ProfilerStep, ...>", ...],
             "trials": [{"session", "settings", "verdict", "step_ratio", "gain_ms", "gain_interval_ms",
                         "went_away", "appeared", "estimates", "error"}],   # only when `ddpdoctor try` ran
             "health": {"kind": "crash" | "startup" | "hang" | "desync" | "died" | "ok", "source": "dumps" |
                        "run record", "summary", "detail", "advice", "culprits": [rank, ...], "waiting": [...],
                        "collective": {"pg", "seq_id", "op", "backend", "text", "issued_at"} | null,
                        "mismatches": [{"pg", "seq_id", "kind", "by_rank": {"0": "all_reduce [1] Float"}}],
                        "ranks": [{"rank", "state", "status", "steps", "steps_at_least"?, "phase", "where",
                                   "collective", "error"}],
                        "evidence": [...], "notes": [...]}},   # only for a run that failed, hung or dumped
             "fsdp_units": [{"unit", "ranks", "param_bytes", "param_share", "allgather_calls", "allgather_ms",
                             "allgather_exposed_ms", "reduce_calls", "reduce_ms", "reduce_exposed_ms",
                             "worst_rank"}],   # only for an FSDP2 run (report/fsdp_units.py)
     "ranks": [{"rank", "step_ms": {"median", "p90"}, "comm_ms", "exposed_comm_ms", "collective_wait_ms",
                "overlap_ratio", "ddp_comm_hook",
                "dataloader_ms", "gil_contention", "forward_ms", "backward_ms", "optimizer_ms", "other_ms",
                "devices": [{"device", "peak_allocated_bytes", "peak_reserved_bytes", "capacity_bytes"}]}],
     "findings": [{"id", "name", "severity", "ranks", "message", "recommendation", "evidence",
                   "estimated_gain_ms"}],
     "not_evaluated": [{"name", "reason"}],
     "passed": [rule names evaluated without a finding],
     "passed_reasons": [{"name", "reason"}],   # why each passed: the values it tested against its thresholds
     "overrides": [{"rule", "param", "value", "default", "source"}]}   # thresholds a config file set

``run.ddp_comm_hook``: the DDP communication hook ("none (DDP's default all-reduce)" when DDP was captured
without one, null when no DDP module was captured); ``ranks[].ddp_comm_hook`` each rank's,
``ranks[].collective_wait_ms`` its time per step waiting in collectives for late peers.

Times are ms per step, ratios 0-1, sizes bytes; a value that was not measured is null.
"""

from __future__ import annotations

import heapq
from typing import Any, NamedTuple

from ddpdoctor.diagnosis.findings import Diagnosis
from ddpdoctor.metrics import catalog
from ddpdoctor.report import fmt
from ddpdoctor.values import clean_value, jsonable

SCHEMA_VERSION = 1
RANK_KEYS = catalog.group("report_rank")
BREAKDOWN_KEYS = tuple(k for k in catalog.group("breakdown") if k not in RANK_KEYS)  # forward .. other
DEVICE_KEYS = catalog.group("device_memory")


def frame(metrics: Any, name: str) -> Any:
    """``metrics.<name>`` (a ``ddpdoctor.table.Table``, or a DataFrame a caller built), or None when absent or
    empty."""
    df = getattr(metrics, name, None)
    if df is None or not hasattr(df, "columns") or len(df) == 0:
        return None
    return df


def frame_records(metrics: Any, name: str) -> list[dict[str, Any]]:
    """The rows of ``metrics.<name>`` as dicts (none when absent or empty)."""
    from ddpdoctor.metrics.result import records

    df = frame(metrics, name)
    return [] if df is None else records(df)


def _devices_by_rank(metrics: Any) -> dict[Any, list[dict[str, Any]]] | None:
    """rank -> its rows of ``metrics.devices`` in the report's shape (None without a devices table with ranks)."""
    df = frame(metrics, "devices")
    if df is None or "rank" not in df.columns:
        return None
    out: dict[Any, list[dict[str, Any]]] = {}
    for r in frame_records(metrics, "devices"):
        entry = {"device": jsonable(r.get("device")), **{k: jsonable(r.get(k)) for k in DEVICE_KEYS}}
        out.setdefault(clean_value(r.get("rank")), []).append(entry)
    return out


def _devices(by_rank: dict[Any, list[dict[str, Any]]] | None, rank: int, row: dict[str, Any]) -> list[dict[str, Any]]:
    if by_rank is not None:
        return by_rank.get(rank, [])
    if any(row.get(k) is not None for k in DEVICE_KEYS):
        return [{"device": jsonable(row.get("device")), **{k: jsonable(row.get(k)) for k in DEVICE_KEYS}}]
    return []


def build(result: Diagnosis) -> dict[str, Any]:
    """The report document of ``result`` (see the module docstring)."""
    metrics = result.metrics
    run = dict(getattr(metrics, "run", {}) or {})
    ranks = []
    devices = _devices_by_rank(metrics)
    for i, row in enumerate(getattr(metrics, "ranks", []) or []):  # read only: no copy of each rank's row
        rank = int(clean_value(row.get("rank")) if row.get("rank") is not None else i)
        entry: dict[str, Any] = {
            "rank": rank,
            "step_ms": {
                "median": jsonable(row.get("step_ms_median")),
                "p90": jsonable(row.get("step_ms_p90")),
            },
        }
        entry.update({k: _json_value(row.get(k)) for k in _ENTRY_KEYS})
        entry["devices"] = _devices(devices, rank, row)
        entry["_ddp_captured"] = any(row.get(k) is not None for k in _DDP_CAPTURED)
        ranks.append(entry)
    hook = comm_hook(ranks)
    for entry in ranks:
        del entry["_ddp_captured"]
    return {
        "schema_version": SCHEMA_VERSION,
        "run": {
            "path": None if run.get("path") is None else str(run["path"]),
            "mode": jsonable(run.get("mode")),
            "parallelism": jsonable(run.get("parallelism")),
            "parallelism_evidence": jsonable(run.get("parallelism_evidence")),
            "world_size": jsonable(run.get("world_size")),
            "backend": jsonable(run.get("backend")),
            "steps_analyzed": jsonable(run.get("steps_analyzed")),
            "skipped": _lines(run.get("skipped")),
            # the host's load in every format (metrics/hostload.py): said whether the host was busy or not
            "notes": _lines(run.get("notes")) + _lines([run.get("host_load_summary")]),
            "ddp_comm_hook": hook,
            **({"trials": jsonable(run["trials"])} if run.get("trials") else {}),
            **({"health": jsonable(run["health"])} if isinstance(run.get("health"), dict) else {}),
            **({"fsdp_units": jsonable(run["fsdp_units"])} if run.get("fsdp_units") else {}),
            **({"over_time": jsonable(run["over_time"])} if run.get("over_time") else {}),  # metrics/overtime.py
        },
        "ranks": ranks,
        "findings": [jsonable(f.to_json()) for f in result.findings],
        "not_evaluated": [n.to_json() for n in result.not_evaluated],
        "passed": list(result.passed),
        "passed_reasons": _passed_reasons(result),
        "overrides": [jsonable(o.to_json()) for o in getattr(result, "overrides", ())],
    }


_ENTRY_KEYS = (*RANK_KEYS, *BREAKDOWN_KEYS)
# the DDP configuration a rank reports when its DDP module was captured (then no comm hook means DDP's own)
_DDP_CAPTURED = tuple(k for k in catalog.group("ddp_config") if k != "ddp_comm_hook")
NO_COMM_HOOK = "none (DDP's default all-reduce)"


def _passed_reasons(result: Diagnosis) -> list[dict[str, str]]:
    """{"name", "reason"} of every passed rule, in ``passed`` order: why it did not fire."""
    said = {p.name: p.reason for p in getattr(result, "passed_reasons", ())}
    return [{"name": name, "reason": said.get(name, "")} for name in result.passed]


def comm_hook(ranks: list[dict[str, Any]]) -> str | None:
    """The DDP communication hook of the run: its name (with the ranks where they differ), ``NO_COMM_HOOK`` when
    DDP was captured without one, None when no rank's DDP module was captured."""
    hooks: dict[str, list[int]] = {}
    for r in ranks:
        hook = r.get("ddp_comm_hook")
        if isinstance(hook, str) and hook:
            hooks.setdefault(hook, []).append(r["rank"])
        elif r.get("_ddp_captured"):
            hooks.setdefault(NO_COMM_HOOK, []).append(r["rank"])
    if not hooks:
        return None
    if len(hooks) == 1:
        return next(iter(hooks))
    from ddpdoctor.diagnosis.findings import format_ranks

    return "; ".join(f"{hook} on {format_ranks(on)}" for hook, on in hooks.items())


_PLAIN = frozenset((type(None), bool, int, str))


def _json_value(value: Any) -> Any:
    """``jsonable(value)``, without a call for the plain values and finite floats that nearly all are."""
    t = type(value)
    return value if t in _PLAIN or (t is float and value - value == 0.0) else jsonable(value)


def _lines(value: Any) -> list[str]:
    """A list of one-line strings (skipped files, notes); anything else is no lines."""
    if not isinstance(value, (list, tuple)):
        return []
    return [str(v) for v in value if v is not None]


def grouped_not_evaluated(result: Diagnosis) -> dict[str, list[str]]:
    """reason -> rule names, in order of first appearance (so "applies to ddp runs" is said once)."""
    groups: dict[str, list[str]] = {}
    for item in result.not_evaluated:
        groups.setdefault(item.reason, []).append(item.name)
    return groups


# The per-rank step breakdown table every format shows: (long header, short header) per column.
RANK_TABLE_COLUMNS = (
    ("rank", "rank"),
    ("step p50", "p50"),
    ("step p90", "p90"),
    ("data", "data"),
    ("fwd", "fwd"),
    ("bwd", "bwd"),
    ("optim", "opt"),
    ("comm", "comm"),
    ("exposed", "exposed"),
    ("wait", "wait"),
    ("overlap", "overlap"),
    ("other", "other"),
    ("GIL", "GIL"),
)
# the table's ms columns: the breakdown up to the optimizer, then all communication, its exposed part and the time
# waiting in collectives for late peers
# (the report_rank group's first three: comm_ms, exposed_comm_ms, collective_wait_ms)
_BREAKDOWN_MS = catalog.group("breakdown")[:4] + RANK_KEYS[: RANK_KEYS.index("overlap_ratio")]


# A report for people lists every rank up to this many; of a larger job, the ranks worth reading (listed_ranks).
# The JSON report keeps every rank.
MAX_LISTED_RANKS = 32
_SLOWEST, _FASTEST, _MOST_MEMORY, _NAMED = 8, 3, 3, 8


Listed = tuple[list[dict[str, Any]], str | None]  # listed_ranks: the ranks a table shows, and which they are


def listed_ranks(doc: dict[str, Any]) -> Listed:
    """The ``doc["ranks"]`` entries the tables of the text, Markdown, HTML and TensorBoard reports show, and a note
    saying which (None when all). Up to 32 ranks: all. Beyond: the lowest rank, the 8 slowest and 3 fastest by
    median step time, the 3 with the most device memory reserved, and the ranks a finding names where it names 8
    or fewer, in rank order: 16,384 rows say less than these and take minutes to scroll. JSON keeps every rank."""
    ranks = doc["ranks"]
    if len(ranks) <= MAX_LISTED_RANKS:
        return ranks, None
    steps = {r["rank"]: clean_value((r.get("step_ms") or {}).get("median")) for r in ranks}
    peaks = {r["rank"]: _peak(r) for r in ranks if r.get("devices")}
    timed = [rank for rank, v in steps.items() if v is not None]
    held = [rank for rank, v in peaks.items() if v is not None]
    by_step, by_peak = (lambda rank: (steps[rank], rank)), (lambda rank: (-peaks[rank], rank))
    keep = {
        ranks[0]["rank"],
        *heapq.nlargest(_SLOWEST, timed, key=by_step),
        *heapq.nsmallest(_FASTEST, timed, key=by_step),
        *heapq.nsmallest(_MOST_MEMORY, held, key=by_peak),
    }
    for f in doc.get("findings") or []:
        if len(f["ranks"]) <= _NAMED:
            keep.update(f["ranks"])
    shown = [r for r in ranks if r["rank"] in keep]
    which = ["the lowest rank"]
    if timed:
        which.append(f"the {min(_SLOWEST, len(timed))} slowest and {min(_FASTEST, len(timed))} fastest by median step")
    if held:
        which.append(f"the {min(_MOST_MEMORY, len(held))} with the most device memory")
    which.append("the ranks findings name")
    return shown, f"{len(shown)} of {len(ranks):,} ranks: {', '.join(which)}; every rank is in --format json"


def _peak(r: dict[str, Any]) -> Any:
    """A rank's most device memory: the largest peak reserved (allocated where reserved is not known)."""
    peaks = [
        clean_value(d.get("peak_reserved_bytes")) or clean_value(d.get("peak_allocated_bytes"))
        for d in r.get("devices") or []
    ]
    return max((p for p in peaks if p is not None), default=None)


def rank_table_rows(doc: dict[str, Any], ranks: list[dict[str, Any]] | None = None) -> list[list[str]]:
    """The per-rank step breakdown as formatted cells, in RANK_TABLE_COLUMNS order (ms per step, ratios in %), of
    ``ranks`` (default: every rank of ``doc``)."""
    return [
        [str(r["rank"]), fmt.ms((r.get("step_ms") or {}).get("median")), fmt.ms((r.get("step_ms") or {}).get("p90"))]
        + [fmt.ms(r.get(k)) for k in _BREAKDOWN_MS]
        + [fmt.ratio_pct(r.get("overlap_ratio")), fmt.ms(r.get("other_ms")), fmt.ratio_pct(r.get("gil_contention"))]
        for r in (doc["ranks"] if ranks is None else ranks)
    ]


# What a run without any timing per rank (no trace: it hung or failed before its profiled window) shows instead
# of a table of dashes: each rank's state as the run's files and dumps say it.
RANK_STATUS_COLUMNS = ("rank", "state", "steps", "last phase", "exit")
RANK_STATUS_TITLE = "Per rank (no trace)"


def rank_status_rows(doc: dict[str, Any]) -> list[list[str]]:
    """One row per rank of a failed or hung run (``run.health.ranks``): state, steps reached, last phase, exit."""
    health = (doc.get("run") or {}).get("health")
    entries = health.get("ranks") if isinstance(health, dict) else None

    def cell(value: Any) -> str:
        return "—" if value is None or value == "" else fmt.plain(str(value).replace("_", " "))

    return [
        [str(r.get("rank")), cell(r.get("state")), cell(r.get("steps")), cell(r.get("phase")), cell(r.get("exit_code"))]
        for r in entries or []
        if isinstance(r, dict)
    ]


class RankTable(NamedTuple):
    kind: str  # "breakdown" | "status"
    columns: list[tuple[str, str]]  # (long, short) headers
    rows: list[list[str]]
    note: str | None = None  # which ranks the rows are, where not all of them (listed_ranks)


def rank_table(doc: dict[str, Any], listed: Listed | None = None) -> RankTable | None:
    """The per-rank table every format shows. The step breakdown where a rank has any timing; else each rank's
    state (a run without trace); else None (no table: never a table of dashes). Of more than 32 ranks, the rows
    of the ranks worth reading, with a note saying which (``listed``: ``listed_ranks(doc)`` where the caller has
    it; ``_listed_status``)."""
    shown, note = listed or listed_ranks(doc)
    if any(_has_timing(doc, r) for r in doc["ranks"]):
        return RankTable("breakdown", list(RANK_TABLE_COLUMNS), rank_table_rows(doc, shown), note)
    status, note = _listed_status(rank_status_rows(doc))
    if status:
        # a column nothing is known of (no dumps: no phase) is left out
        keep = [i for i in range(len(RANK_STATUS_COLUMNS)) if i < 2 or any(row[i] != "—" for row in status)]
        columns = [(RANK_STATUS_COLUMNS[i],) * 2 for i in keep]
        return RankTable("status", columns, [[row[i] for i in keep] for row in status], note)
    return None


def _has_timing(doc: dict[str, Any], r: dict[str, Any]) -> bool:
    """Whether a rank's row of the breakdown table has a value (not only dashes)."""
    return any(cell != fmt.ms(None) for cell in rank_table_rows(doc, [r])[0][1:])


def _listed_status(rows: list[list[str]]) -> tuple[list[list[str]], str | None]:
    """Of more than 32 ranks' states: the ranks whose state is not the most common one (up to 24; in a hang,
    the few that are not waiting) and the first 4 of the rest, with a note saying how many are not shown."""
    if len(rows) <= MAX_LISTED_RANKS:
        return rows, None
    from collections import Counter

    common = Counter(row[1] for row in rows).most_common(1)[0][0]
    odd = [row for row in rows if row[1] != common][: MAX_LISTED_RANKS - 8]
    usual = [row for row in rows if row[1] == common][:4]
    keep = {id(row) for row in odd + usual}
    shown = [row for row in rows if id(row) in keep]
    return shown, (
        f"{len(shown)} of {len(rows):,} ranks: those not {common} (up to {MAX_LISTED_RANKS - 8}) and the first "
        f"{len(usual)} {common}; all in --format json"
    )


def status_justify(columns: list[tuple[str, str]]) -> str:
    """ "r"/"l" per column of the status table: numbers right, words left."""
    return "".join("r" if long in ("rank", "steps", "exit") else "l" for long, _ in columns)


def override_lines(doc: dict[str, Any]) -> list[str]:
    """The thresholds a config file changed, one line each: ``rank-straggler.min_wait_ms = 100 (default 2) from
    pyproject.toml``."""
    from ddpdoctor.diagnosis.findings import Override

    return [
        Override(o["rule"], o["param"], o["value"], o["default"], str(o["source"])).text()
        for o in doc.get("overrides") or []
    ]


def trial_lines(doc: dict[str, Any]) -> list[str]:
    """One line per trial `ddpdoctor try` ran of this run (the text and Markdown reports show them)."""
    out = []
    for t in doc["run"].get("trials") or []:
        if t.get("error"):
            out.append(f"{t['settings']}: failed: {t['error']}")
            continue
        gain = t.get("gain_ms")
        interval = t.get("gain_interval_ms")
        parts = [f"{t['settings']}: {t['verdict']}"]
        if t.get("step_ratio") is not None:
            parts.append(f"median step B/A {t['step_ratio']:.2f}")
        if gain is not None:
            shown = f"measured gain {gain:+.1f} ms/step"
            if interval and None not in interval:
                shown += f" (interval {interval[0]:+.1f} to {interval[1]:+.1f})"
            parts.append(shown)
        for e in t.get("estimates") or []:
            if e.get("estimated_gain_ms") is not None:
                parts.append(f"{e['rule']} estimated {e['estimated_gain_ms']:.1f} ms")
        if t.get("went_away"):
            parts.append("gone: " + ", ".join(t["went_away"]))
        if t.get("appeared"):
            parts.append("new: " + ", ".join(t["appeared"]))
        out.append("; ".join(parts))
    return out


_STATE_WORDS = {
    "crashed": "crashed (the cause)",
    "failed_at_startup": "failed before its first step (the cause)",
    "consequence": "a consequence (failed or stopped because of a peer)",
    "in_collective": "waiting in a collective",
    "outside": "outside any collective",
    "exited": "had returned (finished its script)",
    "no_dump": "wrote no dump",
    "died": "died (killed)",
    "hung": "hung",
}


def health_title(doc: dict[str, Any]) -> str:
    """The heading of ``health_lines``: how a failed job ended, or where the ranks of a healthy one were when they
    dumped (an on-demand dump)."""
    health = doc["run"].get("health")
    kind = health.get("kind") if isinstance(health, dict) else None
    return "Where the ranks were at their dump" if kind == "ok" else "How the job ended"


def health_lines(doc: dict[str, Any]) -> list[str]:
    """How the job ended, one line each (the text, Markdown and HTML reports show them after the findings): the
    collective the others wait in, each rank's state and where it was, the evidence, and what could not be
    decided. None for a run that ended well."""
    health = doc["run"].get("health")
    if not isinstance(health, dict):
        return []
    out = []
    coll = health.get("collective")
    if isinstance(coll, dict) and coll.get("text"):
        issued = f", issued at {coll['issued_at']}" if coll.get("issued_at") else ""
        waiting = health.get("waiting") or []
        who = ("rank " if len(waiting) == 1 else "ranks ") + ", ".join(map(str, waiting)) if waiting else "the others"
        out.append(f"{who} {'waits' if len(waiting) == 1 else 'wait'} in {coll['text']}{issued}")
    for m in health.get("mismatches") or []:
        sides = ", ".join(f"rank {r}: {what}" for r, what in (m.get("by_rank") or {}).items())
        out.append(f"{m.get('kind')} mismatch at #{m.get('seq_id')} ({m.get('pg')}): {sides}")
    culprits = set(health.get("culprits") or [])
    for r in health.get("ranks") or []:
        state = str(r.get("state") or "unknown")
        words = _STATE_WORDS.get(state, state)
        if r.get("rank") in culprits and "cause" not in words:
            words = words[:-1] + "; the cause)" if words.endswith(")") else words + " (the cause)"
        where = []
        if r.get("steps") is not None and state != "failed_at_startup":
            n = r["steps"]
            phase = f", in {r['phase']}" if r.get("phase") and r.get("phase") != "outside" else ""
            where.append(f"after {n} step{'' if n == 1 else 's'}{phase}")
        elif state != "failed_at_startup" and r.get("steps_at_least") is not None:  # a rank file never finished
            n = r["steps_at_least"]
            where.append("step unknown" + (f" (its rank file last recorded {n})" if n else ""))
        if r.get("collective"):
            where.append(f"in {r['collective']}")
        if r.get("where"):
            where.append(f"at {r['where']}")
        error = f": {r['error']}" if r.get("error") and state not in ("ok", "in_collective", "outside") else ""
        out.append(f"rank {r.get('rank')}: {words}" + (", " + ", ".join(where) if where else "") + error)
    out += [f"evidence: {line}" for line in health.get("evidence") or []]
    out += [f"note: {line}" for line in health.get("notes") or []]
    return out
