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

import contextlib
import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from ddpdoctor import owned, rundir
from ddpdoctor.cli.trace_args import _parse_own, _print_help, split_argv
from ddpdoctor.errors import UsageError


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
    import shlex

    from ddpdoctor.capture.interpreter import untraceable

    why = untraceable(command)  # python -I/-E/-S: PYTHONPATH, and so the start-up hook, never reaches it
    if why is not None:
        raise UsageError(f"cannot trace `{shlex.join(command)}`: {why}")
    exe = command[0]
    if os.sep in exe:
        if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
            raise UsageError(f"cannot run command {exe!r}: no such executable file")
    elif shutil.which(exe) is None:
        raise UsageError(f"cannot run command {exe!r}: not found on PATH")


def _prepare_rank_out(out: Path, rank: int, *, force: bool) -> None:
    """In-rank mode: every rank of the job shares ``out``; this one only checks and replaces its own files.
    Everything in ``out`` must be ddpdoctor's (the other ranks' files and unfinished writes as they start
    alongside), checked before anything is deleted."""
    from ddpdoctor.capture import rank_file

    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a directory")
    if out.is_dir():
        found = owned.own_entries(out)
        if found.foreign is not None:
            raise UsageError(f"--out {out}: {found.message(out)}; choose another directory (nothing was deleted)")
        mine = rank_file.own_files(out, rank)
        if mine and not force:
            raise UsageError(
                f"--out {out} already holds rank {rank} of a run; choose another directory or pass --force"
            )
        for path in mine:
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise UsageError(f"--force: cannot delete {path}: {exc.strerror or exc}") from None
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
        finished_run = (out / rundir.MANIFEST).exists()
        if multi_node and not finished_run:
            pass  # the other nodes of this run write here too
        elif not force:
            what = "a ddpdoctor run" if owned.ddpdoctor_owned(out) else "files that are not ddpdoctor's"
            raise UsageError(f"--out {out} already holds {what}; choose another directory or pass --force")
        else:  # everything decided before anything is deleted: ddpdoctor's own files and folders, or nothing
            found = owned.own_entries(out)
            if found.foreign is not None:
                raise UsageError(
                    f"--out {out}: {found.message(out)}; --force only replaces a ddpdoctor run (nothing was deleted)"
                )
            try:
                found.remove()
            except OSError as exc:
                raise UsageError(
                    f"--force: cannot delete {exc.filename or out}: {exc.strerror or exc} "
                    "(something was written there meanwhile?)"
                ) from None
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
    if args.quiet:  # torch's C++ warnings (the profiler's "Memory block of unknown size ...", every rank) too
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
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
        if launch != "torchrun" and not args.quiet:  # the script runs here; what it spawns gets our options
            from ddpdoctor.capture.interpreter import this_interpreter

            if (why := this_interpreter()) is not None:
                print(f"ddpdoctor: warning: {why}", file=sys.stderr, flush=True)
    from ddpdoctor.capture import hang
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
        every_steps=args.every_steps,
        every_s=args.every_s,
        keep=args.keep,
        with_stack=args.with_stack,
        record_shapes=not args.no_record_shapes,
        profile_memory=not args.no_profile_memory,
        gil=not args.no_gil,
        no_step_limit_s=args.no_step_limit,
        launcher_pid=os.getpid(),
        quiet=args.quiet,
        hang_timeout_s=hang.DEFAULT_HANG_S if args.hang_timeout is None else args.hang_timeout or None,
        hang_timeout_default=args.hang_timeout is None,
        all_threads=args.all_threads,
        all_devices=launch == "direct",
        launch=launch,
        max_steps=args.max_steps,
        knobs=args.knobs,
        extra=_metrics_extra(args),
    )
    from ddpdoctor.capture import launcher

    full_command = ["ddpdoctor", "trace", *argv]
    say = launcher.Reporter(quiet=args.quiet)
    first = args.wait + args.warmup + 1
    off = args.hang_timeout is not None and not args.hang_timeout
    explicit = None if args.hang_timeout is None or off else args.hang_timeout
    if launch != "scheduler" or who.rank == 0:
        say.start(
            out,
            target,
            tr,
            (first, first + args.active - 1),
            command=command,
            who=who,
            hang_timeout=hang.describe(explicit, off),
        )
    if (args.every is not None or args.keep) and (launch != "scheduler" or who.rank == 0) and not args.quiet:
        from ddpdoctor.capture.every import header

        print(header(args, first), file=sys.stderr, flush=True)
    judge = None
    if launch != "scheduler" and not off:  # the ranks are other processes here: this one stops them on a hang
        how = f"stopped by ddpdoctor --hang-timeout {explicit:g}" if explicit else "stopped by ddpdoctor's hang timeout"
        judge = launcher.HangJudge(
            out.absolute(), explicit=explicit is not None, launch=launch, say=say, how=how, shown=out
        ).start()
    # Every Python process the job starts runs the start-up hook, so the ranks it starts itself are traced.
    os.environ.update(launcher.startup_hook_env(dict(os.environ)))
    os.environ[ENV_VAR] = config.to_env()
    from ddpdoctor import knobs

    os.environ.update(knobs.environment(args.knobs))  # env.* knobs: for every process of the job
    started = time.time()
    from ddpdoctor.capture import runner

    cwd = os.getcwd()

    def finish(code: int) -> None:
        """Write the node record and manifest, and tell the user; also from ``os._exit`` in a one-process run."""
        with contextlib.suppress(OSError):  # a one-process script may have moved (hydra does): --out is from here
            os.chdir(cwd)
        # ... and may have put writers of its own in sys.stdout/stderr (logging's, without flush()): ddpdoctor's
        # lines go to the real ones, then the script's are put back (the process ends as a bare run would)
        theirs = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = sys.__stdout__ or sys.stdout, sys.__stderr__ or sys.stderr
        try:
            _finish(code)
        finally:
            sys.stdout, sys.stderr = theirs

    def _finish(code: int) -> None:
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
            disk = launcher.rank_write_error(out, man)  # met writing a trace, though the files written later fit
            if disk is not None:  # the ranks met it writing their traces: the same line as in one-process mode
                job = "script" if launch == "direct" else "job"
                print(
                    f"ddpdoctor: error: cannot write the run directory {out}: {disk} "
                    f"(the {job} exited with code {code})",
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
                judge=judge,
            )

    if launch == "command":
        code = launcher.run_command(command or [])
    elif launch == "torchrun":
        code = launcher.run_torchrun(tr, target_argv)
    else:  # direct (this process may only launch the ranks) or scheduler (this process is one rank)
        assert target is not None  # only -- COMMAND has no target
        code = runner.run(
            target,
            config,
            claimed=launch == "scheduler",
            on_os_exit=finish,
            stopped=None if judge is None else judge.stopped_job,
        )
    if judge is not None:
        judge.close()
        if judge.stopped:  # ddpdoctor stopped the job on a hang: its own exit status, not the signal's
            code = hang.HANG_EXIT
    finish(code)
    if code < 0:
        runner.die_by_signal(-code)
    return code


def register(sub: Any, name: str, help_text: str) -> None:  # pragma: no cover - trace bypasses argparse
    p = sub.add_parser(name, help=help_text, add_help=False)
    p.set_defaults(func=lambda _args: main(["--help"]))


def _metrics_extra(args: Any) -> dict:
    """--metrics-port / --metrics-textfile for the ranks (capture/series.py starts the exporters)."""
    extra: dict = {}
    if args.metrics_port is not None:
        extra["metrics_port"] = list(args.metrics_port)
    if args.metrics_textfile is not None:
        extra["metrics_textfile"] = os.path.abspath(args.metrics_textfile)
    return extra
