"""What every GPU-check workload records about itself, beside ddpdoctor: the independent side of each comparison.

A workload writes ``$GPUCHECK_MEASURE/rank<R>.json`` at its end (one file per process; ``GPUCHECK_MEASURE``
is set by ``tests/gpu/gpu_checks.py``). Everything here is read from torch itself (CUDA events, the caching
allocator's own peak counters, ``time.perf_counter``), never from ddpdoctor.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch


def device_facts() -> dict[str, Any]:
    """The process's view of the GPUs: count, current device, and which devices hold a CUDA context."""
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
