"""What every GPU-check workload records about itself, beside ddpdoctor: the independent side of each comparison.

A workload writes ``$GPUCHECK_MEASURE/rank<R>.json`` at its end (one file per process; ``GPUCHECK_MEASURE``
is set by ``tests/gpu/gpu_checks.py``). Everything here is read from torch itself (CUDA events, the caching
allocator's own peak counters, ``time.perf_counter``), never from ddpdoctor.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

# GPUCHECK_CPU=1: run the workloads on the CPU (a smoke run of the kit's plumbing on a machine without a GPU;
# the comparisons then fail, but nothing may crash). Never set on the GPU machine.
CPU_SMOKE = os.environ.get("GPUCHECK_CPU") == "1"


def device(index: int = 0) -> torch.device:
    return torch.device("cpu") if CPU_SMOKE else torch.device("cuda", index)


def shrink_for_cpu(args: Any) -> None:
    """In a CPU smoke run, a model small enough for a shared CPU (the GPU sizes would take minutes)."""
    if CPU_SMOKE:
        args.width, args.batch, args.depth = min(args.width, 64), min(args.batch, 32), min(args.depth, 4)


def pinned(t: torch.Tensor) -> torch.Tensor:
    return t if CPU_SMOKE else t.pin_memory()


class StepTimer:
    """GPU time between two points of the stream, per step: ``torch.cuda.Event`` pairs (perf_counter on CPU)."""

    def __init__(self, steps: int) -> None:
        self._marks: list[list[Any]] = [[None, None] for _ in range(steps)]

    def mark(self, step: int, which: int) -> None:
        if CPU_SMOKE:
            self._marks[step][which] = time.perf_counter()
        else:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._marks[step][which] = ev

    def elapsed_ms(self) -> list[float]:
        if CPU_SMOKE:
            return [(b - a) * 1e3 for a, b in self._marks]
        torch.cuda.synchronize()
        return [a.elapsed_time(b) for a, b in self._marks]


def device_facts() -> dict[str, Any]:
    """The process's view of the GPUs: count, current device, and which devices hold a CUDA context."""
    if CPU_SMOKE:
        return {
            "device_count": 0,
            "current_device": None,
            "initialized_devices": [],
            "device_name": "cpu",
            "total_memory": [1],
            "uuid": [],
            "pid": os.getpid(),
            "nvml_context_devices": None,
        }
    count = torch.cuda.device_count()
    facts: dict[str, Any] = {
        "device_count": count,
        "current_device": torch.cuda.current_device(),
        "initialized_devices": [],
        "device_name": torch.cuda.get_device_name(0),
        "total_memory": [int(torch.cuda.get_device_properties(i).total_memory) for i in range(count)],
        "uuid": [str(getattr(torch.cuda.get_device_properties(i), "uuid", "")) for i in range(count)],
        "pid": os.getpid(),
    }
    for i in range(count):
        # memory_stats never creates a context; reserved > 0 means this process allocated there.
        if int(torch.cuda.memory_stats(i).get("reserved_bytes.all.peak", 0)) > 0:
            facts["initialized_devices"].append(i)
    facts["nvml_context_devices"] = _nvml_context_devices()
    return facts


def _nvml_context_devices() -> list[int] | None:
    """Indices of the GPUs on which NVML lists this process (None where NVML cannot tell)."""
    try:
        import pynvml  # nvidia-ml-py, in the device image

        pynvml.nvmlInit()
        found = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            if any(p.pid == os.getpid() for p in procs):
                found.append(i)
        pynvml.nvmlShutdown()
        return found
    except Exception:
        return None


def memory_peaks(device: int = 0) -> dict[str, int]:
    if CPU_SMOKE:
        return {"max_memory_allocated": 0, "max_memory_reserved": 0}
    return {
        "max_memory_allocated": int(torch.cuda.max_memory_allocated(device)),
        "max_memory_reserved": int(torch.cuda.max_memory_reserved(device)),
    }


def write(record: dict[str, Any]) -> None:
    """Write ``record`` (plus the rank) to ``$GPUCHECK_MEASURE/rank<R>.json`` and print the memory peaks."""
    rank = int(os.environ.get("RANK", "0"))
    folder = os.environ.get("GPUCHECK_MEASURE")
    record = {"rank": rank, **record}
    print(f"gpucheck rank {rank}: " + json.dumps({k: v for k, v in record.items() if "max_memory" in k}))
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        tmp = Path(folder) / f".rank{rank}.json.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, Path(folder) / f"rank{rank}.json")
