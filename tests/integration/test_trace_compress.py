"""A profiled window's trace is gzipped off the training thread (issue 17): the step that closes the window only
exports it; training goes on while it is compressed; the run directory ends with the compressed trace, named in
the rank file and the rank's summary. A compression that fails keeps the uncompressed trace, which still
diagnoses. (One-process runs, a few seconds each.)"""

from __future__ import annotations

import json

import pytest
from helpers import read_json, run_cli, write_script

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# Compression is held back (or made to fail) from inside the traced process: the script replaces the gzip
# function the capture uses, and lets it go only after training ends.
SCRIPT = """
import json, os, sys, threading, time
import torch
from ddpdoctor import rundir

out = sys.argv[1]
release = threading.Event()
real_gzip = rundir.atomic_gzip_file

def held_gzip(src, dest, **kwargs):
    if not release.wait(60):
        raise RuntimeError("compression was never released")
    if os.environ.get("FAIL_GZIP"):
        raise OSError(28, "No space left on device", str(dest))
    return real_gzip(src, dest, **kwargs)

rundir.atomic_gzip_file = held_gzip
model = torch.nn.Linear(32, 32)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
listed, slowest = None, 0.0
for step in range(12):
    t = time.perf_counter()
    model(torch.randn(8, 32)).square().mean().backward()
    opt.step()
    opt.zero_grad()
    slowest = max(slowest, time.perf_counter() - t)
    files = json.load(open(os.path.join(out, "ranks", "rank0.json")))["trace_files"]
    if files and listed is None:
        listed = {"files": files, "on_disk": sorted(os.listdir(out))}
print(json.dumps({"listed": listed, "slowest_step_s": slowest}))
release.set()
"""

FAST = ["--wait", "1", "--warmup", "1", "--active", "2"]


def _run(tmp_path, env=None):
    script = write_script(tmp_path / "train.py", SCRIPT)
    out = tmp_path / "run"
    result = run_cli("trace", "-q", "--out", str(out), *FAST, str(script), str(out), env=env)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    return out, seen


def test_no_step_waits_for_gzip_and_the_run_ends_compressed(tmp_path) -> None:
    out, seen = _run(tmp_path)
    # While compression was held, training went on; the window's trace was listed, uncompressed and complete.
    assert seen["slowest_step_s"] < 10, seen
    (name,) = seen["listed"]["files"]
    assert name.endswith(".pt.trace.json") and name in seen["listed"]["on_disk"], seen
    # At the end: the compressed trace, named everywhere, and no uncompressed or temporary file left.
    rank = read_json(out / "ranks" / "rank0.json")
    assert rank["trace_files"] == [name + ".gz"] and rank["capture_errors"] == [], rank
    assert read_json(out / "ranks" / "rank0.summary.json")["files"] == [name + ".gz"]
    assert read_json(out / "manifest.json")["ranks"][0]["trace_files"] == [name + ".gz"]
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == ["manifest.json", name + ".gz"]
    diagnosis = run_cli("diagnose", "--format", "json", str(out))
    assert diagnosis.returncode == 0, diagnosis.stderr
    assert json.loads(diagnosis.stdout)["run"]["skipped"] == []


def test_a_failed_compression_keeps_the_uncompressed_trace(tmp_path) -> None:
    out, seen = _run(tmp_path, env={"FAIL_GZIP": "1"})
    (name,) = seen["listed"]["files"]
    rank = read_json(out / "ranks" / "rank0.json")
    assert rank["trace_files"] == [name] and (out / name).is_file(), rank
    assert any("compressing trace" in e and "No space left on device" in e for e in rank["capture_errors"]), rank
    assert read_json(out / "ranks" / "rank0.summary.json")["files"] == [name]
    assert not [p.name for p in out.rglob(".*") if p.is_file()]  # no temporary file left behind
    diagnosis = run_cli("diagnose", "--format", "json", str(out))
    assert diagnosis.returncode == 0, diagnosis.stderr
