"""How the job ended: the run-level ``health`` metrics (catalog source ``health``) from the manifest, the ranks'
capture files and, where the ranks dumped, ``ddpdoctor.flight``'s ``HealthVerdict``. Pure: no I/O.

A failure has one cause and its consequences. The cause is decided from evidence, most specific first: a
collective the ranks issued differently (``collective_mismatches``), a hang the dumps show (``hang_detected``),
a rank's own exception (``rank_crashed``; before any step: ``startup_failed``), a rank that died without one
(``rank_died``). A rank that failed because a peer died ("Connection closed by peer", NCCL's "remote process
exited") or because the launcher stopped it after another rank failed is a consequence (``consequence_ranks``),
never a cause. Only one of the flags is true, so one finding leads the report.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ddpdoctor.liveness import stop_signal, stopped_with_job, stopped_with_job_signal
from ddpdoctor.metrics import catalog
from ddpdoctor.runfiles import PROCESS_GONE

HEALTH_METRICS = catalog.names("run", "health")

# The reason the manifest gives a rank whose process ended without finishing its capture.
DIED = "died without finishing"
ENV_RENDEZVOUS = re.compile(r"env:// rendezvous|(?:RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT) expected, but not set")
_SOURCE_LOCATION = re.compile(r"\[[^\]\s]*\.(?:cc|cpp|h|hpp):\d+\] ?")
_MAX_ERROR = 160  # characters of an error message quoted in a summary line


def no_health(reason: str | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """Every health metric unmeasured (a foreign trace: nothing says how the job ended)."""
    values = dict.fromkeys(HEALTH_METRICS)
    return values, ({m: reason for m in HEALTH_METRICS} if reason else {})


def health_metrics(
    manifest: Mapping[str, Any] | None,
    captures: Mapping[int, Mapping[str, Any]] | None,
    verdict: Any = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The health metrics of a run, and the health section of its report (None when nothing is known).

    ``manifest``: ``manifest.json`` (``{}`` when absent); ``captures``: rank -> ``ranks/rank<R>.json``;
    ``verdict``: ``ddpdoctor.flight.HealthVerdict`` of the ranks' dumps, or None. Without any of them every
    metric is None (the rules that read them are "not evaluated")."""
    ranks = _rank_records(manifest or {}, captures or {})
    if not ranks and verdict is None:
        return no_health()[0], None
    status = {r: _classify(rec) for r, rec in ranks.items()}
    states = dict(getattr(verdict, "ranks", None) or {})
    for r, st in states.items():  # a dump says more than a status line: a crash's traceback, a consequence
        own = bool(st.exception) and DIED not in str(st.exception)  # an exception, not "died without finishing"
        if st.state == "crashed" and (own or status.get(r) in (None, "crashed")):
            status[r] = "crashed"  # not a rank the manifest saw die without an exception
        elif st.state == "consequence":
            status[r] = "consequence"
        ranks.setdefault(r, {"rank": r, "steps": st.step, "reason": st.exception})
        if st.step is not None:  # the dump's step: newer than any rank file's
            ranks[r].update(steps=st.step, steps_final=True)
    kind = getattr(verdict, "kind", None)
    consequences = sorted(r for r, s in status.items() if s == "consequence")
    out: dict[str, Any] = dict.fromkeys(HEALTH_METRICS)
    out.update(
        job_failed=False,
        rank_crashed=False,
        rank_died=False,
        hang_detected=False,
        collective_mismatches=0,
        startup_failed=False,
        consequence_ranks=len(consequences),
        steps_cut_short=0,
    )
    doc: dict[str, Any] = {
        "kind": "ok",
        "source": "dumps" if verdict is not None else "run record",
        "culprits": [],
        "waiting": [],
        "collective": None,
        "evidence": list(getattr(verdict, "evidence", ()) or ()),
        "notes": list(getattr(verdict, "notes", ()) or ()),
        "ranks": [
            _rank_entry(r, ranks.get(r, {}), status.get(r), states.get(r)) for r in sorted(set(ranks) | set(states))
        ],
    }
    crashed = sorted(r for r, s in status.items() if s == "crashed")
    died = sorted(r for r, s in status.items() if s == "died")
    hung = sorted(r for r, s in status.items() if s == "hung")
    interrupted = sorted(r for r, s in status.items() if s == "interrupted")
    running = sorted(r for r, s in status.items() if s == "running")
    if running:
        doc["notes"].append(f"{_ranks_text(running)} still running: this is a run in progress, not a verdict")
    failed = bool(crashed or died or hung or consequences) or kind in ("hang", "desync", "crash")
    if not failed:
        if interrupted:
            doc["notes"].append(_stopped_note(interrupted, manifest or {}, verdict))
        return out, (doc if (doc["notes"] or verdict is not None) else None)
    out["job_failed"] = True
    consequence_text = _consequences(consequences, ranks)
    also = f"; {consequence_text}" if consequence_text else ""
    if kind == "desync":
        culprits = tuple(verdict.culprits)
        out["collective_mismatches"] = max(1, len(verdict.mismatches))
        summary = str(verdict.summary or "").rstrip(". ")
        # both sides of each mismatch, where the verdict's own line does not already name them
        lines = [
            _mismatch_text(m)
            for m in verdict.mismatches
            if not all(str(what) in summary for what in m.by_rank.values())
            and not (m.kind == "missing" and f"#{m.seq_id}" in summary)
        ]
        out["health_summary"] = "; ".join([summary, *lines] if summary else lines) or "the ranks' collectives differ"
        out["health_detail"] = "; ".join(doc["evidence"][:3]) or out["health_summary"]
        out["health_advice"] = (
            "Every rank must issue the same collectives in the same order with the same shapes and dtypes: look at"
            " the code that issued each side (a rank-dependent branch, a metric reduced on some ranks only, a"
            " different number of batches per rank) and make the ranks agree."
        )
        doc.update(kind="desync", mismatches=[_mismatch_doc(m) for m in verdict.mismatches])
    elif kind == "hang":
        culprits = tuple(verdict.culprits)
        out["hang_detected"] = True
        waits = [states[r].since_s for r in verdict.waiting if r in states and states[r].since_s is not None]
        out["hang_wait_ms"] = round(max(waits) * 1000.0, 1) if waits else None
        out["health_summary"] = verdict.summary
        out["health_detail"] = "; ".join(doc["evidence"][:4]) or verdict.summary
        where = _where(states.get(culprits[0])) if culprits else ""
        out["health_advice"] = (
            f"Find out why {_ranks_text(culprits) if culprits else 'the stuck rank'} never reached the collective"
            + (f": it was in {where}" if where else "")
            + ". A read or a lock that never returns needs a timeout; a rank-dependent branch or an uneven number"
            " of batches must not leave one rank out of a collective. Until then the others wait for the"
            " backend's timeout (30 minutes by default)."
        )
        doc["kind"] = "hang"
    elif hung and not crashed:
        # the launcher's verdict at the time (manifest.json "health", decided from the dumps when it stopped the
        # job), else the hung rank's own watchdog line
        launcher = (manifest or {}).get("health")
        launcher = launcher if isinstance(launcher, Mapping) and launcher.get("kind") == "hang" else {}
        culprits = tuple(r for r in launcher.get("culprits") or [] if isinstance(r, int)) or tuple(hung)
        reason = _first_line(ranks[hung[0]].get("reason"))
        if launcher.get("summary"):
            out["health_summary"] = _first_line(launcher["summary"])
        else:
            out["health_summary"] = (
                f"{_ranks_text(hung)} hung: {reason}" if reason else f"{_ranks_text(hung)} hung"
            ) + also
        out["hang_detected"] = True
        out["health_detail"] = consequence_text or out["health_summary"]
        out["health_advice"] = (
            f"Look at what {_ranks_text(culprits)} was doing (its stack: dumps/ or ranks/rank<R>.json) for the call"
            " that never returned; a read or a lock needs a timeout, and every rank must reach the same collectives."
        )
        doc["kind"] = "hang"
        if verdict is None and not launcher:
            doc["notes"].append(
                "no dumps of the ranks: the hung rank is the one whose watchdog fired first, not decided from what"
                " every rank was doing"
            )
    elif crashed:
        culprits = tuple(crashed)
        first = culprits[0]
        steps = _known_steps(ranks.get(first, {}))
        error = _error(first, ranks, states)
        where = _where(states.get(first)) or _record_where(ranks.get(first, {}))
        # before the first step: the culprit's count is known to be 0, and no rank recorded a step (a rank file's
        # lower bound counts)
        before_first_step = steps == 0 and all(not ranks.get(r, {}).get("steps") for r in ranks)
        verb = "failed" if before_first_step else "crashed"
        # several ranks with exceptions of their own: which raised first is not in the records (they hold no time
        # of the failure, and two ranks failing alike part by microseconds), so the lowest rank speaks for them
        # without being called the first
        subject = _ranks_text(culprits) + f" {verb}" + (f"; rank {first}" if len(culprits) > 1 else "")
        if steps is None:
            least = ranks.get(first, {}).get("steps")
            when = f" at a step not recorded{f' (its rank file last recorded step {least})' if least else ''}"
        else:
            when = " before its first step" if not steps else f" after {steps} step{'s' if steps != 1 else ''}"
        out["health_summary"] = f"{subject}{when}: {error}" + (f", in {where}" if where else "") + also
        out["health_detail"] = consequence_text or out["health_summary"]
        if before_first_step:
            out["startup_failed"] = True
            for entry in doc["ranks"]:
                if entry["rank"] in culprits:
                    entry["state"] = "failed_at_startup"
            out["health_advice"] = _startup_advice(error, ranks)
            doc["kind"] = "startup"
            if getattr(verdict, "collective", None) is None:
                made = any((cap or {}).get("backend") for cap in (captures or {}).values())
                doc["notes"].append(
                    "collective: unknown: "
                    + ("no rank left a dump of its Flight Recorder" if verdict is None else "no dump holds one")
                    + "; the job failed before its first step"
                    + ("" if made else ", before any process group was made (no rank recorded a backend)")
                )
        else:
            out["rank_crashed"] = True
            several = len(culprits) > 1
            dumped = any(states.get(r) is not None for r in culprits)
            out["health_advice"] = (
                f"Fix the exception{'s' if several else ''} of {_ranks_text(culprits)} ("
                + ("their tracebacks are" if several else "its traceback is")
                + " in the job's output"
                + (f", and in {'their dumps' if several else 'its dump'} under dumps/" if dumped else "")
                + ")"
                + (
                    f"; the errors of {_ranks_text(consequences)} follow from it and need no fix of their own"
                    if consequences
                    else ""
                )
                + "."
            )
            doc["kind"] = "crash"
    elif died:
        culprits = tuple(died)
        steps = ranks.get(died[0], {}).get("steps")
        if steps:
            when = f" (its file last recorded step {steps})"
        else:  # a rank file never finished says nothing of the steps after it was written
            when = " before its first step" if _known_steps(ranks.get(died[0], {})) == 0 else " (its step is unknown)"
        out["rank_died"] = True
        out["health_summary"] = (
            f"{_ranks_text(died)} died without an exception of its own{when}: killed (SIGKILL, the OOM killer) or"
            " its node went away" + also
        )
        out["health_detail"] = consequence_text or out["health_summary"]
        out["health_advice"] = (
            "Find what killed it: the kernel's OOM killer (`dmesg | grep -i oom`, the scheduler's memory limit), a"
            " `kill -9`, or its host going down; watch the rank's memory (peak RSS) over the steps before."
        )
        doc["kind"] = "died"
    else:  # only consequences known (their cause left no record), or a verdict without a cause
        culprits = tuple(getattr(verdict, "culprits", ()) or ())
        out["rank_died"] = True
        out["health_summary"] = getattr(verdict, "summary", None) or (
            f"{_ranks_text(consequences)} failed because a peer went away, and no rank's record says why"
        )
        out["health_detail"] = consequence_text or out["health_summary"]
        out["health_advice"] = "Look at the job's output for the first rank that stopped; the others followed it."
        doc["kind"] = "died"
    for key in ("health_summary", "health_detail"):  # the rules' messages end the sentence
        out[key] = str(out[key] or "").rstrip(". ") or None
    out["culprit_rank"] = culprits[0] if culprits else None
    doc["culprits"] = list(culprits)
    doc["waiting"] = list(getattr(verdict, "waiting", ()) or ())
    collective = getattr(verdict, "collective", None)
    if collective is not None:
        doc["collective"] = {
            "pg": collective.pg,
            "seq_id": collective.seq_id,
            "op": collective.op,
            "backend": collective.backend,
            "text": collective.describe(),
            "issued_at": _frame_text(collective.frame) if collective.frame is not None else None,
        }
    doc["summary"] = out["health_summary"]
    doc["detail"] = out["health_detail"]
    doc["advice"] = out["health_advice"]
    return out, doc


def _rank_records(manifest: Mapping[str, Any], captures: Mapping[int, Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
    """rank -> {status, reason, steps, exit_code}: the manifest's view of each rank, the rank file where the
    manifest has none (a run still being traced, an in-rank run)."""
    out: dict[int, dict[str, Any]] = {}
    for rank, cap in captures.items():
        recorded = cap.get("steps")
        steps: Mapping[str, Any] = recorded if isinstance(recorded, Mapping) else {}
        gone = cap.get(PROCESS_GONE) if cap.get("status") == "running" else None  # runfiles.read_run_files
        out[int(rank)] = {
            "rank": int(rank),
            # a rank file still "running" whose process is gone from this host: the rank died without finishing
            "status": "failed" if gone else cap.get("status"),
            "reason": f"the rank process {DIED}: {gone}" if gone else cap.get("error"),
            "steps": steps.get("count"),
            "exit_code": cap.get("exit_code"),
            "error_frames": cap.get("error_frames") or [],
            # a rank file still "running" was last written before the rank ended (killed, a fatal signal): its
            # count is a lower bound, not the step the rank ended in
            "steps_final": cap.get("status") not in (None, "running"),
        }
    stops = _stopped_nodes(manifest)
    for entry in manifest.get("ranks") or []:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("rank"), int):
            continue
        rec = out.setdefault(entry["rank"], {"rank": entry["rank"]})
        for key in ("status", "reason", "steps", "exit_code", "consequence_of"):
            if entry.get(key) is not None or key not in rec:
                rec[key] = entry.get(key)
        stop = stops.get(entry.get("node_rank") if entry.get("node_rank") is not None else 0)
        if stop and rec.get("status") == "failed" and DIED in str(rec.get("reason") or ""):
            # a manifest written before ranks stopped with their launcher were told apart from ranks that died
            rec["status"], rec["reason"] = "interrupted", stopped_with_job(stop)
    return out


def _stopped_note(ranks: list[int], manifest: Mapping[str, Any], verdict: Any) -> str:
    """What stopped ranks that ended by a signal: ddpdoctor's hang timeout on a verdict without a cause (with the
    verdict: the job was stuck, where is undecided), the signal its launcher was stopped by, or a signal."""
    launcher = manifest.get("health")
    if isinstance(launcher, Mapping) and launcher.get("stopped_by") and launcher.get("kind") not in ("ok", None):
        summary = _first_line(launcher.get("summary"))
        return f"{_ranks_text(ranks)} {launcher['stopped_by']} (interrupted)" + (f": {summary}" if summary else "")
    stops = sorted(set(_stopped_nodes(manifest).values()))
    how = f"with the job by {' and '.join(stops)}" if stops else "by a signal"
    text = f"{_ranks_text(ranks)} stopped {how} (interrupted), not by a failure of their own"
    if getattr(verdict, "kind", None) == "undecided" and getattr(verdict, "summary", None):
        text += f"; their dumps: {_first_line(verdict.summary)}"
    return text


def _stopped_nodes(manifest: Mapping[str, Any]) -> dict[int, str]:
    """node rank -> the stop signal (SIGTERM, SIGINT, SIGHUP) that ended its launcher: the job was stopped from
    outside, and its ranks with it. torchrun ends by the signal only when no rank had failed before it (a rank's
    failure ends torchrun with a failure of its own), so a rank of that node that ended without finishing its files
    was stopped, not killed by something of its own. (A launcher that goes on after a rank dies, a shell script
    that waits for its ranks, could hide a death this way: a missed rank-died, never a false one.)"""
    out: dict[int, str] = {}
    for node in manifest.get("nodes") or []:
        if isinstance(node, Mapping) and isinstance(node.get("node_rank"), int):
            stop = stop_signal(node.get("exit_code"))
            if stop:
                out[node["node_rank"]] = stop
    return out


def _known_steps(rec: Mapping[str, Any]) -> int | None:
    """The steps a rank completed, where known: a dump's, a final rank file's, the manifest's; None for the count of
    a rank file the rank never finished (a lower bound)."""
    steps = rec.get("steps")
    return steps if isinstance(steps, int) and rec.get("steps_final", True) else None


def _classify(rec: Mapping[str, Any]) -> str:
    """ok | running | unknown | hung | interrupted | consequence | died | crashed."""
    status = rec.get("status")
    reason = str(rec.get("reason") or "")
    if status in (None, "ok", "unknown", "running"):
        return "ok" if status is None else str(status)
    if status == "hung":
        return "hung"
    if rec.get("consequence_of"):
        return "consequence"
    if status == "interrupted" and stopped_with_job_signal(reason):  # stopped with its launcher ("...by SIGTERM")
        return "interrupted"
    if _is_consequence(reason):
        return "consequence"
    if status == "interrupted" or "stopped by torchrun" in reason and DIED not in reason:
        return "interrupted"
    if DIED in reason or not reason:
        return "died"
    return "crashed"


def _is_consequence(error: str) -> bool:
    """An error a rank got because a peer died or was stopped (``ddpdoctor.flight``'s one test of it)."""
    from ddpdoctor.flight.analyze import is_consequence

    kind, _, message = error.partition(": ")
    return is_consequence(kind if message else "", message or error)


def _rank_entry(rank: int, rec: Mapping[str, Any], status: str | None, state: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "rank": rank,
        "state": getattr(state, "state", None) or status or "unknown",
        "status": rec.get("status"),
        "steps": _known_steps(rec) if state is None or state.step is None else state.step,
        "phase": getattr(state, "phase", None),
        "where": _where(state) or _record_where(rec) or None,
        "collective": state.collective.describe() if getattr(state, "collective", None) is not None else None,
        "error": _short(_first_line(getattr(state, "exception", None) or rec.get("reason"))) or None,
        "exit_code": rec.get("exit_code"),
    }
    if entry["steps"] is None and isinstance(rec.get("steps"), int):
        entry["steps_at_least"] = rec["steps"]  # its rank file's count, last written before the rank ended
    if status == "consequence":
        entry["state"] = "consequence"
    return entry


def _where(state: Any, depth: int = 3) -> str:
    """``read_shard (train.py:14) ← main (train.py:30)``: a rank's innermost user-code frames."""
    return _frames_text(tuple(getattr(state, "frames", ()) or ()), depth)


def _record_where(rec: Mapping[str, Any], depth: int = 3) -> str:
    """``setup (train.py:4) ← <module> (train.py:7)``: the innermost user-code frames of the exception a rank's file
    recorded (``error_frames``, outermost first), where no dump says where the rank was (it failed before it made
    a process group)."""
    if not rec.get("error_frames"):  # nearly every rank (one that ended well): no frames, no check of none
        return ""
    import msgspec

    from ddpdoctor.flight.frames import user_frames
    from ddpdoctor.runfile_types import Frame

    try:  # checked as RankCapture's list[Frame] when the file was read; a record built otherwise may not fit
        frames = msgspec.convert(list(rec.get("error_frames") or []), list[Frame])
    except msgspec.ValidationError:
        return ""
    return _frames_text(user_frames(frames), depth)


def _frames_text(frames: Any, depth: int) -> str:
    return " ← ".join(_frame_text(f) for f in tuple(frames)[:depth])


def _frame_text(frame: Any) -> str:
    from ddpdoctor.flight.verdict import frame_text

    return frame_text(frame)


def _error(rank: int, ranks: Mapping[int, Mapping[str, Any]], states: Mapping[int, Any]) -> str:
    state = states.get(rank)
    text = getattr(state, "exception", None) or ranks.get(rank, {}).get("reason") or "an exception"
    return _short(_first_line(text))


def _consequences(consequences: list[int], ranks: Mapping[int, Mapping[str, Any]]) -> str:
    if not consequences:
        return ""
    why = _short(_first_line(ranks.get(consequences[0], {}).get("reason")))
    return f"{_ranks_text(consequences)} failed as a consequence: a peer went away" + (f" ({why})" if why else "")


def _startup_advice(error: str, ranks: Mapping[int, Mapping[str, Any]]) -> str:
    if ENV_RENDEZVOUS.search(error):
        return (
            "The script initialises torch.distributed from environment variables (env://) but was started as one"
            " plain process: trace it under a launcher, e.g. `ddpdoctor trace --nproc-per-node 2 script.py`"
            " (torchrun), or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT yourself."
        )
    return "Fix the error above: the job failed before its first step, so nothing was timed."


def _mismatch_text(m: Any) -> str:
    sides = ", ".join(f"rank {r}: {what}" for r, what in sorted(m.by_rank.items()))
    return f"{m.kind} mismatch at collective #{m.seq_id} ({m.pg}): {sides}"


def _mismatch_doc(m: Any) -> dict[str, Any]:
    return {
        "pg": m.pg,
        "seq_id": m.seq_id,
        "kind": m.kind,
        "by_rank": {str(r): v for r, v in sorted(m.by_rank.items())},
    }


def _first_line(text: Any) -> str:
    return str(text or "").strip().split("\n", 1)[0].strip()


def _short(text: str) -> str:
    text = _SOURCE_LOCATION.sub("", text)  # gloo's "[/__w/pytorch/.../pair.cc:553] " says nothing to a user
    return text if len(text) <= _MAX_ERROR else text[: _MAX_ERROR - 3] + "..."


def _ranks_text(ranks: Any) -> str:
    """``rank 1`` / ``ranks 0, 2``."""
    ordered = sorted(set(ranks))
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(map(str, ordered))
