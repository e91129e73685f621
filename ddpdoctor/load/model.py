"""What the loader hands to the metrics: one ``Run`` of ``RankTrace``s.

A rank's events are held as ``ddpdoctor.table.Table``s (named numpy columns) in ``RankTrace.tables``
(``EventTables``), which the metrics read; importing or using pandas costs more than the analysis of a small
rank. ``RankTrace.ops``, ``.kernels``, ``.memory``, ``.steps`` and ``.comm_ops`` are the same tables as pandas
DataFrames, built on first use (the public ``ddpdoctor.load()`` API) from copies of the columns: what a user does
to a frame does not change the tables.

Tables (all timestamps are µs floats as in the trace; ``end_us = ts_us + dur_us``):

- ``ops``      CPU-side complete events (cpu_op, user_annotation, python_function, cuda_runtime, cuda_driver,
               ...):
               ``name, cat, ts_us, dur_us, end_us, pid, tid, external_id, correlation, span``
- ``kernels``  device-side events (kernel, gpu_memcpy, gpu_memset, gpu_user_annotation, cuda_sync):
               ``name, cat, ts_us, dur_us, end_us, pid, tid, device, stream, correlation, external_id, span``
- ``memory``   ``[memory]`` instant events: ``name, cat, ts_us, dur_us, end_us, pid, tid, bytes,
               total_allocated, total_reserved, device_type, device_id, span`` (totals NaN where the trace
               does not record them)
- ``steps``    ``ProfilerStep#N`` ranges on the CPU: the ``ops`` columns plus ``step`` (N); in a trace without
               any, the steps its optimizer's steps delimit (``load.frames``: each row an ``Optimizer.step#``
               range, its start moved back to the end of the one before)
- ``comm_ops`` the collective calls' CPU events (``nccl:*``, ``gloo:*``, ``record_param_comms``, ``c10d::*``) and
               FSDP2's ``fsdp::all_gather_copy_in`` (its Input Dims: the unit's parameter tensors)
               with their arguments: the ``ops`` columns plus ``in_nelems, out_nelems, group_size, dtype,
               collective_name, pg_name, seq, input_dims, input_type`` (the strings and lists as object arrays)

``name`` and ``cat`` are ``ddpdoctor.table.Codes`` (pandas categoricals in the DataFrames); their categories are
all names (categories) of the rank, shared by its tables; ``cat`` holds the canonical lower-case category names of
``ddpdoctor.load.categories``. ``pid``/``tid`` are int64: numeric strings become numbers, ``"stream 7"``
becomes 7, other strings negative codes named in ``RankTrace.thread_names``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ddpdoctor.table import Codes, Table

TABLES = ("ops", "kernels", "memory", "steps", "comm_ops")


@dataclass
class EventTables:
    """The event tables of one rank (all spans concatenated); see the module docstring for the columns."""

    ops: Table
    kernels: Table
    memory: Table
    steps: Table
    comm_ops: Table


@dataclass
class RankFacts:
    """What the loader keeps of a rank it summarised as it decoded it (``load(..., summarize=True)``) once the
    tables are dropped: what the run-level checks and notes read from them."""

    range_us: tuple[float, float] | None  # absolute time span of the CPU-side events (consistency.rank_range)
    names: list[str]  # every event name of the rank (the run's mode and backend are told from them)
    has_steps: bool  # steps in the trace: ProfilerStep#N ranges, or else its optimizer's (optimizer_steps)
    steps: tuple[int, int | None] | None  # the step range the summary covers (None: every step)
    optimizer_steps: bool = False  # no ProfilerStep#N range: the steps are told by the optimizer's (load.frames)
    # step numbers recorded by two spans (frames.repeated_steps); optimizer steps per ProfilerStep#N (frames.*)
    repeated_steps: tuple[int, int] | None = None
    optimizer_steps_per_step: float | None = None


@dataclass
class RankTrace:
    """Everything known about one rank: its event tables (all spans concatenated) and where they came from."""

    rank: int
    files: list[str] = field(default_factory=list)
    distributed_info: dict[str, Any] | None = None
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    # the events (None when loaded from a summary)
    tables: EventTables | None = None
    # (pid, tid) -> thread name from the trace's "thread_name" metadata ("thread 6023 (pt_gloo_runloop)")
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)
    # pid -> process label ("CPU", "GPU 0")
    process_labels: dict[int, str] = field(default_factory=dict)
    # per span (file): the profiler window [start_us, end_us] ("PyTorch Profiler (0)"), in span order
    windows: list[tuple[float, float]] = field(default_factory=list)
    base_time_ns: int | None = None
    # ranks/rank<R>.summary.json when loaded with use_summaries=True (then there are no tables), or the summary
    # computed from the traces as they were decoded with summarize=True (then ``facts`` says what else is known)
    summary: dict[str, Any] | None = None
    facts: RankFacts | None = None
    # the pandas DataFrames built so far from ``tables`` (see ``frame``)
    _frames: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def has_trace(self) -> bool:
        return self.tables is not None

    def frame(self, name: str) -> Any:
        """The table ``name`` (one of ``TABLES``) as a pandas DataFrame (None without tables), built once."""
        if self.tables is None:
            return None
        if name not in self._frames:  # of copies: editing a frame leaves the tables the metrics read as they are
            self._frames[name] = _frame(name, getattr(self.tables, name))
        return self._frames[name]

    def set_tables(self, tables: EventTables | None) -> None:
        """Replace the tables (and forget the DataFrames built from the old ones)."""
        self.tables = tables
        self._frames.clear()

    @property
    def ops(self) -> Any:
        """CPU-side events (pandas DataFrame)."""
        return self.frame("ops")

    @property
    def kernels(self) -> Any:
        """Device-side events (pandas DataFrame)."""
        return self.frame("kernels")

    @property
    def memory(self) -> Any:
        """``[memory]`` events (pandas DataFrame)."""
        return self.frame("memory")

    @property
    def steps(self) -> Any:
        """``ProfilerStep#N`` ranges (pandas DataFrame)."""
        return self.frame("steps")

    @property
    def comm_ops(self) -> Any:
        """The collective calls' CPU events with their arguments (pandas DataFrame)."""
        return self.frame("comm_ops")


def _frame(name: str, table: Table) -> Any:
    """The DataFrame of a table, with the dtypes the loader has always given: object columns stay object (pandas
    would infer strings, turning None into NaN); the memory table's name and category are categoricals of
    strings."""
    import pandas as pd

    frame = table.copy().to_pandas()
    for col in table.columns:
        values = table[col]
        if isinstance(values, np.ndarray) and values.dtype == object and frame[col].dtype != object:
            frame[col] = pd.Series(values, dtype=object, index=frame.index)
        elif name == "memory" and isinstance(values, Codes):
            frame[col] = pd.Categorical.from_codes(values.codes, categories=list(values.categories))
    return frame


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
    # optimizer steps in one step (consistency.optimizer_steps_per_step_by_rank): 1.0 where ddpdoctor marked them
    optimizer_steps_per_step: float | None = None

    def rank(self, rank: int) -> RankTrace:
        for r in self.ranks:
            if r.rank == rank:
                return r
        raise KeyError(rank)
