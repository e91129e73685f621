"""Writing ``ranks/rank<R>.json`` (what one rank captured) and ``ranks/rank<R>.summary.json`` (its own metrics).

The one place that knows the rank capture file's fields (``rundir`` documents them); the session hands over its
state and never builds the record itself. Who a process is (rank, world size, node) comes from :func:`identity`.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddpdoctor import liveness, ranklist, rundir, runfiles
from ddpdoctor._version import __version__
from ddpdoctor.capture import ddp as ddp_capture
from ddpdoctor.capture import knobs as knobs_capture

if TYPE_CHECKING:
    from ddpdoctor.capture.session import Session

# Rank variables by launcher, most specific first: torchrun / torch.distributed.launch / Kubernetes operators,
# SLURM (srun), Open MPI, MPICH / Intel MPI.
_RANK_VARS = (
    ("env", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
    ("mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("mpi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)


@dataclass(frozen=True)
class Identity:
    """Who this process is in the job. ``source``: where it came from ("env", "slurm", "mpi", "process group",
    or "none" for a process with no rank anywhere: rank 0 of 1)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    source: str = "none"

    def with_process_group(self, rank: int, world_size: int) -> Identity:
        """The identity once a process group exists: its rank and size are the truth."""
        local = self.local_rank if self.source != "none" else rank  # no launcher variables: one node (mp.spawn)
        local_size = self.local_world_size if self.source != "none" else world_size
        return replace(
            self,
            rank=rank,
            world_size=world_size,
            local_rank=local,
            local_world_size=local_size,
            source=self.source if self.source != "none" else "process group",
        )


def _int(value: str | None, default: int) -> int:
    try:
        return int(str(value).split("(")[0]) if value not in (None, "") else default  # SLURM writes "2(x3)"
    except ValueError:
        return default


def identity(environ: dict[str, str] | None = None) -> Identity:
    """This process's rank from its launcher's variables (rank 0 of 1 when there are none)."""
    env = os.environ if environ is None else environ
    for source, rank, size, local, local_size in _RANK_VARS:
        if rank in env:
            node = env.get("GROUP_RANK", env.get("NODE_RANK", env.get("SLURM_NODEID")))
            return Identity(
                rank=_int(env.get(rank), 0),
                world_size=_int(env.get(size), 1),
                local_rank=_int(env.get(local), 0),
                local_world_size=_int(env.get(local_size), 1),
                node_rank=_int(node, 0),
                source=source,
            )
    return Identity()


def dist_info() -> dict[str, Any] | None:
    """Backend, rank and world size of the default process group, if one exists."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return {"backend": str(dist.get_backend()), "rank": dist.get_rank(), "world_size": dist.get_world_size()}
    except Exception:
        pass
    return None


def record(session: Session) -> dict[str, Any]:
    """The rank capture file's content for the session as it stands (JSON-ready)."""
    import torch

    device = None
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    info = session.dist or dist_info() or {}
    who = session.identity
    rank, world_size = info.get("rank", who.rank), info.get("world_size", who.world_size)
    if session.memory.cuda_ready():
        device = f"cuda:{torch.cuda.current_device()}"
    elif not torch.cuda.is_available():
        device = "cpu"
    return {
        "schema_version": rundir.SCHEMA_VERSION,
        "ddpdoctor_version": __version__,
        "rank": rank,
        "local_rank": who.local_rank,
        "world_size": world_size,
        "local_world_size": who.local_world_size,
        "node_rank": who.node_rank,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "pid_ns": liveness.pid_namespace(),  # whose pids these are: a reader in another namespace cannot look it up
        "launch": session.config.launch,
        "status": session.status,
        "exit_code": session.exit_code,
        "error": session.error,
        # the traceback of the exception that ended the rank, outermost first (ddpdoctor's frames left out): where a
        # rank failed before it made a process group it leaves no dump, and this is where its code was
        **({"error_frames": session.error_frames} if session.error_frames else {}),
        **({"run_collectives": session.run_collectives} if session.run_collectives is not None else {}),
        **({"training_collectives": session.training_collectives} if session.training_collectives is not None else {}),
        **(
            {"training_collective_bytes": session.training_collective_bytes}
            if session.training_collective_bytes is not None
            else {}
        ),
        "backend": info.get("backend"),
        "device": device,
        "steps": session.clock.steps_json(),
        "fallback_window": session.clock.startup_json(),
        "schedule": {**session.config.schedule_dict(), **({"dropped": d} if (d := session.dropped_windows) else {})},
        "profile_all_threads": session.all_threads(),
        "memory": session.memory.to_json(),
        "gil": session.gil.to_json(),
        "hostload": session.hostload.to_json(),
        "ddp": ddp_capture.describe(),
        "dp": session.dp.describe() if session.dp is not None else [],
        "dp_steps": session.dp_steps,
        "setup": session.setup.to_json(),
        "threads": {
            "cpu_count": os.cpu_count(),
            "affinity_cpus": len(cpus) if cpus is not None else None,
            # which CPUs, as [first, last] ranges: ranks pinned each to its own CPUs share none of them
            "affinity": ranklist.compact(sorted(cpus)) if cpus is not None else None,
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "torch_intra_op_threads": torch.get_num_threads(),
            "torch_inter_op_threads": torch.get_num_interop_threads(),
        },
        "trace_files": list(session.trace_files),
        "torch_version": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "started_at": session.started_at,
        "updated_at": time.time(),
        "capture_errors": session.capture_errors,
        "stopped_by": session.stopped_by,
        # the process groups this process joined: the first is the one this file describes (capture/groups.py)
        "process_groups": session.process_groups,
        "knobs": knobs_capture.describe(),
        "python": sys.version.split()[0],
    }


def write(session: Session) -> bool:
    """Write (replace) ``ranks/rank<R>.json``; a failure is noted in the session, never raised (False)."""
    try:
        path, data = rundir.rank_file(session.out, session.rank), record(session)
        why = runfiles.write_rank_capture(path, data)
        if why:  # a bug of ddpdoctor's (the file is written all the same): say so in the file
            data["capture_errors"] = [*data["capture_errors"], f"rank file does not fit its schema: {why}"]
            runfiles.write_rank_capture(path, data)
    except Exception as exc:
        session.capture_errors.append(f"writing rank file failed: {type(exc).__name__}: {exc}")
        return False
    return True


def summarize(session: Session) -> dict[str, Any] | None:
    """Summarise this rank's own trace here, in the job, so analysing 1,000 ranks reads 1,000 small files (None
    without a trace, or when it failed: noted in the rank file, and analysis falls back to the traces)."""
    if not session.trace_files:
        return None
    try:
        from ddpdoctor.load.loader import load_rank_files
        from ddpdoctor.metrics.summary import summarize_rank

        rank_trace = load_rank_files([session.out / f for f in session.trace_files], session.rank)
        return summarize_rank(rank_trace, record(session))
    except Exception as exc:  # the run's data is on disk either way; analysis falls back to the traces
        session.capture_errors.append(f"per-rank summary failed: {type(exc).__name__}: {exc}")
        write(session)
        return None


def write_summary(session: Session, summary: dict[str, Any] | None) -> None:
    """Write ``ranks/rank<R>.summary.json``; its trace names are the rank's files as they are now (a trace
    summarised before it was compressed is named by its compressed file)."""
    if summary is None:
        return
    try:
        names = {Path(f).name.removesuffix(".gz"): f for f in session.trace_files}
        summary["files"] = [names.get(str(f).removesuffix(".gz"), f) for f in summary.get("files") or []]
        why = runfiles.write_summary(rundir.summary_file(session.out, session.rank), summary)
        if why:  # readers will leave it out and read the trace; say why in the rank file
            session.capture_errors.append(f"per-rank summary does not fit its schema: {why}")
            write(session)
    except Exception as exc:  # the run's data is on disk either way; analysis falls back to the traces
        session.capture_errors.append(f"per-rank summary failed: {type(exc).__name__}: {exc}")
        write(session)


def own_files(out: Path, rank: int) -> list[Path]:
    """The files rank ``rank`` writes in run directory ``out`` (what an in-rank ``--force`` may replace): regular
    files only, never a link or a folder of the same name (``owned.own_entries`` refuses those first)."""
    import stat

    files = [rundir.rank_file(out, rank), rundir.summary_file(out, rank)]
    for path in (out / rundir.RANKS_DIR).glob(f"rank{rank}.window*.summary.json"):  # removed windows' summaries
        match = rundir.WINDOW_SUMMARY_RE.match(path.name)
        if match and int(match["rank"]) == rank:
            files.append(path)
    for path in out.glob(f"rank{rank}.*"):
        match = rundir.TRACE_FILE_RE.match(path.name)
        if match and int(match["rank"]) == rank:
            files.append(path)
    dump = re.compile(rf"rank{rank}\.{rundir.DUMP_ID}\.json")  # its dumps (capture/flight.py), not the request
    files += [p for p in (out / rundir.DUMPS_DIR).glob(f"rank{rank}.*.json") if dump.fullmatch(p.name)]

    def regular(path: Path) -> bool:
        try:
            return stat.S_ISREG(os.lstat(path).st_mode)
        except OSError:
            return False

    return [p for p in files if regular(p)]
