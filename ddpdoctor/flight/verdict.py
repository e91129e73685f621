"""What ``ddpdoctor.flight.analyze`` decides from the ranks' dumps: the types F2 (the launcher's hang report) and G2
(findings and reports) read. Pure data, no I/O.

- ``CollectiveRef``: one collective of one process group as a rank issued it.
- ``RankState``: where one rank was at its dump.
- ``Mismatch``: ranks that issued different things at the same sequence id of a process group.
- ``HealthVerdict``: the decision (hang / desync / crash / ok / undecided), who is the cause, who waits for them,
  and the evidence and notes it rests on.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddpdoctor.runfile_types import Frame

__all__ = ["CollectiveRef", "Frame", "HealthVerdict", "Mismatch", "RankState", "frame_text"]

# RankState.state values
IN_COLLECTIVE = "in_collective"
OUTSIDE = "outside"
EXITED = "exited"
CRASHED = "crashed"
CONSEQUENCE = "consequence"
NO_DUMP = "no_dump"
RANK_STATES = (IN_COLLECTIVE, OUTSIDE, EXITED, CRASHED, CONSEQUENCE, NO_DUMP)

# HealthVerdict.kind values
KINDS = ("hang", "desync", "crash", "ok", "undecided")


def frame_text(frame: Frame | None) -> str:
    """``read_shard (train.py:14)``: a frame as a user reads it (the file's base name)."""
    if frame is None:
        return "?"
    base = frame.file.replace("\\", "/").rsplit("/", 1)[-1] or frame.file
    return f"{frame.name or '?'} ({base}:{frame.line})"


@dataclass(frozen=True)
class CollectiveRef:
    """One collective of one process group."""

    pg: str  # "default_pg" / the group's name or description as the FR has it
    seq_id: int  # collective_seq_id (p2p_seq_id for p2p ops)
    op: str  # "all_reduce", "broadcast", ... (backend prefix stripped)
    backend: str  # "gloo" | "nccl" | ""
    sizes: tuple | None  # input sizes as recorded, None when not recorded
    dtypes: tuple | None
    frame: Frame | None  # innermost frame of the user's own code that issued it (not torch/ddpdoctor)

    def describe(self) -> str:
        """``all_reduce #25 (default_pg) [1] Float``."""
        text = f"{self.op} #{self.seq_id} ({self.pg})"
        shape = describe_shape(self.sizes, self.dtypes)
        return f"{text} {shape}" if shape else text


def describe_shape(sizes: tuple | None, dtypes: tuple | None) -> str:
    """``[1] Float`` / ``[4, 4] Float, [2] Long`` / "" when nothing was recorded."""
    if not sizes and not dtypes:
        return ""
    sizes = tuple(sizes or ())
    dtypes = tuple(dtypes or ())
    parts = []
    for i in range(max(len(sizes), len(dtypes))):
        size = "[" + ", ".join(str(n) for n in sizes[i]) + "]" if i < len(sizes) else ""
        dtype = dtypes[i] if i < len(dtypes) else ""
        parts.append(" ".join(p for p in (size, dtype) if p))
    return ", ".join(parts)


@dataclass(frozen=True)
class RankState:
    """Where one rank was at its dump."""

    rank: int
    # "in_collective" | "outside" (not inside any collective: stuck in its own code) | "exited" (returned from main /
    # finished) | "crashed" | "consequence" (failed because a peer died) | "no_dump"
    state: str
    step: int | None
    phase: str | None
    since_s: float | None  # how long it had been in that state at the dump
    collective: CollectiveRef | None
    frames: tuple[Frame, ...]  # the main thread's frames in the user's own code, innermost first
    exception: str | None  # "RuntimeError: ..." for crashed/consequence


@dataclass(frozen=True)
class Mismatch:
    """Ranks that issued different things at one sequence id of one process group."""

    pg: str
    seq_id: int
    kind: str  # "op" | "size" | "dtype" | "missing" (a rank never issued it)
    by_rank: dict[int, str]  # what each rank issued there, e.g. {0: "all_reduce [1] Float", 1: "broadcast [4] Float"}


@dataclass(frozen=True)
class HealthVerdict:
    """The decision over all ranks' dumps."""

    kind: str  # "hang" | "desync" | "crash" | "ok" | "undecided"
    culprits: tuple[int, ...]  # the cause(s); empty when undecided/ok
    waiting: tuple[int, ...]  # ranks waiting because of them
    collective: CollectiveRef | None  # what the waiting ranks wait in
    mismatches: tuple[Mismatch, ...]
    ranks: dict[int, RankState]
    summary: str  # one line a user reads first
    evidence: tuple[str, ...] = ()  # the facts it rests on, one line each
    notes: tuple[str, ...] = ()  # what could not be decided and why

    @property
    def failed(self) -> bool:
        """A verdict a report leads with (anything but ok/undecided)."""
        return self.kind in ("hang", "desync", "crash")
