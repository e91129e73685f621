"""Assemble the decoded columns of one rank's files (spans) into the ``RankTrace`` tables of ``model``."""

from __future__ import annotations

import re
from itertools import compress

import numpy as np

from ddpdoctor.load.categories import DEVICE_CATS
from ddpdoctor.load.columns import COMM_COLUMNS, FileColumns, RankTables
from ddpdoctor.load.model import EventTables, RankTrace
from ddpdoctor.metrics.intervals import locate
from ddpdoctor.table import Codes, Table

_STEP = re.compile(r"^ProfilerStep\s*#\s*(\d{1,18})$")  # a longer number is no step a profiler counted
# the range torch opens around every torch.optim optimizer's step(): Optimizer.step#<class>.step
OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#(.+)\.step$")
_COMM_ARG_COLUMNS = COMM_COLUMNS[1:]  # the collective call's arguments (not its row)


def build_rank_trace(rank: int, files: list[FileColumns], tables: RankTables) -> RankTrace:
    """One ``RankTrace`` from the columns of its files, spans ordered by start time."""
    files = sorted(files, key=_file_start)
    names = _table(tables.names.index)
    cats = _table(tables.cats.index)

    x, comm = _concat_x(files)
    cat_codes = x["cat"]
    device_cat = np.array([c in DEVICE_CATS for c in cats] + [False], dtype=bool)
    on_device = device_cat[cat_codes] if len(cat_codes) else np.zeros(0, dtype=bool)

    # each column split into the ops' and the kernels' rows and dropped (peak: the columns and one more)
    op_rows, kernel_rows = np.flatnonzero(~on_device), np.flatnonzero(on_device)
    del cat_codes
    parts: dict[str, tuple[np.ndarray | None, np.ndarray]] = {}
    for key in ("name", "cat", "ts", "dur", "pid", "tid", "external_id", "correlation", "device", "stream", "span"):
        col = x.pop(key)
        parts[key] = (None if key in ("device", "stream") else col[op_rows], col[kernel_rows])
        del col

    def table(parts: dict[str, tuple[np.ndarray | None, np.ndarray]], side: int, extra: tuple[str, ...]) -> Table:
        ts, dur = parts["ts"][side], parts["dur"][side]
        cols: dict[str, np.ndarray | Codes] = {
            "name": Codes.shared(parts["name"][side], names),
            "cat": Codes.shared(parts["cat"][side], cats),
            "ts_us": ts,
            "dur_us": dur,
            "end_us": ts + dur,
            "pid": parts["pid"][side],
            "tid": parts["tid"][side],
        }
        for key in extra:
            cols[key] = parts[key][side]
        cols["span"] = parts["span"][side]
        return Table(cols)

    ops = table(parts, 0, ("external_id", "correlation"))
    kernels = table(parts, 1, ("device", "stream", "correlation", "external_id"))
    del parts
    memory = _memory_table(files)

    row_to_op = np.cumsum(~on_device) - 1
    steps = _steps(ops)
    comm_ops = _comm_ops(ops, comm, row_to_op, on_device)

    first = files[0] if files else None
    thread_names: dict[tuple[int, int], str] = {}
    process_labels: dict[int, str] = {}
    for f in files:
        thread_names.update(f.thread_names)
        process_labels.update(f.process_labels)
    for text, code in tables.strings.items():
        thread_names.setdefault((-1, code), text)
    return RankTrace(
        rank=rank,
        files=[f.path for f in files],
        distributed_info=next((f.distributed_info for f in files if f.distributed_info), None),
        device_properties=first.device_properties if first else [],
        tables=EventTables(ops=ops, kernels=kernels, memory=memory, steps=steps, comm_ops=comm_ops),
        thread_names=thread_names,
        process_labels=process_labels,
        windows=[f.window for f in files if f.window is not None],
        base_time_ns=first.base_time_ns if first else None,
    )


def _table(index: dict[str, int]) -> list[str]:
    out = [""] * len(index)
    for value, code in index.items():
        out[code] = value
    return out


def _file_start(f: FileColumns) -> float:
    if f.window is not None:
        return f.window[0]
    ts = f.x.get("ts")
    return float(min(a.min() for a in ts if len(a))) if ts and any(len(a) for a in ts) else 0.0


def _concat_x(files: list[FileColumns]) -> tuple[dict[str, np.ndarray], dict[str, list]]:
    dtypes = {
        "name": np.int32,
        "cat": np.int32,
        "ts": np.float64,
        "dur": np.float64,
        "pid": np.int64,
        "tid": np.int64,
        "external_id": np.int64,
        "correlation": np.int64,
        "device": np.int64,
        "stream": np.int64,
    }
    x: dict[str, np.ndarray] = {}
    for key, dtype in dtypes.items():
        parts = [f.column("x", key, dtype) for f in files]  # each a new array: one file's is used as it is
        x[key] = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
        for f in files:
            f.x.pop(key, None)  # free as we go
    x["span"] = (
        np.concatenate([np.full(f.n_x, i, dtype=np.int32) for i, f in enumerate(files)])
        if files
        else np.zeros(0, dtype=np.int32)
    )
    comm: dict[str, list] = {key: [] for key in COMM_COLUMNS}  # the files' collective calls, rows offset
    offset = 0
    for f in files:
        if f.comm:
            comm["row"] += [row + offset for row in f.comm["row"]] if offset else f.comm["row"]
            for key in _COMM_ARG_COLUMNS:
                comm[key] += f.comm[key]
        offset += f.n_x
    return x, comm


def _memory_table(files: list[FileColumns]) -> Table:
    cols: dict[str, np.ndarray] = {}
    for key, dtype in (
        ("ts", np.float64),
        ("pid", np.int64),
        ("tid", np.int64),
        ("bytes", np.int64),
        ("total_allocated", np.float64),
        ("total_reserved", np.float64),
        ("device_type", np.int64),
        ("device_id", np.int64),
    ):
        parts = [f.column("mem", key, dtype) for f in files]
        cols[key] = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    n = len(cols["ts"])
    span = (
        np.concatenate(
            [np.full(len(f.column("mem", "ts", np.float64)), i, dtype=np.int32) for i, f in enumerate(files)]
        )
        if files
        else np.zeros(0, dtype=np.int32)
    )
    return Table(
        {
            "name": Codes(np.zeros(n, dtype=np.int32), ["[memory]"]),
            "cat": Codes(np.zeros(n, dtype=np.int32), ["cpu_instant_event"]),
            "ts_us": cols["ts"],
            "dur_us": np.zeros(n),
            "end_us": cols["ts"].copy(),
            "pid": cols["pid"],
            "tid": cols["tid"],
            "bytes": cols["bytes"],
            "total_allocated": cols["total_allocated"],
            "total_reserved": cols["total_reserved"],
            "device_type": cols["device_type"],
            "device_id": cols["device_id"],
            "span": span,
        }
    )


def _steps(ops: Table) -> Table:
    """``ProfilerStep#N`` ranges recorded on the CPU (not their GPU-side copies), sorted by start; without any
    (or with only ``ProfilerStep#0``), the steps its optimizer's steps delimit (``_optimizer_steps``)."""
    name = ops["name"]
    step_names = {n: int(m.group(1)) for n in name.categories if (m := _STEP.match(n))}
    if not step_names:
        return _optimizer_steps(ops)
    mask = name.isin(step_names) & ops["cat"].isin(["user_annotation", "cpu_op"])
    steps = ops[mask]
    steps["step"] = steps["name"].map(step_names, default=0, dtype=np.int64)
    if len(steps) and not steps["step"].any():  # only ProfilerStep#0: a scheduled profiler never stepped
        told = _optimizer_steps(ops)
        if len(told):
            return told
    return steps.sort("ts_us")


def _optimizer_steps(ops: Table) -> Table:
    """A trace whose profiler was never stepped (one ``with torch.profiler.profile():`` around the training loop,
    then ``export_chrome_trace``) has no ``ProfilerStep#N`` range (with a ``schedule``, only ``ProfilerStep#0``
    over the whole recording, which does not count): its steps are told by the optimizer's, from
    the end of one ``Optimizer.step#<class>.step`` range to the end of the next (as ``prof.step()`` right after
    ``optimizer.step()`` would have cut them), numbered from 1 in the order of the rank's spans; the rows are
    those ranges with their start moved back to the previous one's end. Only the training thread's (the thread
    with the most), only the outermost (an optimizer wrapping another: ZeroRedundancyOptimizer, a scaler), and of
    one optimizer class, the first to step (a second optimizer stepping in the same iteration, a sparse one beside
    a dense one, stays inside the steps). A span with fewer than two holds no step (none at all: the window is one
    step). Where a GradScaler skipped optimizer steps (``_iteration_marks``), from the end of one of its scale
    updates to the end of the next."""
    empty = ops[0:0].assign(step=np.zeros(0, dtype=np.int64))
    found = _iteration_marks(ops)
    if len(found) < 2:
        return empty
    span, end = found["span"], found["end_us"]
    follows = np.zeros(len(found), dtype=bool)  # a step: the previous optimizer step ended in the same span
    follows[1:] = span[1:] == span[:-1]
    if not follows.any():
        return empty
    starts = np.concatenate([[np.nan], end[:-1]])[follows]
    steps = found[follows]
    steps["ts_us"] = starts
    steps["dur_us"] = steps["end_us"] - starts
    steps["step"] = np.arange(1, len(steps) + 1, dtype=np.int64)
    return steps


_SCALER_UPDATE = "aten::_amp_update_scale_"  # GradScaler.update(): once an iteration, its step skipped or not


def _iteration_marks(ops: Table) -> Table:
    """The ranges that end each iteration of the training loop, sorted by span and start: its optimizer's steps
    (``_training_optimizer_steps``), or where a GradScaler updated its scale more often than they ran (it skips
    ``optimizer.step()`` in an iteration whose gradients overflowed, the first few of an fp16 job often do, but
    updates in every one) the scale updates on the optimizer's thread (on the thread with the most, without an
    optimizer range)."""
    found = _training_optimizer_steps(ops)
    updates = ops[ops["name"].isin([_SCALER_UPDATE])]
    if not len(updates):
        return found
    if len(found):
        updates = updates[np.isin(updates["tid"], found["tid"])]
    else:
        tids, counts = np.unique(updates["tid"], return_counts=True)
        updates = updates[updates["tid"] == tids[int(np.argmax(counts))]]
    return updates.sort("span", "ts_us") if len(updates) > len(found) else found


def _training_optimizer_steps(ops: Table) -> Table:
    """The ``Optimizer.step#<class>.step`` ranges that mark the training loop's iterations, sorted by span and
    start: per span, the training thread's (the thread with the most), only the outermost (an optimizer wrapping
    another), of the first optimizer class to step."""
    name = ops["name"]
    names = [n for n in name.categories if OPTIMIZER_STEP.match(n)]
    found = ops[name.isin(names) & ops["cat"].isin(["user_annotation", "cpu_op"])] if names else ops[0:0]
    if not len(found):
        return found
    found = found.sort("span", "ts_us")
    keep = np.zeros(len(found), dtype=bool)
    for span in np.unique(found["span"]).tolist():  # per span (a restarted process has threads of its own)
        rows = np.flatnonzero(found["span"] == span)
        tids, counts = np.unique(found["tid"][rows], return_counts=True)
        rows = rows[found["tid"][rows] == tids[int(np.argmax(counts))]]
        reach = np.maximum.accumulate(found["end_us"][rows])
        outer = np.ones(len(rows), dtype=bool)  # not inside an earlier range: the outermost optimizer's
        outer[1:] = found["ts_us"][rows][1:] >= reach[:-1]
        keep[rows[outer]] = True
    found = found[keep]
    return found[found["name"].isin([str(found["name"].at(0))])]


def repeated_steps(steps: Table) -> tuple[int, int] | None:
    """``(lowest, highest)`` of the ProfilerStep#N numbers that more than one span of the rank recorded (each
    profiler counts its steps from 0: a second profiler, a restarted job, two runs' traces in one folder), or
    None. The windows of one profiler (a schedule with ``repeat``) go on counting, and never repeat a number."""
    if not len(steps) or steps_told_by_optimizer(steps):
        return None
    spans: dict[int, set[int]] = {}
    for step, span in zip(steps["step"].tolist(), steps["span"].tolist(), strict=True):
        spans.setdefault(step, set()).add(span)
    again = [step for step, seen in spans.items() if len(seen) > 1]
    return (min(again), max(again)) if again else None


def optimizer_steps_per_step(ops: Table, steps: Table) -> float | None:
    """How many optimizer steps (``_training_optimizer_steps``) end in a ProfilerStep#N range, on average over
    the rank's steps: 1 where ``prof.step()`` follows each ``optimizer.step()``; 2 where it is called every second
    iteration (or two optimizers of one class step in each); 0.5 where it is called twice an iteration (or once per
    micro-batch of two); the iterations a GradScaler skipped count (``_iteration_marks``). None where it does not
    apply: no steps, steps told by the optimizer itself, or no optimizer step in any of them (a job without a
    torch.optim optimizer)."""
    if not len(steps) or steps_told_by_optimizer(steps):
        return None
    marks = _iteration_marks(ops)
    if not len(marks):
        return None
    inside = _ends_inside(marks, steps)
    return inside / len(steps) if inside else None


def _ends_inside(ranges: Table, steps: Table) -> int:
    """How many of ``ranges`` end inside a step of their own span."""
    inside = 0
    for span in np.unique(steps["span"]).tolist():
        mine = steps[steps["span"] == span].sort("ts_us")
        inside += int(np.sum(locate(mine["ts_us"], mine["end_us"], ranges["end_us"][ranges["span"] == span]) >= 0))
    return inside


def steps_told_by_optimizer(steps: Table) -> bool:
    """Whether ``steps`` (a rank's steps table) are ``_optimizer_steps``'s, not ProfilerStep#N ranges."""
    if not len(steps):
        return False
    first = str(steps["name"].at(0))
    return first == _SCALER_UPDATE or bool(OPTIMIZER_STEP.match(first))


_OBJECT_ARGS = ("dtype", "collective_name", "pg_name", "input_dims", "input_type")


def _comm_ops(ops: Table, comm: dict[str, list], row_to_op: np.ndarray, on_device: np.ndarray) -> Table:
    at = np.array(comm["row"], dtype=np.int64)
    kept = ~on_device[at] if len(at) else np.zeros(0, dtype=bool)
    mask = None if kept.all() else kept.tolist()
    out = ops[row_to_op[at[kept]]]
    for key in _COMM_ARG_COLUMNS:
        values = comm[key] if mask is None else list(compress(comm[key], mask))
        out[key] = objects(values) if key in _OBJECT_ARGS else np.array(values, dtype=np.int64)
    return out


def objects(values: list) -> np.ndarray:
    """A 1-d object array of ``values`` (lists stay elements, not a second dimension)."""
    return np.fromiter(values, dtype=object, count=len(values))  # each value one element, never looked into
