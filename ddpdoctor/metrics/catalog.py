"""The metric catalog: every metric's name, scope, unit, meaning, source, which way is worse, why it can be
missing, and how ``compare``/``gate`` show and gate it. The one place metric names are defined.

Everything else derives from this table: the names a rule may use (``diagnosis``), the per-rank and run-level
keys ``analyze`` fills (``RunMetrics``), the "not measured because" hints of the rule engine, the metrics
``compare`` shows and ``gate`` gates (``COMPARED``), the TensorBoard tags, docs/CONTRACTS.md and the README's
metric tables (tests check both against this module). Name lists other modules need are the ``GROUPS`` here;
a test fails when a module outside this one spells out a list of metric names.

Import-light on purpose (no pandas, numpy or torch): the rule engine and the CLI read it at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Scope = Literal["rank", "run"]
Kind = Literal["number", "flag", "text"]
# Where a metric comes from:
#   summary     - one rank's own trace and capture file (``ddpdoctor.metrics.summary.summarize_rank``)
#   cross_rank  - several ranks' traces matched against each other (``ddpdoctor.metrics.cross_rank``)
#   setup       - what ``ddpdoctor trace`` observed of the job's set-up (``ddpdoctor.metrics.setup``)
#   collectives - per rank, from ``RunMetrics.collectives`` (``ddpdoctor.metrics.derived``)
#   ddp_log     - DDP's own timers from ``_get_ddp_logging_data()`` (``ddpdoctor.metrics.capture``)
#   run         - the run as a whole (``ddpdoctor.metrics.analyze``)
#   snapshot    - computed by ``compare`` from a run's devices table (not in ``RunMetrics``; rules cannot use it)
Source = Literal["summary", "cross_rank", "setup", "collectives", "ddp_log", "run", "snapshot"]

# Why a metric can be missing from a run, said plainly in a rule's "not evaluated" reason.
WHY_MISSING: dict[str, str] = {
    "comm": "no collective communication was found",
    "cuda": "no CUDA device activity or memory was recorded (a CPU run, or a trace without memory events)",
    "ddp": "no DDP configuration was recorded (DDP not used, or not a `ddpdoctor trace` run)",
    "dp": "no DataParallel activity was found",
    "gil": "no GIL probe data (only `ddpdoctor trace` runs with gilknocker have it)",
    "host": "no host and thread information (only `ddpdoctor trace` runs record it)",
    "loader": "no DataLoader was observed (only `ddpdoctor trace` runs record it, for torch DataLoaders)",
    "device": "no rank used CUDA, or its DDP model's GPU is unknown (only `ddpdoctor trace` runs record it)",
}
ONE_RANK = "only one rank's trace was loaded; cross-rank metrics need two or more"


@dataclass(frozen=True)
class Metric:
    name: str
    scope: Scope
    unit: str  # "ms", "bytes", "ratio" (0-1), "x" (a multiple), "count", "GB/s", "MB", "flag", "rank", "text"
    description: str
    source: Source
    worse: Literal["up", "down"] | None = None  # which way is a regression (None: neither, e.g. a setting)
    missing: str | None = None  # a WHY_MISSING key
    needs_peers: bool = False  # needs two or more ranks (cross-rank matching)

    @property
    def kind(self) -> Kind:
        return "flag" if self.unit == "flag" else "text" if self.unit == "text" else "number"


def _m(name: str, unit: str, description: str, source: Source, worse=None, missing=None, peers=False):
    return (name, unit, description, source, worse, missing, peers)


_RANK_ROWS = [
    _m("rank", "rank", "the global rank this row describes", "summary"),
    _m("step_ms_median", "ms", "median wall time of one training step", "summary", "up"),
    _m("step_ms_p90", "ms", "90th percentile wall time of one training step", "summary", "up"),
    _m("step_ms_mean", "ms", "mean wall time of one training step", "summary", "up"),
    _m("steps_analyzed", "count", "number of profiled steps the metrics of this rank cover", "summary"),
    _m(
        "dataloader_ms",
        "ms",
        "time per step the training loop waits for the next batch from the DataLoader",
        "summary",
        "up",
    ),
    _m("forward_ms", "ms", "time per step in the forward pass", "summary", "up"),
    _m("backward_ms", "ms", "time per step in the backward pass", "summary", "up"),
    _m("optimizer_ms", "ms", "time per step in optimizer.step() (and zero_grad)", "summary", "up"),
    _m(
        "comm_ms",
        "ms",
        "time per step the device spends in collectives (all-reduce, broadcast, ...)",
        "summary",
        "up",
        "comm",
    ),
    _m("exposed_comm_ms", "ms", "communication time per step not hidden behind computation", "summary", "up", "comm"),
    _m("other_ms", "ms", "step time not attributed to any other component", "summary", "up"),
    _m(
        "overlap_ratio",
        "ratio",
        "share of communication time that overlaps computation (0-1)",
        "summary",
        "down",
        "comm",
    ),
    _m(
        "ddp_reported_overlap_ratio",
        "ratio",
        "overlap of communication and backward as DDP's own logging reports it",
        "summary",
        "down",
        "ddp",
    ),
    _m(
        "busbw_gbps",
        "GB/s",
        "collective bus bandwidth (nccl-tests convention: comparable to link speed)",
        "summary",
        "down",
        "comm",
    ),
    _m("algbw_gbps", "GB/s", "collective algorithm bandwidth (bytes / time)", "summary", "down", "comm"),
    _m(
        "collective_wait_ms",
        "ms",
        "time per step this rank waits inside collectives for the other ranks",
        "cross_rank",
        "up",
        "comm",
        True,
    ),
    _m(
        "late_arrival_ms",
        "ms",
        "how late per step this rank enters collectives compared with the earliest rank",
        "cross_rank",
        "up",
        "comm",
        True,
    ),
    _m(
        "gpu_util_ratio",
        "ratio",
        "share of step time at least one kernel runs on the rank's device (0-1)",
        "summary",
        "down",
        "cuda",
    ),
    _m(
        "host_sync_ms",
        "ms",
        "time per step the host blocks waiting for the device (synchronize, .item(), ...)",
        "summary",
        "up",
        "cuda",
    ),
    _m(
        "gil_contention",
        "ratio",
        "share of time Python threads wait for the GIL (gilknocker probe, 0-1)",
        "summary",
        "up",
        "gil",
    ),
    _m("threads", "count", "Python threads alive in the rank's process", "summary", None, "gil"),
    _m(
        "active_python_threads",
        "count",
        "the job's own Python threads that made progress in a step (>= 10% of their CPU time; median step)",
        "summary",
        None,
        "gil",
    ),
    _m(
        "python_cpu_cores",
        "x",
        "CPU time of the job's Python threads together / wall time (median step): about 1 or less when GIL-bound",
        "summary",
        None,
        "gil",
    ),
    _m(
        "gil_contention_spread",
        "ratio",
        "p90 - p10 of the GIL probe's contention over the profiled steps (0-1)",
        "summary",
        None,
        "gil",
    ),
    _m("dp_scatter_ms", "ms", "DataParallel: time per step scattering inputs to the replicas", "summary", "up", "dp"),
    _m(
        "dp_replicate_ms",
        "ms",
        "DataParallel: time per step copying the module to every device",
        "summary",
        "up",
        "dp",
    ),
    _m(
        "dp_parallel_apply_ms",
        "ms",
        "DataParallel: time per step running the replicas' forward in threads",
        "summary",
        "up",
        "dp",
    ),
    _m(
        "dp_gather_ms",
        "ms",
        "DataParallel: time per step gathering outputs onto the output device",
        "summary",
        "up",
        "dp",
    ),
    _m(
        "dp_backward_reduce_ms",
        "ms",
        "DataParallel: time per step reducing gradients onto the source device",
        "summary",
        "up",
        "dp",
    ),
    _m("dp_replicas", "count", "DataParallel: number of devices the module is replicated onto", "summary", None, "dp"),
    _m(
        "thread_parallelism",
        "x",
        "DataParallel: mean number of replica threads making progress at once",
        "summary",
        "down",
        "dp",
    ),
    _m(
        "peak_allocated_bytes",
        "bytes",
        "peak memory allocated by tensors on the rank's device",
        "summary",
        "up",
        "cuda",
    ),
    _m(
        "peak_reserved_bytes",
        "bytes",
        "peak memory reserved by the caching allocator on the rank's device",
        "summary",
        "up",
        "cuda",
    ),
    _m("capacity_bytes", "bytes", "total memory of the rank's device", "summary", None, "cuda"),
    _m(
        "headroom_ratio",
        "ratio",
        "1 - peak reserved / capacity on the rank's device (0-1)",
        "summary",
        "down",
        "cuda",
    ),
    _m(
        "foreign_cuda0_bytes",
        "bytes",
        "memory this rank's process holds on cuda:0 although its device is another",
        "summary",
        "up",
        "cuda",
    ),
    _m("ddp_bucket_count", "count", "number of DDP gradient buckets", "summary", None, "ddp"),
    _m("ddp_bucket_cap_mb", "MB", "DDP bucket_cap_mb setting", "summary", None, "ddp"),
    _m("ddp_find_unused_parameters", "flag", "DDP find_unused_parameters setting", "summary", None, "ddp"),
    _m("ddp_gradient_as_bucket_view", "flag", "DDP gradient_as_bucket_view setting", "summary", None, "ddp"),
    _m("ddp_static_graph", "flag", "DDP static_graph setting", "summary", None, "ddp"),
    _m("ddp_broadcast_buffers", "flag", "DDP broadcast_buffers setting", "summary", None, "ddp"),
    _m("ddp_comm_hook", "text", "name of the DDP communication hook, if one is registered", "summary", None, "ddp"),
    _m(
        "ddp_unused_parameter_size_ratio",
        "ratio",
        "share of parameter bytes that got no gradient in a step",
        "summary",
        "up",
        "ddp",
    ),
    _m("cpu_count", "count", "CPUs available to the rank's process", "summary", None, "host"),
    _m(
        "intra_op_threads",
        "count",
        "torch intra-op threads (torch.get_num_threads()) of the rank",
        "summary",
        None,
        "host",
    ),
    _m("local_world_size", "count", "ranks on the same node", "summary", None, "host"),
    _m(
        "exposed_transfer_ms",
        "ms",
        "exposed communication less the time spent waiting for late peers (per step)",
        "cross_rank",
        "up",
        "comm",
    ),
    # slow ranks: who arrives last at the matched collectives, against chance (ddpdoctor.metrics.cross_rank)
    _m(
        "last_arrival_share",
        "ratio",
        "share of the matched collectives this rank entered last (about 1/world_size when only noise decides)",
        "cross_rank",
        "up",
        "comm",
        True,
    ),
    _m(
        "last_arrival_p_value",
        "ratio",
        "chance of arriving last this often if every rank were equally likely to be last (binomial test)",
        "cross_rank",
        None,
        "comm",
        True,
    ),
    _m(
        "slow_rank",
        "flag",
        "arrives last significantly more often than chance (p below 0.01 / ranks tested)",
        "cross_rank",
        None,
        "comm",
        True,
    ),
    _m(
        "wait_caused_ms",
        "ms",
        "the other ranks' mean wait per step in the collectives this rank entered last",
        "cross_rank",
        "up",
        "comm",
        True,
    ),
    # which parallelism the job uses, from its own trace (ddpdoctor.metrics.parallelism)
    _m("collectives_per_step", "count", "collective calls per analysed step (any kind; 0 = none)", "summary"),
    _m(
        "tp_collectives_per_step",
        "count",
        "collective calls per step inside tensor-parallel ranges (Megatron-LM mappings, DTensor)",
        "summary",
    ),
    _m("forward_allreduce_per_step", "count", "all-reduce calls per step issued during the forward pass", "summary"),
    _m("backward_allreduce_per_step", "count", "all-reduce calls per step issued during the backward pass", "summary"),
    _m("allgather_per_step", "count", "all_gather calls per step", "summary"),
    _m("reduce_scatter_per_step", "count", "reduce_scatter calls per step", "summary"),
    _m("p2p_per_step", "count", "point-to-point send/recv calls per step (pipeline stages)", "summary"),
    _m("ddp_ranges", "flag", "DistributedDataParallel's own ranges are in the trace", "summary"),
    _m("fsdp_ranges", "flag", "FullyShardedDataParallel's own ranges are in the trace", "summary"),
    # the set-up checklist, from what `ddpdoctor trace` observed (ddpdoctor.metrics.setup)
    _m(
        "distributed_sampler",
        "flag",
        "the training DataLoader's sampler is a DistributedSampler",
        "setup",
        None,
        "loader",
    ),
    _m("sampler_shuffle", "flag", "the training DataLoader's sampler shuffles", "setup", None, "loader"),
    _m("dataloader_epochs", "count", "passes (epochs) over the training DataLoader", "setup", None, "loader"),
    _m(
        "epochs_repeating_order",
        "count",
        "epochs that began with the same samples in the same order as the epoch before",
        "setup",
        "up",
        "loader",
    ),
    _m("set_epoch_calls", "count", "calls of DistributedSampler.set_epoch()", "setup", None, "loader"),
    _m(
        "batches_per_epoch",
        "count",
        "batches one epoch of the training DataLoader yields on the rank",
        "setup",
        None,
        "loader",
    ),
    _m("batch_size", "count", "samples per batch of the training DataLoader on the rank", "setup", None, "loader"),
    _m(
        "epoch_dataset_share",
        "ratio",
        "share of the dataset the rank reads in one epoch (1/world size when sharded)",
        "setup",
        None,
        "loader",
    ),
    _m(
        "ddp_sync_rounds_per_step",
        "count",
        "DDP gradient all-reduce rounds per optimizer step (forwards outside no_sync(); median step)",
        "setup",
        "up",
        "ddp",
    ),
    _m(
        "ddp_forwards_per_step",
        "count",
        "DDP forwards (micro-batches) per optimizer step (median step)",
        "setup",
        None,
        "ddp",
    ),
    _m("ddp_batchnorm_layers", "count", "BatchNorm layers (not SyncBatchNorm) in the DDP model", "setup", None, "ddp"),
    _m("ddp_sync_batchnorm_layers", "count", "SyncBatchNorm layers in the DDP model", "setup", None, "ddp"),
    _m(
        "set_device_calls",
        "count",
        "torch.cuda.set_device() calls of a rank that uses CUDA (None on a CPU rank)",
        "setup",
        None,
        "device",
    ),
    _m(
        "gpu_shared_ranks",
        "count",
        "ranks computing on this rank's GPU, itself included (1 = its own)",
        "setup",
        "up",
        "device",
    ),
    _m(
        "current_device_mismatch",
        "flag",
        "the rank computes on a GPU other than its current CUDA device (left at cuda:0)",
        "setup",
        None,
        "device",
    ),
    _m(
        "dp_gathered_bytes",
        "bytes",
        "DataParallel: bytes of outputs gathered onto the output device per step",
        "setup",
        "up",
        "dp",
    ),
    # derived per rank from RunMetrics.collectives (ddpdoctor.metrics.derived)
    _m(
        "broadcast_ms",
        "ms",
        "device time per step in broadcast collectives (from RunMetrics.collectives)",
        "collectives",
        "up",
        "comm",
    ),
    _m(
        "allreduce_count",
        "count",
        "all-reduce calls per step (from RunMetrics.collectives)",
        "collectives",
        None,
        "comm",
    ),
    _m(
        "allreduce_message_bytes",
        "bytes",
        "mean size of one all-reduce message (from RunMetrics.collectives)",
        "collectives",
        None,
        "comm",
    ),
    # DDP's own timers (ns in its logging data, here ms): the dashboard's "DDP's view" chart
    _m("ddp_forward_ms", "ms", "DDP's own average forward compute time (its logging data)", "ddp_log", "up", "ddp"),
    _m("ddp_backward_ms", "ms", "DDP's own average backward compute time (its logging data)", "ddp_log", "up", "ddp"),
    _m(
        "ddp_backward_comm_ms",
        "ms",
        "DDP's own average backward communication time (its logging data)",
        "ddp_log",
        "up",
        "ddp",
    ),
    _m(
        "ddp_overlap_ms",
        "ms",
        "DDP's own average time backward computation and communication overlap (its logging data)",
        "ddp_log",
        "down",
        "ddp",
    ),
]

_RUN_ROWS = [
    _m("world_size", "count", "number of ranks in the job", "run"),
    _m("steps_analyzed", "count", "number of steps the metrics cover", "run"),
    _m(
        "gpu0_peak_reserved_bytes",
        "bytes",
        "peak memory reserved on cuda:0 (by every process using it)",
        "run",
        "up",
        "cuda",
    ),
    _m("gpu0_capacity_bytes", "bytes", "total memory of cuda:0", "run", None, "cuda"),
    _m("gpu0_headroom_ratio", "ratio", "1 - peak reserved / capacity on cuda:0 (0-1)", "run", "down", "cuda"),
    _m(
        "others_max_peak_reserved_bytes",
        "bytes",
        "largest peak reserved memory on any device other than cuda:0",
        "run",
        "up",
        "cuda",
    ),
    _m(
        "gpu0_vs_others_ratio",
        "x",
        "cuda:0 peak reserved / the largest peak reserved on another device",
        "run",
        "up",
        "cuda",
    ),
    _m(
        "step_skew_ratio",
        "ratio",
        "(slowest - fastest median step) / fastest median step over ranks (0 = equal)",
        "run",
        "up",
        None,
        True,
    ),
    _m(
        "straggler_rank",
        "rank",
        "the rank the others wait for (None when no rank stands out)",
        "cross_rank",
        None,
        "comm",
        True,
    ),
    _m(
        "straggler_wait_ms",
        "ms",
        "time the other ranks wait for the straggler in collectives, in the median step",
        "cross_rank",
        "up",
        "comm",
        True,
    ),
    _m(
        "straggler_late_share",
        "ratio",
        "fraction of matched collectives the straggler arrived at last (about 1/world_size for noise)",
        "cross_rank",
        None,
        "comm",
        True,
    ),
    _m(
        "straggler_p_value",
        "ratio",
        "binomial-test p value of the straggler's last arrivals against chance (small = not noise)",
        "cross_rank",
        None,
        "comm",
        True,
    ),
    _m(
        "straggler_collectives",
        "count",
        "collectives matched across ranks in the analysed steps (the trials of the slow-rank test)",
        "cross_rank",
        None,
        "comm",
        True,
    ),
    _m(
        "slow_rank_count",
        "count",
        "ranks that arrive last significantly more often than chance (None when too few collectives to tell)",
        "cross_rank",
        "up",
        "comm",
        True,
    ),
    _m("ranks_loaded", "count", "ranks whose traces or summaries were loaded", "run"),
    _m(
        "ranks_missing",
        "count",
        "ranks of the world size whose data is absent (their waits cannot be told from transfer)",
        "run",
    ),
    _m(
        "data_duplication_factor",
        "x",
        "how many ranks read each sample per epoch (1 = every rank reads its own shard)",
        "setup",
        "up",
        "loader",
    ),
    # compare/gate only: the largest peak allocated memory on any device of the run
    _m("max_peak_allocated_bytes", "bytes", "largest peak memory allocated on any device of the run", "snapshot", "up"),
]


def _build(rows: list[tuple], scope: Scope) -> dict[str, Metric]:
    out: dict[str, Metric] = {}
    for name, unit, description, source, worse, missing, peers in rows:
        if missing is not None and missing not in WHY_MISSING:
            raise ValueError(f"metric {name}: unknown missing-reason key {missing!r}")
        out[name] = Metric(name, scope, unit, description, source, worse, missing, peers)
    return out


RANK: dict[str, Metric] = _build(_RANK_ROWS, "rank")
RUN: dict[str, Metric] = _build(_RUN_ROWS, "run")


def describe(name: str) -> Metric | None:
    """The catalog entry of ``name`` (per-rank first, then run-level)."""
    return RANK.get(name) or RUN.get(name)


# The names a rule may use: every per-rank metric, every run-level one but compare's own.
RULE_RANK: dict[str, Metric] = dict(RANK)
RULE_RUN: dict[str, Metric] = {n: m for n, m in RUN.items() if m.source != "snapshot"}


def rule_metric(name: str) -> Metric | None:
    """The catalog entry of a name a rule may use (per-rank first), None for any other name."""
    return RULE_RANK.get(name) or RULE_RUN.get(name)


def names(scope: Scope, *sources: Source) -> tuple[str, ...]:
    """The metric names of ``scope`` from any of ``sources`` (all sources when none), in catalog order."""
    table = RANK if scope == "rank" else RUN
    return tuple(m.name for m in table.values() if not sources or m.source in sources)


# Named lists other modules use (each a tuple of catalog names, in the order they are shown or stacked).
GROUPS: dict[str, tuple[str, ...]] = {
    # the phase breakdown of a step: these add up to step_ms (ddpdoctor.metrics.breakdown)
    "breakdown": ("dataloader_ms", "forward_ms", "backward_ms", "optimizer_ms", "exposed_comm_ms", "other_ms"),
    # DataParallel's stages in a step
    "dp_stages": ("dp_scatter_ms", "dp_replicate_ms", "dp_parallel_apply_ms", "dp_gather_ms", "dp_backward_reduce_ms"),
    # per-step columns a rank's metrics are the mean of, besides the breakdown
    "step_means": ("comm_ms", "gpu_util_ratio", "host_sync_ms"),
    # the step-time statistics of a rank
    "step_stats": ("steps_analyzed", "step_ms_median", "step_ms_p90", "step_ms_mean"),
    # memory of the rank's own device
    "device_memory": ("peak_allocated_bytes", "peak_reserved_bytes", "capacity_bytes"),
    "rank_memory": (
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "capacity_bytes",
        "headroom_ratio",
        "foreign_cuda0_bytes",
    ),
    # DDP's configuration and its own overlap figure, from _get_ddp_logging_data()
    "ddp_config": (
        "ddp_bucket_count",
        "ddp_bucket_cap_mb",
        "ddp_find_unused_parameters",
        "ddp_gradient_as_bucket_view",
        "ddp_static_graph",
        "ddp_broadcast_buffers",
        "ddp_comm_hook",
        "ddp_unused_parameter_size_ratio",
        "ddp_reported_overlap_ratio",
    ),
    "ddp_timers": ("ddp_forward_ms", "ddp_backward_ms", "ddp_backward_comm_ms", "ddp_overlap_ms"),
    "host": ("gil_contention", "threads", "cpu_count", "intra_op_threads", "local_world_size"),
    "straggler": ("straggler_rank", "straggler_wait_ms", "straggler_late_share"),
    # cuda:0's memory as the run-level GPU-0 rule reads it
    "gpu0_memory": ("gpu0_peak_reserved_bytes", "gpu0_capacity_bytes", "gpu0_headroom_ratio", "gpu0_vs_others_ratio"),
    # per-rank metrics that need every peer in the data: a rank's own collective time mixes transfer and waiting
    "need_all_peers": ("busbw_gbps", "algbw_gbps", "exposed_transfer_ms"),
    "slow_ranks": ("last_arrival_share", "last_arrival_p_value", "slow_rank", "wait_caused_ms"),
    # the GIL probe's view of the job's own Python threads (ddpdoctor.capture.gil)
    "gil_threads": ("active_python_threads", "python_cpu_cores", "gil_contention_spread"),
    "parallelism": (
        "collectives_per_step",
        "tp_collectives_per_step",
        "forward_allreduce_per_step",
        "backward_allreduce_per_step",
        "allgather_per_step",
        "reduce_scatter_per_step",
        "p2p_per_step",
        "ddp_ranges",
        "fsdp_ranges",
    ),
    "bandwidth": ("algbw_gbps", "busbw_gbps"),
    # the report's per-rank columns besides the step time and the breakdown
    "report_rank": ("comm_ms", "exposed_comm_ms", "overlap_ratio", "dataloader_ms", "gil_contention"),
    # TensorBoard scalar groups
    "tb_comm": (
        "comm_ms",
        "exposed_comm_ms",
        "overlapped_comm_ms",
        "overlap_ratio",
        "busbw_gbps",
        "algbw_gbps",
        "collective_wait_ms",
        "late_arrival_ms",
        "ddp_reported_overlap_ratio",
    ),
    "tb_gpu": ("gpu_util_ratio", "gpu_busy_ms", "host_sync_ms"),
    # rank-level values TensorBoard writes once when the per-step rows lack them
    "tb_once": (
        "busbw_gbps",
        "algbw_gbps",
        "overlap_ratio",
        "exposed_comm_ms",
        "collective_wait_ms",
        "late_arrival_ms",
        "ddp_reported_overlap_ratio",
    ),
}
# per-step columns that are not rank metrics of their own (RunMetrics.per_step)
PER_STEP_ONLY: dict[str, tuple[str, str]] = {
    "overlapped_comm_ms": ("ms", "communication time per step hidden behind computation"),
    "gpu_busy_ms": ("ms", "time per step at least one kernel runs on the rank's device"),
}


def group(name: str) -> tuple[str, ...]:
    return GROUPS[name]


# --- compare / gate ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Compared:
    """A metric ``compare`` shows and ``gate`` can gate. ``of``: the catalog metric it is (unit, meaning and
    direction come from there); ``name``: the snapshot key (``step_ms.median`` is the median of the job's
    per-step wall time, the slowest rank's step by step; other per-rank metrics are averaged over the ranks).
    ``threshold``: the default gate threshold (None: shown, gated only when asked for). ``samples``/
    ``statistic``: the per-step samples that let the gate tell a regression from noise and the statistic of
    them the metric is. ``noisy``: a timing that varies from run to run; without enough samples such a metric can
    warn but never fail the gate. Memory peaks are not noisy."""

    name: str
    of: str
    label: str
    section: str
    threshold: str | None = None
    samples: str | None = None
    statistic: str = "mean"  # "median" | "p90" | "mean" of the samples
    noisy: bool = True
    aliases: tuple[str, ...] = ()

    @property
    def metric(self) -> Metric:
        return RANK.get(self.of) or RUN[self.of]

    @property
    def unit(self) -> str:
        return self.metric.unit

    @property
    def worse(self) -> str:
        return self.metric.worse or "up"

    @property
    def description(self) -> str:
        return self.metric.description

    @property
    def run_level(self) -> bool:
        """A value of the run as a whole (not a mean over the ranks)."""
        return self.of in RUN or self.name != self.of


SECTIONS = ("step time", "step breakdown", "communication", "DataParallel", "memory", "host")

# Why these defaults: a shared CI runner moves step time by several percent between runs, so the step median
# gates at +10 % and the p90 (the tail moves more) at +20 %; exposed communication and data-loader waits are
# small absolute times, so they gate in ms; overlap is a 0-1 ratio (a drop of 0.1 is a lost tenth of the hidden
# communication); memory peaks are deterministic for a fixed model and batch, so +10 % is a real change.
COMPARED: tuple[Compared, ...] = (
    Compared(
        "step_ms.median",
        "step_ms_median",
        "step time, median",
        "step time",
        "+10%",
        "step_ms",
        "median",
        aliases=("step_ms", "step_ms_median"),
    ),
    Compared(
        "step_ms.p90", "step_ms_p90", "step time, p90", "step time", "+20%", "step_ms", "p90", aliases=("step_ms_p90",)
    ),
    Compared(
        "step_ms.mean",
        "step_ms_mean",
        "step time, mean",
        "step time",
        None,
        "step_ms",
        "mean",
        aliases=("step_ms_mean",),
    ),
    Compared("dataloader_ms", "dataloader_ms", "data loading", "step breakdown", "+2ms", "dataloader_ms"),
    Compared("forward_ms", "forward_ms", "forward", "step breakdown", None, "forward_ms"),
    Compared("backward_ms", "backward_ms", "backward", "step breakdown", None, "backward_ms"),
    Compared("optimizer_ms", "optimizer_ms", "optimizer", "step breakdown", None, "optimizer_ms"),
    Compared("other_ms", "other_ms", "other", "step breakdown", None, "other_ms"),
    Compared("comm_ms", "comm_ms", "communication", "communication", None, "comm_ms"),
    Compared("exposed_comm_ms", "exposed_comm_ms", "exposed communication", "communication", "+2ms", "exposed_comm_ms"),
    Compared("overlap_ratio", "overlap_ratio", "comm/compute overlap", "communication", "-0.1", "overlap_ratio"),
    Compared("busbw_gbps", "busbw_gbps", "bus bandwidth", "communication"),
    Compared("algbw_gbps", "algbw_gbps", "algorithm bandwidth", "communication"),
    Compared("collective_wait_ms", "collective_wait_ms", "wait inside collectives", "communication"),
    Compared("straggler_wait_ms", "straggler_wait_ms", "wait for the straggler", "communication"),
    Compared("dp_scatter_ms", "dp_scatter_ms", "DP scatter", "DataParallel"),
    Compared("dp_replicate_ms", "dp_replicate_ms", "DP replicate", "DataParallel"),
    Compared("dp_parallel_apply_ms", "dp_parallel_apply_ms", "DP parallel_apply", "DataParallel"),
    Compared("dp_gather_ms", "dp_gather_ms", "DP gather", "DataParallel"),
    Compared("dp_backward_reduce_ms", "dp_backward_reduce_ms", "DP backward reduce", "DataParallel"),
    Compared(
        "gpu0_peak_reserved_bytes",
        "gpu0_peak_reserved_bytes",
        "GPU 0 peak reserved",
        "memory",
        "+10%",
        noisy=False,
        aliases=("gpu0_peak_reserved",),
    ),
    Compared(
        "others_max_peak_reserved_bytes",
        "others_max_peak_reserved_bytes",
        "other GPUs, max peak reserved",
        "memory",
        "+10%",
        noisy=False,
        aliases=("others_max_peak_reserved",),
    ),
    Compared("gpu0_vs_others_ratio", "gpu0_vs_others_ratio", "GPU 0 / other GPUs (reserved)", "memory", noisy=False),
    Compared(
        "max_peak_allocated_bytes",
        "max_peak_allocated_bytes",
        "largest peak allocated on a device",
        "memory",
        noisy=False,
        aliases=("peak_allocated_bytes", "max_peak_allocated"),
    ),
    Compared("gil_contention", "gil_contention", "GIL contention", "host", "+0.1", "gil_contention"),
)


def markdown_tables() -> str:
    """The README's metric tables (per rank, then run level), as Markdown. ``python -m ddpdoctor.metrics.catalog``
    prints them; a test keeps the README equal to them."""

    def rows(table: dict[str, Metric]) -> list[str]:
        return [f"| `{m.name}` | {m.unit} | {m.description} |" for m in table.values() if m.source != "snapshot"]

    lines = ["| metric | unit | definition |", "|---|---|---|", *rows(RANK), ""]
    lines += ["| run-level metric | unit | definition |", "|---|---|---|", *rows(RUN)]
    return "\n".join(lines) + "\n"


def _check() -> None:
    known = set(RANK) | set(RUN) | set(PER_STEP_ONLY)
    for key, members in GROUPS.items():
        unknown = [n for n in members if n not in known]
        if unknown:
            raise ValueError(f"catalog group {key}: unknown metrics {unknown}")
    for c in COMPARED:
        if c.of not in RANK and c.of not in RUN:
            raise ValueError(f"compared metric {c.name}: unknown metric {c.of}")
        if c.section not in SECTIONS:
            raise ValueError(f"compared metric {c.name}: unknown section {c.section}")


_check()


if __name__ == "__main__":
    print(markdown_tables(), end="")
