"""Reading Flight Recorder dumps and deciding what they show (issue 24): ``find_dumps`` (a run directory's dumps,
or torch's own dump files), ``analyze`` (-> ``HealthVerdict``). Pure functions: no I/O but reading files."""

from ddpdoctor.flight.analyze import analyze, is_consequence
from ddpdoctor.flight.read import DumpSet, find_dumps, read_torch_dump
from ddpdoctor.flight.verdict import CollectiveRef, Frame, HealthVerdict, Mismatch, RankState, frame_text

__all__ = [
    "CollectiveRef",
    "DumpSet",
    "Frame",
    "HealthVerdict",
    "Mismatch",
    "RankState",
    "analyze",
    "find_dumps",
    "frame_text",
    "is_consequence",
    "read_torch_dump",
]
