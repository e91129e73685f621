"""The metrics ``compare`` shows and ``gate`` can gate: name, unit, which way is worse, default threshold.

Names are the run-level summary keys of a ``Snapshot`` (``ddpdoctor.compare.snapshot``): ``step_ms.median``
is the median of the job's per-step wall time (the slowest rank's, step by step); the other per-rank metrics
of ``RunMetrics.ranks`` are averaged over the ranks; the ``gpu0_*``/``others_*`` memory metrics are run-level.

``worse``: "up" when a larger value is a regression (times, memory), "down" when a smaller one is (overlap,
bandwidth). ``threshold``: the default gate threshold (None: shown by ``compare``, gated only when asked for).
``samples``/``statistic``: the per-step samples that let the gate tell a regression from noise, and the
statistic of them the metric is (median, p90 or mean). ``noisy``: a timing that varies from run to run;
without enough samples such a metric can warn but never fail the gate. Memory peaks are not noisy.

Why these defaults: a shared CI runner moves step time by several percent between runs, so the step median
gates at +10 % and the p90 (the tail moves more) at +20 %; exposed communication and data-loader waits are
small absolute times, so they gate in ms; overlap is a 0-1 ratio (a drop of 0.1 is a lost tenth of the hidden
communication); memory peaks are deterministic for a fixed model and batch, so +10 % is a real change.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MetricSpec:
    name: str
    unit: str  # "ms", "bytes", "ratio" (0-1), "x" (a multiple), "GB/s", "count"
    worse: str  # "up" | "down"
    label: str
    section: str
    threshold: str | None = None
    samples: str | None = None
    statistic: str = "mean"  # "median" | "p90" | "mean" of the samples
    noisy: bool = True
    aliases: tuple[str, ...] = ()


SECTIONS = ("step time", "step breakdown", "communication", "DataParallel", "memory", "host")

METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "step_ms.median",
        "ms",
        "up",
        "step time, median",
        "step time",
        "+10%",
        "step_ms",
        "median",
        aliases=("step_ms", "step_ms_median"),
    ),
    MetricSpec(
        "step_ms.p90",
        "ms",
        "up",
        "step time, p90",
        "step time",
        "+20%",
        "step_ms",
        "p90",
        aliases=("step_ms_p90",),
    ),
    MetricSpec(
        "step_ms.mean",
        "ms",
        "up",
        "step time, mean",
        "step time",
        None,
        "step_ms",
        "mean",
        aliases=("step_ms_mean",),
    ),
    MetricSpec("dataloader_ms", "ms", "up", "data loading", "step breakdown", "+2ms", "dataloader_ms"),
    MetricSpec("forward_ms", "ms", "up", "forward", "step breakdown", None, "forward_ms"),
    MetricSpec("backward_ms", "ms", "up", "backward", "step breakdown", None, "backward_ms"),
    MetricSpec("optimizer_ms", "ms", "up", "optimizer", "step breakdown", None, "optimizer_ms"),
    MetricSpec("other_ms", "ms", "up", "other", "step breakdown", None, "other_ms"),
    MetricSpec("comm_ms", "ms", "up", "communication", "communication", None, "comm_ms"),
    MetricSpec(
        "exposed_comm_ms", "ms", "up", "exposed communication", "communication", "+2ms", "exposed_comm_ms"
    ),
    MetricSpec(
        "overlap_ratio", "ratio", "down", "comm/compute overlap", "communication", "-0.1", "overlap_ratio"
    ),
    MetricSpec("busbw_gbps", "GB/s", "down", "bus bandwidth", "communication", None),
    MetricSpec("algbw_gbps", "GB/s", "down", "algorithm bandwidth", "communication", None),
    MetricSpec("collective_wait_ms", "ms", "up", "wait inside collectives", "communication", None),
    MetricSpec("straggler_wait_ms", "ms", "up", "wait for the straggler", "communication", None),
    MetricSpec("dp_scatter_ms", "ms", "up", "DP scatter", "DataParallel", None),
    MetricSpec("dp_replicate_ms", "ms", "up", "DP replicate", "DataParallel", None),
    MetricSpec("dp_parallel_apply_ms", "ms", "up", "DP parallel_apply", "DataParallel", None),
    MetricSpec("dp_gather_ms", "ms", "up", "DP gather", "DataParallel", None),
    MetricSpec("dp_backward_reduce_ms", "ms", "up", "DP backward reduce", "DataParallel", None),
    MetricSpec(
        "gpu0_peak_reserved_bytes",
        "bytes",
        "up",
        "GPU 0 peak reserved",
        "memory",
        "+10%",
        noisy=False,
        aliases=("gpu0_peak_reserved",),
    ),
    MetricSpec(
        "others_max_peak_reserved_bytes",
        "bytes",
        "up",
        "other GPUs, max peak reserved",
        "memory",
        "+10%",
        noisy=False,
        aliases=("others_max_peak_reserved",),
    ),
    MetricSpec(
        "gpu0_vs_others_ratio", "x", "up", "GPU 0 / other GPUs (reserved)", "memory", None, noisy=False
    ),
    MetricSpec(
        "max_peak_allocated_bytes",
        "bytes",
        "up",
        "largest peak allocated on a device",
        "memory",
        None,
        noisy=False,
        aliases=("peak_allocated_bytes", "max_peak_allocated"),
    ),
    MetricSpec("gil_contention", "ratio", "up", "GIL contention", "host", "+0.1", "gil_contention"),
)

BY_NAME: dict[str, MetricSpec] = {m.name: m for m in METRICS}
_ALIASES: dict[str, str] = {alias: m.name for m in METRICS for alias in m.aliases}


def canonical(name: str) -> str | None:
    """The catalog name of ``name`` or one of its aliases (``gpu0_peak_reserved``), None when unknown."""
    name = name.strip()
    if name in BY_NAME:
        return name
    return _ALIASES.get(name)


def spec(name: str) -> MetricSpec:
    return BY_NAME[name]
