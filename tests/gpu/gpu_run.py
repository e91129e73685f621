"""Run every GPU check once, within a time budget, and write what a device call can bring back.

    python3 tests/gpu/gpu_run.py --out DIR [--only 1,3] [--budget 330]

(``bash tests/gpu/run.sh`` installs the carried wheels first and calls this.) Checks run one after the other
(they share one GPU, two of them time it, and one fills 93 % of its memory); one that fails or breaks is
reported and the next one starts. After each check, ``DIR`` holds:

    gpu-summary.json          environment, dependency versions, each check's status and numbers
    <check>.tar.gz            its run directories, diagnose reports and the workloads' own measurements

at most 7 files (the device tool brings back 8, ``run.sh`` adds ``run.log``), each under 16 MiB, none in a
sub-folder. Exit status: 0 every check passed, 1 some check failed or broke, 2 no CUDA device.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_kit  # noqa: E402

SUMMARY = "gpu-summary.json"
MAX_FILE_BYTES = 15 * 2**20  # the device tool brings back files of at most 16 MiB
TRACE_SUFFIX = ".pt.trace.json.gz"


def archive(paths: list[Path], dest: Path, *, root: Path, cap: int = MAX_FILE_BYTES) -> dict[str, Any]:
    """Write ``paths`` (files or folders, stored relative to ``root``) as ``dest`` (tar.gz). Over ``cap`` bytes,
    write it again without the Kineto traces (the summaries and reports stay); still over: remove it."""
    for keep_traces in (True, False):
        tmp = dest.with_name(dest.name + ".tmp")
        with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
            for p in paths:
                tar.add(p, arcname=str(p.relative_to(root)), filter=None if keep_traces else _without_traces)
        size = tmp.stat().st_size
        if size <= cap:
            os.replace(tmp, dest)
            return {"file": dest.name, "bytes": size, "traces": keep_traces}
        tmp.unlink()
    return {"file": None, "bytes": None, "traces": False, "note": f"over {cap} bytes even without traces"}


def _without_traces(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if info.name.endswith(TRACE_SUFFIX) else info


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def environment() -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": _nccl_version(),
        "gpus": _gpu_names(),
        "cpus": os.cpu_count(),
        "dependencies": gpu_kit.installed_versions(),
    }
    try:
        env["git_commit"] = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        env["git_commit"] = None
    return env


def _gpu_names() -> list[str] | None:
    """The GPUs' names from NVML: this process must hold no CUDA context (one check fills 93 % of the GPU)."""
    try:
        import pynvml  # nvidia-ml-py, in the device image

        pynvml.nvmlInit()
        try:
            names = [
                pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                for i in range(pynvml.nvmlDeviceGetCount())
            ]
        finally:
            pynvml.nvmlShutdown()
        return [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    except Exception:
        return None


def _nccl_version() -> str | None:
    import torch

    try:
        return ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
    except Exception:  # a build without NCCL
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path, help="folder for the summary and the archives")
    p.add_argument("--only", default="", help="comma-separated check numbers or keys (default: all)")
    p.add_argument("--budget", type=float, default=330.0, help="seconds for all checks (default 330)")
    p.add_argument("--work", type=Path, default=None, help="working folder (default: a temporary one)")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    deadline = t0 + args.budget

    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    cpu_smoke = os.environ.get("GPUCHECK_CPU") == "1"  # the plumbing on a CPU (workloads/_measure.py)
    if not torch.cuda.is_available() and not cpu_smoke:
        print(
            "gpu checks: no CUDA device here; run them on a GPU machine (see the README, Development)", file=sys.stderr
        )
        return 2
    import gpu_checks

    wanted = {w.strip() for w in args.only.split(",") if w.strip()}
    checks = [c for c in gpu_checks.CHECKS if not wanted or c.key in wanted or c.key.split("-")[0] in wanted]
    missing = gpu_kit.missing_requirements()
    summary: dict[str, Any] = {
        "kind": "ddpdoctor-gpu-checks",
        "cpu_smoke": cpu_smoke,
        "environment": environment(),
        "missing_requirements": missing,
        "budget_s": args.budget,
        "checks": [],
    }
    work = args.work or Path(tempfile.mkdtemp(prefix="ddpdoctor-gpu-"))
    for check in checks:
        print(f"== {check.key}: {check.title}", flush=True)
        result, produced = gpu_checks.run_check(check, work, deadline)
        if produced:
            try:
                result["archive"] = archive(produced, args.out / f"{check.key}.tar.gz", root=work)
            except OSError as exc:  # the check's result matters more than its files
                result["archive"] = {"file": None, "note": f"archiving failed: {exc}"}
        summary["checks"].append(result)
        summary["elapsed_s"] = round(time.monotonic() - t0, 1)
        write_json(args.out / SUMMARY, summary)  # after every check: a later timeout keeps what is done
        print(f"   {result['status'].upper()} in {result['seconds']}s", flush=True)
        for it in result.get("items", []):
            print(
                f"   [{it['status']}] {it['what']}: ddpdoctor {it['ddpdoctor']} | independent "
                f"{it['independent']} | {it.get('expect', '')} {it.get('note', '')}",
                flush=True,
            )
        if result.get("error"):
            print("   error: " + result["error"].replace("\n", "\n   "), flush=True)
    statuses = [c["status"] for c in summary["checks"]]
    summary["result"] = "pass" if statuses and all(s == "pass" for s in statuses) and not missing else "fail"
    write_json(args.out / SUMMARY, summary)
    states = ", ".join(f"{c['check']} {c['status']}" for c in summary["checks"])
    print(f"gpu checks: {summary['result']} ({states}) in {summary.get('elapsed_s')}s", flush=True)
    return 0 if summary["result"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
