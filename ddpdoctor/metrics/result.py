"""``RunMetrics``: what ``analyze`` returns (see docs/CONTRACTS.md for every name and unit)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

RANK_METRICS = (
    "step_ms_median",
    "step_ms_p90",
    "step_ms_mean",
    "steps_analyzed",
    "dataloader_ms",
    "forward_ms",
    "backward_ms",
    "optimizer_ms",
    "comm_ms",
    "exposed_comm_ms",
    "other_ms",
    "overlap_ratio",
    "ddp_reported_overlap_ratio",
    "busbw_gbps",
    "algbw_gbps",
    "collective_wait_ms",
    "late_arrival_ms",
    "gpu_util_ratio",
    "host_sync_ms",
    "gil_contention",
    "threads",
    "dp_scatter_ms",
    "dp_replicate_ms",
    "dp_parallel_apply_ms",
    "dp_gather_ms",
    "dp_backward_reduce_ms",
    "dp_replicas",
    "thread_parallelism",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "capacity_bytes",
    "headroom_ratio",
    "foreign_cuda0_bytes",
    "ddp_bucket_count",
    "ddp_bucket_cap_mb",
    "ddp_find_unused_parameters",
    "ddp_gradient_as_bucket_view",
    "ddp_static_graph",
    "ddp_broadcast_buffers",
    "ddp_comm_hook",
    "ddp_unused_parameter_size_ratio",
    "cpu_count",
    "intra_op_threads",
    "local_world_size",
)
RUN_METRICS = (
    "world_size",
    "steps_analyzed",
    "gpu0_peak_reserved_bytes",
    "gpu0_capacity_bytes",
    "gpu0_headroom_ratio",
    "others_max_peak_reserved_bytes",
    "gpu0_vs_others_ratio",
    "step_skew_ratio",
    "straggler_rank",
    "straggler_wait_ms",
    "straggler_late_share",
)


@dataclass(frozen=True)
class RunMetrics:
    """Run-level dict, one flat dict per rank, and frames for charts and gating."""

    run: dict[str, Any]
    ranks: list[dict[str, Any]]
    per_step: pd.DataFrame
    collectives: pd.DataFrame
    devices: pd.DataFrame

    def rank(self, rank: int) -> dict[str, Any]:
        return next(r for r in self.ranks if r["rank"] == rank)

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict (NaN becomes None)."""
        return {
            "run": jsonable(self.run),
            "ranks": jsonable(self.ranks),
            "per_step": jsonable(self.per_step.to_dict(orient="records")),
            "collectives": jsonable(self.collectives.to_dict(orient="records")),
            "devices": jsonable(self.devices.to_dict(orient="records")),
        }


def jsonable(obj: Any) -> Any:
    """``obj`` with numpy scalars as Python numbers and NaN/inf as None (JSON has neither)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return None if math.isnan(obj) or math.isinf(obj) else float(obj)
    return obj
