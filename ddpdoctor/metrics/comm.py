"""Communication of one rank: what runs when (interval sets) and the list of its collective calls.

- GPU (NCCL/RCCL): communication = device kernels named ``nccl*Kernel*`` (Holistic Trace Analysis' rule);
  computation = the other kernels except memcpy/memset/``*Sync`` (same rule), so ``overlap_ratio`` is HTA's
  ``comp_comm_overlap_pctg`` / 100.
- CPU (gloo): communication = the ``gloo:*`` ranges, which run on gloo's own threads; computation = the CPU
  ops on every other thread, except the calls that only start or wait for communication (``c10d::*``, ...).

Collectives (kinds all_reduce, broadcast, all_gather, reduce_scatter, all_to_all, reduce, barrier, send, recv,
send_recv): bytes = the whole buffer, as nccl-tests counts it (all_gather: the gathered output; reduce_scatter: the
input of all ranks' shards): max(In/Out msg nelems) × dtype size from ``record_param_comms``, or the largest tensor
(list) in the call's Input Dims × dtype size; timed on the device (NCCL kernels) or on the gloo thread.
"""

from __future__ import annotations

import functools
import math
import re
from typing import NamedTuple

import numpy as np

from ddpdoctor.load.model import RankTrace
from ddpdoctor.metrics import intervals as iv
from ddpdoctor.metrics.phases import names_matching
from ddpdoctor.metrics.steps import first_index, launch_times
from ddpdoctor.table import Codes, Table, distinct

COMM_KERNEL = re.compile(r"^(nccl|rccl).*kernel", re.IGNORECASE)
# HTA's is_compute_kernel() regex "(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)" without the leading ".*",
# which made re.search quadratic in the name length (70 ms per rank on long templated kernel names)
_NOT_COMPUTE = re.compile(r"^nccl.*Kernel|Memcpy|Memset|Sync")
_CPU_COMM_RANGE = re.compile(r"^(gloo|ucc|mpi):")
_COMM_CALL = re.compile(r"^(nccl|gloo|ucc|mpi):")
# The collective calls on the CPU timeline and their waits (c10d, the backends' ranges, the functional collectives
# torch names ``_c10d_functional::``): the others' time, not the rank's work. One pattern for every use (busy_sets
# here, fsdp's work inside its ranges, same_work's ops), so that a name added is added everywhere.
COLLECTIVE_CALL = r"c10d::|record_param_comms$|nccl:|gloo:|ucc:|mpi:|aten::wait|_?c10d_functional"
# Not computation on the CPU timeline: communication calls, and the step/data-loading ranges that torch <= 1.9
# wrote with category "Operator" (so they load as cpu_op) although they enclose waiting as much as work.
_NOT_CPU_COMPUTE = re.compile(rf"^({COLLECTIVE_CALL}|ProfilerStep#|enumerate\(DataLoader\))")
# Waiting for a collective on the CPU timeline, inside the ops that hold it: a DTensor op (tensor parallelism) waits in
# ``_c10d_functional::wait_tensor`` inside its ``aten::linear``; that time is not computation of the op that holds it.
_CPU_WAIT = re.compile(r"^(aten::wait|_?c10d_functional)")
KINDS = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "reduce",
    "barrier",
    "send_recv",
    "send",
    "recv",
)
COLLECTIVE_COLUMNS = [
    "kind",
    "start_us",
    "end_us",
    "dur_us",
    "bytes",
    "group_size",
    "source",
    "issued_us",
    "arrival_us",
]

# Bytes per element of every dtype string torch writes into a trace, keyed in the form ``dtype_bytes`` looks up
# (lower case, no ``c10::``/``at::``/``torch.`` prefix, single spaces): c10::toString names (``Float``, ``Byte``:
# record_param_comms' ``dtype``), C++ type names (``float``, ``unsigned char``, ``c10::complex<c10::Half>``: the
# ``Input type`` of ops) and torch's Python names (``float32``). tests/unit/test_comm_dtypes.py checks it against
# every dtype of the installed torch.
_DTYPE_GROUPS: dict[int, tuple[str, ...]] = {
    1: (
        "byte",
        "uint8",
        "unsigned char",
        "char",
        "int8",
        "signed char",
        "bool",
        "qint8",
        "quint8",
        "quint4x2",
        "quint2x4",
        "bits1x8",
        "bits2x4",
        "bits4x2",
        "bits8",
        "float8_e5m2",
        "float8_e4m3fn",
        "float8_e5m2fnuz",
        "float8_e4m3fnuz",
        "float8_e8m0fnu",
        "float4_e2m1fn_x2",
        *(f"uint{i}" for i in range(1, 8)),
        *(f"int{i}" for i in range(1, 8)),
        *(f"dummy_uint1_7_t<{i}>" for i in range(1, 8)),
        *(f"dummy_int1_7_t<{i}>" for i in range(1, 8)),
    ),
    2: (
        "half",
        "float16",
        "bfloat16",
        "short",
        "int16",
        "short int",
        "uint16",
        "unsigned short",
        "short unsigned int",
        "unsigned short int",
        "bits16",
    ),
    4: (
        "float",
        "float32",
        "int",
        "int32",
        "unsigned int",
        "uint32",
        "qint32",
        "complexhalf",
        "complex32",
        "chalf",
        "complex<half>",
    ),
    8: (
        "double",
        "float64",
        "long",
        "int64",
        "long int",
        "long long",
        "long long int",
        "uint64",
        "unsigned long",
        "long unsigned int",
        "unsigned long int",
        "unsigned long long",
        "long long unsigned int",
        "complexfloat",
        "complex64",
        "cfloat",
        "complex<float>",
    ),
    16: ("complexdouble", "complex128", "cdouble", "complex<double>"),
}
_DTYPE_BYTES = {name: size for size, names in _DTYPE_GROUPS.items() for name in names}
_DTYPE_PREFIX = re.compile(r"\b(c10|at|torch)(::|\.)")


def kind_of(name: str) -> str | None:
    """Collective kind from a call, ``Collective name`` or kernel name (``nccl:all_reduce``,
    ``AllGather``...)."""
    text = re.sub(
        r"[^a-z]",
        "",
        name.split(":", 1)[-1].lower().replace("ncclkernel", "").replace("ncclkernel", "").replace("nccldevkernel", ""),
    )
    for key, kind in (
        ("reducescatter", "reduce_scatter"),
        ("allgather", "all_gather"),
        ("allreduce", "all_reduce"),
        ("alltoall", "all_to_all"),
        ("broadcast", "broadcast"),
        ("barrier", "barrier"),
        ("sendrecv", "send_recv"),
        ("reduce", "reduce"),
        ("send", "send"),
        ("recv", "recv"),
        ("gather", "all_gather"),
        ("scatter", "reduce_scatter"),
    ):
        if key in text:
            return kind
    return None


def dtype_bytes(dtype: str | None) -> int | None:
    """Bytes per element of a dtype string as a trace writes it (``Float``, ``c10::Half``, ``unsigned char``),
    None when unknown."""
    if not dtype or not isinstance(dtype, str):
        return None
    return _dtype_bytes(dtype)


@functools.lru_cache(maxsize=4096)
def _dtype_bytes(dtype: str) -> int | None:
    key = " ".join(_DTYPE_PREFIX.sub("", dtype).lower().split())
    return _DTYPE_BYTES.get(key)


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' busbw/algbw factor for a collective over ``n`` ranks."""
    if n <= 1:
        return 1.0
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def comm_kernels(rt: RankTrace) -> Table:
    k = rt.tables.kernels
    if len(k) == 0:
        return k
    return k[k["cat"].isin(["kernel"]) & names_matching(k, COMM_KERNEL)]


def busy_sets(rt: RankTrace) -> tuple[iv.Intervals, iv.Intervals, bool]:
    """(communication, computation, on_device): the interval sets that define overlap and exposed comm."""
    k = rt.tables.kernels
    kernels = k[k["cat"].isin(["kernel"])]
    if len(kernels):
        comm = names_matching(kernels, COMM_KERNEL)
        comp = ~names_matching(kernels, _NOT_COMPUTE)
        ts, te = kernels["ts_us"], kernels["end_us"]
        return iv.union(ts[comm], te[comm]), iv.union(ts[comp], te[comp]), True
    ops = rt.tables.ops
    comm = names_matching(ops, _CPU_COMM_RANGE)
    tid = ops["tid"]
    comm_threads = distinct(tid[comm])
    cpu = ops["cat"].isin(["cpu_op"]) & ~np.isin(tid, comm_threads)
    comp = cpu & ~names_matching(ops, _NOT_CPU_COMPUTE)
    ts, te = ops["ts_us"], ops["end_us"]
    compute = iv.union(ts[comp], te[comp])
    wait = cpu & names_matching(ops, _CPU_WAIT)
    if wait.any():
        compute = iv.subtract(compute, iv.union(ts[wait], te[wait]))
    return iv.union(ts[comm], te[comm]), compute, False


def exposed_set(rt: RankTrace) -> iv.Intervals:
    """Communication not overlapped by computation, as the breakdown's ``exposed_comm_ms`` counts it: on the device,
    comm kernels less every other device work; on the CPU, the gloo ranges less the compute ops of ``busy_sets``."""
    from ddpdoctor.load.categories import DEVICE_WORK_CATS

    comm, compute, on_device = busy_sets(rt)
    k = rt.tables.kernels
    work = k[k["cat"].isin(DEVICE_WORK_CATS)] if len(k) else k
    if on_device and len(work):
        dev = work[~names_matching(work, COMM_KERNEL)]
        return iv.subtract(comm, iv.union(dev["ts_us"], dev["end_us"]))
    return iv.subtract(comm, compute)


def collectives(rt: RankTrace, calls: Table | None = None) -> Table:
    """One row per collective call: ``kind, start_us, end_us, dur_us, bytes, group_size, source``.

    ``bytes`` is NaN where the trace records no size; ``source`` says what was timed ("kernel" or the call's
    name). ``kind`` and ``source`` are object arrays of strings.
    """
    calls = _calls(rt) if calls is None else calls  # ``calls``: collective_calls(rt), when the caller has them
    kernels = comm_kernels(rt)
    if len(kernels):
        rows = _kernel_collectives(rt, kernels, calls)
    else:
        timed = calls[calls["name"].matches(_CPU_COMM_RANGE)] if len(calls) else calls
        timed = timed[_notna(timed["kind"])]
        called = gloo_arrivals(rt.tables.comm_ops, timed)
        rows = Table(
            {
                "kind": timed["kind"],
                "start_us": timed["ts_us"],
                "end_us": timed["end_us"],
                "dur_us": timed["dur_us"],
                "bytes": timed["bytes"],
                "group_size": timed["group_size"],
                "source": timed["name"].values(),
                # when the job issued it (metrics.issuers): its call, else its range's start (queued just before)
                "issued_us": np.where(np.isfinite(called), called, timed["ts_us"]),
                "arrival_us": called,
            }
        )
    rows = rows[_notna(rows["kind"])]
    return rows.sort("start_us").select(COLLECTIVE_COLUMNS)


# Calls gloo runs as another kind: FSDP2's reduce-scatter (``c10d::_reduce_scatter_base_``) is a
# ``gloo:all_reduce`` range (torch 2.13, CPU).
_GLOO_RUNS_AS = {"reduce_scatter": "all_reduce"}


def gloo_arrivals(ops: Table, ranges: Table) -> np.ndarray:
    """For each of ``ranges`` (the collectives' ``gloo:*`` ranges, with ``kind``), when the rank called it: the
    start of the ``c10d::*`` op that queued it, on the thread that issued it; NaN where that is not known.

    Gloo runs a collective on threads of its own, which take the queued work first in, first out, so the k-th
    range to start ran the k-th call. On a busy host such a thread can wait for a CPU for milliseconds before it
    starts (8 ms measured beside a CPU burner on 2 cores), and the range starts late though the rank called on
    time: timed by its range, the rank whose communication thread lost the CPU looks like a straggler. Every
    outermost ``c10d::*`` op of a collective kind and every range of the window are paired only when they match
    in number and, in order, kind for kind (``_GLOO_RUNS_AS``), each call no later than its range; otherwise (a
    call queued before the profiled window, an op with no range of its own) all are NaN and the ranges' starts
    are used, as before."""
    out = np.full(len(ranges), np.nan)
    if len(ranges) == 0 or len(ops) == 0 or not ranges["name"].startswith("gloo:").all():
        return out
    c = ops[ops["name"].startswith("c10d::")]
    kinds = kinds_of(c["name"])
    c, kinds = c[_notna(kinds)], kinds[_notna(kinds)]
    if len(c) != len(ranges):
        return out
    # outermost: a call inside another of its thread (one collective op calling another) is not one of its own
    by_thread = np.lexsort((c["ts_us"], c["tid"]))
    tid, ts, end = (c[k][by_thread].tolist() for k in ("tid", "ts_us", "end_us"))
    reach, last_tid = -math.inf, None
    for t, a, b in zip(tid, ts, end, strict=True):
        if t != last_tid:
            reach, last_tid = -math.inf, t
        if a < reach:
            return out
        reach = max(reach, b)
    calls = np.argsort(c["ts_us"], kind="stable")
    runs = np.argsort(ranges["ts_us"], kind="stable")
    ran = np.asarray(ranges["kind"], dtype=object)[runs].tolist()
    if any(k != r and _GLOO_RUNS_AS.get(k) != r for k, r in zip(kinds[calls].tolist(), ran, strict=True)):
        return out
    called = c["ts_us"][calls]
    if np.any(called > ranges["ts_us"][runs]):
        return out
    out[runs] = called
    return out


def _notna(values: np.ndarray) -> np.ndarray:
    """Rows of an object array that hold a value (not None or NaN), as pandas' ``notna``."""
    return np.fromiter((v is not None and v == v for v in values), dtype=bool, count=len(values))


def collective_calls(rt: RankTrace) -> Table:
    """The host-side collective calls (``nccl:*``/``gloo:*``...) with ``kind``, ``bytes``, ``group_size``,
    ``tid``, ``ts_us``, ``end_us``."""
    return _calls(rt)


_CALL_COLUMNS = ("name", "tid", "ts_us", "end_us", "dur_us", "kind", "bytes", "group_size")


def kinds_of(names: Codes) -> np.ndarray:
    """``kind_of`` of each row's name (an object array; None where none), evaluated once per distinct name."""
    return names.map({n: kind_of(n) for n in names.used()})


def _calls(rt: RankTrace) -> Table:
    """The ``nccl:*``/``gloo:*`` calls with kind, bytes and group size filled in from the ops around them."""
    c = rt.tables.comm_ops
    if len(c) == 0:
        return Table(
            {
                "name": Codes(np.zeros(0, dtype=np.int32), []),
                **{k: np.zeros(0) for k in _CALL_COLUMNS if k not in ("name", "kind")},
                "kind": np.zeros(0, dtype=object),
            }
        )
    names = c["name"]
    is_call = names.matches(_COMM_CALL)
    if not is_call.any():  # older traces: the record_param_comms ops are the calls
        calls = c[names.isin(["record_param_comms"]) & _notna(c["collective_name"])]
        calls["kind"] = np.array([kind_of(n) for n in calls["collective_name"]] + [None], dtype=object)[:-1]
    else:
        calls = c[is_call]
        calls["kind"] = kinds_of(calls["name"])
    params = c[names.isin(["record_param_comms"])]
    outer = c[names.startswith("c10d::")]
    p_at = _enclosing(params, calls)
    o_at = _enclosing(outer, calls)
    # the enclosing rows of each call (row 0 standing in where there is none: not used)
    p_rows = _row_objects(params[np.maximum(p_at, 0)]) if len(params) else [None] * len(calls)
    o_rows = _row_objects(outer[np.maximum(o_at, 0)]) if len(outer) else [None] * len(calls)
    bytes_, groups = [], []
    for row, pi, oi, p_row, o_row in zip(
        _row_objects(calls), p_at.tolist(), o_at.tolist(), p_rows, o_rows, strict=True
    ):
        p = p_row if pi >= 0 else None
        o = o_row if oi >= 0 else None
        bytes_.append(_bytes(row, p, o))
        gs = p.group_size if p is not None and p.group_size > 0 else (row.group_size if row.group_size > 0 else -1)
        groups.append(gs)
    calls["bytes"] = np.array(bytes_, dtype=np.float64)
    calls["group_size"] = np.array(groups, dtype=np.int64)
    return calls


class _Args(NamedTuple):
    """The collective-argument fields of one row (Python values)."""

    in_nelems: int
    out_nelems: int
    group_size: int
    dtype: object
    input_dims: object
    input_type: object


def _row_objects(table: Table) -> list[_Args]:
    """The collective-argument fields of each row."""
    return list(map(_Args._make, zip(*(table[k].tolist() for k in _Args._fields), strict=True)))


def _enclosing(ranges: Table, calls: Table) -> np.ndarray:
    """For each call, the row of ``ranges`` on its thread that encloses it (the innermost), or -1."""
    out = np.full(len(calls), -1, dtype=np.int64)
    if len(ranges) == 0 or len(calls) == 0:
        return out
    f_tid, f_ts, f_end = ranges["tid"], ranges["ts_us"], ranges["end_us"]
    c_tid, c_ts, c_end = calls["tid"], calls["ts_us"], calls["end_us"]
    for tid in distinct(f_tid):
        sel = np.flatnonzero(c_tid == tid)
        if len(sel) == 0:
            continue
        rows = np.flatnonzero(f_tid == tid)
        rows = rows[np.argsort(f_ts[rows], kind="stable")]
        j = np.searchsorted(f_ts[rows], c_ts[sel], side="right") - 1
        ok = (j >= 0) & (f_end[rows][np.maximum(j, 0)] >= c_end[sel])
        out[sel[ok]] = rows[j[ok]]
    return out


def _bytes(call, params, outer) -> float:  # noqa: ANN001
    for src in (params, call):
        if src is not None and max(src.in_nelems, src.out_nelems) > 0:
            size = (
                dtype_bytes(src.dtype)
                or _type_bytes(src.input_type)
                or (_type_bytes(call.input_type) if src is not call else None)
            )
            if size:
                return float(max(src.in_nelems, src.out_nelems) * size)
    for src in (call, outer):
        if src is None:
            continue
        n = _numel(src.input_dims, src.input_type)
        size = (
            _type_bytes(src.input_type)
            or _type_bytes(call.input_type)
            or (dtype_bytes(params.dtype) if params is not None else None)
        )
        if n and size:
            return float(n * size)
    return math.nan


def _numel(dims: object, types: object = None) -> int:
    """Elements of the largest tensor (or tensor list) argument in an ``Input Dims`` value: the whole buffer of a
    collective, as nccl-tests sizes it (all_gather's output list, reduce_scatter's input list). A 0-dim tensor (a
    loss all-reduced for logging) has dims ``[]``, as an argument that is no tensor has: it counts 1 element where
    ``Input type`` names its dtype (``"float"``), and inside a tensor list (``[[]]``)."""
    if not isinstance(dims, list):
        return 0
    kinds = types if isinstance(types, list) and len(types) == len(dims) else [None] * len(dims)
    return max(
        (
            _arg_numel(arg) or (1 if arg == [] and isinstance(kind, str) and dtype_bytes(kind) else 0)
            for arg, kind in zip(dims, kinds, strict=True)
        ),
        default=0,
    )


def _arg_numel(arg: object, in_list: bool = False) -> int:
    if not isinstance(arg, list):
        return 0
    if not arg:
        return 1 if in_list else 0  # a 0-dim tensor of a tensor list; at the top, an argument that is no tensor
    if all(isinstance(d, int) for d in arg):
        return math.prod(arg)
    if all(isinstance(d, list) for d in arg):  # TensorList (or a list of them)
        return sum(_arg_numel(d, in_list=True) for d in arg)
    return 0


def _type_bytes(types: object) -> int | None:
    if isinstance(types, list):
        for t in types:
            if isinstance(t, str) and (size := dtype_bytes(t)):
                return size
    return None


def _kernel_collectives(rt: RankTrace, kernels: Table, calls: Table) -> Table:
    """Comm kernels, each matched to the call that launched it (same thread, launch inside the call)."""
    launched = launch_times(rt, kernels)
    ops = rt.tables.ops
    # the thread of the first op with the kernel's correlation id
    at = first_index(ops["correlation"], kernels["correlation"])
    found = at >= 0
    tids = ops["tid"][np.maximum(at, 0)] if len(ops) else np.zeros(len(kernels), dtype=np.int64)
    kind = kinds_of(kernels["name"])
    nbytes = np.full(len(kernels), np.nan)
    group = np.full(len(kernels), -1, dtype=np.int64)
    source = np.full(len(kernels), "kernel", dtype=object)
    if len(calls):
        c_tid = calls["tid"]
        for tid in distinct(c_tid):
            idx = np.flatnonzero(c_tid == tid)
            idx = idx[np.argsort(calls["ts_us"][idx], kind="stable")]
            lo, hi = calls["ts_us"][idx], calls["end_us"][idx]
            sel = np.flatnonzero(found & (tids == tid))
            j = np.searchsorted(lo, launched[sel], side="right") - 1
            ok = (j >= 0) & (launched[sel] <= hi[np.maximum(j, 0)])
            sel, rows = sel[ok], idx[j[ok]]
            call_kind = calls["kind"][rows]
            kind[sel] = np.where(_notna(call_kind), call_kind, kind[sel])
            nbytes[sel] = calls["bytes"][rows]
            group[sel] = calls["group_size"][rows]
            source[sel] = "kernel (" + calls["name"][rows].values() + ")"
    return Table(
        {
            "kind": kind,
            "start_us": kernels["ts_us"],
            "end_us": kernels["end_us"],
            "dur_us": kernels["dur_us"],
            "bytes": nbytes,
            "group_size": group,
            "source": source,
            "issued_us": np.asarray(launched, dtype=np.float64),
            "arrival_us": np.full(len(kernels), np.nan),  # the kernel's start: the GPU's arrival
        }
    )
