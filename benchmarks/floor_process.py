"""The floor: the least a program must do to read a set of Kineto traces, as one cold process.

    python benchmarks/floor_process.py FILE [FILE ...]

Gunzip with ISA-L (``isal``) and decode each whole document with msgspec into typed structs holding only the
fields ddpdoctor reads (the same types, by phase, with the same fields and JSON names as
``ddpdoctor/load/schema.py``; tests/unit/test_benchmarks_smoke.py checks they agree), then drop it. Nothing is
computed from the events. It imports nothing of ddpdoctor (whose package would bring numpy), so its time is
interpreter start-up, two small extension modules, inflating and decoding: ``benchmarks/bench_floor.py`` compares
a cold ``ddpdoctor diagnose`` of the same files with this. Prints the number of events decoded.
"""

from __future__ import annotations

import sys
from typing import Any, Union

import msgspec
from isal import igzip

_NO_RAW = msgspec.Raw(b"")


class Args(msgspec.Struct, gc=False):
    external_id: int = msgspec.field(default=-1, name="External id")
    external_id_v1: int = msgspec.field(default=-1, name="external id")
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
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")


class MemoryArgs(msgspec.Struct, gc=False):
    bytes: int = msgspec.field(default=0, name="Bytes")
    total_allocated: int | None = msgspec.field(default=None, name="Total Allocated")
    total_reserved: int | None = msgspec.field(default=None, name="Total Reserved")
    device_type: int = msgspec.field(default=-1, name="Device Type")
    device_id: int = msgspec.field(default=-1, name="Device Id")


class MetaArgs(msgspec.Struct, gc=False):
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
    pass


class Metadata(msgspec.Struct, gc=False, tag_field="ph", tag="M"):
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    args: MetaArgs = msgspec.field(default_factory=MetaArgs)


OTHER_PHASES = "BEbneSTpFstfPCONDVvRc()"
OTHER_TYPES = tuple(msgspec.defstruct(f"Phase_{ord(ph)}", [], gc=False, tag_field="ph", tag=ph) for ph in OTHER_PHASES)
EVENT_TYPES = (Complete, Instant, OldInstant, Metadata, *OTHER_TYPES)
Event = Union[EVENT_TYPES]  # noqa: UP007


class Trace(msgspec.Struct):
    traceEvents: list[Event] = []
    deviceProperties: Any = None
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    otherData: Any = None  # ddpdoctor reads it too (its own Perfetto export names the ranks there)


def main(paths: list[str]) -> int:
    decoder = msgspec.json.Decoder(Trace)
    events = 0
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        if data[:2] == b"\x1f\x8b":
            data = igzip.decompress(data)
        events += len(decoder.decode(data).traceEvents)
    print(events)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
