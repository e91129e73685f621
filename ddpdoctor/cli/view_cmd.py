"""``ddpdoctor view RUN [--port N] [--host H]``: TensorBoard on a run directory, with the ddpdoctor dashboard.

Writes the run's event files first when they are missing, serves on 127.0.0.1 unless ``--host`` says
otherwise, prints the URL and runs until Ctrl-C or SIGTERM (exit 0). A taken port or a folder that is not a
run directory is a one-line error (exit 2).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from ddpdoctor import rundir
from ddpdoctor.cli.diagnose_cmd import add_rule_options, add_rule_selection, rule_options
from ddpdoctor.errors import DDPDoctorError
from ddpdoctor.pipeline import resolve_rules

_ALL_INTERFACES = {"0.0.0.0", "::", ""}


def register(subparsers: Any, name: str, help_text: str) -> None:
    from ddpdoctor.tensorboard.server import DEFAULT_HOST, DEFAULT_PORT

    p = subparsers.add_parser(name, help=help_text, description=help_text)
    p.add_argument("run", metavar="RUN", help="a ddpdoctor run directory (written by `ddpdoctor trace`)")
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        metavar="N",
        help=f"port to serve on (default {DEFAULT_PORT}; 0 = any free port)",
    )
    p.add_argument(
        "--host",
        default=DEFAULT_HOST,
        metavar="H",
        help=f"address to serve on (default {DEFAULT_HOST}: this machine only; 0.0.0.0 = every interface)",
    )
    p.add_argument(
        "--rewrite-events",
        action="store_true",
        help="write the TensorBoard event files again even when they exist",
    )
    add_rule_selection(p)
    add_rule_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ddpdoctor.tensorboard import report, server
    from ddpdoctor.tensorboard.events import has_events, write_events

    path = Path(args.run)
    if not path.is_dir() or not rundir.is_run_dir(path):
        raise DDPDoctorError(f"{args.run}: not a ddpdoctor run directory (no manifest.json or ranks/ in it)")
    if not 0 <= args.port <= 65535:
        raise DDPDoctorError(f"--port {args.port}: not a port number (0-65535)")
    server.check_port_free(args.host, args.port)
    rules = resolve_rules(rule_options(args))
    report.DEFAULT_RULES = rules  # the dashboard, served from this process, uses the same rules
    if args.rewrite_events or not has_events(path):
        why = _keep_unchanged(path)
        if why:
            path = _served_copy(path)
            print(f"ddpdoctor: {args.run} is {why}: it stays as it is; TensorBoard serves a copy in {path}", flush=True)
        out = write_events(path, rules=rules)
        print(f"ddpdoctor: wrote TensorBoard event files to {out}", flush=True)
    for why in server.unreadable_traces(path):
        print(f"ddpdoctor: warning: {why}; the PyTorch Profiler tab leaves it out", file=sys.stderr, flush=True)
    live = _follow_series(Path(args.run), path)
    url = server.start(path.resolve(), args.host, args.port)
    _serve_until_stopped(banner(args.run, url, args.host))
    if live is not None:
        live.stop()
    print("ddpdoctor: TensorBoard stopped", flush=True)
    return 0


def banner(run: str, url: str, host: str) -> str:
    """What ``view`` prints once TensorBoard serves ``run`` at ``url``: where each view is, and for a timeline of
    every event the Perfetto export's command for this run (the PyTorch Profiler tab needs the internet)."""
    warning = (
        ("ddpdoctor: warning: serving on every network interface; anyone who can reach this machine can read the run\n")
        if host in _ALL_INTERFACES
        else ""
    )
    return (
        f"{warning}ddpdoctor: TensorBoard at {url} (Ctrl-C to stop)\n"
        f"  ddpdoctor dashboard: {url}#ddpdoctor\n"
        f"  scalars:             {url}#timeseries\n"
        f"  timeline:            ddpdoctor export {shlex.quote(run)} --perfetto run.perfetto.json, then open it "
        "in ui.perfetto.dev (every rank, clocks aligned, findings marked; the PyTorch Profiler tab at "
        f"{url}#pytorch_profiler needs the internet for its charts)"
    )


def _follow_series(run: Path, logdir: Path) -> Any:
    """The always-on series as scalars (``series/*``), followed while the job runs (tensorboard/live.py)."""
    from ddpdoctor.tensorboard.live import SeriesEvents, has_series

    if not has_series(run):
        return None
    live = SeriesEvents(run, logdir)
    try:
        live.start()
    except OSError as exc:
        print(f"ddpdoctor: warning: the step series is not shown: {exc}", file=sys.stderr, flush=True)
        return None
    print(f"ddpdoctor: step series of {len(live._ranks)} rank(s) as series/* scalars, followed live", flush=True)
    return live


def _keep_unchanged(path: Path) -> str | None:
    """Why ``view`` must not write its event files into the run directory, or None: a directory it cannot write,
    or one whose files are tracked by git (a run committed to a repository, such as the bundled samples: the
    checkout would turn dirty)."""
    if not os.access(path, os.W_OK):
        return "not writable"
    import subprocess

    try:
        tracked = subprocess.run(
            ["git", "-C", str(path), "ls-files", "--error-unmatch", rundir.MANIFEST],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):  # no git, or it hangs: nothing says the run is tracked
        return None
    return "tracked by git" if tracked.returncode == 0 else None


def _cache_home() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ddpdoctor" / "view"


def _served_copy(path: Path) -> Path:
    """A copy of the run directory (without its ``tensorboard/``) under the user's cache, made afresh each time:
    TensorBoard's logdir must hold the traces and the event files together."""
    import hashlib
    import shutil

    real = path.resolve()
    home = _cache_home() / hashlib.sha256(str(real).encode()).hexdigest()[:16]
    copy = home / real.name
    if copy.exists():
        shutil.rmtree(copy)
    home.mkdir(parents=True, exist_ok=True)
    try:
        shutil.copytree(real, copy, symlinks=True, ignore=shutil.ignore_patterns(rundir.TENSORBOARD_DIR))
    except OSError as exc:
        raise DDPDoctorError(
            f"{path}: could not copy the run to {copy} for TensorBoard: {exc.strerror or exc}"
        ) from None
    return copy


def _serve_until_stopped(banner: str) -> None:
    """Print ``banner``, then block until Ctrl-C or SIGTERM (also one arriving while the banner prints);
    from then on a second Ctrl-C ends the process at once, whatever the clean-up (TensorBoard's plugins shut
    down helper processes at exit) is doing."""

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        print(banner, flush=True)
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(128 + signum))
