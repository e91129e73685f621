"""ddpdoctor's start-up hook: Python runs this file at start-up in every process of a traced job.

``ddpdoctor trace`` puts this folder at the front of ``PYTHONPATH`` (as coverage.py's subprocess support does with a
``.pth`` file), so every Python interpreter the job starts — ``mp.spawn``'s children, the processes of
``accelerate launch``, Lightning's re-executed script, torchrun's ranks — runs it. Outside a traced job the folder is
on no path and this never runs. Inside one, a process that is not a rank (a launcher, a DataLoader worker, a helper)
only gets an import hook that waits for ``torch.distributed.init_process_group``; see ``ddpdoctor.capture.autostart``.

It never stops a process from starting: if ddpdoctor fails, one line on stderr says so and the process runs
untraced. Then the ``sitecustomize`` this one shadows (if any) runs as it would have.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _warn(exc: BaseException) -> None:
    try:
        print(
            f"ddpdoctor: warning: process {os.getpid()} is not traced: {type(exc).__name__}: {exc}",
            file=sys.stderr,
            flush=True,
        )
    except Exception:
        pass


def _start() -> None:
    if not os.environ.get("DDPDOCTOR_CAPTURE"):
        return
    try:
        from ddpdoctor.capture import autostart

        autostart.activate()
    except ModuleNotFoundError as exc:
        if exc.name != "ddpdoctor":  # an interpreter without ddpdoctor, started by the job: not ours to trace
            _warn(exc)
    except Exception as exc:  # never break the process because of ddpdoctor
        _warn(exc)


def _chain() -> None:
    """Run the ``sitecustomize`` this folder shadows, and leave ``sys.path`` as a bare start-up would."""
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    this = sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401  (the user's or the distribution's, if there is one)
    except ImportError:
        if this is not None:
            sys.modules["sitecustomize"] = this
    except Exception as exc:  # reported as Python reports a failing sitecustomize; start-up carries on
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}", file=sys.stderr)


_start()
_chain()
