"""Keep ddpdoctor's wrappers out of the warnings the script sees.

ddpdoctor wraps a few torch callables to observe them (DataLoader iterators, ``DistributedDataParallel``,
``DataParallel``, ``set_device``, ...). A wrapper is one more Python frame between the caller and torch, so a
``warnings.warn(..., stacklevel=2)`` inside torch names the wrapper's line (``ddpdoctor/capture/setup.py: ...
original(it, loader)``) instead of the line it names without ddpdoctor.

When CPython's warnings machinery counts ``stacklevel`` frames up, it skips every frame whose file name contains
both "importlib" and "_bootstrap" (that is how importlib keeps its own frames from being blamed for a warning).
``invisible(wrapper)`` gives the wrapper's code that kind of file name: the real path, with a note that says why.
Line numbers are unchanged. ``strip_exception`` removes ddpdoctor's frames, wherever they are, from the traceback
the script's uncaught exception prints. tests/unit/test_wrapper_warnings.py checks both.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

F = TypeVar("F", bound=Callable[..., object])

# Both words are what CPython's warnings module looks for (``_is_internal_filename``); the rest is for a reader.
_NOTE = " [ddpdoctor wrapper: skipped by warnings like importlib._bootstrap frames]"


def invisible(function: F) -> F:
    """Return ``function`` (changed in place) with its frames skipped by ``warnings.warn``'s ``stacklevel``."""
    code = function.__code__
    if _NOTE not in code.co_filename:
        function.__code__ = code.replace(co_filename=code.co_filename + _NOTE)
    return function


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def is_own_file(filename: str) -> bool:
    """True for a frame of ddpdoctor's own code (a wrapper or the runner), which the script's traceback leaves out."""
    return filename.startswith(_PACKAGE_DIR) or _NOTE in filename


def strip_traceback(
    tb: TracebackType | None, also: Callable[[str], bool] = lambda filename: False
) -> TracebackType | None:
    """``tb`` without ddpdoctor's frames (and those ``also`` names), wherever they are in it: the traceback a bare
    run shows. Kept whole when every frame is ddpdoctor's (an error of ddpdoctor itself)."""
    kept = []
    entry = tb
    while entry is not None:
        filename = entry.tb_frame.f_code.co_filename
        if not (is_own_file(filename) or also(filename)):
            kept.append(entry)
        entry = entry.tb_next
    if not kept:
        return tb
    rebuilt: TracebackType | None = None
    for entry in reversed(kept):
        rebuilt = TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return rebuilt


def strip_exception(value: BaseException | None, tb: TracebackType | None, **kwargs: object) -> TracebackType | None:
    """``strip_traceback(tb)``, and the same for the exceptions chained to ``value`` (``raise ... from``, or raised
    while handling another), as ``traceback.print_exception`` prints those too."""
    seen: set[int] = set()
    chained = [value.__cause__, value.__context__] if value is not None else []
    while chained:
        exc = chained.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        exc.__traceback__ = strip_traceback(exc.__traceback__, **kwargs)  # type: ignore[arg-type]
        chained += [exc.__cause__, exc.__context__]
    return strip_traceback(tb, **kwargs)  # type: ignore[arg-type]
