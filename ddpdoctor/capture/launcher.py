"""The launcher side of ``ddpdoctor trace``: hand off to torchrun, then write the manifest and tell the user.

Ranks print nothing of their own; hints are printed once, here.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ddpdoctor import rundir
from ddpdoctor.capture import interpreter
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
) -> dict[str, Any]:
    """Write this launcher's node record, then (re)build the manifest from every node and rank file present.

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
        _name_untraced(man, _untraced)
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
    probe = out / f".ddpdoctor-space-probe-{os.getpid()}"
    try:
        with open(probe, "wb") as f:
            f.write(bytes(PROBE_BYTES))
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        probe.unlink(missing_ok=True)
    return None


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
    ) -> None:
        if command is not None:
            what = f"every rank started by `{shlex.join(command)}`"
        elif tr:
            what = f"{target.name} with torchrun " + " ".join(tr)
        elif who is not None and who.world_size > 1:
            what = f"{target.name} as one of {who.world_size} ranks started by the scheduler ({who.source} variables)"
        else:
            what = f"{target.name} in this process (and any ranks it starts)"
        self._print(f"ddpdoctor: tracing {what}; profiling steps {window[0]}-{window[1]}; run directory {out}")

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
        for r in failed:
            self._print(
                f"ddpdoctor:   rank {r['rank']} {r['status']}: {r.get('reason') or 'exit ' + str(r.get('exit_code'))}"
            )
        notes = man.get("notes", [])
        before = [n for n in notes if n.startswith(manifest_mod.BEFORE_WINDOW)]
        groups = [n for n in notes if n.startswith(manifest_mod.GROUPS_NOTE)]  # where each process group's files are
        for note in groups:
            self._print(f"ddpdoctor: note: {note}")
        for note in [n for n in notes if n not in before and n not in groups] if not failed else []:
            self._print(f"ddpdoctor: note: {note}; call ddpdoctor.step() at the end of each iteration to mark steps")
        for note in before:  # a crash too: it happened before anything was profiled
            self._print(f"ddpdoctor: note: {note}; lower --wait/--warmup or run more steps")
        self._print(f"ddpdoctor: next: ddpdoctor diagnose {out}    (or open it in TensorBoard: ddpdoctor view {out})")
