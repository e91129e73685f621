"""Canonical, lower-case event categories across torch 1.9 … 2.13 traces.

Kineto renamed its categories over the years (``Operator`` → ``cpu_op``, ``Runtime`` → ``cuda_runtime``,
``Kernel`` → ``kernel``, ``Memcpy`` → ``gpu_memcpy``, ...). Everything downstream sees only the names on the
right.
"""

from __future__ import annotations

CANONICAL = {
    "cpu_op": "cpu_op",
    "operator": "cpu_op",
    "user_annotation": "user_annotation",
    "gpu_user_annotation": "gpu_user_annotation",
    "python_function": "python_function",
    "python": "python_function",
    "cuda_runtime": "cuda_runtime",
    "runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver",
    "kernel": "kernel",
    "gpu_memcpy": "gpu_memcpy",
    "memcpy": "gpu_memcpy",
    "gpu_memset": "gpu_memset",
    "memset": "gpu_memset",
    "cuda_sync": "cuda_sync",
    "trace": "trace",
    "cpu_instant_event": "cpu_instant_event",
    "fwdbwd": "forward_backward",
    "forward_backward": "forward_backward",
    "ac2g": "ac2g",
    "async": "ac2g",
    "overhead": "overhead",
}

# Events that happen on the device timeline (pid = device, tid = stream).
DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync"})
# Device events that keep the device busy (what "GPU busy" and tb-profiler's Kernel/Memcpy/Memset count).
DEVICE_WORK_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
# Host-side calls into the device runtime/driver.
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver"})


def canonical(cat: str | None) -> str:
    """The canonical lower-case name of a raw trace category ("" for a missing one)."""
    if not cat:
        return ""
    low = cat.lower()
    if low in CANONICAL:
        return CANONICAL[low]
    if low.endswith("_runtime"):  # privateuse1_runtime, xpu_runtime, mtia_runtime
        return "cuda_runtime"
    if low.endswith("_driver"):
        return "cuda_driver"
    return low
