"""msgspec types for the parts of a Kineto Chrome trace that ddpdoctor reads; every other field is skipped
unparsed.

``Event``/``Args`` are the strict, fast types. Traces whose values do not fit them (a string where a number is
expected, say) are decoded again with ``LooseEvent`` and coerced field by field.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

_NO_RAW = msgspec.Raw(b"")


class Args(msgspec.Struct, gc=False):
    """The few ``args`` keys ddpdoctor uses; ints default to -1 ("absent"), strings to None."""

    external_id: int = msgspec.field(default=-1, name="External id")
    external_id_v1: int = msgspec.field(default=-1, name="external id")  # torch 1.9 device events
    correlation: int = -1
    device: int = -1
    stream: int = -1
    bytes: int = msgspec.field(default=0, name="Bytes")
    total_allocated: int | None = msgspec.field(default=None, name="Total Allocated")
    total_reserved: int | None = msgspec.field(default=None, name="Total Reserved")
    device_type: int = msgspec.field(default=-1, name="Device Type")
    device_id: int = msgspec.field(default=-1, name="Device Id")
    in_nelems: int = msgspec.field(default=-1, name="In msg nelems")
    out_nelems: int = msgspec.field(default=-1, name="Out msg nelems")
    group_size: int = msgspec.field(default=-1, name="Group size")
    dtype: str | None = None
    collective_name: str | None = msgspec.field(default=None, name="Collective name")
    pg_name: str | None = msgspec.field(default=None, name="Process Group Name")
    seq: int = msgspec.field(default=-1, name="Seq")
    # kept raw: decoded only for the few collective calls that need them
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    # metadata ("M") events
    name: str | None = None
    labels: str | None = None


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str | None = None
    name: str = ""
    ts: float = 0.0
    dur: float = 0.0
    pid: int | str = 0
    tid: int | str = 0
    args: Args | None = None


class LooseEvent(msgspec.Struct, gc=False):
    ph: Any = ""
    cat: Any = None
    name: Any = ""
    ts: Any = 0.0
    dur: Any = 0.0
    pid: Any = 0
    tid: Any = 0
    args: Any = None


class Header(msgspec.Struct):
    """The top-level trace object; ``traceEvents`` stays raw and is decoded in chunks."""

    traceEvents: msgspec.Raw = _NO_RAW  # empty when the key is missing
    deviceProperties: Any = None
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None


_ARG_FIELDS = {
    f: (Args.__struct_encode_fields__[i]) for i, f in enumerate(Args.__struct_fields__)
}
_INT_FIELDS = {
    "external_id",
    "external_id_v1",
    "correlation",
    "device",
    "stream",
    "bytes",
    "device_type",
    "device_id",
    "in_nelems",
    "out_nelems",
    "group_size",
    "seq",
}
_OPT_INT_FIELDS = {"total_allocated", "total_reserved"}
_RAW_FIELDS = {"input_dims", "input_type"}


_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_MAX_RANK = 2**20  # larger ranks and world sizes are not real (and must not size anything)


def valid_rank(value: Any) -> int | None:
    """A rank as a trace may state it: a non-negative int (not a bool), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MAX_RANK:
        return value
    return None


def valid_world_size(value: Any) -> int | None:
    """A world size as a trace or capture file may state it: a positive int (not a bool), else None."""
    size = valid_rank(value)
    return size if size else None


def clean_distributed_info(info: dict[str, Any]) -> dict[str, Any]:
    """``distributedInfo`` without a rank, world size or backend of the wrong type (everything else as is)."""
    out = dict(info)
    if "rank" in out and valid_rank(out["rank"]) is None:
        del out["rank"]
    if "world_size" in out and valid_world_size(out["world_size"]) is None:
        del out["world_size"]
    if "backend" in out and not isinstance(out["backend"], str):
        del out["backend"]
    return out



def _to_int(value: Any, default: int | None) -> int | None:
    """An int64 from a number or numeric string; ``default`` for anything else (bools, beyond int64...)."""
    if isinstance(value, bool):
        return default
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return number if _I64_MIN <= number <= _I64_MAX else default


def _to_float(value: Any) -> float:
    """A finite float from a number or numeric string; NaN for anything else (the decoder skips timed events
    whose time is NaN, and says so)."""
    if isinstance(value, bool):
        return math.nan
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return math.nan
    return number if math.isfinite(number) else math.nan


def _to_id(value: Any) -> int | str:
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    return _to_int(value, 0) or 0


def loosen(event: LooseEvent) -> Event:
    """Coerce one loosely decoded event into an ``Event`` (values that do not fit become defaults)."""
    args = None
    if isinstance(event.args, dict):
        kw: dict[str, Any] = {}
        for attr, key in _ARG_FIELDS.items():
            if key not in event.args:
                continue
            value = event.args[key]
            if attr in _INT_FIELDS:
                converted = _to_int(value, None)
                if converted is not None:
                    kw[attr] = converted
            elif attr in _OPT_INT_FIELDS:
                kw[attr] = _to_int(value, None)
            elif attr in _RAW_FIELDS:
                kw[attr] = msgspec.Raw(msgspec.json.encode(value))
            elif isinstance(value, str):
                kw[attr] = value
        args = Args(**kw)
    return Event(
        ph=event.ph if isinstance(event.ph, str) else "",
        cat=event.cat if isinstance(event.cat, str) else None,
        name=event.name if isinstance(event.name, str) else str(event.name),
        ts=_to_float(event.ts),
        dur=_to_float(event.dur),
        pid=_to_id(event.pid),
        tid=_to_id(event.tid),
        args=args,
    )
