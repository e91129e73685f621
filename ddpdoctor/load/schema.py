"""msgspec types for the parts of a Kineto Chrome trace that ddpdoctor reads; every other field is skipped
unparsed.

An event is decoded by its phase (``ph``, a tagged union): complete events (``"X"``) into ``Complete``, instants
(``"i"``/``"I"``, for ``[memory]``) into ``Instant``, metadata (``"M"``) into ``Metadata``, each with the ``args``
keys ddpdoctor reads of that kind; every other phase (flows, counters, async...) into an empty struct, its fields
skipped. These are the strict, fast types. Traces whose values do not fit them (a string where a number is
expected, a phase that is no Chrome phase, no ``ph``) are decoded again with ``LooseEvent`` and coerced field by
field into the same types (``loosen``); a value that fits gives the same result either way.
"""

from __future__ import annotations

import math
from typing import Any, Union

import msgspec

_NO_RAW = msgspec.Raw(b"")


class Args(msgspec.Struct, gc=False):
    """The ``args`` keys ddpdoctor reads of a complete ("X") event; ints default to -1 ("absent"), strings to
    None."""

    external_id: int = msgspec.field(default=-1, name="External id")
    external_id_v1: int = msgspec.field(default=-1, name="external id")  # torch 1.9 device events
    correlation: int = -1
    device: int = -1
    stream: int = -1
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


class MemoryArgs(msgspec.Struct, gc=False):
    """The ``args`` of a ``[memory]`` instant."""

    bytes: int = msgspec.field(default=0, name="Bytes")
    total_allocated: int | None = msgspec.field(default=None, name="Total Allocated")
    total_reserved: int | None = msgspec.field(default=None, name="Total Reserved")
    device_type: int = msgspec.field(default=-1, name="Device Type")
    device_id: int = msgspec.field(default=-1, name="Device Id")


class MetaArgs(msgspec.Struct, gc=False):
    """The ``args`` of a metadata event (``thread_name``, ``process_labels``)."""

    name: str | None = None
    labels: str | None = None


class Complete(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    cat: str | None = None
    name: str = ""
    ts: float = 0.0
    dur: float = 0.0
    pid: int | str = 0
    tid: int | str = 0
    args: Args = msgspec.field(default_factory=Args)


class Instant(msgspec.Struct, gc=False, tag_field="ph", tag="i"):
    name: str = ""
    ts: float = 0.0
    pid: int | str = 0
    tid: int | str = 0
    args: MemoryArgs = msgspec.field(default_factory=MemoryArgs)


class OldInstant(Instant, tag="I"):
    """``"I"``, the instant's phase in older traces."""


class Metadata(msgspec.Struct, gc=False, tag_field="ph", tag="M"):
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    args: MetaArgs = msgspec.field(default_factory=MetaArgs)


# The other phases of the Chrome trace format: counted, their fields skipped.
OTHER_PHASES = "BEbneSTpFstfPCONDVvRc()"
OTHER_TYPES = tuple(msgspec.defstruct(f"Phase_{ord(ph)}", [], gc=False, tag_field="ph", tag=ph) for ph in OTHER_PHASES)
EVENT_TYPES: tuple[type[msgspec.Struct], ...] = (Complete, Instant, OldInstant, Metadata, *OTHER_TYPES)
Event = Union[EVENT_TYPES]  # noqa: UP007 (a union built from a tuple)


class Ignored(msgspec.Struct, gc=False):
    """What ``loosen`` makes of an event of any other phase (none, or one that is not a string)."""


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
    otherData: Any = None


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


def _loose_args(cls: type[msgspec.Struct], args: Any) -> Any:
    """``args`` (any JSON value) as ``cls``: the values that fit its fields, coerced; defaults for the rest."""
    kw: dict[str, Any] = {}
    if isinstance(args, dict):
        for attr, key in zip(cls.__struct_fields__, cls.__struct_encode_fields__, strict=True):
            if key not in args:
                continue
            value = args[key]
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
    return cls(**kw)


_IGNORED = Ignored()


def loosen(event: LooseEvent) -> Any:
    """Coerce one loosely decoded event into the type its phase decodes to (values that do not fit become
    defaults); ``Ignored`` for a phase ddpdoctor does not read."""
    ph = event.ph if isinstance(event.ph, str) else ""
    if ph == "X":
        return Complete(
            cat=event.cat if isinstance(event.cat, str) else None,
            name=_to_name(event.name),
            ts=_to_float(event.ts),
            dur=_to_float(event.dur),
            pid=_to_id(event.pid),
            tid=_to_id(event.tid),
            args=_loose_args(Args, event.args),
        )
    if ph == "i" or ph == "I":
        return (Instant if ph == "i" else OldInstant)(
            name=_to_name(event.name),
            ts=_to_float(event.ts),
            pid=_to_id(event.pid),
            tid=_to_id(event.tid),
            args=_loose_args(MemoryArgs, event.args),
        )
    if ph == "M":
        return Metadata(
            name=_to_name(event.name),
            pid=_to_id(event.pid),
            tid=_to_id(event.tid),
            args=_loose_args(MetaArgs, event.args),
        )
    return _IGNORED


def _to_name(value: Any) -> str:
    return value if isinstance(value, str) else str(value)
