"""Make ``torch.nn.DataParallel``'s stages visible in a trace.

DataParallel wraps a whole forward in one ``DataParallel.forward`` range; where its time goes (scattering the
batch, copying the parameters to every device, the replicas' forwards in their threads, gathering the outputs,
and in backward the reduction of the replicas' gradients onto device 0) is invisible. ``install()`` patches,
reversibly and idempotently, the methods and autograd functions DataParallel runs so each stage opens a
``torch.profiler.record_function`` range whose name the metrics key on:

    DataParallel.scatter          DataParallel.scatter()          inputs split and copied to the devices
    DataParallel.replicate        DataParallel.replicate()        module copied to every device (Broadcast)
    DataParallel.parallel_apply   DataParallel.parallel_apply()   all replicas' forwards, threads joined
    DataParallel.replica[<i>]     replica i, in parallel_apply    replica i's forward, in its worker thread
    DataParallel.gather           DataParallel.gather()           outputs concatenated on the output device
    DataParallel.backward_reduce  Broadcast.backward              replicas' parameter gradients summed onto
                                                                  the source device (ReduceAddCoalesced)
    DataParallel.gather_backward  Gather.backward                 output gradient scattered back (Scatter)

The replica ranges only reach the trace when the profiler records every thread
(``_ExperimentalConfig(profile_all_threads=True)``): the workers are plain Python threads, which the
profiler does not follow otherwise.

Cost: ranges are opened only while a profiler runs (the global flag torch's own compiled code checks). Always,
each stage takes a ``perf_counter`` pair, and gather sums its outputs' sizes, for ``take_step_stats()``.

The patches target DataParallel's internals (the same shape since torch 1.x; checked against 2.13); a target
that is missing or not what is expected is skipped, and ``install()`` names it, instead of failing the run.
"""

from __future__ import annotations

import functools
import importlib
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import torch
from torch.autograd import profiler as _autograd_profiler

from ddpdoctor.capture.invisible import invisible

SCATTER_RANGE = "DataParallel.scatter"
REPLICATE_RANGE = "DataParallel.replicate"
PARALLEL_APPLY_RANGE = "DataParallel.parallel_apply"
GATHER_RANGE = "DataParallel.gather"
BACKWARD_REDUCE_RANGE = "DataParallel.backward_reduce"
GATHER_BACKWARD_RANGE = "DataParallel.gather_backward"
REPLICA_RANGE_PREFIX = "DataParallel.replica["


def replica_range(index: int) -> str:
    """The range name of replica ``index``'s forward: ``DataParallel.replica[<index>]``."""
    return f"{REPLICA_RANGE_PREFIX}{index}]"


@dataclass(frozen=True)
class _Patch:
    owner: type
    name: str
    original: Any  # exactly what owner.__dict__ held (a staticmethod stays a staticmethod)
    replacement: Any


@dataclass
class _Seen:
    """A DataParallel instance (held weakly: never keeps a model alive) and its last description, which
    outlives it: the session writes its final capture after the script returned and its model was freed."""

    ref: weakref.ref[Any]
    last: dict[str, Any]
    forwarded: bool = False


_lock = threading.Lock()
_patches: list[_Patch] = []
_installed = False
_seen: list[_Seen] = []  # creation order
_seen_by_instance: weakref.WeakKeyDictionary[Any, _Seen] = weakref.WeakKeyDictionary()
_MAX_GONE = 16  # freed instances remembered (a script building DataParallel every step would grow forever)


def _new_stats() -> dict[str, Any]:
    return {
        "gathered_bytes": 0,
        "scatter_ms": 0.0,
        "replicate_ms": 0.0,
        "parallel_apply_ms": 0.0,
        "gather_ms": 0.0,
        "replicas": 0,
        "forwards": 0,
    }


# Updated from the thread that calls DataParallel (stage methods never run in the worker threads); replaced
# whole by take_step_stats(), so a stage finishing during the swap lands in one interval or the next.
_stats = _new_stats()


def _profiling() -> bool:
    # The Python-side flag torch.profiler sets on start/stop; unlike torch.autograd._profiler_enabled() it is
    # True under the Kineto profiler, and reading it costs a module attribute lookup.
    return getattr(_autograd_profiler, "_is_profiler_enabled", True)


def _record(name: str) -> Any:
    return _autograd_profiler.record_function(name)


# --- the wrappers -------------------------------------------------------------------------------------------


def _wrap_stage(original: Callable[..., Any], range_name: str, ms_key: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def stage(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = perf_counter()
        if _profiling():
            with _record(range_name):
                result = original(self, *args, **kwargs)
        else:
            result = original(self, *args, **kwargs)
        _stats[ms_key] += (perf_counter() - start) * 1e3
        return result

    return invisible(stage)


def _wrap_scatter(original: Callable[..., Any]) -> Callable[..., Any]:
    timed = _wrap_stage(original, SCATTER_RANGE, "scatter_ms")

    @functools.wraps(original)
    def scatter(self: Any, *args: Any, **kwargs: Any) -> Any:
        # Every multi-device forward starts here: catches instances built before install(), and describes each
        # as it is used (attributes set after __init__ included).
        seen = _seen_by_instance.get(self)
        if seen is None or not seen.forwarded:
            _remember(self, forwarded=True)
        _stats["forwards"] += 1
        return timed(self, *args, **kwargs)

    return invisible(scatter)


class _ReplicaCall:
    """Stands in for a replica in parallel_apply, which only calls it: opens the replica's range in the worker
    thread that runs it, around the whole call (hooks included)."""

    __slots__ = ("_module", "_name")

    def __init__(self, module: Any, index: int) -> None:
        self._module = module
        self._name = replica_range(index)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with _record(self._name):
            return self._module(*args, **kwargs)


def _wrap_parallel_apply(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def parallel_apply(self: Any, replicas: Any, *args: Any, **kwargs: Any) -> Any:
        start = perf_counter()
        count = len(replicas)
        if _profiling():
            calls = [_ReplicaCall(replica, i) for i, replica in enumerate(replicas)]
            with _record(PARALLEL_APPLY_RANGE):
                result = original(self, calls, *args, **kwargs)
        else:
            result = original(self, replicas, *args, **kwargs)
        stats = _stats
        stats["parallel_apply_ms"] += (perf_counter() - start) * 1e3
        stats["replicas"] = max(stats["replicas"], count)
        return result

    return invisible(parallel_apply)


def _wrap_gather(original: Callable[..., Any]) -> Callable[..., Any]:
    timed = _wrap_stage(original, GATHER_RANGE, "gather_ms")

    @functools.wraps(original)
    def gather(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = timed(self, *args, **kwargs)
        _stats["gathered_bytes"] += _tensor_bytes(result)
        return result

    return invisible(gather)


def _tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors in a gathered output (gather() rebuilds tensors, sequences and dicts)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def _wrap_backward(original: Callable[..., Any], range_name: str) -> Callable[..., Any]:
    # Runs in the autograd engine's thread for the device; the profiler follows the engine's threads.
    @functools.wraps(original)
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        if _profiling():
            with _record(range_name):
                return original(ctx, *grad_outputs)
        return original(ctx, *grad_outputs)

    return invisible(backward)


def _wrap_init(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _remember(self, forwarded=False)

    return invisible(__init__)


# --- install / uninstall ------------------------------------------------------------------------------------

# (owner, attribute, kind, wrapper factory); kind "method" or "staticmethod" is what owner.__dict__ must hold.
_Target = tuple[Any, str, str, Callable[[Callable[..., Any]], Callable[..., Any]]]


def _targets() -> list[_Target]:
    try:
        _functions = importlib.import_module("torch.nn.parallel._functions")
    except ImportError:
        _functions = None
    dp_cls = getattr(torch.nn, "DataParallel", None)
    broadcast = getattr(_functions, "Broadcast", None)
    gather_fn = getattr(_functions, "Gather", None)
    return [
        (dp_cls, "__init__", "method", _wrap_init),
        (dp_cls, "scatter", "method", _wrap_scatter),
        (dp_cls, "replicate", "method", lambda f: _wrap_stage(f, REPLICATE_RANGE, "replicate_ms")),
        (dp_cls, "parallel_apply", "method", _wrap_parallel_apply),
        (dp_cls, "gather", "method", _wrap_gather),
        (broadcast, "backward", "staticmethod", lambda f: _wrap_backward(f, BACKWARD_REDUCE_RANGE)),
        (gather_fn, "backward", "staticmethod", lambda f: _wrap_backward(f, GATHER_BACKWARD_RANGE)),
    ]


def _make_patch(owner: Any, name: str, kind: str, factory: Callable[..., Any]) -> _Patch | None:
    if not isinstance(owner, type):
        return None
    raw = owner.__dict__.get(name)
    if kind == "staticmethod":
        if not isinstance(raw, staticmethod) or not callable(raw.__func__):
            return None
        return _Patch(owner, name, raw, staticmethod(factory(raw.__func__)))
    if not callable(raw) or isinstance(raw, (staticmethod, classmethod)):
        return None
    return _Patch(owner, name, raw, factory(raw))


def install() -> list[str]:
    """Patch DataParallel so its stages appear as named ranges (idempotent; undo with ``uninstall()``).

    Returns the targets that could not be patched in this torch version, as ``"Owner.attribute"`` (empty when
    every range is available); those stages simply stay unlabelled.
    """
    global _installed
    with _lock:
        if _installed:
            return [_target_name(o, name) for o, name, *_ in _targets() if not _is_patched(o, name)]
        missing = []
        for owner, name, kind, factory in _targets():
            patch = _make_patch(owner, name, kind, factory)
            if patch is None:
                missing.append(_target_name(owner, name))
                continue
            setattr(patch.owner, patch.name, patch.replacement)
            _patches.append(patch)
        _installed = True
        return missing


def uninstall() -> None:
    """Restore everything ``install()`` patched (a no-op when not installed). An attribute someone re-patched
    after us is left alone: restoring it would drop their patch."""
    global _installed
    with _lock:
        while _patches:
            patch = _patches.pop()
            if patch.owner.__dict__.get(patch.name) is patch.replacement:
                setattr(patch.owner, patch.name, patch.original)
        _installed = False


def is_installed() -> bool:
    return _installed


def _is_patched(owner: Any, name: str) -> bool:
    return any(p.owner is owner and p.name == name for p in _patches)


def _target_name(owner: Any, name: str) -> str:
    return f"{getattr(owner, '__name__', owner)}.{name}"


# --- what the session reads ---------------------------------------------------------------------------------


def take_step_stats() -> dict[str, Any]:
    """DataParallel activity since the previous call (call it at each step boundary).

    ``gathered_bytes``: bytes of the outputs gather() produced on the output device (all replicas' shares);
    ``scatter_ms``, ``replicate_ms``, ``parallel_apply_ms``, ``gather_ms``: host wall time of each stage in
    milliseconds (with CUDA, launches and the waits the stage makes, not asynchronous kernel time);
    ``replicas``: most replicas one forward used; ``forwards``: multi-device DataParallel forwards.
    """
    global _stats
    stats, _stats = _stats, _new_stats()
    return stats


def describe() -> list[dict[str, Any]]:
    """The DataParallel instances of this process, in creation order, freed ones included (as last seen):
    ``{"module", "wrapper", "device_ids", "output_device", "dim"}``.

    ``module`` is the wrapped module's class name, ``wrapper`` the DataParallel (sub)class. ``device_ids`` is
    empty, and ``output_device``/``dim`` are None, when DataParallel found no accelerator and just calls the
    module.
    """
    with _lock:
        for seen in _seen:
            instance = seen.ref()
            if instance is not None:
                seen.last = _describe_one(instance)
        return [dict(seen.last) for seen in _seen]


def _remember(instance: Any, *, forwarded: bool) -> None:
    with _lock:
        seen = _seen_by_instance.get(instance)
        if seen is None:
            seen = _Seen(weakref.ref(instance), {})
            _seen_by_instance[instance] = seen
            _seen.append(seen)
            _forget_gone()
        seen.last = _describe_one(instance)
        seen.forwarded = seen.forwarded or forwarded


def _forget_gone() -> None:
    # Of the freed instances, keep one per distinct description, and at most _MAX_GONE of them.
    kept: list[_Seen] = []
    gone_descriptions: list[dict[str, Any]] = []
    for seen in reversed(_seen):  # newest first: the most recent of each description stays
        if seen.ref() is None:
            if seen.last in gone_descriptions or len(gone_descriptions) >= _MAX_GONE:
                continue
            gone_descriptions.append(seen.last)
        kept.append(seen)
    _seen[:] = reversed(kept)


def _describe_one(instance: Any) -> dict[str, Any]:
    module = instance.__dict__.get("_modules", {}).get("module")
    return {
        "module": type(module).__name__ if module is not None else None,
        "wrapper": type(instance).__name__,
        "device_ids": [_device_json(d) for d in getattr(instance, "device_ids", None) or []],
        "output_device": _device_json(getattr(instance, "output_device", None)),
        "dim": getattr(instance, "dim", None),
    }


def _device_json(device: Any) -> int | str | None:
    if device is None or isinstance(device, (int, str)):
        return device
    if isinstance(device, torch.device):
        return device.index if device.index is not None else str(device)
    return str(device)
