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

and the findings about that rank as markdown text (``ddpdoctor/findings``). Writing again replaces the event
files in the folder; nothing else is deleted (a file of the user's in it stays), and nothing is written or deleted
through a symbolic link: a linked ``tensorboard/`` or ``tensorboard/rank<R>`` is a one-line error.
"""

from __future__ import annotations

import os
import stat
import tempfile
from itertools import accumulate
from pathlib import Path
from typing import Any

from ddpdoctor import escape, owned, rundir, runfiles
from ddpdoctor.errors import DDPDoctorError
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
    """Rank ``rank``'s findings as Markdown for TensorBoard's Text tab, which renders Markdown and some HTML: every
    value from the run or a rule file escaped (``escape.markdown``), so only ddpdoctor's own markup renders."""
    md = escape.markdown
    mine = [f for f in report.get("findings", []) if rank in (f.get("ranks") or [])]
    lines = [f"**ddpdoctor findings for rank {rank}** ({len(mine)} of {len(report.get('findings', []))})", ""]
    for f in mine:
        gain = f.get("estimated_gain_ms")
        gain_text = f" (could save ~{gain:.1f} ms/step)" if isinstance(gain, (int, float)) else ""
        lines += [
            f"- **{md(f.get('severity'))} {md(f.get('id'))} {md(f.get('name'))}**{gain_text}: {md(f.get('message'))}",
            f"  - *Recommendation:* {md(f.get('recommendation'))}",
        ]
    if not mine:
        lines.append("- no finding for this rank")
    skipped = report.get("not_evaluated", [])
    if skipped:
        lines += ["", f"Not evaluated ({len(skipped)}):", ""]
        lines += [f"- {md(n.get('name'))}: {md(n.get('reason'))}" for n in skipped]
    for note in report.get("notes", []):
        lines += ["", f"*Note:* {md(note)}"]
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
    rank_row: dict[str, Any] = next((r for r in report["rank_metrics"] if r.get("rank") == rank), {})
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
    _check_own_folder(out)
    analysis = analyze_for_dashboard(run_dir, rules)  # read once: the report and the per-rank files
    report = build_report(run_dir, analysis=analysis)
    for rank in analysis.captures:  # every folder checked before anything is written
        _check_own_folder(out / f"rank{rank}")
    out.mkdir(exist_ok=True)
    for rank, capture in analysis.captures.items():
        tmp = Path(tempfile.mkdtemp(prefix=f".rank{rank}.", suffix=".tmp", dir=out))
        try:
            os.chmod(tmp, _DIR_MODE)  # the permissions a plain mkdir gives (mkdtemp's are 0700)
            writer = SummaryWriter(log_dir=str(tmp))
            try:
                _write_rank(writer, rank, capture, report)
            finally:
                writer.close()
            _replace(tmp, out / f"rank{rank}")
        finally:
            _remove_own(tmp, "events")
        _remove_own(out / f".rank{rank}.old", "events")  # what an earlier version moved aside, if only its own
    return out


_DIR_MODE = 0o777 & ~rundir._umask()


def _check_own_folder(folder: Path) -> None:
    """A folder the event files go in is a real folder or absent: never a link (what it points to is not the run
    directory's) nor a file."""
    try:
        mode = os.lstat(folder).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        return
    what = rundir.entry_kind(mode)
    raise DDPDoctorError(
        f"{escape.terminal(folder)} is {what}, not a folder: ddpdoctor writes its TensorBoard event files only into "
        "a folder of its own, never through a link (move it away to have them written)"
    )


def _replace(new: Path, dest: Path) -> None:
    """Put the event files of folder ``new`` in ``dest`` in place of the event files there (ddpdoctor's: regular
    files of that name); anything else in ``dest`` stays. A ``dest`` not there yet is ``new``, renamed."""
    if not os.path.lexists(dest):
        new.rename(dest)
        return
    ours = _own_event_files(dest)
    written = os.listdir(new)
    for name in written:
        os.replace(new / name, dest / name)
    for name in ours.difference(written):
        try:
            os.unlink(dest / name)
        except FileNotFoundError:
            pass


def _own_event_files(folder: Path) -> set[str]:
    """The event files in ``folder``: regular files of that name (what ddpdoctor writes there)."""
    names = set()
    for name in os.listdir(folder):
        if owned.EVENT_FILE_RE.match(name):
            try:
                if stat.S_ISREG(os.lstat(folder / name).st_mode):
                    names.add(name)
            except OSError:
                pass
    return names


def _remove_own(folder: Path, kind: str) -> None:
    """Remove ``folder`` when it holds nothing but what ddpdoctor writes there (else leave it as it is)."""
    if not os.path.lexists(folder) or os.path.islink(folder):
        return
    found = owned.own_entries(folder, kind, include_folder=True)
    if found.foreign is None:
        try:
            found.remove()
        except OSError:  # something appeared in it meanwhile: it stays
            pass


def has_events(run_dir: str | Path) -> bool:
    """Whether ``<run>/tensorboard/rank<R>/`` holds an event file for every rank with a capture file."""
    run_dir = Path(run_dir)
    out = run_dir / rundir.TENSORBOARD_DIR
    ranks = runfiles.read_rank_captures(run_dir)[0]
    return bool(ranks) and all(any((out / f"rank{r}").glob("events.out.tfevents.*")) for r in ranks)
