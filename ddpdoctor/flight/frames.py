"""Which frames are the user's own code: not torch's, ddpdoctor's or the Python standard library's (judged by the
path as the dumping host wrote it, so a dump read on another machine is judged the same). Other libraries'
site-packages frames count only when the stack holds none of the script's own files."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from ddpdoctor.runfile_types import Frame

_SITE = re.compile(r"/(?:site|dist)-packages/")
_TORCH = re.compile(
    r"/(?:site|dist)-packages/(?:torch|torchgen|functorch|triton)/"
    r"|/torch/(?:distributed|nn|autograd|utils|optim|_dynamo|_inductor|multiprocessing|cuda|fx|_C)/"
    r"|/torch/(?:_tensor|functional|serialization|overrides|_ops)\.py$"
)
_DDPDOCTOR = re.compile(
    r"/(?:site|dist)-packages/ddpdoctor/|/ddpdoctor/(?:capture|flight|cli|trial|load|metrics|diagnosis|report)/"
    r"|/ddpdoctor/(?:__main__|pytest_plugin|pipeline|rundir)\.py$"
)
_STDLIB = re.compile(r"/lib(?:64)?/python\d+(?:\.\d+)?t?/(?!(?:site|dist)-packages/)|/Lib/(?!site-packages/)")
_INTERNAL = ("<frozen ", "<string>", "<built-in", "<stdin>", "<decorator-gen")
_DIST_FILE = "/torch/distributed/distributed_c10d.py"


def _norm(path: str) -> str:
    return path.replace("\\", "/")


def is_torch(frame: Frame) -> bool:
    return bool(_TORCH.search(_norm(frame.file)))


def is_ddpdoctor(frame: Frame) -> bool:
    return bool(_DDPDOCTOR.search(_norm(frame.file)))


def is_stdlib(frame: Frame) -> bool:
    f = _norm(frame.file)
    return f.startswith(_INTERNAL) or bool(_STDLIB.search(f))


def is_other_library(frame: Frame) -> bool:
    return bool(_SITE.search(_norm(frame.file)))


def is_library(frame: Frame) -> bool:
    """torch, ddpdoctor or the standard library: never the user's own code."""
    return is_torch(frame) or is_ddpdoctor(frame) or is_stdlib(frame)


def user_frames(frames: Sequence[Frame]) -> tuple[Frame, ...]:
    """The user's own frames of a stack given outermost first, innermost first. The script's own files when there are
    any; otherwise other libraries' frames (site-packages), which are better than nothing."""
    own = [f for f in frames if not is_library(f) and not is_other_library(f)]
    if not own:
        own = [f for f in frames if not is_library(f)]
    return tuple(reversed(own))


def innermost_user_frame(frames: Sequence[Frame]) -> Frame | None:
    found = user_frames(frames)
    return found[0] if found else None


def below_user(frames: Sequence[Frame]) -> list[Frame]:
    """The frames called from the innermost user frame (outermost first): where the user's code is blocked."""
    inner = innermost_user_frame(frames)
    if inner is None:
        return list(frames)
    idx = max(i for i, f in enumerate(frames) if f is inner)
    return list(frames[idx + 1 :])


def dist_op(frames: Iterable[Frame]) -> str | None:
    """The c10d function (``all_reduce``, ``barrier``, ...) a stack (outermost first) is inside, innermost one."""
    op = None
    for f in frames:
        if _norm(f.file).endswith(_DIST_FILE) and not f.name.startswith("_"):
            op = f.name
    return op


def in_torch_wait(frames: Sequence[Frame]) -> bool:
    """The frames below the user's code are torch's collectives, autograd (DDP's reducer waits there) or DDP."""
    for f in frames:
        n = _norm(f.file)
        if (
            "/torch/distributed/" in n
            or "/torch/autograd/" in n
            or n.endswith("/torch/_tensor.py")
            and f.name == "backward"
        ):
            return True
    return False
