"""TensorBoard event files per rank: ``write_events(run_dir) -> <run>/tensorboard``.

Each rank gets ``<run>/tensorboard/rank<R>/`` (TensorBoard run ``tensorboard/rank<R>``) with, per step:

- ``time/step_ms``: wall time of every step (capture files); ``time/<part>_ms``: the trace breakdown of each
  profiled step (data loading, forward, backward, optimizer, exposed communication, other, DataParallel
  stages);
- ``comm/*``: communication, exposed and overlapped communication (ms), overlap (0-1), bus bandwidth (GB/s)
  per profiled step; a rank-level value (mean over the analysed steps) is written once, at the last analysed
  step, when the trace metrics have no per-step column for it (bus bandwidth, and DDP's own overlap figure);
- ``gpu/*``: device utilisation (0-1), busy and host-sync time (ms) per profiled step;
- ``gil/contention`` (0-1) and ``gil/threads``;
- ``memory/<device>/peak_allocated_bytes``, ``peak_reserved_bytes`` (peak since the start of the run) and
  ``capacity_bytes``;

and the findings about that rank as markdown text (``ddpdoctor/findings``). Writing again replaces the folder.
"""

from __future__ import annotations

import os
import shutil
from itertools import accumulate
from pathlib import Path
from typing import Any

from ddpdoctor import rundir
from ddpdoctor.metrics import catalog
from ddpdoctor.tensorboard.report import STACK_ORDER, analyze_for_dashboard, build_report

# Trace metric -> scalar tag; other per-step columns (offsets, the profiler plugin's figures) are left out.
TAGS = {
    **{part: f"time/{part}" for part in STACK_ORDER},
    **{name: f"comm/{name}" for name in catalog.group("tb_comm")},
    **{name: f"gpu/{name}" for name in catalog.group("tb_gpu")},
}
# Rank-level values written once (at the last analysed step) when the per-step rows do not have them.
_ONCE = catalog.group("tb_once")


def _wall_times(capture: dict[str, Any]) -> dict[int, float]:
    """Step -> approximate wall clock at its end (start of capture + the step times so far), seconds."""
    steps = capture.get("steps") or {}
    start = capture.get("started_at")
    if not isinstance(start, (int, float)):
        return {}
    first = int(steps.get("first") or 1)
    ends = accumulate(float(ms) / 1000.0 for ms in steps.get("wall_ms") or [])
    return {first + i: start + t for i, t in enumerate(ends)}


def _findings_markdown(report: dict[str, Any], rank: int) -> str:
    mine = [f for f in report.get("findings", []) if rank in (f.get("ranks") or [])]
    lines = [f"**ddpdoctor findings for rank {rank}** ({len(mine)} of {len(report.get('findings', []))})", ""]
    for f in mine:
        gain = f.get("estimated_gain_ms")
        gain_text = f" (could save ~{gain:.1f} ms/step)" if isinstance(gain, (int, float)) else ""
        lines += [
            f"- **{f.get('severity')} {f.get('id')} {f.get('name')}**{gain_text}: {f.get('message')}",
            f"  - *Recommendation:* {f.get('recommendation')}",
        ]
    if not mine:
        lines.append("- no finding for this rank")
    skipped = report.get("not_evaluated", [])
    if skipped:
        lines += ["", f"Not evaluated ({len(skipped)}):", ""]
        lines += [f"- {n.get('name')}: {n.get('reason')}" for n in skipped]
    for note in report.get("notes", []):
        lines += ["", f"*Note:* {note}"]
    return "\n".join(lines)


def _write_rank(writer: Any, rank: int, capture: dict[str, Any], report: dict[str, Any]) -> None:
    from tensorboard.plugins.text.summary_v2 import text_pb

    walls = _wall_times(capture)

    def scalar(tag: str, value: Any, step: int) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return
        writer.add_scalar(tag, value, step, walltime=walls.get(step))

    for row in (r for r in report["steps"] if r["rank"] == rank):
        scalar("time/step_ms", row.get("step_ms"), row["step"])
        scalar("gil/contention", row.get("gil_contention"), row["step"])
        scalar("gil/threads", row.get("threads"), row["step"])
    per_step = [r for r in report["per_step"] if r.get("rank") == rank and r.get("step") is not None]
    columns: set[str] = set()
    for row in per_step:
        for column, value in row.items():
            if column in TAGS and value is not None:
                columns.add(column)
                scalar(TAGS[column], value, int(row["step"]))
    analysed = [int(r["step"]) for r in per_step] or [
        r["step"] for r in report["steps"] if r["rank"] == rank and r.get("profiled")
    ]
    rank_row = next((r for r in report["rank_metrics"] if r.get("rank") == rank), {})
    if analysed:
        for name in _ONCE:
            if name not in columns:
                scalar(TAGS[name], rank_row.get(name), max(analysed))
    for dev in (capture.get("memory") or {}).get("devices") or []:
        name = str(dev.get("device"))
        series = dev.get("per_step") or {}
        for i, step in enumerate(series.get("step") or []):
            for key in ("peak_allocated_bytes", "peak_reserved_bytes"):
                values = series.get(key) or []
                if i < len(values):
                    scalar(f"memory/{name}/{key}", values[i], int(step))
            scalar(f"memory/{name}/capacity_bytes", dev.get("capacity_bytes"), int(step))
    last = max([r["step"] for r in report["steps"] if r["rank"] == rank] or [0])
    # tensorboard's own text summary (SummaryWriter.add_text would append "/text_summary" to the tag)
    summary = text_pb(
        "ddpdoctor/findings",
        _findings_markdown(report, rank),
        description="ddpdoctor's findings about this rank, with the rules that could not be evaluated",
    )
    writer.file_writer.add_summary(summary, last, walltime=walls.get(last))


def write_events(run_dir: str | Path, *, rules: Any = None) -> Path:
    """Write ``<run>/tensorboard/rank<R>/`` per rank with a capture file; returns ``<run>/tensorboard``.
    ``rules``: ``RuleOptions`` or resolved rules for the findings text (default: as ``build_report``)."""
    from torch.utils.tensorboard import SummaryWriter

    run_dir = Path(run_dir)
    out = run_dir / rundir.TENSORBOARD_DIR
    analysis = analyze_for_dashboard(run_dir, rules)  # read once: the report and the per-rank files
    report = build_report(run_dir, analysis=analysis)
    out.mkdir(parents=True, exist_ok=True)
    for rank, capture in analysis.captures.items():
        tmp = out / f".rank{rank}.{os.getpid()}.tmp"  # mkdir, not mkdtemp: the umask's permissions
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            writer = SummaryWriter(log_dir=str(tmp))
            try:
                _write_rank(writer, rank, capture, report)
            finally:
                writer.close()
            _replace(tmp, out / f"rank{rank}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _replace(new: Path, dest: Path) -> None:
    """Put folder ``new`` at ``dest``, replacing what was there (the old folder is moved aside first)."""
    old = None
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        dest.rename(old)
    new.rename(dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def has_events(run_dir: str | Path) -> bool:
    """Whether ``<run>/tensorboard/rank<R>/`` holds an event file for every rank with a capture file."""
    run_dir = Path(run_dir)
    out = run_dir / rundir.TENSORBOARD_DIR
    ranks = rundir.read_rank_captures(run_dir)[0]
    return bool(ranks) and all(any((out / f"rank{r}").glob("events.out.tfevents.*")) for r in ranks)
