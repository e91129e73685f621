"""The types of the run-directory files that more than one part reads: ``ranks/rank<R>.json`` (``RankCapture``),
``ranks/rank<R>.summary.json`` (``RankSummary``) and ``manifest.json`` (``Manifest``). The capture writes through
them and every reader reads through them (``ddpdoctor.rundir``, which re-exports them with the layout)."""

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


class StepRecord(msgspec.Struct, forbid_unknown_fields=False):
    """``steps`` of a rank capture: how steps were counted and every step's wall time (ms)."""

    source: str | None = None
    count: int | None = None
    first: int = 1
    wall_ms: list[Number] = []
    profiled: list[tuple[int, int]] = []

    def __post_init__(self) -> None:
        if (None in self.wall_ms or not _all_plain(self.wall_ms, text=False)) and not all(
            _plain_value(v, text=False) and v is not None for v in self.wall_ms
        ):
            raise ValueError("steps.wall_ms holds a value that is not a finite number")


class RankCapture(msgspec.Struct, forbid_unknown_fields=False):
    """``ranks/rank<R>.json``: what the capture recorded in rank R (layout in the module docstring). Nested
    records a single part reads (memory, GIL, DDP logging data, set-up observations) stay plain objects."""

    rank: Rank
    schema_version: int = SCHEMA_VERSION
    ddpdoctor_version: str | None = None
    local_rank: int | None = None
    world_size: Size | None = None
    local_world_size: int | None = None
    node_rank: int | None = None
    hostname: str | None = None
    pid: int | None = None
    status: str | None = None
    exit_code: int | None = None
    error: str | None = None
    backend: str | None = None
    device: str | None = None
    steps: StepRecord | None = None
    memory: dict[str, Any] | None = None
    gil: dict[str, Any] | None = None
    ddp: list[dict[str, Any]] = []
    dp: list[dict[str, Any]] = []
    setup: dict[str, Any] | None = None
    threads: dict[str, Any] | None = None
    trace_files: list[str] = []
    torch_version: str | None = None
    cuda_available: bool | None = None
    capture_errors: list[str] = []


class DeviceMemory(msgspec.Struct, forbid_unknown_fields=False):
    device: str
    peak_allocated_bytes: Number | None = None
    peak_reserved_bytes: Number | None = None
    capacity_bytes: Number | None = None


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

    def __post_init__(self) -> None:
        for table in ("per_step", "collectives"):
            lengths = {len(column) for column in getattr(self, table).values()}
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
                    if not all(_plain_value(v, text=key == "kind") for v in values):
                        raise ValueError(f"{table}.{key} holds a value that is not a finite number")


# Numbers as msgspec decodes them from JSON: floats are always finite (it refuses NaN, Infinity and 1e400), integers
# bounded here to int64 (larger ones, rare, are checked the slow way).
_WireNumber = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)] | float


class RankSummaryWire(RankSummary):
    """``RankSummary`` as ``rundir.read_summaries`` decodes a file with msgspec: numbers finite by their type (the
    check left is where text may be), and ``distributed_info``'s values left undecoded (``msgspec.Raw``), so that
    the process groups' rank lists (16,384 numbers in each rank's file of a 16,384-rank job) are decoded once for
    all the ranks that hold the same ones. A file this refuses is read as a ``RankSummary``, which says why."""

    distributed_info: dict[str, msgspec.Raw] | None = None  # type: ignore[assignment]
    metrics: dict[str, _WireNumber | bool | str | None] = {}  # type: ignore[assignment]
    per_step: dict[str, list[_WireNumber | bool | str | None]] = {}  # type: ignore[assignment]
    collectives: dict[str, list[_WireNumber | bool | str | None]] = {}  # type: ignore[assignment]

    def __post_init__(self) -> None:
        for table in (self.per_step, self.collectives):
            if len({len(column) for column in table.values()}) > 1:
                raise ValueError("columns of different lengths")
        if self.per_step and "step_ms" not in self.per_step:
            raise ValueError("per_step has no step_ms column")
        if str in set(map(type, self.metrics.values())) and any(
            isinstance(v, str) and _metric_kind(k) != "text" for k, v in self.metrics.items()
        ):
            raise ValueError("text in a numeric metric")
        for table in (self.per_step, self.collectives):
            for key, column in table.items():
                if key != "kind" and str in set(map(type, column)):
                    raise ValueError("text in a numeric column")


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
    """The quick test of a summary's columns (text only in ``kind``), all columns at once."""
    numbers = [v for t in tables for k, col in t.items() if k != "kind" for v in (col,)]
    return _all_plain(list(itertools.chain.from_iterable(numbers)), text=False) and all(
        _all_plain(t["kind"], text=True) for t in tables if "kind" in t
    )


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
