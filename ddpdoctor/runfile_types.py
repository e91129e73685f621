"""The types of the run-directory files that more than one part reads: ``ranks/rank<R>.json`` (``RankCapture``),
``ranks/rank<R>.summary.json`` (``RankSummary``) and ``manifest.json`` (``Manifest``). The capture writes through
them and every reader reads through them (``ddpdoctor.rundir``, which re-exports them with the layout)."""

from __future__ import annotations

import math
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
        if not all(_plain_value(v, text=False) and v is not None for v in self.wall_ms):
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
        for key, value in self.metrics.items():
            if not _plain_value(value, text=_metric_kind(key) == "text"):
                raise ValueError(f"metric {key} is {_kind_of(value)}, not a finite number")
        for table in ("per_step", "collectives"):
            for key, values in getattr(self, table).items():
                if not all(_plain_value(v, text=key == "kind") for v in values):
                    raise ValueError(f"{table}.{key} holds a value that is not a finite number")


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
