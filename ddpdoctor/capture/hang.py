"""A hang decided by evidence: ask every rank to dump (``dumps/request.json``), wait for the answers, read them
with :func:`ddpdoctor.flight.analyze.analyze`, say what was found, and stop the job.

Who acts: a rank's watchdog (:mod:`ddpdoctor.capture.watchdog`) that sees no step for the hang timeout only writes
the request; the launcher (:class:`ddpdoctor.capture.launcher.HangJudge`: torchrun, ``-- COMMAND``, or the process
that spawned the ranks) sees every local rank, waits for their dumps, prints the verdict and stops them. Where no
ddpdoctor launcher runs (a scheduler started each rank), each rank whose watchdog fired does it for itself.

The timeout: ``--hang-timeout SECONDS``, or by default the larger of :data:`DEFAULT_HANG_S` and
:data:`STEP_FACTOR` times the slowest step seen (a first step that compiles for minutes is not a hang);
``--hang-timeout off`` turns the watchdog off.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from ddpdoctor import liveness, rundir, runfiles
from ddpdoctor.capture.flight import dump_path, request_path
from ddpdoctor.runfile_types import FlightDump

__all__ = ["dump_path", "request_path"]  # the capture's own names of the dump files (ddpdoctor.capture.flight)

DEFAULT_HANG_S = 300.0  # the default hang timeout's floor (seconds)
STEP_FACTOR = 10  # ... or this many times the slowest step seen, whichever is longer
DUMP_WAIT_S = 15.0  # how long the ranks' dumps are waited for
STOP_GRACE_S = 10.0  # SIGTERM, then SIGKILL after this long
DUMPS_DIR = rundir.DUMPS_DIR
SETTLE_S = 0.3  # after writing a hang request: another rank's written at the same moment has replaced it by then
HANG_EXIT = 124  # trace's exit code when ddpdoctor stopped a hung job (as timeout(1))


def timeout_s(explicit: float | None, wall_ms: Iterable[float]) -> float:
    """The hang timeout in seconds: ``explicit`` (``--hang-timeout``), else the default: the larger of
    :data:`DEFAULT_HANG_S` and :data:`STEP_FACTOR` times the slowest step seen (``wall_ms``, ms)."""
    if explicit is not None:
        return float(explicit)
    slowest_ms = max(wall_ms, default=0.0)
    return max(DEFAULT_HANG_S, STEP_FACTOR * slowest_ms / 1e3)


def describe(explicit: float | None, off: bool) -> str:
    """The hang timeout as the trace header states it."""
    if off:
        return "hang timeout off"
    if explicit is not None:
        return f"hang timeout {explicit:g} s"
    return f"hang timeout {DEFAULT_HANG_S:.0f} s or {STEP_FACTOR}x the slowest step, reported (--hang-timeout stops)"


# ---- the request --------------------------------------------------------------------------------------------
def read_request(out: Path) -> dict[str, Any] | None:
    """``dumps/request.json`` as written (None when absent or unreadable)."""
    try:
        data = msgspec.json.decode(rundir.read_regular(request_path(out), limit=1 << 16))
    except (OSError, ValueError, msgspec.DecodeError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("id"), str):
        return None
    return data


def write_request(out: Path, *, reason: str, by: str) -> str:
    """Ask every rank to dump: write ``dumps/request.json`` (atomically); returns the request id."""
    now = time.time()
    ident = f"{'hang' if reason == 'hang' else 'dump'}-{int(now * 1000)}-{os.getpid() % 100000}"
    path = request_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    rundir.atomic_write_json(path, {"id": ident, "reason": reason, "by": by, "time": now})
    return ident


def request_hang(out: Path, *, by: str, since: float) -> tuple[str, bool]:
    """Ask for a hang dump unless a hang request made after ``since`` (unix s: when this rank last stepped) is
    already there (another rank's watchdog fired first: one request, one verdict). Returns (id, written)."""
    current = read_request(out)
    if current is not None and current.get("reason") == "hang" and float(current.get("time") or 0) >= since:
        return str(current["id"]), False
    mine = write_request(out, reason="hang", by=by)
    time.sleep(SETTLE_S)  # two ranks that asked at the same moment: the request left in place is the one
    current = read_request(out)
    if current is not None and current.get("reason") == "hang" and current["id"] != mine:
        return str(current["id"]), False
    return mine, True


# ---- the answers --------------------------------------------------------------------------------------------
def read_dump(path: Path) -> FlightDump | None:
    try:
        return msgspec.json.decode(rundir.read_regular(path), type=FlightDump)
    except (OSError, ValueError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def answers(out: Path, ident: str) -> dict[int, FlightDump]:
    """The dumps that answer request ``ident`` so far, by rank (a file that does not fit its type is left out)."""
    found: dict[int, FlightDump] = {}
    suffix = f".{ident}.json"
    try:
        names = os.listdir(Path(out) / DUMPS_DIR)
    except OSError:
        return found
    for name in names:
        if not (name.startswith("rank") and name.endswith(suffix)):
            continue
        digits = name[4 : -len(suffix)]
        if digits.isdigit():
            dump = read_dump(Path(out) / DUMPS_DIR / name)
            if dump is not None:
                found[int(digits)] = dump
    return found


def wait_for_answers(
    out: Path, ident: str, expected: Iterable[int], *, wait_s: float = DUMP_WAIT_S, alive: Any = None
) -> dict[int, FlightDump]:
    """Wait (at most ``wait_s``) until every rank in ``expected`` answered request ``ident``; the answers found.
    ``alive()``: False when the ranks are all gone (no use waiting further)."""
    want = set(expected)
    deadline = time.monotonic() + wait_s
    while True:
        found = answers(out, ident)
        if want <= set(found) or time.monotonic() >= deadline or (alive is not None and not alive()):
            return found
        time.sleep(0.2)


def running_ranks(out: Path) -> dict[int, dict[str, Any]]:
    """The rank files of ranks still running (they answer requests), by rank."""
    return {r: d for r, d in runfiles.read_rank_captures(Path(out))[0].items() if d.get("status") == "running"}


def world_ranks(out: Path) -> list[int]:
    """Every rank the run's rank files say the job has (their world size), or those present."""
    ranks = runfiles.read_rank_captures(Path(out))[0]
    size = max((int(d.get("world_size") or 1) for d in ranks.values()), default=0)
    return sorted(set(ranks) | set(range(size)))


# ---- the verdict --------------------------------------------------------------------------------------------
def judge(dumps: Mapping[int, FlightDump], world_size: int | None) -> Any:
    """``ddpdoctor.flight.analyze`` of ``dumps``: a ``HealthVerdict``."""
    from ddpdoctor.flight.analyze import analyze

    return analyze(dumps, world_size=world_size)


def verdict_lines(verdict: Any, *, waited_for: Iterable[int] = ()) -> list[str]:
    """The verdict in a few lines: what was found (culprit first), the consequences as consequences, and what
    could not be decided."""
    from ddpdoctor.flight.verdict import frame_text

    lines = [f"{verdict.kind}: {verdict.summary}"]  # the cause first, as analyze words it
    for rank in verdict.culprits:
        state = verdict.ranks.get(rank)
        if state is not None and state.frames:
            where = " <- ".join(frame_text(f) for f in state.frames[:3])
            lines.append(f"  rank {rank} (the cause) at {where}")
    if verdict.waiting:
        ranks = ", ".join(str(r) for r in verdict.waiting)
        lines.append(f"  rank{'s' if len(verdict.waiting) > 1 else ''} {ranks}: waiting for it (a consequence)")
    missing = sorted(set(waited_for) - set(verdict.ranks if verdict.ranks else ()))
    if missing:
        lines.append(f"  no dump from rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}")
    lines += [f"  note: {n}" for n in verdict.notes[:3]]
    return lines


def rank_outcomes(verdict: Any) -> dict[int, tuple[str, str]]:
    """How each rank ended after ddpdoctor stopped the job on ``verdict``: rank -> (status, reason) for the
    manifest. The cause(s) "hung" with where they were; the ranks waiting for them stopped, as consequences."""
    from ddpdoctor.flight.verdict import frame_text

    out: dict[int, tuple[str, str]] = {}
    for rank, state in (verdict.ranks or {}).items():
        if state.collective is not None:
            c = state.collective
            where = f"in {c.op} #{c.seq_id} ({c.pg})"
        elif state.frames:
            where = "at " + " <- ".join(frame_text(f) for f in state.frames[:2])
        else:
            where = ""
        when = f" at step {state.step}" if state.step is not None else ""
        when += f" ({state.phase})" if state.phase else ""
        if rank in verdict.culprits:
            out[rank] = ("hung", f"the cause of the {verdict.kind}: {where}{when}".rstrip(": "))
        elif rank in verdict.waiting:
            waited = f" for {state.since_s:.0f} s" if state.since_s is not None else ""
            out[rank] = ("interrupted", f"waiting {where}{waited} when ddpdoctor stopped the job".replace("  ", " "))
    return out


# ---- stopping -----------------------------------------------------------------------------------------------
def stop(term: Iterable[int], *, kill: Iterable[int], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM ``term``; SIGKILL those of ``kill`` still there after ``grace_s`` (or once all of ``term`` ended and
    ``kill`` is still there a moment later)."""
    me = os.getpid()
    term = [p for p in set(term) if p and p != me]
    kill = [p for p in set(kill) if p and p != me]
    for pid in term:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(liveness.exists(p) for p in [*term, *kill]):
        time.sleep(0.2)
    for pid in kill:
        if liveness.exists(pid):
            _signal(pid, signal.SIGKILL)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
