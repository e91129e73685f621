"""``ddpdoctor trace [OPTIONS] [TORCHRUN OPTIONS] (SCRIPT | -m MODULE) [ARGS...]`` and
``ddpdoctor trace [OPTIONS] -- COMMAND [ARGS...]``.

Everything after the script (or ``-m MODULE``) belongs to the script. The launch forms:

- direct: the script runs in this process; if it starts its ranks itself (``mp.spawn``, Lightning), they are traced
  through the start-up hook and this process, which trains nothing, leaves no files;
- torchrun: any torchrun option (``--nproc-per-node``, ``--nnodes``, ``--rdzv-*``, ...) hands the launch to torch's
  own ``torch.distributed.run``;
- scheduler (in-rank): the process already has a rank from its scheduler (``RANK``/``WORLD_SIZE``, SLURM or MPI
  variables, world size over 1): it traces itself as that rank and writes only that rank's files;
- command: ``-- COMMAND`` runs any launcher; every process it starts that becomes a rank is traced.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from ddpdoctor import rundir
from ddpdoctor.errors import UsageError

_TORCHRUN_SKIP = {"-h", "--help", "-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path"}


def _own_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ddpdoctor trace",
        usage="ddpdoctor trace [OPTIONS] [TORCHRUN OPTIONS] (SCRIPT | -m MODULE) [ARGS...]\n"
        "       ddpdoctor trace [OPTIONS] -- COMMAND [ARGS...]",
        description="Run an unmodified training script under torch.profiler and write a run directory. "
        "With any torchrun option (e.g. --nproc-per-node 4) the script is launched by torchrun, one traced "
        "process per rank. Ranks the script starts itself (mp.spawn, Lightning) are traced too. Started by a "
        "scheduler as one rank (RANK/WORLD_SIZE or SLURM variables set), it traces that rank into the shared --out. "
        "After --, any launcher command (accelerate launch, python -m torch.distributed.launch, bash run.sh, ...) runs "
        "with every rank it starts traced.",
        add_help=False,
    )
    g = p.add_argument_group("ddpdoctor options")
    g.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    g.add_argument("--out", "-o", metavar="DIR", help="run directory (default: ddpdoctor-runs/<script>-<time>)")
    g.add_argument("--force", action="store_true", help="replace ddpdoctor's files in an existing run directory")
    g.add_argument("--wait", type=int, default=5, metavar="N", help="steps to skip before profiling (default 5)")
    g.add_argument("--warmup", type=int, default=2, metavar="N", help="profiler warm-up steps (default 2)")
    g.add_argument("--active", type=int, default=5, metavar="N", help="steps recorded per window (default 5)")
    g.add_argument(
        "--repeat", type=int, default=1, metavar="N", help="number of windows, 0 = until the end (default 1)"
    )
    g.add_argument("--with-stack", action="store_true", help="record Python stacks (larger traces)")
    g.add_argument("--no-record-shapes", action="store_true", help="do not record operator input shapes")
    g.add_argument("--no-profile-memory", action="store_true", help="do not record allocator events")
    g.add_argument(
        "--all-threads",
        choices=("auto", "on", "off"),
        default="auto",
        help="record every thread (auto: in one-process runs, for DataParallel's replica threads; torch 2.13 then "
        "leaves allocator events out of the trace)",
    )
    g.add_argument("--no-gil", action="store_true", help="do not measure GIL contention")
    g.add_argument(
        "--no-step-limit",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="when no step is ever seen, record the run's first SECONDS (default 60)",
    )
    g.add_argument(
        "--hang-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="end a rank that makes no step for SECONDS (after its first), recording where it was stuck",
    )
    g.add_argument(
        "--max-steps",
        type=int,
        default=None,
        metavar="N",
        help="end the job cleanly after N training steps, every rank at the same step (exit 0)",
    )
    g.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="apply a knob through ddpdoctor's hooks, no code change (e.g. ddp.bucket_cap_mb=25; "
        "the table: README 'Try the prescription')",
    )
    g.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    return p


def _torchrun_options() -> dict[str, bool]:
    """Option string -> takes a value, from torchrun's own parser (so every torchrun flag passes through)."""
    from torch.distributed.run import get_args_parser

    options: dict[str, bool] = {}
    for action in get_args_parser()._actions:
        for opt in action.option_strings:
            if opt not in _TORCHRUN_SKIP:
                options[opt] = action.nargs != 0
    return options


def split_argv(argv: list[str]) -> tuple[list[str], list[str], list[str], list[str] | None]:
    """Split into (ddpdoctor options, torchrun options, target, command): target is [SCRIPT, args] or
    [-m, MOD, args]; command is what follows ``--`` (None without one). ``-- train.py`` (a Python file) and
    ``-- -m MOD`` still name the target."""
    own_takes_value = {}
    for action in _own_parser()._actions:
        for opt in action.option_strings:
            own_takes_value[opt] = action.nargs != 0
    torchrun = _torchrun_options()
    own: list[str] = []
    tr: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            rest = argv[i + 1 :]
            if not rest:
                raise UsageError("no command after --: ddpdoctor trace [OPTIONS] -- COMMAND [ARGS...]")
            if rest[0] in ("-m", "--module") or (rest[0].endswith(".py") and os.path.isfile(rest[0])):
                return own, tr, ["-m", *rest[1:]] if rest[0] == "--module" else rest, None
            return own, tr, [], rest
        if tok in ("-m", "--module"):
            if i + 1 >= len(argv):
                raise UsageError("-m needs a module name")
            return own, tr, ["-m", *argv[i + 1 :]], None
        if not tok.startswith("-") or tok == "-":
            return own, tr, argv[i:], None
        name = tok.split("=", 1)[0]
        if name in own_takes_value:
            bucket, takes_value = own, own_takes_value[name]
        elif name in torchrun:
            bucket, takes_value = tr, torchrun[name]
        else:
            raise UsageError(
                f"unknown option {name!r} (ddpdoctor and torchrun options go before the script; "
                "see `ddpdoctor trace --help`)"
            )
        bucket.append(tok)
        if takes_value and "=" not in tok:
            if i + 1 >= len(argv):
                raise UsageError(f"option {name} needs a value")
            bucket.append(argv[i + 1])
            i += 1
        i += 1
    return own, tr, [], None


def _parse_own(own: list[str]) -> argparse.Namespace:
    parser = _own_parser()
    try:
        args = parser.parse_args(own)
    except SystemExit as exc:
        raise UsageError("invalid ddpdoctor option (see `ddpdoctor trace --help`)") from exc
    for name in ("wait", "warmup", "repeat"):
        if getattr(args, name) < 0:
            raise UsageError(f"--{name} must be 0 or more")
    if args.active < 1:
        raise UsageError("--active must be at least 1")
    if args.hang_timeout is not None and args.hang_timeout <= 0:
        raise UsageError("--hang-timeout must be positive")
    if args.no_step_limit <= 0:
        raise UsageError("--no-step-limit must be positive")
    if args.max_steps is not None and args.max_steps < 1:
        raise UsageError("--max-steps must be at least 1")
    from ddpdoctor import knobs

    args.knobs = knobs.parse_settings(args.set)
    return args


def _print_help() -> None:
    _own_parser().print_help()
    import textwrap

    names = " ".join(sorted(o for o in _torchrun_options() if o.startswith("--") and "_" not in o))
    print("\ntorchrun options (passed to torch.distributed.run unchanged):")
    print(textwrap.fill(names, width=100, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False))


def _check_target(target: list[str]) -> Any:
    from ddpdoctor.capture.runner import Target

    if not target:
        raise UsageError("no script given: ddpdoctor trace [OPTIONS] (SCRIPT | -m MODULE) [ARGS...]")
    if target[0] == "-m":
        if len(target) < 2:
            raise UsageError("-m needs a module name")
        name = target[1]
        sys.path.insert(0, os.getcwd())
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError) as exc:
            raise UsageError(f"cannot find module {name!r}: {exc}") from None
        finally:
            sys.path.pop(0)
        if spec is None:
            raise UsageError(f"no module named {name!r}")
        return Target("module", name, tuple(target[2:]))
    script = target[0]
    if not os.path.isfile(script):
        raise UsageError(f"cannot open script {script!r}: no such file")
    try:
        with open(script, "rb") as f:
            source = f.read()
        compile(source, script, "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f"{script}:{exc.lineno}" + (f":{exc.offset}" if exc.offset else "")
        # exit 1, as `python script.py` does: a script's own error, not a misuse of ddpdoctor
        raise UsageError(f"{where}: SyntaxError: {exc.msg}", exit_code=1) from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read script {script!r}: {exc}") from None
    return Target("script", script, tuple(target[1:]))


def _default_out(target: Any, command: list[str] | None = None) -> Path:
    if command is not None:  # the training script the command names, else the command itself
        script = next((a for a in command[1:] if a.endswith(".py")), None)
        stem = Path(script).stem if script else Path(command[0]).name
    elif target.kind == "script":
        stem = Path(target.name).stem
    else:
        stem = target.name.rsplit(".", 1)[-1]
    return Path("ddpdoctor-runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def _check_command(command: list[str]) -> None:
    exe = command[0]
    if os.sep in exe:
        if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
            raise UsageError(f"cannot run command {exe!r}: no such executable file")
    elif shutil.which(exe) is None:
        raise UsageError(f"cannot run command {exe!r}: not found on PATH")


def _prepare_rank_out(out: Path, rank: int, *, force: bool) -> None:
    """In-rank mode: every rank of the job shares ``out``; this one only checks and replaces its own files."""
    from ddpdoctor.capture import rank_file

    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a directory")
    if out.is_dir():
        owned = rundir.ddpdoctor_owned(out)
        # Hidden entries are the other ranks' temporary files (written, then renamed) as they start alongside.
        visible = [entry for entry in out.iterdir() if not entry.name.startswith(".")]
        if len(owned) != len(visible):
            raise UsageError(f"--out {out} holds files that are not ddpdoctor's; choose another directory")
        mine = rank_file.own_files(out, rank)
        if mine and not force:
            raise UsageError(
                f"--out {out} already holds rank {rank} of a run; choose another directory or pass --force"
            )
        for path in mine:
            path.unlink()
    try:
        (out / rundir.RANKS_DIR).mkdir(parents=True, exist_ok=True)
        probe = out / f".ddpdoctor-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"cannot write to --out {out}: {exc.strerror or exc}") from None


def _prepare_out(out: Path, *, force: bool, multi_node: bool) -> None:
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        owned = rundir.ddpdoctor_owned(out)
        finished_run = (out / rundir.MANIFEST).exists()
        if multi_node and not finished_run:
            pass  # the other nodes of this run write here too
        elif not force:
            what = "a ddpdoctor run" if owned else "files that are not ddpdoctor's"
            raise UsageError(f"--out {out} already holds {what}; choose another directory or pass --force")
        elif len(owned) != len(list(out.iterdir())):
            raise UsageError(f"--out {out} holds files that are not ddpdoctor's; --force only replaces a ddpdoctor run")
        else:
            for entry in owned:
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    try:
        (out / rundir.RANKS_DIR).mkdir(parents=True, exist_ok=True)
        (out / rundir.NODES_DIR).mkdir(parents=True, exist_ok=True)
        probe = out / f".ddpdoctor-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"cannot write to --out {out}: {exc.strerror or exc}") from None


def _torchrun_value(tr: list[str], *names: str) -> str | None:
    for i, tok in enumerate(tr):
        name, _, value = tok.partition("=")
        if name in names:
            return value if value else (tr[i + 1] if i + 1 < len(tr) else None)
    return None


def main(argv: list[str]) -> int:
    # Kineto prints start/stop lines of its own on every profiler cycle of every rank; keep the user's console
    # for the user's script (set KINETO_LOG_LEVEL yourself to see them).
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    own, tr, target_argv, command = split_argv(argv)
    args = _parse_own(own)
    if args.help:
        _print_help()
        return 0
    from ddpdoctor.capture import rank_file

    who = rank_file.identity()
    if command is not None:
        if tr:
            raise UsageError("torchrun options cannot be combined with -- COMMAND (put them in the command)")
        _check_command(command)
        target, launch = None, "command"
    else:
        target = _check_target(target_argv)
        launch = "torchrun" if tr else "scheduler" if who.world_size > 1 else "direct"
    from ddpdoctor.capture.config import ENV_VAR, CaptureConfig

    out = Path(args.out) if args.out else _default_out(target, command)
    if launch == "scheduler":
        if not args.out:
            raise UsageError(
                f"this process is rank {who.rank} of {who.world_size} ({who.source} variables): "
                "give every rank the same --out DIR"
            )
        _prepare_rank_out(out, who.rank, force=args.force)
    else:
        nnodes = _torchrun_value(tr, "--nnodes") or "1"
        _prepare_out(out, force=args.force, multi_node=nnodes != "1")
    config = CaptureConfig(
        out=str(out.resolve()),
        wait=args.wait,
        warmup=args.warmup,
        active=args.active,
        repeat=args.repeat,
        with_stack=args.with_stack,
        record_shapes=not args.no_record_shapes,
        profile_memory=not args.no_profile_memory,
        gil=not args.no_gil,
        no_step_limit_s=args.no_step_limit,
        launcher_pid=os.getpid(),
        quiet=args.quiet,
        hang_timeout_s=args.hang_timeout,
        all_threads=args.all_threads,
        all_devices=launch == "direct",
        launch=launch,
        max_steps=args.max_steps,
        knobs=args.knobs,
    )
    from ddpdoctor.capture import launcher

    full_command = ["ddpdoctor", "trace", *argv]
    say = launcher.Reporter(quiet=args.quiet)
    first = args.wait + args.warmup + 1
    if launch != "scheduler" or who.rank == 0:
        say.start(out, target, tr, (first, first + args.active - 1), command=command, who=who)
    # Every Python process the job starts runs the start-up hook, so the ranks it starts itself are traced.
    os.environ.update(launcher.startup_hook_env(dict(os.environ)))
    os.environ[ENV_VAR] = config.to_env()
    from ddpdoctor import knobs

    os.environ.update(knobs.environment(args.knobs))  # env.* knobs: for every process of the job
    started = time.time()
    from ddpdoctor.capture import runner

    def finish(code: int) -> None:
        """Write the node record and manifest, and tell the user; also from ``os._exit`` in a one-process run."""
        try:
            man = _finish_out(code)
        except OSError as exc:  # a full or read-only disk: say so, and still end with the script's own exit status
            print(
                f"ddpdoctor: error: cannot write the run directory {out}: {exc.strerror or exc} "
                f"(the script exited with code {code})",
                file=sys.stderr,
                flush=True,
            )
        else:
            say.summary(out, rank=who.rank if launch == "scheduler" else None)
            disk = launcher.rank_write_error(out, man) if launch != "direct" else None  # direct: raised above
            if disk is not None:  # the ranks met it writing their traces: the same line as in one-process mode
                print(
                    f"ddpdoctor: error: cannot write the run directory {out}: {disk} (the job exited with code {code})",
                    file=sys.stderr,
                    flush=True,
                )

    def _finish_out(code: int) -> dict[str, Any]:
        if launch == "scheduler":
            return launcher.finish_rank(out, command=full_command, config=config)
        else:
            mode = {"direct": "single"}.get(launch, launch)
            return launcher.finish_run(
                out,
                mode=mode,
                command=full_command,
                config=config,
                tr=tr,
                exit_code=code,
                started=started,
                launch=launch,
            )

    if launch == "command":
        code = launcher.run_command(command or [])
    elif launch == "torchrun":
        code = launcher.run_torchrun(tr, target_argv)
    else:  # direct (this process may only launch the ranks) or scheduler (this process is one rank)
        assert target is not None  # only -- COMMAND has no target
        code = runner.run(target, config, claimed=launch == "scheduler", on_os_exit=finish)
    finish(code)
    if code < 0:
        runner.die_by_signal(-code)
    return code


def register(sub: Any, name: str, help_text: str) -> None:  # pragma: no cover - trace bypasses argparse
    p = sub.add_parser(name, help=help_text, add_help=False)
    p.set_defaults(func=lambda _args: main(["--help"]))
