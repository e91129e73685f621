"""Shared pieces of the benchmark harness: where things are, interleaved timing, peak memory of a child
process, and the one-line-per-measure output (``name  value  (target)  PASS|MISS|INFO|SKIP``)."""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
CACHE = BENCH / ".cache"  # generated traces and runs (gitignored): reruns reuse them
RESULTS = BENCH / "results"  # one JSON file per harness run (gitignored)
# The recorded GPU traces (see ../shared/traces/README.md); every measure that needs them skips without them.
TRACES = Path(os.environ.get("DDPDOCTOR_TRACES", REPO.parent / "shared" / "traces"))
CHILD = BENCH / "diagnose_child.py"

OPS = {"<=": lambda v, b: v <= b, "<": lambda v, b: v < b, ">=": lambda v, b: v >= b, ">": lambda v, b: v > b}


@dataclass
class Measure:
    """One printed line: ``value`` in ``unit``, checked against ``target`` (e.g. ``("<=", 1.3)``) if any."""

    name: str
    value: float | None
    unit: str = "x"
    target: tuple[str, float] | None = None
    status: str = "INFO"  # PASS | MISS | UNSURE (an interval across the target) | INFO | SKIP
    note: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        value = "-" if self.value is None else _fmt(self.value, self.unit)
        target = f"(target {self.target[0]} {_fmt(self.target[1], self.unit)})" if self.target else ""
        text = f"{self.name:<48} {value:>9}  {target:<21} {self.status}"
        return f"{text}  {self.note}" if self.note else text


def _fmt(value: float, unit: str) -> str:
    if unit == "x":  # three decimals: "1.02x" must not read as meeting "<= 1.02x" when it is 1.022
        return f"{value:.3f}x" if value < 10 else f"{value:.1f}x"
    if unit == "s":
        return f"{value:.2f} s"
    if unit == "MB":
        return f"{value:.0f} MB"
    if unit == "pp":
        return f"{value:.2f} pp"
    if unit == "%":
        return f"{value:+.1f}%"
    return f"{value:.3g} {unit}".strip()


class Report:
    """Collects the measures of a harness run and prints each as soon as it is known."""

    def __init__(self, stream: Any = None) -> None:
        self.measures: list[Measure] = []
        self.sections: dict[str, dict[str, Any]] = {}
        self.stream = stream or sys.stdout

    def add(
        self,
        name: str,
        value: float | None,
        *,
        unit: str = "x",
        target: tuple[str, float] | None = None,
        note: str = "",
        status: str | None = None,
        **detail: Any,
    ) -> Measure:
        if status is None:
            status = (
                "INFO" if target is None or value is None else ("PASS" if OPS[target[0]](value, target[1]) else "MISS")
            )
        m = Measure(name, value, unit, target, status, note, detail)
        self.measures.append(m)
        print(m.line(), file=self.stream, flush=True)
        return m

    def skip(self, name: str, why: str) -> Measure:
        return self.add(name, None, status="SKIP", note=why)

    def say(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def to_json(self) -> dict[str, Any]:
        return {"measures": [asdict(m) for m in self.measures], "sections": self.sections}


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def interleave(fns: dict[str, Callable[[], Any]], reps: int, *, warm: bool = True) -> dict[str, list[float]]:
    """Wall seconds of each function over ``reps`` rounds, run in turn (a, b, c, a, b, c, ...; the order
    rotates each round) so that the noise of a shared machine hits all of them alike. ``warm`` runs each
    once untimed first (imports, page cache)."""
    if warm:
        for fn in fns.values():
            fn()
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(reps):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            gc.collect()
            t = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t)
    return times


def run_child(args: list[str], *, python: str | None = None, timeout: float = 900) -> dict[str, Any]:
    """Run ``python args...`` that writes one JSON object to the file named by its last argument."""
    out = CACHE / f".child-{os.getpid()}-{time.monotonic_ns()}.json"
    CACHE.mkdir(parents=True, exist_ok=True)
    cmd = [python or sys.executable, *args, str(out)]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t
    try:
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"{Path(args[0]).name} exited {proc.returncode}: {' | '.join(tail)}")
        data = json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)
    data["child_wall_s"] = wall
    return data


def mb(n_bytes: float) -> float:
    return n_bytes / 1e6


def uncompressed_size(path: Path) -> int:
    """Bytes of a trace file once gunzipped (the gzip trailer's size field, mod 4 GiB: read it fully past
    that)."""
    if path.suffix != ".gz":
        return path.stat().st_size
    import gzip

    size = 0
    with gzip.open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            size += len(chunk)
    return size


def trace_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith((".json", ".json.gz")))


SHORT = {
    "hta/df_index_resolver": "df_index_resolver",
    "hta/nccl_parser_config": "nccl_parser_config",
    "hta/ns_resolution_trace": "ns_resolution_trace",
    "astra-sim/megatron_tp8_a100_8ranks": "megatron_8ranks",
    "tb-profiler/resnet50_num_workers_0": "resnet50_workers0",
    "tracelens/mi300_resnet_act_checkpoint": "mi300_resnet",
}


def label(name: str) -> str:
    """The short name of a recorded trace set, for the printed lines."""
    return SHORT.get(name, name.rsplit("/", 1)[-1])


def real_set(name: str) -> Path | None:
    """The folder of a recorded trace set (``hta/df_index_resolver``), None when absent."""
    path = TRACES / name
    return path if path.is_dir() and trace_files(path) else None


def environment() -> dict[str, Any]:
    import platform

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    from importlib import metadata

    # from the installed metadata, not by importing them: torch or pandas imported here would change what this
    # process measures (the loader does not fork its workers beside torch; their threads and memory)
    for mod in ("torch", "orjson", "msgspec", "pandas", "numpy"):
        try:
            info[mod] = metadata.version(mod)
        except metadata.PackageNotFoundError:  # a missing module is reported, not fatal
            info[mod] = None
    try:
        info["git"] = subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        info["git"] = None
    return info
