"""One rank's view of its Flight Recorder dump, as ``flight.analyze`` decides over it: its process groups (each
collective by sequence id, the last enqueued and completed from the FR's ``pg_status``, the members from its
``pg_config``) and its main thread's stack; and from that view, the rank's state (``rank_state``: crashed, a
consequence of a peer, waiting in a collective, in its own code, exited, no dump)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ddpdoctor.flight import frames as fr
from ddpdoctor.flight import words
from ddpdoctor.flight.verdict import (
    CONSEQUENCE,
    CRASHED,
    EXITED,
    IN_COLLECTIVE,
    NO_DUMP,
    OUTSIDE,
    CollectiveRef,
    RankState,
    describe_shape,
)
from ddpdoctor.runfile_types import FlightDump, FlightEntry, Frame

# Exceptions a rank gets because of a peer (its death, or a collective that never completed): consequences.
_CONSEQUENCE_TYPES = ("DistBackendError", "DistNetworkError", "DistStoreError")
_CONSEQUENCE_TEXT = re.compile(
    r"connection closed by peer|connection reset by peer|broken pipe|remote process exited|"
    r"connection refused|socket closed|timed out waiting|operation timed out|timeout|"
    r"communicator was aborted|watchdog caught collective operation timeout|ncclRemoteError|"
    r"process group .*aborted|sigterm|terminated by ddpdoctor|stopped by ddpdoctor",
    re.IGNORECASE,
)


def is_consequence(exc_type: str, message: str) -> bool:
    """An exception a rank raises because of a peer (a dead peer's closed connection, a collective timeout)."""
    return exc_type.rsplit(".", 1)[-1] in _CONSEQUENCE_TYPES or bool(_CONSEQUENCE_TEXT.search(message or ""))


@dataclass
class Group:
    """One process group as one rank's FR saw it."""

    name: str  # the key across ranks (the pg's name)
    label: str  # what a user reads (its description, or its name)
    backend: str
    entries: dict[int, FlightEntry] = field(default_factory=dict)  # collective seq -> entry (no p2p)
    last_enqueued: int = -1
    last_completed: int = -1
    members: tuple[int, ...] | None = None

    @property
    def pending(self) -> int | None:
        """The oldest collective this rank issued that had not completed, or None."""
        return self.last_completed + 1 if self.last_enqueued > self.last_completed else None


@dataclass
class RankView:
    """One rank: its dump (None without one), its status in the manifest, its process groups and main stack."""

    rank: int
    dump: FlightDump | None
    status: Mapping[str, Any]
    groups: dict[str, Group] = field(default_factory=dict)
    main_frames: list[Frame] = field(default_factory=list)  # outermost first
    has_stack: bool = False


def op_of(name: str) -> tuple[str, str]:
    """(op, backend) of an FR profiling name such as ``gloo:all_reduce`` / ``nccl:broadcast``."""
    backend, _, op = name.rpartition(":")
    return (op or name or "?"), backend


def as_int(value: Any, default: int = -1) -> int:
    """``int(value)``, or ``default`` where it is not a number."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def pg_label(entry: FlightEntry) -> tuple[str, str]:
    """(the process group's name, what a user reads: its description, else its name) of an FR entry."""
    pg = entry.process_group
    name = pg[0] if pg else str(entry.pg_id)
    desc = pg[1] if len(pg) > 1 else ""
    if desc in ("", "undefined"):
        desc = ""
    return name, (desc or name or "default_pg")


def members_of(config: Mapping[str, Any], name: str, label: str) -> tuple[int, ...] | None:
    """The ranks of a process group from the FR's ``pg_config`` (by name, else by description), where listed."""
    conf = config.get(name)
    if not isinstance(conf, Mapping):
        conf = next((c for c in config.values() if isinstance(c, Mapping) and c.get("desc") == label), None)
    if not isinstance(conf, Mapping):
        return None
    ranks = conf.get("ranks")
    if isinstance(ranks, str):
        try:
            ranks = json.loads(ranks)
        except ValueError:
            return None
    if isinstance(ranks, list) and ranks and all(isinstance(r, int) for r in ranks):
        return tuple(ranks)
    return None


def rank_view(rank: int, dump: FlightDump | None, status: Mapping[str, Any]) -> RankView:
    """The rank's view of its dump: its main thread's stack and its process groups' collectives (no p2p), the
    last enqueued and completed of each from ``pg_status``, else from the entries' own states (NCCL)."""
    view = RankView(rank, dump, status)
    if dump is None:
        return view
    main = next((t for t in dump.threads if t.main), None)
    if main is None and dump.threads:
        main = next((t for t in dump.threads if t.name == "MainThread"), None)
    if main is not None:
        view.main_frames = list(main.frames)
        view.has_stack = True
    for record in dump.flight_recorder:
        status_by_id = record.pg_status or {}
        for entry in record.entries:
            if entry.is_p2p:
                continue
            name, label = pg_label(entry)
            op, backend = op_of(entry.profiling_name)
            group = view.groups.get(name)
            if group is None:
                group = view.groups[name] = Group(name, label, backend or record.source)
                st = status_by_id.get(str(entry.pg_id))
                if isinstance(st, Mapping):
                    group.last_enqueued = as_int(st.get("last_enqueued_collective"))
                    group.last_completed = as_int(st.get("last_completed_collective"))
                group.members = members_of(record.pg_config or {}, name, label)
            group.entries[entry.collective_seq_id] = entry
        for group in view.groups.values():
            if group.entries:
                top = max(group.entries)
                if group.last_enqueued < top:
                    group.last_enqueued = top
                # NCCL (and a pg_status that lacks it): completion from the entries' own states
                if group.last_completed < 0 and not status_by_id:
                    done = [s for s, e in group.entries.items() if e.state == "completed"]
                    group.last_completed = max(done) if done else min(group.entries) - 1
    return view


def collective_ref(group: Group, seq: int) -> CollectiveRef:
    """Collective ``seq`` of ``group`` as a verdict names it (op, sizes, dtypes, the user's frame that issued it)."""
    entry = group.entries.get(seq)
    if entry is None:
        return CollectiveRef(group.label, seq, "?", group.backend, None, None, None)
    op, backend = op_of(entry.profiling_name)
    sizes = tuple(tuple(s) for s in entry.input_sizes) if entry.input_sizes or entry.input_dtypes else None
    dtypes = tuple(entry.input_dtypes) if entry.input_dtypes else None
    if sizes is None and op not in ("barrier",):
        sizes = None
    return CollectiveRef(
        group.label, seq, op, backend or group.backend, sizes, dtypes, fr.innermost_user_frame(entry.frames)
    )


def issued(group: Group, seq: int) -> str:
    """What the rank issued as collective ``seq`` of ``group``, in words (op and shape)."""
    entry = group.entries[seq]
    op, _ = op_of(entry.profiling_name)
    shape = describe_shape(tuple(tuple(s) for s in entry.input_sizes), tuple(entry.input_dtypes))
    return f"{op} {shape}".strip()


# --- the rank's state ------------------------------------------------------------------------------------------


def exception_of(view: RankView) -> tuple[str, str] | None:
    """(type, message) of the exception the rank raised: from its dump, else from its status in the manifest."""
    d = view.dump
    if d is not None and d.exception is not None:
        return d.exception.type, d.exception.message
    status = view.status
    if status.get("status") in ("failed", "died") and status.get("reason"):
        text = str(status["reason"])
        typ, sep, msg = text.partition(": ")
        if sep and re.fullmatch(r"[A-Za-z_][\w.]*", typ):
            return typ, msg
        return "", text
    return None


def rank_state(view: RankView, weak: set[int]) -> RankState:
    """What the rank was doing at its dump (or at its end, without one). A rank that died without saying how
    (no exception, no exit code) is added to ``weak``: a cause only when nothing better is known."""
    d = view.dump
    rank = view.rank
    # torch's own dump: no step, phase or stacks; a fatal-signal record: stacks only
    # a fatal-signal record: its "where" line, kept by the phase tracker to the signal (phase "unknown" without)
    located = d is not None and d.reason == "fatal" and d.phase != "unknown"
    foreign = d is not None and d.reason in ("torch", "fatal") and not located
    got = d.step if d is not None and not foreign else as_int(view.status.get("steps"), -1)
    if d is not None and d.reason == "fatal" and not located:
        got = -1  # the rank file's step count is the one it last wrote, not the step the signal came in
    step = got if got >= 0 else None
    phase = d.phase if d is not None and not foreign else None
    since = (d.time - d.phase_since) if d is not None and d.phase_since else None
    user = fr.user_frames(view.main_frames)
    exc = exception_of(view)
    exc_text = (f"{exc[0]}: {exc[1]}" if exc[0] else exc[1]).strip() if exc else None
    if d is not None and d.exception is not None and d.exception.frames and not user:
        user = fr.user_frames(d.exception.frames)
    elif d is not None and d.exception is not None and d.exception.frames:
        user = fr.user_frames(d.exception.frames) or user
    pending = pending_collective(view)
    if exc is not None and (d is None or d.reason == "exception" or d.exception is not None):
        state = CONSEQUENCE if is_consequence(*exc) else CRASHED
        if state == CONSEQUENCE and pending is None:
            pending = last_collective(view)  # the collective that failed: gloo counts it completed
        return RankState(rank, state, step, phase, None, pending, user, exc_text[:2000] if exc_text else None)
    if d is None:
        st = view.status.get("status")
        exit_code = view.status.get("exit_code")
        if st == "ok" or (st in (None, "unknown") and exit_code == 0):
            return RankState(rank, EXITED, step, None, None, None, (), None)
        if st == "failed" and not view.status.get("stopped_by") and not words.stopped(exit_code):
            if not isinstance(exit_code, int) or exit_code == 0:
                weak.add(rank)  # died without saying how: a cause only when nothing better is known
            why = str(view.status.get("reason") or "") or words.exit_text(exit_code)
            return RankState(rank, CRASHED, step, None, None, None, (), why)
        return RankState(rank, NO_DUMP, step, None, None, None, (), None)
    if d.reason == "exit":
        return RankState(rank, EXITED, step, phase, since, None, (), None)
    below = fr.below_user(view.main_frames) if view.has_stack else []
    blocked_in_torch = fr.in_torch_wait(below)
    if pending is not None and (blocked_in_torch or not view.has_stack):
        wait = waited_s(view, pending)
        return RankState(rank, IN_COLLECTIVE, step, phase, wait, pending, user, None)
    return RankState(rank, OUTSIDE, step, phase, since, pending, user, None)


def pending_collective(view: RankView) -> CollectiveRef | None:
    """The oldest collective of any of the rank's groups that it issued and that had not completed."""
    best = None
    for group in view.groups.values():
        seq = group.pending
        if seq is not None:
            ref = collective_ref(group, seq)
            entry = group.entries.get(seq)
            key = entry.time_created_ns if entry is not None else 0
            if best is None or key < best[0]:
                best = (key, ref)
    return best[1] if best else None


def last_collective(view: RankView) -> CollectiveRef | None:
    """The collective the rank issued last, in any group."""
    best = None
    for group in view.groups.values():
        if group.entries:
            seq = max(group.entries)
            key = group.entries[seq].time_created_ns
            if best is None or key > best[0]:
                best = (key, collective_ref(group, seq))
    return best[1] if best else None


def waited_s(view: RankView, ref: CollectiveRef) -> float | None:
    """How long before its dump the rank issued ``ref`` (s), where both times are known."""
    d = view.dump
    for group in view.groups.values():
        if group.label == ref.pg:
            entry = group.entries.get(ref.seq_id)
            if entry is not None and entry.time_created_ns and d is not None and d.time:
                return max(0.0, d.time - entry.time_created_ns / 1e9)
    return None
