"""The launcher side of ``ddpdoctor trace``: hand off to torchrun, then write the manifest and tell the user.

Ranks print nothing of their own; hints are printed once, here.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ddpdoctor import liveness, rundir
from ddpdoctor.capture import hang, interpreter
from ddpdoctor.capture import manifest as manifest_mod
from ddpdoctor.capture.config import CaptureConfig


def run_torchrun(torchrun_args: list[str], target_argv: list[str]) -> int:
    """Run ``torch.distributed.run`` (torch's own launcher) with every rank entering through ddpdoctor.

    Returns torchrun's exit code, or ``-signal`` if it was ended by a signal (see :func:`run_command`).
    """
    cmd = [
        sys.executable,
        "-m",
        "ddpdoctor.capture.torchrun_main",  # torch.distributed.run, ending quietly by a signal
        *torchrun_args,
        "-m",
        "ddpdoctor.capture.rank_main",
        *target_argv,
    ]
    return run_command(cmd)


def run_command(cmd: list[str]) -> int:
    """Run a launcher command (its ranks are traced through the start-up hook); return its exit code, or
    ``-signal`` if it was ended by a signal.

    A SIGTERM sent to ddpdoctor is passed on, so the launcher stops its ranks (they flush what they captured);
    Ctrl-C reaches the whole process group from the terminal, so here we only keep waiting for the launcher to
    finish its own shutdown.
    """
    global _untraced
    child = subprocess.Popen(cmd)
    if _judge is not None:
        _judge.child = child
    watch = interpreter.Watch(child.pid).start()

    def forward(signum: int, frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:
                forward(signal.SIGINT, None)
    finally:
        signal.signal(signal.SIGTERM, previous)
        _untraced = watch.stop()


# The hang judge of this trace (set by HangJudge.start): run_command tells it the launcher process it started.
_judge: HangJudge | None = None


class HangJudge:
    """The launcher's side of the hang timeout: a thread that waits for a rank's hang request
    (``dumps/request.json``, :mod:`ddpdoctor.capture.watchdog`), waits for every rank's dump (at most
    ``hang.DUMP_WAIT_S``), has them analysed, prints the verdict (the cause first, the ranks waiting for it as
    consequences) and stops the job: SIGTERM (to torchrun, which stops its ranks; else to the command and the
    ranks), then SIGKILL to what is left after ``hang.STOP_GRACE_S``.

    ``explicit``: ``--hang-timeout`` was given (stop whatever the dumps show); the default timeout stops only on a
    hang or a desync. After a stop, ``verdict`` is the verdict and ``request`` the request's ``by``.
    """

    def __init__(
        self, out: Path, *, explicit: bool, launch: str, say: Reporter, how: str, shown: Path | None = None
    ) -> None:
        self.out = out
        self.shown = shown if shown is not None else out  # the run directory as the user named it, in messages
        self.explicit = explicit
        self.how = how  # what stopped it, in the manifest: "stopped by ddpdoctor --hang-timeout 10"
        self.launch = launch
        self.say = say
        self.child: subprocess.Popen[Any] | None = None
        self.verdict: Any = None
        self.request: str | None = None
        self._seen: set[str] = set()
        self._done = False

    @property
    def stopped(self) -> bool:
        """ddpdoctor stopped the job on a verdict."""
        return self.verdict is not None

    def stopped_job(self) -> bool:
        return self.stopped

    def start(self) -> HangJudge:
        global _judge
        _judge = self
        threading.Thread(target=self._watch, name="ddpdoctor-hang-judge", daemon=True).start()
        return self

    def close(self) -> None:
        global _judge
        self._done = True
        if _judge is self:
            _judge = None

    def _watch(self) -> None:
        while not self._done:
            time.sleep(0.5)
            request = hang.read_request(self.out)
            if request is None or request.get("reason") != "hang" or request["id"] in self._seen:
                continue
            self._seen.add(request["id"])
            try:
                self.decide(request)
            except Exception as exc:  # noqa: BLE001 - the ranks' own watchdogs remain; say why, never a traceback
                self.say._print(f"ddpdoctor: the hang dumps could not be analysed: {type(exc).__name__}: {exc}")

    def decide(self, request: dict[str, Any]) -> None:
        ranks = manifest_mod.read_rank_files(self.out)
        here = socket.gethostname()
        if any(d.get("pid") == os.getpid() and d.get("hostname") == here for d in ranks.values()):
            return  # this process is a rank itself (a one-process run): its own watchdog acts
        local = {r: int(d["pid"]) for r, d in ranks.items() if d.get("hostname") == here and d.get("pid")}
        expected = hang.world_ranks(self.out)
        self.say._print(f"ddpdoctor: hang timeout: {request.get('by') or 'a rank'}; every rank dumps where it is")
        dumps = hang.wait_for_answers(
            self.out, request["id"], expected, alive=lambda: any(liveness.exists(p) for p in local.values())
        )
        if self._done:
            return  # the job ended meanwhile
        verdict = hang.judge(dumps, world_size=len(expected) or None)
        from ddpdoctor.capture.watchdog import should_stop

        lines = hang.verdict_lines(verdict, waited_for=expected)
        if not should_stop(verdict, explicit=self.explicit):
            if verdict.kind == "hang":  # the default timeout: a rank that may only be slow (a long checkpoint)
                for line in lines:
                    self.say._print(f"ddpdoctor: {line}")
                self.say._print(
                    "ddpdoctor: not stopped: the default hang timeout only reports (a long checkpoint or evaluation "
                    f"on one rank looks the same); `--hang-timeout SECONDS` stops such a job (dumps in "
                    f"{self.shown / hang.DUMPS_DIR})"
                )
                return
            self.say._print(f"ddpdoctor: no hang in the dumps ({lines[0]}); the job goes on")
            return
        for line in lines:
            self.say._print(f"ddpdoctor: {line}")
        self.say._print(
            f"ddpdoctor: stopping the job (dumps in {self.shown / hang.DUMPS_DIR}; `ddpdoctor diagnose {self.shown}`)"
        )
        self.verdict, self.request = verdict, str(request.get("by") or "")
        child = [self.child.pid] if self.child is not None and self.child.poll() is None else []
        if self.launch == "torchrun":  # torchrun stops its ranks itself; what is left is killed after the grace
            hang.stop(child, grace_s=hang.STOP_GRACE_S, kill=list(local.values()))
        else:
            pids = list(local.values()) + child
            hang.stop(pids, grace_s=hang.STOP_GRACE_S, kill=pids)


def apply_verdict(man: dict[str, Any], verdict: Any, how: str) -> None:
    """Put what the hang verdict found into the manifest: the cause(s) marked hung with where they were, the ranks
    that waited for them as consequences (``consequence_of``), and ``health`` (kind, summary, culprits, waiting)."""
    outcomes = hang.rank_outcomes(verdict)
    for entry in man.get("ranks") or []:
        outcome = outcomes.get(entry.get("rank"))
        if outcome is not None:
            entry["status"], entry["reason"] = outcome
            if entry["rank"] in verdict.waiting:
                entry["consequence_of"] = list(verdict.culprits)
    # the note of a run that ended before its window lists how each rank ended: as the verdict has it now
    notes = man.get("notes") or []
    for i, note in enumerate(notes):
        if note.startswith(manifest_mod.BEFORE_WINDOW):
            notes[i] = manifest_mod.before_window_note(man.get("ranks") or [], man.get("capture") or {})
    man["health"] = {
        "kind": verdict.kind,
        "summary": verdict.summary,
        "culprits": list(verdict.culprits),
        "waiting": list(verdict.waiting),
        "stopped_by": how,
    }
    if man.get("exit_code") in (None, 0) or man.get("exit_code", 0) < 0:
        man["exit_code"] = hang.HANG_EXIT


# What the last run_command saw of its job: processes that ran interpreters the start-up hook cannot reach
# (python -I/-E/-S), for finish_run to name as the likely cause of a rank that left no data.
_untraced: list[interpreter.Untraced] = []


def startup_hook_env(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with ddpdoctor's start-up hook first on ``PYTHONPATH``: every Python process the job starts
    then runs it (see ``ddpdoctor/capture/_startup/sitecustomize.py``)."""
    hook = str(Path(__file__).resolve().parent / "_startup")
    paths = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != hook]
    return {**environ, "PYTHONPATH": os.pathsep.join([hook, *paths])}


def launch_form(out: Path, requested: str) -> str:
    """How the job was launched, as the manifest says: "direct" becomes "spawn" when the ranks were processes
    the script started (``mp.spawn``, Lightning), not the process ddpdoctor ran it in."""
    if requested != "direct":
        return requested
    pids = {data.get("pid") for data in manifest_mod.read_rank_files(out).values()}
    return "spawn" if pids - {os.getpid()} else "direct"


def _node_rank(tr: list[str]) -> int:
    for i, tok in enumerate(tr):
        name, _, value = tok.partition("=")
        if name in ("--node-rank", "--node_rank"):
            return int(value or tr[i + 1])
    return 0


def _expected_ranks(tr: list[str], node_rank: int) -> list[int] | None:
    nproc = None
    for i, tok in enumerate(tr):
        name, _, value = tok.partition("=")
        if name in ("--nproc-per-node", "--nproc_per_node"):
            nproc = value or (tr[i + 1] if i + 1 < len(tr) else None)
    if not tr:
        return [0]
    if nproc is None or not nproc.isdigit():
        return None  # "gpu", "auto", ...: unknown here
    n = int(nproc)
    nnodes = next((tr[i + 1] for i, t in enumerate(tr) if t == "--nnodes" and i + 1 < len(tr)), "1")
    if nnodes != "1":
        return None  # elastic ranges: ranks are assigned at rendezvous
    return list(range(node_rank * n, node_rank * n + n))


def finish_run(
    out: Path,
    *,
    mode: str,
    command: list[str],
    config: CaptureConfig,
    tr: list[str],
    exit_code: int,
    started: float,
    launch: str | None = None,
    judge: HangJudge | None = None,
) -> dict[str, Any]:
    """Write this launcher's node record, then (re)build the manifest from every node and rank file present
    (with what ``judge`` found, when it stopped the job on a hang).

    The launchers of a multi-node run end together (torchrun's agents leave through one barrier) and each writes
    the manifest: one that built it before another node's record landed may write it after that node's complete
    one. So each reads the node and rank files again after writing, and builds again if they changed meanwhile.
    """
    node_rank = _node_rank(tr)
    record = manifest_mod.node_record(
        node_rank=node_rank,
        command=command,
        exit_code=exit_code,
        started_at=started,
        expected_ranks=_expected_ranks(tr, node_rank),
    )
    rundir.atomic_write_json(rundir.node_file(out, node_rank), record)
    man: dict[str, Any] = {}
    for _ in range(5):
        before = _run_files_state(out)
        man = manifest_mod.build(
            out, mode=mode, command=command, config=config.schedule_dict(), launch=launch_form(out, launch or mode)
        )
        if launch == "command":
            _name_command_without_ranks(out, man, command)
        _name_untraced(man, _untraced)  # a process the hook could not reach (python -I): the more exact cause
        if judge is not None and judge.stopped:
            apply_verdict(man, judge.verdict, judge.how)
        manifest_mod.write(out, man)
        if _run_files_state(out) == before:
            break
    return man


def _name_untraced(man: dict[str, Any], found: list[interpreter.Untraced]) -> None:
    """A rank that left no data while the job ran an interpreter the start-up hook cannot reach: say that is the
    likely cause, instead of "crashed at start-up or was not launched"."""
    reason = interpreter.no_data_reason(found)
    if reason is None:
        return
    for entry in man.get("ranks") or []:
        if str(entry.get("reason") or "").startswith("no data:"):
            entry["reason"] = reason


def _name_command_without_ranks(out: Path, man: dict[str, Any], command: list[str]) -> None:
    """A ``-- COMMAND`` job none of whose processes became a rank: say what ddpdoctor waited for and what to run,
    instead of "crashed at start-up or was not launched" (the job may have run well)."""
    if manifest_mod.read_rank_files(out):
        return
    job = command[command.index("--") + 1 :] if "--" in command else command
    script = next((a for a in job if a.endswith(".py")), None)
    run = f"`ddpdoctor trace {script} ARGS`" if script else "`ddpdoctor trace SCRIPT ARGS`"
    reason = (
        "no data: no process the command started created a torch.distributed process group or a torch.optim "
        f"optimizer, so none was traced (its exit code: {man.get('exit_code')}); a job that trains in one process "
        f"can be traced directly: {run}"
    )
    for entry in man.get("ranks") or []:
        if str(entry.get("reason") or "").startswith("no data: the rank never started"):
            entry["reason"] = reason


def _run_files_state(out: Path) -> tuple[Any, ...]:
    nodes = []
    for path in sorted((out / rundir.NODES_DIR).glob("node*.json")):
        try:
            stat = path.stat()
        except OSError:
            continue
        nodes.append((path.name, stat.st_mtime_ns, stat.st_size))
    return tuple(nodes), _rank_files_state(out)


_WRITE_ERROR = re.compile(r"\[Errno (?:28|30|122)\] ([^:'\"]+)")  # ENOSPC, EROFS, EDQUOT


PROBE_BYTES = 256 << 10  # a test write when ranks did not finish their files: a small trace's size


def rank_write_error(out: Path, man: dict[str, Any]) -> str | None:
    """The disk error the ranks met writing their files in ``out`` (``No space left on device``...): under
    torchrun the ranks, not this process, write the traces. From the rank files' capture errors; when a rank
    did not finish its files at all (its last write failed too), from a test write of ``PROBE_BYTES``."""
    for rank in manifest_mod.read_rank_files(out).values():
        for error in rank.get("capture_errors") or []:
            match = _WRITE_ERROR.search(str(error))
            if match:
                return match.group(1).strip()
    reasons = [str(r.get("reason")) for r in man.get("ranks") or []]
    if not any("died without finishing" in why or why.startswith("no data") for why in reasons):
        return None
    from ddpdoctor.capture.export import disk_error

    error = disk_error(out, PROBE_BYTES)
    return None if error is None else re.sub(r"^\[Errno \d+\] ", "", error)  # "No space left on device"


def finish_rank(out: Path, *, command: list[str], config: CaptureConfig) -> dict[str, Any]:
    """In-rank mode (a scheduler started this process as one rank): rebuild the manifest from the rank files.

    Every rank does this when it ends, so the last one leaves the complete manifest. A rank whose write overtook a
    later rank's is caught by reading the rank files again after writing: if they changed, it builds again.
    """
    man: dict[str, Any] = {}
    for _ in range(5):
        before = _rank_files_state(out)
        man = manifest_mod.build(
            out, mode="scheduler", command=command, config=config.schedule_dict(), launch="scheduler"
        )
        manifest_mod.write(out, man)
        time.sleep(0.2)
        if _rank_files_state(out) == before:
            break
    return man


def _rank_files_state(out: Path) -> dict[int, tuple[Any, Any]]:
    return {r: (d.get("status"), d.get("updated_at")) for r, d in manifest_mod.read_rank_files(out).items()}


class Reporter:
    """What the user sees from ddpdoctor itself (on stderr, so the script's stdout stays its own)."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self._t0 = time.perf_counter()

    def _print(self, text: str) -> None:
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)

    def start(
        self,
        out: Path,
        target: Any,
        tr: list[str],
        window: tuple[int, int],
        *,
        command: list[str] | None = None,
        who: Any = None,
        hang_timeout: str = "",
    ) -> None:
        if command is not None:
            what = f"every rank started by `{shlex.join(command)}`"
        elif tr:
            what = f"{target.name} with torchrun " + " ".join(tr)
        elif who is not None and who.world_size > 1:
            what = f"{target.name} as one of {who.world_size} ranks started by the scheduler ({who.source} variables)"
        else:
            what = f"{target.name} in this process (and any ranks it starts)"
        hang_text = f"; {hang_timeout}" if hang_timeout else ""
        self._print(
            f"ddpdoctor: tracing {what}; profiling steps {window[0]}-{window[1]}{hang_text}; run directory {out}"
        )

    def summary(self, out: Path, *, rank: int | None = None) -> None:
        """What the run left. ``rank``: in-rank mode, this process's rank (it speaks only when the run is complete,
        or for itself)."""
        try:
            man = rundir.read_json(out / rundir.MANIFEST)
        except (OSError, ValueError):
            return
        ranks = man.get("ranks", [])
        if rank is not None:
            waiting = [r["rank"] for r in ranks if r.get("status") == "running" or not r.get("hostname")]
            if waiting:
                if rank == 0:
                    self._print(
                        f"ddpdoctor: rank {rank} wrote its files to {out}; {len(waiting)} rank(s) still to finish "
                        "(the last one to finish completes manifest.json)"
                    )
                return
        failed = [r for r in ranks if r.get("status") != "ok"]
        profiled = sorted({sum(b - a + 1 for a, b in (r.get("profiled_steps") or [])) for r in ranks})
        steps_text = "/".join(str(p) for p in profiled) or "0"
        took = time.perf_counter() - self._t0
        self._print(
            f"ddpdoctor: wrote {out} in {took:.1f}s: {len(ranks)} rank(s), {steps_text} step(s) profiled per rank, "
            f"exit code {man.get('exit_code')}"
        )
        if man.get("stopped_by"):
            self._print(f"ddpdoctor: every rank stopped at the same step ({man['stopped_by']})")
        for name, knob in (man.get("knobs") or {}).items():
            if not knob.get("applied"):
                self._print(f"ddpdoctor: --set {name}={knob.get('value')} did not apply: {knob.get('reason')}")
        if (man.get("health") or {}).get("summary"):
            health = man["health"]  # the verdict itself was printed when it was made: here, what was done
            causes = ", ".join(str(r) for r in health.get("culprits") or []) or "undecided"
            self._print(f"ddpdoctor: {health['kind']}, {health.get('stopped_by')}; the cause: rank {causes}")
        for r in sorted(failed, key=lambda r: bool(r.get("consequence_of"))):  # the causes first
            reason = r.get("reason") or "exit " + str(r.get("exit_code"))
            if r.get("consequence_of"):
                peers = ", ".join(str(p) for p in r["consequence_of"])
                reason = f"a consequence of rank {peers}: {_short(reason)}"
            self._print(f"ddpdoctor:   rank {r['rank']} {r['status']}: {reason}")
        notes = man.get("notes", [])
        before = [n for n in notes if n.startswith(manifest_mod.BEFORE_WINDOW)]
        groups = [n for n in notes if n.startswith(manifest_mod.GROUPS_NOTE)]  # where each process group's files are
        groups += [n for n in notes if n.startswith(manifest_mod.RESTART_NOTE)]  # where each attempt's files are
        groups += [n for n in notes if n.startswith(manifest_mod.WINDOW_CUT)]  # fewer steps than --active
        for note in groups:
            self._print(f"ddpdoctor: note: {note}")
        for note in [n for n in notes if n not in before and n not in groups] if not failed else []:
            self._print(f"ddpdoctor: note: {note}; call ddpdoctor.step() at the end of each iteration to mark steps")
        for note in before:  # a crash too: it happened before anything was profiled
            self._print(f"ddpdoctor: note: {note}; lower --wait/--warmup or run more steps")
        self._print(f"ddpdoctor: next: ddpdoctor diagnose {out}    (or open it in TensorBoard: ddpdoctor view {out})")


def _short(reason: str, limit: int = 160) -> str:
    """A consequence's error, cut to its first sentence (gloo's run on with advice for the remote worker)."""
    first = reason.split("\n", 1)[0]
    cut = first.find(". ", first.find(": ") + 2)
    first = first[: cut + 1] if cut > 0 else first
    return first if len(first) <= limit else first[: limit - 3] + "..."
