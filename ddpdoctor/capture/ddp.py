"""DistributedDataParallel: track every DDP module the script builds and keep DDP's own logging data.

``_get_ddp_logging_data()`` carries the bucket layout, bucket_cap, find_unused_parameters, gradient_as_bucket_view,
static_graph and DDP's own timing of forward, backward, communication and their overlap (ns). DDP samples those
timings only on some iterations (its first 10, then every 100th); inside a profiled window we ask it to time every
iteration so the numbers cover the window, and outside one to go back to its own rate: timing every iteration costs
~30 us a step (benchmarks/bench_series.py), more than the rest of the always-on series.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

from ddpdoctor.capture.invisible import invisible

_instances: weakref.WeakSet = weakref.WeakSet()
_original_init: Any = None
_original_destroy: Any = None
# Called with each new DDP module (the set-up observer counts its BatchNorm layers, parameters, device).
_listeners: list[Callable[[Any], None]] = []
# Long enough for gloo's worker threads to finish freeing their last work items (they need the GIL to do it).
_TEARDOWN_GRACE_S = 0.05
# time.monotonic() when the script last called destroy_process_group() (every collective was issued before it)
destroy_started: float | None = None
# DDP's own timing rate: torch's default (kDDPRuntimeLoggingSampleRate) outside a profiled window, 1 inside one
DEFAULT_SAMPLE_RATE = 100
_every_iteration = False


def time_every_iteration(on: bool) -> None:
    """Have every DDP module time each iteration (``on``: a profiled window is open) or at DDP's own rate."""
    global _every_iteration
    if on == _every_iteration:
        return
    _every_iteration = on
    for module in list(_instances):
        _set_rate(module)


def _set_rate(module: Any) -> None:
    try:
        module._set_ddp_runtime_logging_sample_rate(1 if _every_iteration else DEFAULT_SAMPLE_RATE)
    except Exception:  # older torch or a subclass without a logger
        pass


def install() -> None:
    global _original_init
    try:
        from torch.nn.parallel import DistributedDataParallel as DDP
    except ImportError:  # pragma: no cover - torch without distributed
        return
    if _original_init is not None:
        return
    _original_init = DDP.__init__
    _install_destroy_grace()

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _original_init(self, *args, **kwargs)
        _instances.add(self)
        try:
            _gradients[id(self)] = gradient_sizes(self)
        except Exception:  # a module whose parameters cannot be listed: no giant-gradient check, the run goes on
            pass
        for listener in list(_listeners):
            listener(self)
        if _every_iteration:  # built inside a window; outside one DDP keeps its own rate
            _set_rate(self)

    __init__.__wrapped__ = _original_init  # type: ignore[attr-defined]
    DDP.__init__ = invisible(__init__)


def add_listener(listener: Callable[[Any], None]) -> None:
    """Call ``listener(ddp_module)`` for every DDP module built while capture is installed."""
    if listener not in _listeners:
        _listeners.append(listener)


def remove_listener(listener: Callable[[Any], None]) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def _install_destroy_grace() -> None:
    """Release the GIL briefly around ``destroy_process_group()``.

    Seen under ddpdoctor and, more rarely, bare: right after the last collective a gloo worker thread frees the
    finished work item, whose thread-local state holds a Python object, so it waits for the GIL; meanwhile the
    main thread returns from the training function and frees the DDP model, whose Reducer destroys the process
    group and joins that worker with the GIL held. Both wait forever. A short sleep (GIL released) before and
    after the teardown lets the worker finish first.
    """
    global _original_destroy, destroy_started
    import torch.distributed as dist

    if _original_destroy is not None or not hasattr(dist, "destroy_process_group"):
        return
    destroy_started = None  # this session's script has destroyed nothing yet
    _original_destroy = dist.destroy_process_group

    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        global destroy_started
        destroy_started = time.monotonic()
        time.sleep(_TEARDOWN_GRACE_S)
        try:
            return _original_destroy(*args, **kwargs)
        finally:
            time.sleep(_TEARDOWN_GRACE_S)

    destroy_process_group.__wrapped__ = _original_destroy  # type: ignore[attr-defined]
    dist.destroy_process_group = invisible(destroy_process_group)


def uninstall() -> None:
    global _original_init, _original_destroy
    if _original_init is None:
        return
    from torch.nn.parallel import DistributedDataParallel as DDP

    DDP.__init__ = _original_init
    _original_init = None
    if _original_destroy is not None:
        import torch.distributed as dist

        dist.destroy_process_group = _original_destroy
        _original_destroy = None


_snapshots: dict[int, dict[str, Any]] = {}
_gradients: dict[int, dict[str, Any]] = {}  # id(DDP module) -> gradient_sizes() at construction


def gradient_sizes(ddp: Any) -> dict[str, Any]:
    """The gradients DDP reduces (parameters that require grad, minus those it was told to ignore): their total
    bytes, and the largest one's name, bytes, the type of the module that holds it and, for an embedding, whether it
    already has sparse gradients. One pass over the parameters when DDP is built."""
    ignored = set(getattr(ddp, "parameters_to_ignore", None) or ())
    owners: dict[int, Any] = {}
    for module in ddp.module.modules():
        for param in module.parameters(recurse=False):
            owners.setdefault(id(param), module)
    total = 0
    count = 0
    largest: tuple[int, str, Any] | None = None
    for name, param in ddp.module.named_parameters():
        if not param.requires_grad or name in ignored:
            continue
        size = param.numel() * param.element_size()
        total += size
        count += 1
        if largest is None or size > largest[0]:
            largest = (size, name, param)
    out: dict[str, Any] = {"total_bytes": total, "count": count}
    if largest is not None:
        size, name, param = largest
        owner = owners.get(id(param))
        out.update(name=name, bytes=size, module_type=type(owner).__name__ if owner is not None else None)
        sparse = getattr(owner, "sparse", None)
        if isinstance(sparse, bool):  # nn.Embedding / nn.EmbeddingBag
            out["sparse"] = sparse
    return out


def snapshot() -> None:
    """Keep the latest logging data of every live DDP module (the script may drop its model before it exits)."""
    for entry_id, entry in _describe_live():
        _snapshots[entry_id] = entry


def describe() -> list[dict[str, Any]]:
    """DDP's logging data for each DDP module the script built, live or already collected (JSON-ready)."""
    snapshot()
    return list(_snapshots.values())


def _describe_live() -> list[tuple[int, dict[str, Any]]]:
    out = []
    for module in list(_instances):
        entry: dict[str, Any] = {"module": type(module.module).__name__ if hasattr(module, "module") else "?"}
        try:
            data = module._get_ddp_logging_data()
            entry["logging_data"] = {k: v for k, v in data.items() if isinstance(v, (int, float, str, bool))}
        except Exception as exc:
            entry["logging_data"] = None
            entry["error"] = f"{type(exc).__name__}: {exc}"
        try:
            entry["device_ids"] = [str(d) for d in (module.device_ids or [])]
        except Exception:
            entry["device_ids"] = None
        if id(module) in _gradients:
            entry["gradients"] = _gradients[id(module)]
        out.append((id(module), entry))
    return out
