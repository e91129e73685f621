"""The types of the run-directory files that more than one part reads: ``ranks/rank<R>.json`` (``RankCapture``),
``ranks/rank<R>.summary.json`` (``RankSummary``) and ``manifest.json`` (``Manifest``). The capture writes through
them and every reader reads through them (``ddpdoctor.runfiles``; ``ddpdoctor.rundir`` re-exports them with the
layout)."""

from __future__ import annotations

import functools
import itertools
import math
import operator
from typing import Annotated, Any

import msgspec

from ddpdoctor.metrics import catalog

SCHEMA_VERSION = 1

Rank = Annotated[int, msgspec.Meta(ge=0, lt=1 << 31)]
Size = Annotated[int, msgspec.Meta(ge=1, lt=1 << 31)]
Number = int | float

# Bounds of the values that size loops or are summed (a hand-edited 10**15 would build a range that never ends).
MAX_STEP = 1 << 31  # step numbers and counts (a run of 2**31 optimizer steps is not a run ddpdoctor traced)
MAX_PROFILED_STEPS = 1_000_000  # steps inside the profiled windows, all windows together
Step = Annotated[int, msgspec.Meta(ge=0, lt=MAX_STEP)]
Count = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]  # bytes, parameters, threads: a non-negative int64
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
Finite = Annotated[float, msgspec.Meta(ge=-1.7976931348623157e308, le=1.7976931348623157e308)]  # no NaN, no inf
Bytes = Count | Annotated[float, msgspec.Meta(ge=0, le=1.7976931348623157e308)]
Scalar = str | bool | Int64 | Finite | None  # one JSON value that is not a container (a key, a label)
# What is parsed as a number by a reader: ASCII digits of a sane length ("cuda:²" or 5,000 digits crashed int())
Device = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}(:[0-9]{1,9})?$")]  # cpu, cuda:3
IntText = Annotated[str, msgspec.Meta(pattern=r"^-?[0-9]{1,18}$")]


class StepRecord(msgspec.Struct, forbid_unknown_fields=False):
    """``steps`` of a rank capture: how steps were counted and every step's wall time (ms). The profiled windows
    ``[first_step, last_step]`` lie within the steps the rank recorded (steps ``first`` .. ``first + len(wall_ms)
    - 1``, or up to ``count``), at most ``MAX_PROFILED_STEPS`` steps together."""

    source: str | None = None
    count: Step | None = None
    first: Step = 1
    wall_ms: list[Number] = []
    profiled: list[tuple[Step, Step]] = []

    def __post_init__(self) -> None:
        if (None in self.wall_ms or not _all_plain(self.wall_ms, text=False)) and not all(
            _plain_value(v, text=False) and v is not None for v in self.wall_ms
        ):
            raise ValueError("steps.wall_ms holds a value that is not a finite number")
        last = max(self.first + len(self.wall_ms) - 1, self.count or 0)
        inside = 0
        for lo, hi in self.profiled:
            if not lo <= hi <= last:
                raise ValueError(f"steps.profiled window [{lo}, {hi}] is not within the recorded steps (0-{last})")
            inside += hi - lo + 1
        if inside > MAX_PROFILED_STEPS:
            raise ValueError(f"steps.profiled holds {inside} steps (more than {MAX_PROFILED_STEPS:,})")


# The records inside a rank capture that the metrics, compare and the gate read, typed down to the values they
# use (what ``ddpdoctor.capture`` writes; unknown keys are allowed, newer versions add some).
class CapturedDevice(msgspec.Struct, forbid_unknown_fields=False):
    """``memory.devices[]``: one CUDA device's allocator counters (bytes)."""

    device: Device | None = None
    index: Annotated[int, msgspec.Meta(ge=0, lt=1 << 31)] | None = None
    name: str | None = None
    capacity_bytes: Bytes | None = None
    peak_allocated_bytes: Bytes | None = None
    peak_reserved_bytes: Bytes | None = None
    per_step: dict[str, list[Bytes | None]] | None = None

    def __post_init__(self) -> None:
        steps = (self.per_step or {}).get("step") or []
        if any(type(s) is not int or s >= MAX_STEP for s in steps if s is not None):
            raise ValueError("memory per_step.step holds a value that is not a step number")


class MemoryRecord(msgspec.Struct, forbid_unknown_fields=False):
    cuda_available: bool | None = None
    devices: list[CapturedDevice] = []


class GilSeries(msgspec.Struct, forbid_unknown_fields=False):
    step: list[Step] = []
    contention: list[Finite | None] = []
    threads: list[Count | None] = []
    native_threads: list[Count | None] = []
    job_threads: list[Count | None] = []
    active_threads: list[Count | None] = []
    cpu_cores: list[Finite | None] = []
    runnable_cores: list[Finite | None] = []
    cpu_share: list[Finite | None] = []
    blocked_share: list[Finite | None] = []
    switches: list[Count | None] = []


class GilRecord(msgspec.Struct, forbid_unknown_fields=False):
    probe: str | None = None
    available: bool | None = None
    reason: str | None = None
    per_step: GilSeries | None = None


class HostLoadWindow(msgspec.Struct, forbid_unknown_fields=False):
    """``hostload.windows[]``: the host's load over one profiled window (``ddpdoctor.capture.hostload``): seconds
    of CPU time, wall time and run-queue wait; counts of switches, threads, CPUs and runnable tasks."""

    first_step: Step = 0
    last_step: Step = 0
    complete: bool = True
    wall_s: Annotated[float, msgspec.Meta(ge=0, le=1e9)] = 0.0
    cpu_s: Annotated[float, msgspec.Meta(ge=0, le=1e12)] | None = None
    voluntary_switches: Count | None = None
    involuntary_switches: Count | None = None
    threads: Count | None = None
    run_s: Annotated[float, msgspec.Meta(ge=0, le=1e12)] | None = None
    run_delay_s: Annotated[float, msgspec.Meta(ge=0, le=1e12)] | None = None
    timeslices: Count | None = None
    main_run_s: Annotated[float, msgspec.Meta(ge=0, le=1e12)] | None = None
    main_run_delay_s: Annotated[float, msgspec.Meta(ge=0, le=1e12)] | None = None
    affinity_cpus: Count | None = None
    host_cpus: Count | None = None
    host_total_s: Annotated[float, msgspec.Meta(ge=0, le=1e12)] | None = None
    host_busy_s: Annotated[float, msgspec.Meta(ge=0, le=1e12)] | None = None
    host_steal_s: Annotated[float, msgspec.Meta(ge=0, le=1e12)] | None = None
    host_iowait_s: Annotated[float, msgspec.Meta(ge=0, le=1e12)] | None = None
    runnable_mean: Annotated[float, msgspec.Meta(ge=0, le=1e9)] | None = None
    runnable_max: Count | None = None
    load1: Annotated[float, msgspec.Meta(ge=0, le=1e9)] | None = None
    # CPU time of the rank's child processes (DataLoader workers, compile workers) in the window
    children_cpu_s: Annotated[float, msgspec.Meta(ge=0, le=1e12)] | None = None
    # CPU time of ddpdoctor's own helper processes of the rank (the GIL probe, gilwatch) in the window
    probe_cpu_s: Annotated[float, msgspec.Meta(ge=0, le=1e12)] | None = None

    def __post_init__(self) -> None:
        if self.last_step < self.first_step:
            raise ValueError(f"hostload window ends (step {self.last_step}) before it starts ({self.first_step})")


class HostLoadRecord(msgspec.Struct, forbid_unknown_fields=False):
    """``hostload``: the host's load over the profiled windows, as the rank saw it (``reason``: why it was not
    recorded, e.g. not Linux)."""

    source: str | None = None
    reason: str | None = None
    windows: list[HostLoadWindow] = []


class ScheduleRecord(msgspec.Struct, forbid_unknown_fields=False):
    """``schedule``: the profiler's schedule (steps)."""

    wait: Step | None = None
    warmup: Step | None = None
    active: Step | None = None
    repeat: Step | None = None
    skip_first: Step | None = None


class DDPModule(msgspec.Struct, forbid_unknown_fields=False):
    """``ddp[]``: one DDP module and ``_get_ddp_logging_data()`` (its values scalars)."""

    module: str | None = None
    logging_data: dict[str, Scalar] | None = None
    device_ids: list[str | Int64] | None = None
    error: str | None = None
    # the gradients it reduces: total_bytes, count, and the largest one's name, bytes, module_type, sparse
    # (ddpdoctor.capture.ddp.gradient_sizes)
    gradients: dict[str, Scalar] | None = None


class DPModule(msgspec.Struct, forbid_unknown_fields=False):
    """``dp[]``: one ``nn.DataParallel``."""

    module: str | None = None
    wrapper: str | None = None
    device_ids: list[str | Int64] | None = None
    output_device: str | Int64 | None = None
    dim: Int64 | None = None


class DPStep(msgspec.Struct, forbid_unknown_fields=False):
    """``dp_steps[]``: DataParallel's stages in one step (ms) and the bytes its gather produced."""

    step: Step | None = None
    gathered_bytes: Bytes | None = None
    scatter_ms: Finite | None = None
    replicate_ms: Finite | None = None
    parallel_apply_ms: Finite | None = None
    gather_ms: Finite | None = None
    replicas: Count | None = None
    forwards: Count | None = None


class LoaderPass(msgspec.Struct, forbid_unknown_fields=False):
    """``setup.data_loaders[]``: one pass over a DataLoader (``ddpdoctor.capture.setup``)."""

    loader: Int64 | str | None = None  # id(loader): which passes belong to one loader
    dataset: str | None = None
    dataset_len: Count | None = None
    root_dataset_len: Count | None = None
    iterable: bool | None = None
    sampler: str | None = None
    distributed_sampler: bool | None = None
    shuffle: Scalar = None  # a sampler's own attributes: whatever the user's sampler holds
    sampler_epoch: Scalar = None
    sampler_num_replicas: Scalar = None
    batch_size: Count | None = None
    batches_per_epoch: Count | None = None
    num_workers: Count | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    batches_yielded: Count | None = None
    steps_fed: Count | None = None
    exhausted: bool | None = None
    first_indices_digest: str | None = None
    first_batch_digest: str | None = None
    first_labels_digest: str | None = None
    content_digest: str | None = None
    content_full_digest: str | None = None


class DDPModel(msgspec.Struct, forbid_unknown_fields=False):
    """``setup.ddp_models[]``: the model inside one DDP wrapper."""

    module: str | None = None
    batchnorm_layers: Count | None = None
    batchnorm_batch_stats_layers: Count | None = None
    sync_batchnorm_layers: Count | None = None
    parameters: Count | None = None
    parameter_bytes: Count | None = None
    device: Device | None = None


class SetupRecord(msgspec.Struct, forbid_unknown_fields=False):
    """``setup``: what the capture observed of the job's set-up (``ddpdoctor.capture.setup``)."""

    data_loaders: list[LoaderPass] = []
    data_loader_epochs: Count | None = None
    set_epoch_calls: list[Int64] = []
    set_device_calls: list[str] = []
    cuda_visible_devices: str | None = None
    ddp_models: list[DDPModel] = []
    ddp_sync_rounds_per_step: dict[IntText, Count] = {}  # histograms {count: number of steps}
    ddp_forwards_per_step: dict[IntText, Count] = {}
    join_contexts: Count | None = None  # `with Join(...)` / `with model.join()` entered


class ThreadsRecord(msgspec.Struct, forbid_unknown_fields=False):
    cpu_count: Count | None = None
    affinity_cpus: Count | None = None
    affinity: list[list[Count]] | None = None  # the CPUs themselves, as [first, last] ranges (ranklist.compact)
    omp_num_threads: str | Int64 | None = None
    torch_intra_op_threads: Count | None = None
    torch_inter_op_threads: Count | None = None


class RankCapture(msgspec.Struct, forbid_unknown_fields=False):
    """``ranks/rank<R>.json``: what the capture recorded in rank R (layout in the module docstring), typed down
    to the nested values the metrics, compare and the gate read. The ``DROPPABLE`` records (GIL probe, host
    load, profiler schedule) are optional to every reader: one that does not fit is left out alone (``runfiles``),
    not the file."""

    rank: Rank
    schema_version: int = SCHEMA_VERSION
    ddpdoctor_version: str | None = None
    local_rank: int | None = None
    world_size: Size | None = None
    local_world_size: int | None = None
    node_rank: int | None = None
    hostname: str | None = None
    pid: int | None = None
    pid_ns: str | None = None  # the process's pid namespace (``pid:[4026531836]``): where ``pid`` means this process
    status: str | None = None
    exit_code: int | None = None
    error: str | None = None
    backend: str | None = None
    device: Device | None = None
    steps: StepRecord | None = None
    memory: MemoryRecord | None = None
    gil: GilRecord | None = None
    hostload: HostLoadRecord | None = None
    schedule: ScheduleRecord | None = None
    ddp: list[DDPModule] = []
    dp: list[DPModule] = []
    dp_steps: list[DPStep] = []
    setup: SetupRecord | None = None
    threads: ThreadsRecord | None = None
    started_at: Finite | None = None
    trace_files: list[str] = []
    torch_version: str | None = None
    cuda_available: bool | None = None
    capture_errors: list[str] = []
    error_frames: list[Frame] = []  # the ending exception's traceback, outermost first (capture/session.py)
    # collectives other than barriers in the Flight Recorder's buffer where the run ended (capture/flight.py)
    run_collectives: Count | None = None
    # of them, those created after the end of the rank's first step (what it exchanged while training)
    training_collectives: Count | None = None
    training_collective_bytes: Count | None = None  # their inputs' bytes (where the buffer holds all of them)


# Records of a rank capture that a reader may leave out alone when they do not fit (every reader treats them as
# optional, and the README promises that their wrongly typed values are ignored): key -> type.
DROPPABLE: dict[str, Any] = {
    "gil": GilRecord | None,
    "schedule": ScheduleRecord | None,
    "hostload": HostLoadRecord | None,
}


class DeviceMemory(msgspec.Struct, forbid_unknown_fields=False):
    device: str
    peak_allocated_bytes: Number | None = None
    peak_reserved_bytes: Number | None = None
    capacity_bytes: Number | None = None


# columns of a summary's tables that hold text: the collective's kind, where it was issued (metrics.issuers.issuers)
_TEXT_COLUMNS = frozenset(("kind", "issued_in"))


class RankSummary(msgspec.Struct, forbid_unknown_fields=False):
    """``ranks/rank<R>.summary.json``: the metrics rank R computed from its own trace
    (``ddpdoctor.metrics.summary``). ``per_step``/``collectives`` are columns of equal length."""

    rank: Rank
    ddpdoctor_version: str
    schema_version: int = SCHEMA_VERSION
    files: list[str] = []
    distributed_info: dict[str, Any] | None = None
    hostname: str | None = None
    world_size: Size | None = None
    own_device: str | None = None
    metrics: dict[str, Number | bool | str | None] = {}
    per_step: dict[str, list[Number | bool | str | None]] = {}
    collectives: dict[str, list[Number | bool | str | None]] = {}
    devices: list[DeviceMemory] = []
    fsdp_units: dict[str, list[Number | str | None]] = {}  # FSDP2 units (ddpdoctor.metrics.fsdp.UNIT_COLUMNS)
    # communication not hidden by computation in the analysed steps: intervals (µs), what exposed transfer needs
    exposed_comm: dict[str, list[Number]] = {}
    # a few analysed steps' phase intervals (ddpdoctor.metrics.timeline: step, lane, start_us, end_us); None: a
    # capture from before the timeline
    timeline: dict[str, list[Number | str]] | None = None
    # CPU ops per analysed step by name: [ops, top-level ops, top-level ms] (ddpdoctor.metrics.same_work); None: a
    # capture from before it, or no steps
    op_work: dict[str, list[Number]] | None = None

    def __post_init__(self) -> None:
        if self.op_work and not all(
            len(v) == 3 and all(_plain_value(x, text=False) for x in v) for v in self.op_work.values()
        ):
            raise ValueError("op_work holds a row that is not 3 finite numbers")
        for table in ("per_step", "collectives", "fsdp_units", "exposed_comm", "timeline"):
            lengths = {len(column) for column in (getattr(self, table) or {}).values()}
            if len(lengths) > 1:
                raise ValueError(f"the {table} columns have different lengths")
        if self.per_step and "step_ms" not in self.per_step:
            raise ValueError("per_step has no step_ms column")
        # JSON holds NaN, 10**400 and "12" as well as numbers: only what summarize_rank writes gets through
        if not _plain_metrics(self.metrics):  # the quick test over all values at once; this names the culprit
            for key, value in self.metrics.items():
                if not _plain_value(value, text=_metric_kind(key) == "text"):
                    raise ValueError(f"metric {key} is {_kind_of(value)}, not a finite number")
        if not _plain_tables(self.per_step, self.collectives):
            for table in ("per_step", "collectives"):
                for key, values in getattr(self, table).items():
                    if not all(_plain_value(v, text=key in _TEXT_COLUMNS) for v in values):
                        raise ValueError(f"{table}.{key} holds a value that is not a finite number")


# Numbers as msgspec decodes them from JSON: floats are always finite (it refuses NaN, Infinity and 1e400), integers
# bounded here to int64 (larger ones, rare, are checked the slow way).
_WireNumber = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)] | float


_OpRow = Annotated[list[_WireNumber], msgspec.Meta(min_length=3, max_length=3)]  # same_work.op_work's row


class RankSummaryWire(RankSummary):
    """``RankSummary`` as ``runfiles.read_summaries`` decodes a file with msgspec: numbers finite by their type (the
    check left is where text may be), and ``distributed_info``'s values left undecoded (``msgspec.Raw``), so that
    the process groups' rank lists (16,384 numbers in each rank's file of a 16,384-rank job) are decoded once for
    all the ranks that hold the same ones. A file this refuses is read as a ``RankSummary``, which says why."""

    distributed_info: dict[str, msgspec.Raw] | None = None  # type: ignore[assignment]
    metrics: dict[str, _WireNumber | bool | str | None] = {}  # type: ignore[assignment]
    # no text in per_step here (ddpdoctor writes none; a file with some is read the checked way, which allows it
    # in a text column): one type check by msgspec, not a scan of every column after it
    per_step: dict[str, list[_WireNumber | bool | None]] = {}  # type: ignore[assignment]
    collectives: dict[str, list[_WireNumber | bool | str | None]] = {}  # type: ignore[assignment]
    fsdp_units: dict[str, list[_WireNumber | str | None]] = {}  # type: ignore[assignment]
    exposed_comm: dict[str, list[_WireNumber]] = {}  # type: ignore[assignment]
    timeline: dict[str, list[_WireNumber | str]] | None = None  # type: ignore[assignment]
    # absent (UNSET, left out as the checked reader leaves it) in summaries from before it
    op_work: dict[str, _OpRow] | None | msgspec.UnsetType = msgspec.UNSET  # type: ignore[assignment]

    def __post_init__(self) -> None:
        for table in (self.per_step, self.collectives, self.fsdp_units, self.exposed_comm, self.timeline or {}):
            if len({len(column) for column in table.values()}) > 1:
                raise ValueError("columns of different lengths")
        if self.per_step and "step_ms" not in self.per_step:
            raise ValueError("per_step has no step_ms column")
        metrics = self.metrics
        # text only in text metrics: first all at C speed (as many strings as the catalog's text metrics hold, what
        # every file of ddpdoctor's has: no set of the other names), then name by name where that cannot say
        strings = list(map(type, metrics.values())).count(str)
        if strings and strings != list(map(type, map(metrics.get, _TEXT_METRICS))).count(str):
            if any(_metric_kind(k) != "text" for k, v in metrics.items() if type(v) is str):
                raise ValueError("text in a numeric metric")
        for key, column in self.collectives.items():
            if key not in _TEXT_COLUMNS and str in set(map(type, column)):
                raise ValueError("text in a numeric column")


class RankSummaryLazy(RankSummaryWire):
    """``RankSummaryWire`` with ``timeline`` and ``op_work`` left as JSON text (``msgspec.Raw``: its syntax checked,
    nothing decoded): what ``runfiles.read_summaries`` reads where the loader keeps those two tables on disk
    (``load.kept``), half of each file's decoding. Each is checked in full (``RankSummaryWire``) when it is read."""

    timeline: msgspec.Raw = msgspec.Raw(b"null")  # type: ignore[assignment]
    op_work: msgspec.Raw = msgspec.Raw(b"")  # type: ignore[assignment]  # b"": absent

    def __post_init__(self) -> None:
        timeline = self.timeline
        self.timeline = None  # type: ignore[assignment]  # the checks of the other tables, not this one's
        try:
            RankSummaryWire.__post_init__(self)
        finally:
            self.timeline = timeline


_PLAIN_TYPES = frozenset((int, float, bool, type(None)))
_NOT_NONE = functools.partial(operator.is_not, None)


def _all_plain(values: list[Any], text: bool) -> bool:
    """A quick sufficient test that every value is plain (``_plain_value``): True means all are; False means the
    values must be checked one by one (a string, an infinite or NaN float, an integer too large for a float)."""
    kinds = set(map(type, values))
    if text and str in kinds:
        kinds.discard(str)
        values = [v for v in values if type(v) is not str]
    if not kinds <= _PLAIN_TYPES:
        return False
    numbers = filter(_NOT_NONE, values) if type(None) in kinds else values
    try:  # NaN or inf anywhere makes the sum of magnitudes so (a sum too large is only not quick)
        return math.isfinite(sum(map(abs, numbers)))
    except OverflowError:  # an integer too large for a float
        return False


def _plain_metrics(metrics: dict[str, Any]) -> bool:
    """The quick test of a summary's metrics: numbers, and text only in the catalog's text metrics."""
    values = list(metrics.values())
    if str in set(map(type, values)):
        if any(isinstance(v, str) and _metric_kind(k) != "text" for k, v in metrics.items()):
            return False
        values = [v for v in values if type(v) is not str]
    return _all_plain(values, text=False)


def _plain_tables(*tables: dict[str, list[Any]]) -> bool:
    """The quick test of a summary's columns (text only in ``_TEXT_COLUMNS``), all columns at once."""
    numbers = [v for t in tables for k, col in t.items() if k not in _TEXT_COLUMNS for v in (col,)]
    return _all_plain(list(itertools.chain.from_iterable(numbers)), text=False) and all(
        _all_plain(t[k], text=True) for t in tables for k in _TEXT_COLUMNS if k in t
    )


_TEXT_METRICS = frozenset(n for n, m in {**catalog.RUN, **catalog.RANK}.items() if m.kind == "text")


def _metric_kind(name: str) -> str | None:
    spec = catalog.describe(name)
    return spec.kind if spec is not None else None


def _plain_value(value: Any, text: bool) -> bool:
    """None, a bool, a finite number, or (where ``text``) a string."""
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, str):
        return text
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


def _kind_of(value: Any) -> str:
    return "text" if isinstance(value, str) else "too large" if isinstance(value, int) else repr(value)


class ManifestRank(msgspec.Struct, forbid_unknown_fields=False):
    rank: Rank
    status: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    trace_files: list[str] = []


class Manifest(msgspec.Struct, forbid_unknown_fields=False):
    """``manifest.json``: the run as the launchers saw it (``ddpdoctor.capture.manifest`` writes it)."""

    schema_version: int = SCHEMA_VERSION
    world_size: Size | None = None
    exit_code: int | None = None
    ranks: list[ManifestRank] = []


# --- dumps/rank<R>.<id>.json: what one rank was doing when a dump was asked for (issue 24) ----------------------
# Written by the capture (``ddpdoctor.capture.flight``) on a hang, an exception, a signal or on demand; read by
# ``ddpdoctor.flight`` (which also reads torch's own Flight Recorder dumps of jobs not run under ddpdoctor).
class Frame(msgspec.Struct, forbid_unknown_fields=False):
    """One Python frame: file, line, function name."""

    file: str
    line: Annotated[int, msgspec.Meta(ge=0, lt=1 << 31)] = 0
    name: str = ""


class ThreadStack(msgspec.Struct, forbid_unknown_fields=False):
    """One thread's Python stack at the dump, outermost frame first (as ``traceback.extract_stack``)."""

    name: str
    ident: Int64 = 0
    main: bool = False
    frames: list[Frame] = []


class DumpException(msgspec.Struct, forbid_unknown_fields=False):
    """The exception a rank raised (``reason == "exception"``): type, message, its traceback outermost first."""

    type: str
    message: str = ""
    frames: list[Frame] = []


class FlightEntry(msgspec.Struct, forbid_unknown_fields=False):
    """One Flight Recorder entry, with torch's own field names (``_dump_fr_trace_json`` / the pickle dump).
    ``frames``: the Python stack that issued the collective, outermost first (torch's pickle dump lists them
    innermost first; the writer reverses them). Sizes and dtypes are recorded by gloo and NCCL alike here."""

    collective_seq_id: Int64 = 0
    p2p_seq_id: Int64 = 0
    op_id: Int64 = 0
    record_id: Int64 = 0
    pg_id: Int64 = 0
    process_group: list[str] = []  # [pg name, pg description], e.g. ["0", "default_pg"]
    profiling_name: str = ""  # "gloo:all_reduce", "nccl:all_reduce"
    state: str = ""  # "scheduled", "started", "completed"
    is_p2p: bool = False
    retired: bool = False
    input_sizes: list[list[Int64]] = []
    input_dtypes: list[str] = []
    output_sizes: list[list[Int64]] = []
    output_dtypes: list[str] = []
    time_created_ns: Int64 = 0
    time_discovered_started_ns: Int64 | None = None
    time_discovered_completed_ns: Int64 | None = None
    timeout_ms: Int64 | None = None
    thread_name: str = ""
    frames: list[Frame] = []


class FlightRecord(msgspec.Struct, forbid_unknown_fields=False):
    """A rank's Flight Recorder buffer(s) as torch dumped them: ``pg_config`` (pg name -> {name, desc, ranks}),
    ``pg_status`` (pg id -> last enqueued/started/completed collective seq id), ``entries`` oldest first."""

    source: str = "gloo"  # "gloo" | "nccl": which buffer (a rank may have both: one record each)
    version: str = ""
    pg_config: dict[str, Any] = {}
    pg_status: dict[str, Any] = {}
    entries: list[FlightEntry] = []


class FlightDump(msgspec.Struct, forbid_unknown_fields=False):
    """``dumps/rank<R>.<id>.json``: one rank at one moment. ``reason``: "hang" (a rank made no step for the hang
    timeout and every rank was asked to dump), "exception", "signal", "on_demand", "exit". ``step``: the steps the
    rank had completed; ``phase``: where in the iteration it was ("data", "forward", "backward", "optimizer",
    "outside": before the first step or between steps' hooks), since ``phase_since`` (unix seconds).
    ``flight_recorder``: one record per buffer; empty when the torch in the rank has none (``fr_error`` says why)."""

    schema_version: int = SCHEMA_VERSION
    rank: Rank = 0
    world_size: Size = 1
    pid: int = 0
    host: str = ""
    request: str = ""  # the id of the request this dump answers ("" for a dump the rank made on its own)
    reason: str = "on_demand"
    time: Finite = 0.0  # unix seconds
    step: Step = 0
    phase: str = "outside"
    phase_since: Finite | None = None
    last_step_end: Finite | None = None
    exception: DumpException | None = None
    threads: list[ThreadStack] = []
    flight_recorder: list[FlightRecord] = []
    fr_error: str | None = None
