"""Run ``torch.nn.DataParallel``'s real multi-device code on CPU, for tests.

Without CUDA, DataParallel finds no device and its forward just calls the module: scatter, replicate,
parallel_apply, gather and the Broadcast/ReduceAddCoalesced/Gather/Scatter autograd functions never run.
Inside ``simulated_devices()`` they all run for real, with N replicas in N real threads; the only code
replaced is what needs CUDA, each by a CPU stand-in that does what the CUDA code does:

- ``torch._C._broadcast_coalesced`` / ``_scatter`` / ``_gather`` (the C++ kernels behind ``comm``): copies,
  chunking and concatenation on CPU; ``comm``'s Python wrappers around them still run.
- ``comm.reduce_add``: asserts its inputs are on GPUs and may use NCCL; the stand-in sums like its non-NCCL
  path. ``comm.reduce_add_coalesced`` (flattening into buckets) still runs for real.
- the ``torch.accelerator`` / ``torch.cuda`` calls of ``parallel_apply`` (device guard, current stream) and of
  ``Scatter`` (copy streams): no-ops on CPU, seen only by those modules.
- ``Broadcast.forward`` / ``Gather.forward`` refuse CPU tensors; they run as torch's own source with that one
  guard statement removed (compiled from torch's file, so tracebacks point at the real lines).

Every "device" is the CPU, so a tensor's ``get_device()`` is -1 everywhere; the stand-ins follow the C++ rules
with that (e.g. ``_scatter`` copies a chunk only when its target device differs from the tensor's).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import textwrap
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.nn.parallel import _functions, comm

# By module path: torch.nn.parallel re-exports functions of the same names as these modules.
data_parallel_module = importlib.import_module("torch.nn.parallel.data_parallel")
parallel_apply_module = importlib.import_module("torch.nn.parallel.parallel_apply")

_active = threading.Lock()  # the patches are process-wide: one simulation at a time


class HarnessUnsupported(RuntimeError):
    """This torch version's DataParallel differs from what the harness knows how to run on CPU."""


class _Overlay:
    """``base`` as seen through a few replaced attributes; everything else is ``base``'s own."""

    def __init__(self, base: Any, **overrides: Any) -> None:
        self._base = base
        self.__dict__.update(overrides)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


class _CpuStream:
    """What parallel_apply's workers enter as the replica's stream: CPU work has no streams."""

    def __enter__(self) -> _CpuStream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


_CPU_STREAM = _CpuStream()


# --- the C++ comm kernels (torch/csrc/cuda/comm.cpp) on CPU ---------------------------------------------


def _broadcast_coalesced(
    tensors: Sequence[torch.Tensor], devices: Sequence[int], buffer_size: int
) -> list[list[torch.Tensor]]:
    # comm.cpp returns the inputs themselves for devices[0] (so replica 0 shares storage with the module, as
    # DataParallel documents for BatchNorm buffers) and fresh, autograd-free copies for the other devices.
    if not devices:
        raise RuntimeError("Expected at least one device to broadcast to")
    copies = [[t.detach().clone() for t in tensors] for _ in devices[1:]]
    return [list(tensors), *copies]


def _scatter(
    tensor: torch.Tensor,
    devices: Sequence[int],
    chunk_sizes: Sequence[int] | None,
    dim: int,
    streams: Any,
) -> list[torch.Tensor]:
    if not devices:
        raise RuntimeError("Expected at least one device to scatter to")
    if chunk_sizes is not None:
        chunks = list(tensor.split_with_sizes(list(chunk_sizes), dim))
    else:
        chunks = list(tensor.chunk(len(devices), dim))
    # comm.cpp copies a chunk with .to(device) only when it is not already there; otherwise it stays a view.
    return [chunk.clone() if devices[i] != tensor.get_device() else chunk for i, chunk in enumerate(chunks)]


def _gather(tensors: Sequence[torch.Tensor], dim: int, destination: int | None) -> torch.Tensor:
    # comm.cpp allocates the result on `destination` and copies each input into its slice: a concatenation.
    return torch.cat(list(tensors), dim)


def _reduce_add(inputs: Sequence[torch.Tensor], destination: int | None = None) -> torch.Tensor:
    # comm.reduce_add without NCCL: the input already on `destination` plus the others copied over. For
    # DataParallel that root is replica 0 (the parameters' device); on CPU every input "is" there, so pick it.
    input_size = inputs[0].size()
    for i, inp in enumerate(inputs):
        if inp.size() != input_size:
            raise ValueError(f"input {i} has invalid size: got {inp.size()}, but expected {input_size}")
    if len(inputs) == 1:
        return inputs[0]
    result = inputs[0] + inputs[1]
    for other in inputs[2:]:
        result.add_(other)
    return result


# --- Broadcast.forward / Gather.forward without their CPU guard ------------------------------------------

_CPU_GUARD = "not implemented for CPU tensors"


def _without_cpu_guard(function: Any) -> Any:
    """``function`` recompiled from torch's source minus the one statement that rejects CPU tensors."""
    try:
        source = textwrap.dedent(inspect.getsource(function))
        filename = inspect.getsourcefile(function) or "<torch>"
    except (OSError, TypeError) as exc:
        raise HarnessUnsupported(f"no source for {function.__qualname__}: {exc}") from exc
    tree = ast.parse(source)
    definition = tree.body[0]
    if not isinstance(definition, ast.FunctionDef):
        raise HarnessUnsupported(f"{function.__qualname__} is not a plain function")
    kept = [stmt for stmt in definition.body if _CPU_GUARD not in ast.unparse(stmt)]
    if len(kept) != len(definition.body) - 1:
        raise HarnessUnsupported(f"{function.__qualname__}: expected exactly one CPU guard statement")
    definition.body = kept
    definition.decorator_list = []
    ast.increment_lineno(tree, function.__code__.co_firstlineno - 1)
    namespace: dict[str, Any] = {}
    # The module's own globals: the recompiled function sees comm, torch, ... exactly as the original does.
    exec(compile(tree, filename, "exec"), function.__globals__, namespace)
    return namespace[definition.name]


# --- the context ---------------------------------------------------------------------------------------


def _accelerator_for_workers() -> _Overlay:
    # parallel_apply asserts an accelerator exists, then enters the replica's device and stream and autocast
    # for the accelerator's device type: on CPU, no device guard, no stream, CPU autocast (state passed on).
    return _Overlay(
        getattr(torch, "accelerator", None),
        is_available=lambda: True,
        current_accelerator=lambda *args, **kwargs: torch.device("cpu"),
        current_stream=lambda *args, **kwargs: _CPU_STREAM,
        device_index=lambda *args, **kwargs: contextlib.nullcontext(),
    )


def _cuda_for_workers() -> _Overlay:
    # Older torch (before torch.accelerator) wrote the same with torch.cuda.
    return _Overlay(
        torch.cuda,
        current_stream=lambda *args, **kwargs: _CPU_STREAM,
        device=lambda *args, **kwargs: contextlib.nullcontext(),
        stream=lambda *args, **kwargs: contextlib.nullcontext(),
    )


def _no_copy_streams() -> _Overlay:
    # Scatter.forward makes background copy streams when an accelerator is present; CPU copies have none.
    return _Overlay(
        torch,
        accelerator=_Overlay(getattr(torch, "accelerator", None), is_available=lambda: False),
        cuda=_Overlay(torch.cuda, is_available=lambda: False),
    )


@contextlib.contextmanager
def simulated_devices() -> Iterator[None]:
    """Let DataParallel's multi-device forward and backward run on CPU (one simulation at a time).

    Build the module with ``data_parallel()``; run forward *and* backward inside the context.
    """
    if not _active.acquire(blocking=False):
        raise RuntimeError("simulated_devices() is already active")
    try:
        broadcast_forward = _without_cpu_guard(_functions.Broadcast.forward)
        gather_forward = _without_cpu_guard(_functions.Gather.forward)
        patches: list[tuple[Any, str, Any]] = [
            (
                comm,
                "torch",
                _Overlay(
                    torch,
                    _C=_Overlay(
                        torch._C,
                        _broadcast_coalesced=_broadcast_coalesced,
                        _scatter=_scatter,
                        _gather=_gather,
                    ),
                ),
            ),
            (comm, "reduce_add", _reduce_add),
            (_functions, "torch", _no_copy_streams()),
            (_functions.Broadcast, "forward", staticmethod(broadcast_forward)),
            (_functions.Gather, "forward", staticmethod(gather_forward)),
            (
                parallel_apply_module,
                "torch",
                _Overlay(torch, accelerator=_accelerator_for_workers(), cuda=_cuda_for_workers()),
            ),
        ]
        with contextlib.ExitStack() as undo:
            for owner, name, value in patches:
                _set_restorably(undo, owner, name, value)
            yield
    finally:
        _active.release()


def _set_restorably(undo: contextlib.ExitStack, owner: Any, name: str, value: Any) -> None:
    original = owner.__dict__[name]  # the raw attribute (a staticmethod stays one)
    setattr(owner, name, value)
    undo.callback(setattr, owner, name, original)


def data_parallel(module: torch.nn.Module, devices: int, *, dim: int = 0) -> torch.nn.DataParallel:
    """``torch.nn.DataParallel(module, device_ids=[0..devices-1], output_device=0, dim=dim)`` as it is on a
    machine with ``devices`` GPUs, except that the module stays on the CPU (its "device 0")."""
    # __init__ would look for GPUs (none here) and move the module to device 0; build it as on a machine
    # without accelerators, then set what __init__ sets with device_ids given.
    device_type = data_parallel_module._get_available_device_type
    data_parallel_module._get_available_device_type = lambda: None
    try:
        wrapper = torch.nn.DataParallel(module)
    finally:
        data_parallel_module._get_available_device_type = device_type
    wrapper.dim = dim
    wrapper.device_ids = list(range(devices))
    wrapper.output_device = 0
    wrapper.src_device_obj = torch.device("cpu")
    return wrapper
