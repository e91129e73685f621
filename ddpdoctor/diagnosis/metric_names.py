"""The metric names a rule may use, with unit and meaning (from docs/CONTRACTS.md, plus a few derived here).

A rule file that names anything else fails to load. Per-rank metrics are the flat dicts in
``RunMetrics.ranks``; run-level metrics live in ``RunMetrics.run``. ``DERIVED`` metrics are per-rank values
ddpdoctor's diagnosis computes itself from ``RunMetrics.collectives`` (see ``ddpdoctor.diagnosis.derived``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["number", "flag", "text"]


@dataclass(frozen=True)
class MetricName:
    name: str
    unit: str  # "ms", "bytes", "ratio" (0-1), "x" (a multiple), "count", "GB/s", "MB", "flag", "rank", "text"
    description: str
    kind: Kind = "number"


def _table(rows: list[tuple[str, str, str]]) -> dict[str, MetricName]:
    out = {}
    for name, unit, description in rows:
        kind: Kind = "flag" if unit == "flag" else "text" if unit == "text" else "number"
        out[name] = MetricName(name, unit, description, kind)
    return out


PER_RANK: dict[str, MetricName] = _table(
    [
        ("rank", "rank", "the global rank this row describes"),
        ("step_ms_median", "ms", "median wall time of one training step"),
        ("step_ms_p90", "ms", "90th percentile wall time of one training step"),
        ("step_ms_mean", "ms", "mean wall time of one training step"),
        ("steps_analyzed", "count", "number of profiled steps the metrics of this rank cover"),
        (
            "dataloader_ms",
            "ms",
            "time per step the training loop waits for the next batch from the DataLoader",
        ),
        ("forward_ms", "ms", "time per step in the forward pass"),
        ("backward_ms", "ms", "time per step in the backward pass"),
        ("optimizer_ms", "ms", "time per step in optimizer.step() (and zero_grad)"),
        ("comm_ms", "ms", "time per step the device spends in collectives (all-reduce, broadcast, ...)"),
        ("exposed_comm_ms", "ms", "communication time per step not hidden behind computation"),
        (
            "exposed_transfer_ms",
            "ms",
            "exposed communication less the time spent waiting for late peers (per step)",
        ),
        ("other_ms", "ms", "step time not attributed to any other component"),
        ("overlap_ratio", "ratio", "share of communication time that overlaps computation (0-1)"),
        (
            "ddp_reported_overlap_ratio",
            "ratio",
            "overlap of communication and backward as DDP's own logging reports it",
        ),
        ("busbw_gbps", "GB/s", "collective bus bandwidth (nccl-tests convention: comparable to link speed)"),
        ("algbw_gbps", "GB/s", "collective algorithm bandwidth (bytes / time)"),
        ("collective_wait_ms", "ms", "time per step this rank waits inside collectives for the other ranks"),
        (
            "late_arrival_ms",
            "ms",
            "how late per step this rank enters collectives compared with the earliest rank",
        ),
        ("gpu_util_ratio", "ratio", "share of step time at least one kernel runs on the rank's device (0-1)"),
        (
            "host_sync_ms",
            "ms",
            "time per step the host blocks waiting for the device (synchronize, .item(), ...)",
        ),
        ("gil_contention", "ratio", "share of time Python threads wait for the GIL (gilknocker probe, 0-1)"),
        ("threads", "count", "Python threads alive in the rank's process"),
        ("dp_scatter_ms", "ms", "DataParallel: time per step scattering inputs to the replicas"),
        ("dp_replicate_ms", "ms", "DataParallel: time per step copying the module to every device"),
        (
            "dp_parallel_apply_ms",
            "ms",
            "DataParallel: time per step running the replicas' forward in threads",
        ),
        ("dp_gather_ms", "ms", "DataParallel: time per step gathering outputs onto the output device"),
        (
            "dp_backward_reduce_ms",
            "ms",
            "DataParallel: time per step reducing gradients onto the source device",
        ),
        ("dp_replicas", "count", "DataParallel: number of devices the module is replicated onto"),
        ("thread_parallelism", "x", "DataParallel: mean number of replica threads making progress at once"),
        ("peak_allocated_bytes", "bytes", "peak memory allocated by tensors on the rank's device"),
        (
            "peak_reserved_bytes",
            "bytes",
            "peak memory reserved by the caching allocator on the rank's device",
        ),
        ("capacity_bytes", "bytes", "total memory of the rank's device"),
        ("headroom_ratio", "ratio", "1 - peak reserved / capacity on the rank's device (0-1)"),
        (
            "foreign_cuda0_bytes",
            "bytes",
            "memory this rank's process holds on cuda:0 although its device is another",
        ),
        ("ddp_bucket_count", "count", "number of DDP gradient buckets"),
        ("ddp_bucket_cap_mb", "MB", "DDP bucket_cap_mb setting"),
        ("ddp_find_unused_parameters", "flag", "DDP find_unused_parameters setting"),
        ("ddp_gradient_as_bucket_view", "flag", "DDP gradient_as_bucket_view setting"),
        ("ddp_static_graph", "flag", "DDP static_graph setting"),
        ("ddp_broadcast_buffers", "flag", "DDP broadcast_buffers setting"),
        ("ddp_comm_hook", "text", "name of the DDP communication hook, if one is registered"),
        (
            "ddp_unused_parameter_size_ratio",
            "ratio",
            "share of parameter bytes that got no gradient in a step",
        ),
        ("cpu_count", "count", "CPUs available to the rank's process"),
        ("intra_op_threads", "count", "torch intra-op threads (torch.get_num_threads()) of the rank"),
        ("local_world_size", "count", "ranks on the same node"),
        # the set-up checklist, from what `ddpdoctor trace` observed (ddpdoctor.metrics.setup)
        ("distributed_sampler", "flag", "the training DataLoader's sampler is a DistributedSampler"),
        ("sampler_shuffle", "flag", "the training DataLoader's sampler shuffles"),
        ("dataloader_epochs", "count", "passes (epochs) over the training DataLoader"),
        (
            "epochs_repeating_order",
            "count",
            "epochs that began with the same samples in the same order as the epoch before",
        ),
        ("set_epoch_calls", "count", "calls of DistributedSampler.set_epoch()"),
        ("batches_per_epoch", "count", "batches one epoch of the training DataLoader yields on the rank"),
        ("batch_size", "count", "samples per batch of the training DataLoader on the rank"),
        (
            "epoch_dataset_share",
            "ratio",
            "share of the dataset the rank reads in one epoch (1/world size when sharded)",
        ),
        (
            "ddp_sync_rounds_per_step",
            "count",
            "DDP gradient all-reduce rounds per optimizer step (forwards outside no_sync(); median step)",
        ),
        ("ddp_forwards_per_step", "count", "DDP forwards (micro-batches) per optimizer step (median step)"),
        ("ddp_batchnorm_layers", "count", "BatchNorm layers (not SyncBatchNorm) in the DDP model"),
        ("ddp_sync_batchnorm_layers", "count", "SyncBatchNorm layers in the DDP model"),
        (
            "set_device_calls",
            "count",
            "torch.cuda.set_device() calls of a rank that uses CUDA (None on a CPU rank)",
        ),
        ("gpu_shared_ranks", "count", "ranks computing on this rank's GPU, itself included (1 = its own)"),
        (
            "current_device_mismatch",
            "flag",
            "the rank computes on a GPU other than its current CUDA device (left at cuda:0)",
        ),
        (
            "dp_gathered_bytes",
            "bytes",
            "DataParallel: bytes of outputs gathered onto the output device per step",
        ),
    ]
)

DERIVED: dict[str, MetricName] = _table(
    [
        ("broadcast_ms", "ms", "device time per step in broadcast collectives (from RunMetrics.collectives)"),
        ("allreduce_count", "count", "all-reduce calls per step (from RunMetrics.collectives)"),
        (
            "allreduce_message_bytes",
            "bytes",
            "mean size of one all-reduce message (from RunMetrics.collectives)",
        ),
    ]
)

RUN: dict[str, MetricName] = _table(
    [
        ("world_size", "count", "number of ranks in the job"),
        ("steps_analyzed", "count", "number of steps the metrics cover"),
        ("gpu0_peak_reserved_bytes", "bytes", "peak memory reserved on cuda:0 (by every process using it)"),
        ("gpu0_capacity_bytes", "bytes", "total memory of cuda:0"),
        ("gpu0_headroom_ratio", "ratio", "1 - peak reserved / capacity on cuda:0 (0-1)"),
        (
            "others_max_peak_reserved_bytes",
            "bytes",
            "largest peak reserved memory on any device other than cuda:0",
        ),
        ("gpu0_vs_others_ratio", "x", "cuda:0 peak reserved / the largest peak reserved on another device"),
        (
            "step_skew_ratio",
            "ratio",
            "(slowest - fastest median step) / fastest median step over ranks (0 = equal)",
        ),
        ("straggler_rank", "rank", "the rank the others wait for (None when no rank stands out)"),
        ("straggler_wait_ms", "ms", "time the other ranks wait for the straggler in collectives, in the median step"),
        (
            "straggler_late_share",
            "ratio",
            "fraction of matched collectives the straggler arrived at last (about 1/world_size for noise)",
        ),
        (
            "data_duplication_factor",
            "x",
            "how many ranks read each sample per epoch (1 = every rank reads its own shard)",
        ),
    ]
)

ALL_RANK: dict[str, MetricName] = {**PER_RANK, **DERIVED}


def describe(name: str) -> MetricName | None:
    """The registry entry of ``name`` (per-rank first, then run-level)."""
    return ALL_RANK.get(name) or RUN.get(name)
