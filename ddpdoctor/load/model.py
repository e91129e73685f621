"""What the loader hands to the metrics: one ``Run`` of ``RankTrace``s (plain dataclasses of pandas frames).

Frames (all timestamps are µs floats as in the trace; ``end_us = ts_us + dur_us``):

- ``ops``      CPU-side complete events (cpu_op, user_annotation, python_function, cuda_runtime, cuda_driver,
               ...):
               ``name, cat, ts_us, dur_us, end_us, pid, tid, external_id, correlation, span``
- ``kernels``  device-side events (kernel, gpu_memcpy, gpu_memset, gpu_user_annotation, cuda_sync):
               ``name, cat, ts_us, dur_us, end_us, pid, tid, device, stream, correlation, external_id, span``
- ``memory``   ``[memory]`` instant events: ``name, cat, ts_us, dur_us, end_us, pid, tid, bytes,
               total_allocated, total_reserved, device_type, device_id, span`` (totals NaN where the trace
               does not record them)
- ``steps``    ``ProfilerStep#N`` ranges on the CPU: the ``ops`` columns plus ``step`` (N)
- ``comm_ops`` the collective calls' CPU events (``nccl:*``, ``gloo:*``, ``record_param_comms``, ``c10d::*``)
               with their arguments: the ``ops`` columns plus ``in_nelems, out_nelems, group_size, dtype,
               collective_name, pg_name, seq, input_dims, input_type``

``name`` and ``cat`` are pandas categoricals; ``cat`` holds the canonical lower-case category names of
``ddpdoctor.load.categories``. ``pid``/``tid`` are int64: numeric strings become numbers, ``"stream 7"``
becomes 7, other strings negative codes named in ``RankTrace.thread_names``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd


@dataclass
class RankTrace:
    """Everything known about one rank: its trace frames (all spans concatenated) and where they came from."""

    rank: int
    files: list[str] = field(default_factory=list)
    distributed_info: dict[str, Any] | None = None
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    ops: pd.DataFrame | None = None
    kernels: pd.DataFrame | None = None
    memory: pd.DataFrame | None = None
    steps: pd.DataFrame | None = None
    comm_ops: pd.DataFrame | None = None
    # (pid, tid) -> thread name from the trace's "thread_name" metadata ("thread 6023 (pt_gloo_runloop)")
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)
    # pid -> process label ("CPU", "GPU 0")
    process_labels: dict[int, str] = field(default_factory=dict)
    # per span (file): the profiler window [start_us, end_us] ("PyTorch Profiler (0)"), in span order
    windows: list[tuple[float, float]] = field(default_factory=list)
    base_time_ns: int | None = None
    # ranks/rank<R>.summary.json when loaded with use_summaries=True (then the frames are None)
    summary: dict[str, Any] | None = None

    @property
    def has_trace(self) -> bool:
        return self.ops is not None


@dataclass
class Run:
    """A loaded run: a ddpdoctor run directory, a folder of torch.profiler traces or one trace file."""

    path: Path
    ranks: list[RankTrace]
    world_size: int
    mode: str  # "ddp" | "dp" | "single"
    backend: str | None  # "nccl" | "gloo" | None
    rank_source: str  # "distributedInfo" | "filename" | "order"
    capture: dict[int, dict[str, Any]] = field(default_factory=dict)
    manifest: dict[str, Any] | None = None
    skipped: list[str] = field(default_factory=list)
    # what a report should say about the ranks loaded: ranks missing from the world size, ranks numbered by
    # file order, ranks without ProfilerStep ranges (one line each)
    notes: list[str] = field(default_factory=list)

    def rank(self, rank: int) -> RankTrace:
        for r in self.ranks:
            if r.rank == rank:
                return r
        raise KeyError(rank)
