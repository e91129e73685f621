"""``manifest.json``: what ran, how it ended, and which files each rank left.

Every launcher (one per node) writes its own ``nodes/node<K>.json`` and then rebuilds ``manifest.json`` from all
node and rank files present, so on shared storage the last node to finish leaves the complete picture and no node
overwrites another's data.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from ddpdoctor import liveness, rundir, runfiles
from ddpdoctor._version import __version__
from ddpdoctor.capture import command_mark
from ddpdoctor.capture import groups as groups_mod
from ddpdoctor.rundir import BEFORE_WINDOW, WINDOW_CUT


def read_rank_files(out: Path) -> dict[int, dict[str, Any]]:
    """The rank capture files (the run directory's one reader; a file that cannot be used is left out)."""
    return runfiles.read_rank_captures(out)[0]


def _rank_entry(
    rank: int, data: dict[str, Any] | None, node: dict[str, Any] | None, *, in_rank: bool = False
) -> dict[str, Any]:
    if data is None:
        return {
            "rank": rank,
            "status": "failed",
            "exit_code": None,
            "reason": "no data: the rank never started ddpdoctor's capture (crashed at start-up or was not launched)",
            "trace_files": [],
        }
    status = data.get("status")
    reason = data.get("error")
    if status == "hung":
        reason = (reason or "").split("\n", 1)[0] + f" (stack in ranks/rank{rank}.json)"
    if status == "running" and in_rank:
        reason = "still running when this manifest was written (the last rank to finish rewrites it)"
    elif status == "running":
        # The process ended without finishing its capture: killed (SIGKILL, OOM killer) or torn down by torchrun.
        status, reason = "failed", "the rank process died without finishing (killed, or stopped by torchrun)"
        stop = liveness.stop_signal(node.get("exit_code")) if node is not None else None
        if node is not None and node.get("exit_code") == 0:
            status = "unknown"
        elif stop:
            # the job was stopped from outside: a rank that did not end on the signal (stuck in a call that never
            # returns to Python, its files half written) was stopped with it, not killed by something of its own
            status, reason = "interrupted", liveness.stopped_with_job(stop)
    return {
        "rank": rank,
        "status": "ok" if status == "ok" else status,
        "exit_code": data.get("exit_code"),
        "reason": reason,
        "hostname": data.get("hostname"),
        "local_rank": data.get("local_rank"),
        "node_rank": data.get("node_rank"),
        "device": data.get("device"),
        "steps": data.get("steps", {}).get("count"),
        "profiled_steps": data.get("steps", {}).get("profiled"),
        "step_source": data.get("steps", {}).get("source"),
        "trace_files": data.get("trace_files", []),
        "stopped_by": data.get("stopped_by"),
    }


def _how_they_died(
    out: Path, entries: list[dict[str, Any]], ranks: dict[int, dict[str, Any]], *, nodes_of: Path | None = None
) -> None:
    """A rank that ended without finishing its files: its exit status as torchrun saw it (``nodes/exits<K>.json``)
    and, when a fatal signal ended it, where its main thread was (its fatal record,
    ``dumps/rank<R>.fatal-<pid>.txt``)."""
    from ddpdoctor.flight.frames import dist_op, user_frames
    from ddpdoctor.flight.read import read_fatal_record
    from ddpdoctor.flight.verdict import frame_text

    exits: dict[int, int] = {}
    for path in sorted(((nodes_of or out) / rundir.NODES_DIR).glob("exits*.json")):
        try:
            for rank, failure in (rundir.read_json(path).get("failures") or {}).items():
                if isinstance(failure, dict) and isinstance(failure.get("exitcode"), int):
                    exits[int(rank)] = failure["exitcode"]
        except (OSError, ValueError, AttributeError, TypeError):
            continue
    for entry in entries:
        if "died without finishing" not in str(entry.get("reason") or ""):
            continue
        rank = entry["rank"]
        if entry.get("exit_code") is None and rank in exits:
            entry["exit_code"] = exits[rank]
        pid = (ranks.get(rank) or {}).get("pid")
        records = sorted((out / rundir.DUMPS_DIR).glob(f"rank{rank}.fatal-*.txt"))
        records = [p for p in records if pid is None or p.name == f"rank{rank}.fatal-{pid}.txt"] or records
        for path in records:
            try:
                fatal = read_fatal_record(path)
            except (OSError, ValueError):
                continue
            if fatal is None or fatal.exception is None:
                continue
            frames = next((t.frames for t in fatal.threads if t.main), [])
            op, user = dist_op(frames), user_frames(frames)
            where = (f" inside {op}" if op else "") + (f" at {frame_text(user[0])}" if user else "")
            entry["reason"] = f"ended by {fatal.exception.type}{where} (its stacks: {rundir.DUMPS_DIR}/{path.name})"
            break
        else:
            code = entry.get("exit_code")
            if isinstance(code, int) and code < 0:
                import signal as _signal

                try:
                    name = _signal.Signals(-code).name
                except ValueError:
                    name = f"signal {-code}"
                entry["reason"] = f"the rank process died without finishing: ended by {name} (torchrun's exit status)"


def mark_consequences(entries: list[dict[str, Any]]) -> None:
    """A rank that failed because a peer died ("Connection closed by peer", stopped by torchrun after another
    rank's failure: ``ddpdoctor.flight.analyze.is_consequence``) while another rank failed for a reason of its own:
    ``consequence_of`` names the cause(s)."""
    from ddpdoctor.flight.analyze import is_consequence

    def gone(entry: dict[str, Any]) -> bool:
        kind, _, message = str(entry.get("reason") or "").partition(": ")
        return entry["status"] == "interrupted" or is_consequence(kind, message or kind)

    causes = [e["rank"] for e in entries if e["status"] in ("failed", "hung") and not gone(e)]
    if not causes:
        return
    for entry in entries:
        if entry["status"] not in ("ok", "unknown", "running") and entry["rank"] not in causes and gone(entry):
            entry["consequence_of"] = causes


def _window_start(config: dict[str, Any]) -> int | None:
    """The first profiled step of the capture config (after --wait and --warmup); None where it is unreadable."""
    try:
        return int(config.get("wait") or 0) + int(config.get("warmup") or 0) + 1
    except (AttributeError, TypeError, ValueError):
        return None


def before_window_note(entries: list[dict[str, Any]], config: dict[str, Any]) -> str:
    """The note for a run that recorded no trace because it ended (or crashed) before the window started."""
    start = _window_start(config)
    first = f" (it starts at step {start})" if start is not None else ""
    ended = [
        f"rank {e['rank']} {e['status']} after {e.get('steps') or 0} steps"
        + (f" (a consequence of rank {', '.join(map(str, e['consequence_of']))})" if e.get("consequence_of") else "")
        for e in sorted(entries, key=lambda e: (bool(e.get("consequence_of")), e["rank"]))  # the causes first
        if e["status"] != "ok"
    ]
    return f"{BEFORE_WINDOW}{first}: no trace was recorded" + (f"; {', '.join(ended)}" if ended else "")


def window_cut_note(entries: list[dict[str, Any]], config: dict[str, Any]) -> str | None:
    """The note for a run whose only profiled window the job's end cut short (fewer steps profiled than --active):
    more --active would not profile more of them. None when no rank's was (or the window is unknown)."""
    first = _window_start(config)
    try:
        active = int(config.get("active") or 0)
    except (AttributeError, TypeError, ValueError):
        return None
    if first is None:
        return None
    cut = []
    for e in entries:
        windows = e.get("profiled_steps") or []
        if e.get("status") == "ok" and len(windows) == 1 and 0 < windows[0][1] - windows[0][0] + 1 < active:
            cut.append(windows[0][1] - windows[0][0] + 1)
    if not cut or active <= 0:
        return None
    got = "/".join(str(n) for n in sorted(set(cut)))
    steps = max(int(e.get("steps") or 0) for e in entries)
    return (
        f"{WINDOW_CUT} (steps {first}-{first + active - 1}), after {steps} steps: {got} of its {active} steps were"
        f" profiled, and a larger --active profiles no more; run more steps, or skip fewer before the window"
        f" (--wait {config.get('wait')} --warmup {config.get('warmup')} skip the first {first - 1})"
    )


def node_record(
    *, node_rank: int, command: list[str], exit_code: int, started_at: float, expected_ranks: list[int] | None
) -> dict[str, Any]:
    return {
        "node_rank": node_rank,
        "hostname": socket.gethostname(),
        "command": command,
        "cwd": os.getcwd(),  # where the command ran (``ddpdoctor try`` runs it again from there)
        "exit_code": exit_code,
        "started_at": started_at,
        "finished_at": time.time(),
        "expected_ranks": expected_ranks,
    }


RESTART_NOTE = "torchrun restarted the job"


def build(
    out: Path,
    *,
    mode: str,
    command: list[str],
    config: dict[str, Any],
    launch: str | None = None,
    attempt_of: Path | None = None,
    last_attempt: bool = True,
) -> dict[str, Any]:
    """The manifest from every node and rank file in ``out``. ``launch``: how the job was started ("direct",
    "torchrun", "spawn", "scheduler", "command"). In-rank runs (a scheduler started each rank) have no node files:
    the exit code and times then come from the rank files.

    A job torchrun may restart keeps each attempt's files in ``attempts/attempt<k>/``: each attempt gets a manifest
    of its own there (``attempt_of``: the run directory, whose node files it reads; ``last_attempt``: whether the
    job's exit status is this attempt's), and the run's manifest is the last attempt's with ``attempts`` and a note."""
    if attempt_of is None:
        attempts = rundir.attempt_dirs(out)
        if attempts:
            return _build_attempts(out, attempts, mode=mode, command=command, config=config, launch=launch)
    nodes = []
    for path in sorted(((attempt_of or out) / rundir.NODES_DIR).glob("node*.json")):
        try:
            nodes.append(rundir.read_json(path))
        except (OSError, ValueError):
            continue
    ranks = read_rank_files(out)
    if _may_settle(out, nodes, ranks) and groups_mod.settle(out, process_groups(out, ranks)):
        ranks = read_rank_files(out)  # the training group's, now at the top level
    expected: set[int] = set(ranks)
    for node in nodes:
        expected.update(node.get("expected_ranks") or [])
    world_sizes = {int(d.get("world_size") or 1) for d in ranks.values()}
    world_size = max(world_sizes | {len(expected) or 1})
    expected.update(range(world_size))
    by_node = {n["node_rank"]: n for n in nodes}
    entries = [
        _rank_entry(r, ranks.get(r), by_node.get((ranks.get(r) or {}).get("node_rank", 0)), in_rank=not nodes)
        for r in sorted(expected)
    ]
    if not last_attempt:  # an earlier attempt's exit status is its ranks' own, not the job's
        nodes = []
    # A rank killed between renaming a trace into place and updating its rank file still left that trace.
    on_disk: dict[int, list[str]] = {}
    for path in sorted(out.iterdir()):
        match = rundir.TRACE_FILE_RE.match(path.name)
        if match:
            on_disk.setdefault(int(match["rank"]), []).append(path.name)
    for entry in entries:
        listed = entry["trace_files"]
        # one trace, whether still .json or gzipped (the .json is removed only after the rank file names the .gz)
        same = {f.removesuffix(".gz") for f in listed}
        entry["trace_files"] = listed + [f for f in on_disk.get(entry["rank"], []) if f.removesuffix(".gz") not in same]
    _how_they_died(out, entries, ranks, nodes_of=attempt_of if last_attempt else out)
    mark_consequences(entries)
    exit_codes = [n["exit_code"] for n in nodes]
    if not nodes:  # in-rank: each rank's own exit status; None while a rank has not finished
        exit_codes = [e["exit_code"] for e in entries]
    exit_code = next((c for c in exit_codes if c not in (0, None)), None)
    if exit_code is None and exit_codes and all(c == 0 for c in exit_codes):
        exit_code = 0
    steps_seen = any((d.get("steps") or {}).get("source") not in (None, "none") for d in ranks.values())
    notes = []
    # a rank file still "running" was last written before its rank ended (killed, stuck): its steps say nothing
    if ranks and not steps_seen and all(d.get("status") != "running" for d in ranks.values()):
        notes.append(
            "no training step was detected (no torch.optim optimizer stepped and ddpdoctor.step() was never "
            "called): the trace covers the start of the run instead of chosen steps"
        )
    if ranks and steps_seen and not any(e.get("profiled_steps") or e.get("trace_files") for e in entries):
        notes.append(before_window_note(entries, config))
    elif ranks and steps_seen and (cut := window_cut_note(entries, config)):
        notes.append(cut)
    groups = process_groups(out, ranks)
    if len(groups) > 1:
        notes.append(groups_note(groups))
    rejoined = [r for r, d in ranks.items() if len(d.get("process_groups") or []) > 1]
    if rejoined:
        notes.append(
            f"{GROUPS_NOTE} more than one process group in the same process{'es' if len(rejoined) > 1 else ''} "
            f"(rank{'s' if len(rejoined) > 1 else ''} {', '.join(map(str, rejoined))}): what a process did after its "
            "first group is counted in its files here, with that group's rank (ranks/rank<R>.json: process_groups)"
        )
    stopped = sorted({str(d["stopped_by"]) for d in ranks.values() if d.get("stopped_by")})
    knobs = _knobs(ranks)
    cwd = next((n["cwd"] for n in nodes if n.get("cwd")), None)
    return {
        "schema_version": rundir.SCHEMA_VERSION,
        "ddpdoctor_version": __version__,
        "command": command,
        "cwd": cwd,
        # this user's mark on the command this trace ran (`try` runs a marked one without asking)
        command_mark.FIELD: command_mark.mark(command, cwd) if cwd == os.getcwd() else None,
        # "ddpdoctor --max-steps N" when ddpdoctor ended the job there (every rank at the same step)
        "stopped_by": stopped[0] if stopped else None,
        "knobs": knobs,  # trace --set: knob -> {"value", "applied", "reason"} (rank 0's, or the first rank's)
        # ranks the script started itself (mp.spawn, Lightning, Fabric) make no one-process job of a "direct" launch
        "mode": "spawn" if mode == "single" and world_size > 1 else mode,
        "launch": launch or mode,
        "world_size": world_size,
        "nnodes": len(nodes) or len({d.get("node_rank") for d in ranks.values()}) or 1,
        "exit_code": exit_code,
        "started_at": min(_times(nodes or ranks.values(), "started_at"), default=None),
        "finished_at": max(_times(nodes or ranks.values(), "finished_at", "updated_at"), default=None),
        "capture": config,
        "steps_detected": steps_seen,
        "notes": notes,
        "nodes": nodes,
        "ranks": entries,
        **({"groups": groups} if len(groups) > 1 else {}),
    }


def _build_attempts(
    out: Path,
    attempts: list[tuple[int, Path]],
    *,
    mode: str,
    command: list[str],
    config: dict[str, Any],
    launch: str | None,
) -> dict[str, Any]:
    """The manifest of a job torchrun restarted: each attempt's own (written in its folder), and the run's: the last
    attempt's, with ``attempts`` (k, dir, status, exit code, a one-line summary of how it ended) and a note."""
    records = []
    last: dict[str, Any] = {}
    for i, (k, folder) in enumerate(attempts):
        is_last = i == len(attempts) - 1
        man = build(folder, mode=mode, command=command, config=config, launch=launch, attempt_of=out,
                    last_attempt=is_last)  # fmt: skip
        man["attempt"] = k
        try:
            write(folder, man)
        except OSError:
            pass
        failed = [e for e in man["ranks"] if e["status"] not in ("ok", "unknown")]
        records.append(
            {
                "attempt": k,
                "dir": f"{rundir.ATTEMPTS_DIR}/{folder.name}",
                "status": "failed" if failed or man.get("exit_code") not in (0, None) else "ok",
                "exit_code": man.get("exit_code"),
                "summary": attempt_summary(folder, man) if failed else "every rank ended well",
            }
        )
        if is_last:
            last = man
    man = dict(last)
    man.pop("attempt", None)
    man["attempts"] = records
    man["notes"] = [restart_note(records), *man.get("notes", [])]
    return man


def restart_note(records: list[dict[str, Any]]) -> str:
    """The note on a restarted job: how many attempts, which one the run directory's top level describes, how each
    earlier one ended."""
    final = records[-1]
    earlier = "; ".join(f"attempt {r['attempt']} {r['status']}: {r['summary']}" for r in records[:-1])
    restarts = len(records) - 1
    return (
        f"{RESTART_NOTE} {restarts} time{'s' if restarts != 1 else ''} (--max-restarts): {len(records)} attempts, each"
        f" in its own folder ({rundir.ATTEMPTS_DIR}/attempt<k>/); the top level describes the last one, attempt"
        f" {final['attempt']} ({final['status']})" + (f"; {earlier}" if earlier else "")
    )


def attempt_summary(folder: Path, man: dict[str, Any]) -> str:
    """How an attempt failed, in one line: its ranks' dumps' verdict (the cause and where), else its failed ranks'
    reasons (the causes first)."""
    from ddpdoctor.flight import analyze, find_dumps

    status = {e["rank"]: {k: e.get(k) for k in ("status", "exit_code", "reason")} for e in man["ranks"]}
    try:
        found = find_dumps(folder)
        if found.dumps:
            verdict = analyze(found.dumps, world_size=man.get("world_size"), rank_status=status)
            if verdict.kind in ("crash", "hang", "desync") and verdict.summary:
                return str(verdict.summary)
    except Exception:  # noqa: BLE001 - the ranks' own reasons below still say it
        pass
    failed = [e for e in man["ranks"] if e["status"] not in ("ok", "unknown")]
    failed.sort(key=lambda e: (bool(e.get("consequence_of")), e["rank"]))
    return "; ".join(f"rank {e['rank']} {e['status']}: {str(e.get('reason') or '').splitlines()[0]}" for e in failed)


def _may_settle(out: Path, nodes: list[dict[str, Any]], ranks: dict[int, dict[str, Any]]) -> bool:
    """Whether this launcher may move groups' files (``groups.settle``): the only launcher of the job, on this host,
    after every rank of every group finished (an in-rank run, or one of several nodes, leaves them where they are)."""
    if len(nodes) != 1 or nodes[0].get("hostname") != socket.gethostname() or not (out / rundir.GROUPS_DIR).is_dir():
        return False
    folders = [out] + [p for p in (out / rundir.GROUPS_DIR).iterdir() if p.is_dir()]
    return all(
        d.get("status") != "running" and d.get("hostname") == socket.gethostname()
        for folder in folders
        for d in (ranks if folder == out else read_rank_files(folder)).values()
    )


def process_groups(out: Path, top: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """The process groups whose files are in ``out``: the top level's first (the one every command reads), then
    each ``groups/group<N>/`` (a job that created more than one group; see ``ddpdoctor.capture.groups``), with
    what they did: ranks, steps, profiled steps, DDP. Empty for a run with no rank files at all."""
    found, top_name = [], ""
    for path in sorted((out / rundir.GROUPS_DIR).glob("group*.json"), key=lambda p: _group_number(p.stem)):
        try:
            record = rundir.read_json(path)
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or not isinstance(record.get("dir"), str):
            continue
        if record["dir"] == ".":  # a group made the top-level one when the run ended (groups.settle)
            top_name = path.stem
            continue
        members = read_rank_files(out / record["dir"])
        if members:  # none: a group whose ranks were processes of an earlier group (their files say so)
            found.append(_group_entry(path.stem, record["dir"], members, record))
    if top:
        found.insert(0, _group_entry(top_name, ".", top))
    if found:
        max(found, key=groups_mod.training_evidence)["training"] = True  # the first of equals: the top level
    return found


def _group_number(name: str) -> int:
    digits = name.removeprefix("group")
    return int(digits) if digits.isdigit() else 1 << 30


def _group_entry(
    name: str, folder: str, ranks: dict[int, dict[str, Any]], record: dict[str, Any] | None = None
) -> dict[str, Any]:
    steps = [int((d.get("steps") or {}).get("count") or 0) for d in ranks.values()]
    profiled = [sum(b - a + 1 for a, b in (d.get("steps") or {}).get("profiled") or []) for d in ranks.values()]
    sizes = {int(d.get("world_size") or 1) for d in ranks.values()}
    backends = sorted({str(d["backend"]) for d in ranks.values() if d.get("backend")})
    return {
        "name": name or None,  # None: the top level's files, of no group record (the first group's, or none)
        "dir": folder,
        "world_size": max(sizes | {int((record or {}).get("world_size") or 1)}),
        "backend": backends[0] if backends else (record or {}).get("backend"),
        "ranks": sorted(ranks),
        "steps": max(steps, default=0),
        "profiled_steps": max(profiled, default=0),
        "ddp": any(d.get("ddp") for d in ranks.values()),
        "training": False,  # set below for the top level: the one read
    }


GROUPS_NOTE = "the job created"


def groups_note(groups: list[dict[str, Any]]) -> str:
    """The note for a job that created more than one process group: which one is read, where the others are."""
    top = groups[0]
    others = "; ".join(
        f"{'the training one, ' if g['training'] else ''}{g['dir']}/ ({_describe(g)}; `ddpdoctor diagnose` that "
        "folder to read it)"
        for g in groups[1:]
    )
    return (
        f"{GROUPS_NOTE} {len(groups)} process groups; this run directory's top level holds the "
        f"{'training one' if top['training'] else 'first one'} ({_describe(top)}), which is the one analysed; the "
        f"others' files are kept apart: {others}"
    )


def _describe(group: dict[str, Any]) -> str:
    ranks = len(group["ranks"])
    what = [f"{ranks} rank{'s' if ranks != 1 else ''}", f"{group['steps']} step{'s' if group['steps'] != 1 else ''}"]
    if group["ddp"]:
        what.append("DDP")
    return ", ".join(what)


def _knobs(ranks: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """trace --set over the ranks: knob -> {"value", "applied" (objects changed on all ranks), "reason"}."""
    out: dict[str, Any] = {}
    for data in ranks.values():
        for name, entry in (data.get("knobs") or {}).items():
            if not isinstance(entry, dict):
                continue
            merged = out.setdefault(name, {"value": entry.get("value"), "applied": 0, "reason": None})
            merged["applied"] += int(entry.get("applied") or 0)
            merged["reason"] = None if merged["applied"] else merged["reason"] or entry.get("reason")
    return out


def _times(records: Any, *keys: str) -> list[float]:
    """The first of ``keys`` each record has (node files: started_at/finished_at; rank files: updated_at)."""
    found = (next((r[k] for k in keys if r.get(k) is not None), None) for r in records)
    return [t for t in found if t is not None]


def rebuild(out: Path) -> dict[str, Any]:
    """The manifest of a run directory from its rank and node files alone, keeping what the last written manifest
    said about the command and settings (for readers of an in-rank run whose last rank never wrote it)."""
    try:
        previous = rundir.read_json(out / rundir.MANIFEST)
    except (OSError, ValueError):
        previous = {}
    if not isinstance(previous, dict):
        previous = {}
    rebuilt = build(
        out,
        mode=str(previous.get("mode") or "scheduler"),
        command=list(previous.get("command") or []),
        config=dict(previous.get("capture") or {}),
        launch=previous.get("launch"),
    )
    rebuilt[command_mark.FIELD] = previous.get(command_mark.FIELD)  # a command read from a file is never marked
    return rebuilt


def write(out: Path, manifest: dict[str, Any]) -> None:
    why = runfiles.write_manifest(out / rundir.MANIFEST, manifest)
    if why:  # a bug of ddpdoctor's, caught by its tests: the manifest is written all the same
        print(f"ddpdoctor: warning: manifest.json does not fit its schema: {why}", file=sys.stderr)


def dumps(manifest: dict[str, Any]) -> str:
    return json.dumps(manifest, indent=1)
