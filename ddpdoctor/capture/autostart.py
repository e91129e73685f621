"""Trace every process of a job that becomes a rank, however it was started (run by the start-up hook).

``ddpdoctor trace`` hands its settings to the whole job in ``DDPDOCTOR_CAPTURE`` and puts
``ddpdoctor/capture/_startup`` (a ``sitecustomize``) on ``PYTHONPATH``, so every Python process the job starts calls
:func:`activate`. That costs one import of this small module: it imports neither torch nor the rest of ddpdoctor.
It only adds an import hook that, when torch's ``distributed_c10d`` module is loaded, wraps
``init_process_group``. A process that creates its default process group is a rank: it then starts a capture session
(unless it has one already), with the group's rank, and finishes it when the process exits, recording how it ended.
Its files go where its group's do (:mod:`ddpdoctor.capture.groups`): a second group of the job never replaces the
files of the first.

A launcher (torchrun's agent, ``accelerate launch``, ``mp.spawn``'s parent), a DataLoader worker or a helper script
never creates a process group, so it is never traced. Anything that fails here prints one line and leaves the
process running untraced.

Under ``trace -- COMMAND`` a job may train in one process without any process group (``accelerate launch --cpu``
starts one process; ``python train.py`` behind a shell script): the hook also watches ``torch.optim.Optimizer``, and
a process that creates an optimizer before it has a session starts one not yet claimed (as ``trace`` does for the
script it runs itself). It becomes rank 0 of 1 when its optimizer steps (or the group's rank, if it creates a process
group later); a process that never steps and never joins a group leaves no files when the job's ranks wrote theirs.

:func:`activate` also turns torch's Flight Recorder on for the process and those it starts (``FR_VARIABLES``, unless
the user set them): the collectives a rank's dumps list (:mod:`ddpdoctor.capture.flight`).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing is not imported for real: every Python process of a traced job loads this module
if TYPE_CHECKING:
    from typing import Any

_TARGET = "torch.distributed.distributed_c10d"
_OPTIM = "torch.optim.optimizer"  # Optimizer: a process training without a process group (-- COMMAND only)
_active = False
_started_pids: set[int] = set()
# The Flight Recorder's buffer size (entries per process group): torch reads the first name, older torch the second
# (torch 2.11 and later warn that the second is deprecated, once per rank: it is set only for an older torch).
FR_VARIABLES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FR_BUFFER = "2000"
_FR_NEW_NAME_ONLY = (2, 11)


def enable_flight_recorder(environ: Any = None) -> None:
    """Turn the Flight Recorder on in this process's environment (read when a process group is created), unless the
    user set either variable (an empty value too: theirs; the new name would override a user's old one)."""
    env = os.environ if environ is None else environ
    if not any(name in env for name in FR_VARIABLES):
        env[FR_VARIABLES[0]] = FR_BUFFER


def _flight_recorder_for_this_torch(torch_version: str, environ: Any = None) -> None:
    """Just before a process group is created (torch loaded): a torch older than 2.11 also gets the old name, unless
    the user set one of them (``enable_flight_recorder`` set only the new one, and only when neither was set)."""
    env = os.environ if environ is None else environ
    if env.get(FR_VARIABLES[0]) != FR_BUFFER or FR_VARIABLES[1] in env:
        return
    try:
        major, minor = (int(part) for part in torch_version.split(".")[:2])
    except ValueError:
        return
    if (major, minor) < _FR_NEW_NAME_ONLY:
        env[FR_VARIABLES[1]] = FR_BUFFER


def activate() -> None:
    """Watch for ``init_process_group`` in this process (idempotent)."""
    global _active
    if _active:
        return
    _active = True
    enable_flight_recorder()
    waiting = set()
    for name, patch in _PATCHES.items():
        module = sys.modules.get(name)
        if module is not None:
            patch(module)
        else:
            waiting.add(name)
    if waiting:
        sys.meta_path.insert(0, _Finder(waiting))


class _Finder:
    """A meta-path finder that only answers for the modules it waits for (``torch.distributed.distributed_c10d``,
    ``torch.optim.optimizer``), with a patching loader."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.names:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PatchingLoader(spec.loader, _PATCHES[fullname])  # type: ignore[assignment]
        self.names.discard(fullname)
        if not self.names and self in sys.meta_path:
            sys.meta_path.remove(self)  # each loaded once per process
        return spec


class _PatchingLoader:
    def __init__(self, loader: Any, patch: Any) -> None:
        self._loader = loader
        self._patch = patch

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... as the real loader answers
        return getattr(self._loader, name)

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        self._patch(module)  # before torch.distributed's `from .distributed_c10d import *` copies the name


def _patch(module: Any) -> None:
    try:
        import functools

        original = module.init_process_group
        if getattr(original, "_ddpdoctor_wrapped", False):
            return

        @functools.wraps(original)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            torch = sys.modules.get("torch")
            if torch is not None:
                _flight_recorder_for_this_torch(str(getattr(torch, "__version__", "")))
            result = original(*args, **kwargs)
            _joined_process_group()
            return result

        init_process_group._ddpdoctor_wrapped = True  # type: ignore[attr-defined]
        from ddpdoctor.capture.invisible import invisible

        module.init_process_group = invisible(init_process_group)
        package = sys.modules.get("torch.distributed")  # loaded already (the process ddpdoctor runs a script in)
        if package is not None and getattr(package, "init_process_group", None) is original:
            setattr(package, "init_process_group", module.init_process_group)  # noqa: B010 (mypy: a ModuleType)
    except Exception as exc:
        _warn("cannot watch init_process_group", exc)


def _patch_optimizer(module: Any) -> None:
    """Wrap ``Optimizer.__init__`` (every optimizer calls it): see :func:`_optimizer_created`."""
    try:
        cls = module.Optimizer
        original = cls.__init__
        if getattr(original, "_ddpdoctor_wrapped", False):
            return
        import functools

        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            _optimizer_created()

        __init__._ddpdoctor_wrapped = True  # type: ignore[attr-defined]
        from ddpdoctor.capture.invisible import invisible

        cls.__init__ = invisible(__init__)
    except Exception as exc:
        _warn("cannot watch torch.optim.Optimizer", exc)


def _optimizer_created() -> None:
    """A process of a ``-- COMMAND`` job created an optimizer: if it has no session (no process group yet, and
    ddpdoctor did not start it as a rank), start one, not yet claimed: it may be the job's one training process."""
    if os.getpid() in _started_pids or not os.environ.get("DDPDOCTOR_CAPTURE"):
        return
    try:
        from ddpdoctor.capture import session as session_mod

        if session_mod.current() is not None:
            return
        _started_pids.add(os.getpid())
        _start_rank_session(alone=True)
    except Exception as exc:
        _warn("capture not started", exc)


_PATCHES = {_TARGET: _patch, _OPTIM: _patch_optimizer}


def _joined_process_group() -> None:
    try:
        from ddpdoctor.capture import session as session_mod

        current = session_mod.current()
        if current is not None:  # traced already (the script ddpdoctor runs, a torchrun rank): it is a rank
            current.joined_process_group()
        elif os.getpid() not in _started_pids:
            _started_pids.add(os.getpid())
            _start_rank_session()
    except Exception as exc:
        _warn("capture not started", exc)


def _start_rank_session(*, alone: bool = False) -> None:
    """Start this process's session as the rank its process group says; ``alone``: a ``-- COMMAND`` process with
    an optimizer and no process group, whose session is claimed when it steps (rank 0 of 1, or as its launcher's
    variables say)."""
    import dataclasses
    from pathlib import Path

    from ddpdoctor.capture import exits, groups, rank_file
    from ddpdoctor.capture.config import CaptureConfig
    from ddpdoctor.capture.session import Session

    config = CaptureConfig.from_env()
    if config is None or not os.path.isdir(config.out):
        return
    if alone:
        if config.launch != "command" or rank_file.dist_info() is not None:
            return  # the other launch forms start their sessions themselves; a rank's starts at its group
        who = rank_file.identity()
        config = dataclasses.replace(config, all_devices=who.world_size == 1)  # one process: every device is its
        session = Session(config, claimed=False, identity=who)
        session.start()
        exits.finish_at_exit(session)
        _dump_on_exception(session)
        session.flight.watch_signals()
        return
    # One rank among several: not the one-process DataParallel set-up that "direct" settings are for.
    launch = "spawn" if config.launch == "direct" else config.launch  # started by the traced script itself
    config = dataclasses.replace(config, launch=launch, all_devices=False)
    info = rank_file.dist_info()
    if info is None:
        return
    # Where this group's files go (the run's top level, or a folder of its own): agreed with the group's other ranks.
    placement = groups.join(Path(config.out), rank=info["rank"], world_size=info["world_size"], backend=info["backend"])
    who = rank_file.identity().with_process_group(info["rank"], info["world_size"])
    session = Session(config, identity=who)
    session.joined_process_group(placement)
    session.start()
    exits.finish_at_exit(session)
    _dump_on_exception(session)
    session.flight.watch_signals()  # SIGTERM / SIGUSR1 dump while the main thread is blocked in a collective


def _dump_on_exception(session: Any) -> None:
    """An exception that escapes this rank's ``__main__``: dump the rank (its traceback, every thread, the Flight
    Recorder) before the exception is printed and the process ends."""
    previous = sys.excepthook

    def excepthook(etype: Any, value: Any, tb: Any) -> None:
        try:
            session.saw_exception(value)
        except Exception:  # never stand between the user and their traceback
            pass
        previous(etype, value, tb)

    sys.excepthook = excepthook


def _warn(what: str, exc: BaseException) -> None:
    try:
        print(
            f"ddpdoctor: warning: process {os.getpid()}: {what}: {type(exc).__name__}: {exc}",
            file=sys.stderr,
            flush=True,
        )
    except Exception:
        pass
