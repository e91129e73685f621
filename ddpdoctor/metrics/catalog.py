"""The metric catalog: every metric's name, scope, unit, meaning, source, which way is worse, why it can be
missing, and how ``compare``/``gate`` show and gate it. The one place metric names are defined: the metrics
themselves are data, one line each, in ``catalog.toml`` beside this module; this module loads and checks them and
adds the named lists (``GROUPS``) and the compare/gate specs (``COMPARED``).

Everything else derives from this table: the names a rule may use (``diagnosis``), the per-rank and run-level
keys ``analyze`` fills (``RunMetrics``), the "not measured because" hints of the rule engine, the metrics
``compare`` shows and ``gate`` gates (``COMPARED``), the TensorBoard tags, docs/CONTRACTS.md and the README's
metric tables (tests check both against this module). Name lists other modules need are the ``GROUPS`` here;
a test fails when a module outside this one spells out a list of metric names.

Import-light on purpose (no pandas, numpy or torch): the rule engine and the CLI read it at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Scope = Literal["rank", "run"]
Kind = Literal["number", "flag", "text"]
# Where a metric comes from:
#   summary     - one rank's own trace and capture file (``ddpdoctor.metrics.summary.summarize_rank``)
#   cross_rank  - several ranks' traces matched against each other (``ddpdoctor.metrics.cross_rank``)
#   setup       - what ``ddpdoctor trace`` observed of the job's set-up (``ddpdoctor.metrics.setup``)
#   collectives - per rank, from ``RunMetrics.collectives`` (``ddpdoctor.metrics.derived``)
#   ddp_log     - DDP's own timers and whether its hook is noop_hook, from ``_get_ddp_logging_data()``
#                 (``ddpdoctor.metrics.capture``)
#   run         - the run as a whole (``ddpdoctor.metrics.analyze``)
#   health      - how the job ended: the manifest, the rank files and the ranks' dumps (``ddpdoctor.metrics.health``)
#   snapshot    - computed by ``compare`` from a run's devices table (not in ``RunMetrics``; rules cannot use it)
#   hostload    - the host's load the ranks recorded in the profiled window (``ddpdoctor.metrics.hostload``)
Source = Literal["summary", "cross_rank", "setup", "collectives", "ddp_log", "run", "health", "snapshot", "hostload"]

ONE_RANK = "only one rank's trace was loaded; cross-rank metrics need two or more"


@dataclass(frozen=True)
class Metric:
    name: str
    scope: Scope
    # "ms", "bytes", "ratio" (0-1), "x" (a multiple), "CPUs" (CPU time / wall time), "count", "GB/s", "MB", "flag",
    # "rank", "text"
    unit: str
    description: str
    source: Source
    worse: Literal["up", "down"] | None = None  # which way is a regression (None: neither, e.g. a setting)
    missing: str | None = None  # a WHY_MISSING key
    needs_peers: bool = False  # needs two or more ranks (cross-rank matching)

    @property
    def kind(self) -> Kind:
        return "flag" if self.unit == "flag" else "text" if self.unit == "text" else "number"


_SOURCES = ("summary", "cross_rank", "setup", "collectives", "ddp_log", "run", "health", "snapshot", "hostload")


def _load() -> tuple[dict[str, str], dict[str, Metric], dict[str, Metric], dict[str, tuple[str, str]]]:
    """The tables of ``catalog.toml`` (package data beside this module), checked."""
    from ddpdoctor.tomlfile import loads

    data = loads((Path(__file__).with_name("catalog.toml")).read_text(encoding="utf-8"))
    why = {str(k): str(v) for k, v in data["why_missing"].items()}
    tables: list[dict[str, Metric]] = []
    for scope in ("rank", "run"):
        table: dict[str, Metric] = {}
        for name, row in data[scope].items():
            unknown = set(row) - {"unit", "source", "worse", "missing", "needs_peers", "description"}
            if unknown or row.get("source") not in _SOURCES or row.get("missing", None) not in (None, *why):
                raise ValueError(f"catalog.toml [{scope}] {name}: bad entry {row}")
            if row.get("worse") not in (None, "up", "down"):
                raise ValueError(f"catalog.toml [{scope}] {name}: worse must be up or down")
            table[name] = Metric(
                name,
                scope,  # type: ignore[arg-type]
                row["unit"],
                row["description"],
                row["source"],
                row.get("worse"),
                row.get("missing"),
                bool(row.get("needs_peers", False)),
            )
        tables.append(table)
    per_step = {k: (v["unit"], v["description"]) for k, v in data["per_step_only"].items()}
    return why, tables[0], tables[1], per_step


# Why a metric can be missing from a run (said in a rule's "not evaluated" reason); per-rank metrics (the flat
# dicts of ``RunMetrics.ranks``); run-level metrics (``RunMetrics.run``); per-step columns that are no metric of
# their own.
WHY_MISSING, RANK, RUN, PER_STEP_ONLY = _load()


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
        "ddp_largest_grad_bytes",
        "ddp_largest_grad_share",
        "ddp_largest_grad_name",
        "ddp_largest_grad_module",
        "ddp_largest_grad_sparse",
        "ddp_largest_grad_own_bucket",
    ),
    # torch.compile as the trace shows it (ddpdoctor.metrics.compile)
    "compile": (
        "compiled_regions",
        "compiled_region_calls",
        "compiled_graphs_per_region",
        "compile_recompiles",
        "compile_ms",
    ),
    "ddp_timers": ("ddp_forward_ms", "ddp_backward_ms", "ddp_backward_comm_ms", "ddp_overlap_ms"),
    "host": ("gil_contention", "threads", "cpu_count", "intra_op_threads", "local_world_size"),
    "straggler": ("straggler_rank", "straggler_wait_ms", "straggler_late_share"),
    # cuda:0's memory as the run-level GPU-0 rule reads it
    "gpu0_memory": ("gpu0_peak_reserved_bytes", "gpu0_capacity_bytes", "gpu0_headroom_ratio", "gpu0_vs_others_ratio"),
    # per-rank metrics that need every peer in the data: a rank's own collective time mixes transfer and waiting
    "need_all_peers": ("busbw_gbps", "algbw_gbps", "exposed_transfer_ms"),
    # what needs the collectives to be timed (kernels or gloo ranges), not only called
    "timed_comm": ("overlap_ratio", "busbw_gbps", "algbw_gbps"),
    "slow_ranks": ("last_arrival_share", "last_arrival_p_value", "slow_rank", "wait_caused_ms"),
    # a late rank's CPU ops against the others' (ddpdoctor.metrics.same_work, hostload._same_work)
    "same_work": ("extra_ops_ms", "ops_slower_ms", "same_work_slower"),
    # the GIL probe's view of the job's own Python threads (ddpdoctor.capture.gil)
    "gil_threads": (
        "active_python_threads",
        "python_cpu_cores",
        "python_cpu_share",
        "gil_host_other_cores",
        "gil_contention_spread",
        "gil_probe_reading",
        "gil_samples",
    ),
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
        "optimizer_collectives_per_step",
    ),
    "bandwidth": ("algbw_gbps", "busbw_gbps"),
    # from each collective's transfer time, the same on every rank (transfer.transfer_metrics)
    "transfer": (
        "exposed_transfer_ms",
        "optimizer_exposed_transfer_ms",
        "loop_exposed_transfer_ms",
        "ddp_exposed_transfer_ms",
        "buffer_broadcast_transfer_ms",
        "algbw_gbps",
        "busbw_gbps",
    ),
    # FSDP2 units (ddpdoctor.metrics.fsdp)
    "fsdp": (
        "fsdp_units",
        "fsdp_allgather_ms",
        "fsdp_allgather_exposed_ms",
        "fsdp_backward_allgather_ms",
        "fsdp_reduce_ms",
        "fsdp_reduce_exposed_ms",
        "fsdp_largest_unit",
        "fsdp_largest_unit_share",
        "fsdp_largest_unit_exposed_ms",
        "fsdp_largest_unit_tensors",
        "fsdp_largest_unit_tensor_share",
        "fsdp_explicit_prefetch",
        "fsdp_reduce_as_allreduce",
        "fsdp_comm_on_device",
        "fsdp_allgather_elem_bytes",
        "fsdp_reduce_elem_bytes",
    ),
    # the report's per-rank columns besides the step time and the breakdown
    "report_rank": (
        "comm_ms",
        "exposed_comm_ms",
        "collective_wait_ms",
        "overlap_ratio",
        "dataloader_ms",
        "gil_contention",
        "ddp_comm_hook",
    ),
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
    # not gated by default: what the gate weighs a timing regression against (gate.host_explains)
    Compared("cpu_wait_ms", "cpu_wait_ms", "training loop's wait for a CPU", "host"),
    Compared("other_cpu_cores", "other_cpu_cores", "other processes' CPUs", "host"),
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
