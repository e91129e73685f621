"""`ddpdoctor try`: RUN's own command run again with a knob applied by ddpdoctor's hooks, measured against a
control run of the same steps (CPU, gloo, 2 ranks). The machine is shared and loaded: the tests assert what the
measurement and its interval say, and that the verdict is the one the interval gives, never a fixed speed-up."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from helpers import SAMPLES, read_json, run_cli, write_script

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module", autouse=True)
def own_trace_key(tmp_path_factory):
    """This module's traces mark their commands with a key of their own, not the user's (~/.config/ddpdoctor)."""
    before = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("config"))
    yield
    if before is None:
        os.environ.pop("XDG_CONFIG_HOME", None)
    else:
        os.environ["XDG_CONFIG_HOME"] = before


# One huge bucket: DDP can all-reduce only after backward has finished (samples/ddp_train.py, an ~8 MB model).
HUGE_BUCKET = [
    "--wait",
    "2",
    "--warmup",
    "1",
    "--active",
    "5",
    "--max-steps",
    "16",
    "--standalone",
    "--nproc-per-node",
    "2",
    str(SAMPLES / "ddp_train.py"),
    "--steps",
    "200",
    "--batch-size",
    "64",
    "--width",
    "512",
    "--bucket-cap-mb",
    "500",
]


@pytest.fixture(scope="module")
def huge_bucket_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("try") / "run"
    result = run_cli("trace", "--out", str(run), *HUGE_BUCKET, timeout=240)
    assert result.returncode == 0, result.stderr
    return run


def _findings(run: Path) -> set[str]:
    result = run_cli("diagnose", str(run), "--format", "json", timeout=120)
    return {f["name"] for f in json.loads(result.stdout)["findings"]}


def _verdict(trial: dict) -> str:
    """What the intervals of the median step's B/A say: against the pooled controls and against each control run
    (before and after the trials) on its own, all on the same side of no change."""
    measurement = trial["measurement"]
    step = next(m for m in measurement["metrics"] if m["metric"] == "step_ms.median")
    intervals = [step["ratio_interval"], *measurement["step_ratio_interval_vs_each_control"]]
    assert len(intervals) == 3  # pooled, before, after
    if any(i is None for i in intervals):
        return "no measurable effect"
    # ...and the host no quieter during the trial than during both controls (busier, for a loss), by 0.25 CPUs of
    # other processes: a gain or loss the host's load can explain is none (DataLoader workers are the knob's own)
    load, loads = measurement["other_cpu_cores"], measurement["control_other_cpu_cores"]
    recorded = load is not None and len(loads) == 2 and None not in loads
    spawns = bool(
        {"loader.num_workers", "loader.persistent_workers", "loader.prefetch_factor", "dp.as_ddp"}
        & set(trial["settings"])
    )
    if all(i[1] < 1 for i in intervals):
        return "no measurable effect" if recorded and load <= min(loads) - 0.25 else "helps"
    if all(i[0] > 1 for i in intervals):
        return "no measurable effect" if recorded and not spawns and load >= max(loads) + 0.25 else "hurts"
    return "no measurable effect"


def _metric(trial: dict, name: str) -> dict:
    return next(m for m in trial["measurement"]["metrics"] if m["metric"] == name)


def _bucket_cap(run_dir: Path) -> set[int]:
    return {
        read_json(run_dir / "ranks" / f"rank{r}.json")["ddp"][0]["logging_data"]["bucket_cap_bytes"] for r in (0, 1)
    }


@pytest.mark.timeout(600)
def test_set_bucket_cap_measures_the_change_truthfully(huge_bucket_run):
    assert "poor-comm-compute-overlap" in _findings(huge_bucket_run)
    before = sorted(p.name for p in huge_bucket_run.rglob("*"))
    result = run_cli("try", str(huge_bucket_run), "--set", "ddp.bucket_cap_mb=2", "--max-steps", "16", timeout=560)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in huge_bucket_run.rglob("*")) == before  # RUN itself is never written
    (session,) = sorted((huge_bucket_run.parent / "run.trials").iterdir())
    results = read_json(session / "results.json")
    (trial,) = results["trials"]
    assert trial["error"] is None and trial["knobs"]["ddp.bucket_cap_mb"]["applied"] == 2  # one DDP per rank
    # the knob reached DDP itself (its own logging data), and the control ran without it
    assert _bucket_cap(Path(trial["out"])) == {2 * 1024 * 1024}
    assert _bucket_cap(Path(results["control"]["out"])) == {500 * 1024 * 1024}
    for r in (0, 1):
        capture = read_json(Path(trial["out"]) / "ranks" / f"rank{r}.json")
        assert capture["ddp"][0]["logging_data"]["num_buckets_reduced"] > 1
        assert capture["steps"]["count"] == 16 and capture["stopped_by"] == "ddpdoctor --max-steps 16"
    step = _metric(trial, "step_ms.median")
    assert trial["verdict"] == _verdict(trial)
    assert trial["measurement"]["measured_gain_ms"] == pytest.approx(step["a"] - step["b"])
    # several buckets let all-reduce run beside backward: more overlap, and the interval excludes no change
    overlap = _metric(trial, "overlap_ratio")
    assert overlap["difference_interval"][0] > 0, overlap
    # the rule's estimate is set against the measurement
    (estimate,) = [e for e in trial["rules"] if e["rule"] == "poor-comm-compute-overlap"]
    assert (
        estimate["estimated_gain_ms"] > 0 and estimate["measured_gain_ms"] == trial["measurement"]["measured_gain_ms"]
    )
    out = result.stdout
    assert f"verdict: {trial['verdict']}" in out and "exposed communication" in out and "comm/compute overlap" in out
    assert "poor-comm-compute-overlap: estimated" in out
    if trial["verdict"] == "helps":
        assert "to keep it: DDP(model, ..., bucket_cap_mb=2)" in out


@pytest.mark.timeout(900)
def test_findings_tries_the_rules_prescriptions(huge_bucket_run):
    result = run_cli(
        "try",
        str(huge_bucket_run),
        "--findings",
        "--select",
        "poor-comm-compute-overlap",
        "--max-steps",
        "16",
        timeout=860,
    )
    assert result.returncode == 0, result.stderr
    session = max((huge_bucket_run.parent / "run.trials").iterdir(), key=lambda p: int(p.name))
    results = read_json(session / "results.json")
    tried = [t["settings"] for t in results["trials"]]
    assert tried == [{"ddp.bucket_cap_mb": v} for v in ("1", "5", "25")]  # rules/poor-comm-compute-overlap.toml
    table = result.stdout.split("Prescriptions tried", 1)[1]
    for t in results["trials"]:
        assert t["verdict"] == _verdict(t)
        label = f"ddp.bucket_cap_mb={t['settings']['ddp.bucket_cap_mb']}"
        line = next(line for line in table.splitlines() if label + " " in line)
        assert line.split()[0] == "poor-comm-compute-overlap" and line.rstrip().endswith(t["verdict"])
    helping = [t for t in results["trials"] if t["verdict"] == "helps"]
    if helping:
        best = max(helping, key=lambda t: t["measurement"]["measured_gain_ms"])
        assert results["best"] == [
            {"rule": "poor-comm-compute-overlap", "settings": best["settings"], "code": best["code"]}
        ]
        assert f"DDP(model, ..., bucket_cap_mb={best['settings']['ddp.bucket_cap_mb']})" in table
    else:
        assert "none of its settings measurably helped" in table


UNUSED = """
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(16, 16)
        self.unused = nn.Linear(16, 16)  # never called: DDP needs find_unused_parameters=True

    def forward(self, x):
        return self.used(x)

dist.init_process_group("gloo")
model = DDP(Net(), find_unused_parameters=True)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(100):
    opt.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.timeout(400)
def test_a_knob_that_breaks_the_job_is_reported_failed_with_ddps_error(tmp_path):
    script = write_script(tmp_path / "unused.py", UNUSED)
    run = tmp_path / "run"
    traced = run_cli(
        "trace",
        "--out",
        str(run),
        "--wait",
        "1",
        "--warmup",
        "1",
        "--active",
        "3",
        "--max-steps",
        "8",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(script),
        cwd=tmp_path,
        timeout=180,
    )
    assert traced.returncode == 0, traced.stderr
    result = run_cli("try", str(run), "--set", "ddp.find_unused_parameters=false", cwd=tmp_path, timeout=360)
    assert result.returncode == 0, result.stderr
    (session,) = sorted((tmp_path / "run.trials").iterdir())
    (trial,) = read_json(session / "results.json")["trials"]
    assert trial["verdict"] == "failed" and trial["measurement"] is None
    # DDP's own words: the reduction of the previous step never finished (unused parameters)
    assert "Expected to have finished reduction in the prior iteration" in trial["error"]
    assert "failed: the job failed" in result.stdout
    assert "Expected to have finished reduction" in result.stdout


@pytest.mark.timeout(300)
def test_a_knob_that_does_not_apply_fails_the_trial_with_the_reason(tmp_path):
    script = write_script(
        tmp_path / "single.py",
        """
        import torch
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(40):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
        """,
    )
    run = tmp_path / "run"
    traced = run_cli(
        "trace", "--out", str(run), "--wait", "1", "--warmup", "1", "--active", "5", str(script), cwd=tmp_path
    )
    assert traced.returncode == 0, traced.stderr
    result = run_cli("try", str(run), "--set", "ddp.bucket_cap_mb=5", cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr
    # what runs, and where, is shown first; this user's own trace marked it, so it runs without asking
    assert f"runs again in {tmp_path}:" in result.stderr and f"the script it runs: {script}" in result.stderr
    assert "--active 5 " + str(script) in result.stderr
    assert (
        "failed: ddp.bucket_cap_mb does not apply to this job: the job builds no DistributedDataParallel"
        in result.stdout
    )
    as_json = run_cli("try", str(run), "--set", "ddp.bucket_cap_mb=5", "--format", "json", cwd=tmp_path, timeout=240)
    (trial,) = json.loads(as_json.stdout)["trials"]  # the session's results.json, on stdout
    assert trial["verdict"] == "failed" and "builds no DistributedDataParallel" in trial["error"]
    assert sorted(p.name for p in (tmp_path / "run.trials").iterdir()) == ["1", "2"]  # one folder per try


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "ddp.bucket_cap_mb=25"], "not a ddpdoctor run directory"),
        (["--set", "nope=1"], "unknown knob 'nope'"),
        (["--set", "loader.num_workers=-1"], "loader.num_workers=-1: must be a whole number from 0 to 1024"),
        (["--set", "torch.intra_op_threads=" + "9" * 30], "torch.intra_op_threads=999"),
        ([], "give one of --set KNOB=VALUE (one trial), --findings"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, args, message):
    not_a_run = tmp_path / "folder"
    not_a_run.mkdir()
    result = run_cli("try", str(not_a_run), *args, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and message in result.stderr, result.stderr
    assert not (tmp_path / "folder.trials").exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "args",
    [
        ["--timeout", "nan"],
        ["--timeout", "inf"],
        ["--timeout", "-5"],
        ["--max-steps", "9" * 30],
        ["--as-ddp", "--nproc-per-node", "100000"],
    ],
)
def test_numbers_out_of_range_are_refused_naming_the_option(tmp_path, args):
    """`try --timeout nan` was accepted (nan <= 0 is false) and stopped every trial at once."""
    not_a_run = tmp_path / "folder"
    not_a_run.mkdir()
    extra = [] if "--as-ddp" in args else ["--set", "loader.num_workers=1"]
    result = run_cli("try", str(not_a_run), *args, *extra, cwd=tmp_path)
    assert result.returncode == 2
    assert f"argument {args[-2]}: must be" in result.stderr, result.stderr
    assert "not a ddpdoctor run directory" not in result.stderr


@pytest.mark.timeout(600)
def test_loader_workers_on_a_data_loading_bound_job_are_reported_as_measured(tmp_path):
    run = tmp_path / "slow"
    traced = run_cli(
        "trace",
        "--out",
        str(run),
        "--wait",
        "1",
        "--warmup",
        "1",
        "--active",
        "5",
        "--max-steps",
        "12",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(SAMPLES / "ddp_slow_dataloader.py"),
        "--steps",
        "200",
        timeout=240,
    )
    assert traced.returncode == 0, traced.stderr
    assert "dataloader-bound" in _findings(run)
    result = run_cli("try", str(run), "--set", "loader.num_workers=2", "--max-steps", "16", timeout=500)
    assert result.returncode == 0, result.stderr
    (session,) = sorted((tmp_path / "slow.trials").iterdir())
    results = read_json(session / "results.json")
    (trial,) = results["trials"]
    assert trial["error"] is None
    for out, workers in ((Path(trial["out"]), 2), (Path(results["control"]["out"]), 0)):
        for r in (0, 1):
            loaders = read_json(out / "ranks" / f"rank{r}.json")["setup"]["data_loaders"]
            assert {entry["num_workers"] for entry in loaders} == {workers}
    assert trial["verdict"] == _verdict(trial)  # helps or not, as the interval says
    (estimate,) = [e for e in trial["rules"] if e["rule"] == "dataloader-bound"]
    assert estimate["estimated_gain_ms"] > 0
    assert f"verdict: {trial['verdict']}" in result.stdout and "data loading" in result.stdout


def _first_linear_batch(run_dir: Path, rank: int) -> int:
    """The batch dimension of the first aten::linear input in rank ``rank``'s trace (shapes are recorded)."""
    import gzip

    (trace_file,) = read_json(run_dir / "ranks" / f"rank{rank}.json")["trace_files"]
    with gzip.open(run_dir / trace_file, "rt") as f:
        events = json.load(f)["traceEvents"]
    dims = next(e["args"]["Input Dims"] for e in events if e.get("name") == "aten::linear" and "args" in e)
    return dims[0][0]


DP = [str(SAMPLES / "dp_train.py"), "--steps", "60", "--batch-size", "64", "--width", "256"]


@pytest.mark.timeout(400)
def test_as_ddp_runs_a_dataparallel_run_as_two_ddp_ranks_with_half_the_batch(tmp_path):
    run = tmp_path / "dp"
    traced = run_cli("trace", "--out", str(run), "--wait", "1", "--warmup", "1", "--active", "5", *DP, timeout=150)
    assert traced.returncode == 0, traced.stderr
    result = run_cli("try", str(run), "--as-ddp", timeout=300)
    assert result.returncode == 0, result.stderr
    (session,) = sorted((tmp_path / "dp.trials").iterdir())
    results = read_json(session / "results.json")
    control, (trial,) = Path(results["control"]["out"]), results["trials"]
    assert trial["error"] is None and trial["knobs"]["dp.as_ddp"]["applied"] == 2  # one DDP per rank
    manifest = read_json(Path(trial["out"]) / "manifest.json")
    assert manifest["world_size"] == 2 and manifest["launch"] == "torchrun"
    for r in (0, 1):
        capture = read_json(Path(trial["out"]) / "ranks" / f"rank{r}.json")
        assert capture["ddp"][0]["logging_data"]["world_size"] == 2 and capture["backend"] == "gloo"
        assert _first_linear_batch(Path(trial["out"]), r) == 32  # each rank: half of the global batch of 64
    assert _first_linear_batch(control, 0) == 64 and read_json(control / "manifest.json")["world_size"] == 1
    assert trial["verdict"] == _verdict(trial)
    assert "Different set-ups: A is DataParallel (one process)" in result.stdout


@pytest.mark.timeout(300)
def test_as_ddp_gives_dataparallels_numbers(tmp_path):
    """The same script, bare (DataParallel) and as 2 DDP ranks: the same final loss (the same gradients)."""
    import subprocess
    import sys

    bare = subprocess.run(
        [sys.executable, *DP[:1], "--steps", "10", *DP[3:]], capture_output=True, text=True, timeout=120
    )
    assert bare.returncode == 0, bare.stderr
    converted = run_cli(
        "trace",
        "--out",
        str(tmp_path / "run"),
        "--set",
        "dp.as_ddp=true",
        "--standalone",
        "--nproc-per-node",
        "2",
        *DP[:1],
        "--steps",
        "10",
        *DP[3:],
        timeout=200,
    )
    assert converted.returncode == 0, converted.stderr
    (loss,) = [line for line in bare.stdout.splitlines() if "final loss" in line]
    assert converted.stdout.count(loss) == 2, (loss, converted.stdout)  # both ranks, the same loss


@pytest.mark.timeout(120)
def test_as_ddp_refuses_a_run_that_is_not_dataparallel(tmp_path):
    script = write_script(tmp_path / "single.py", "import torch\nprint(torch.ones(1))\n")
    run = tmp_path / "run"
    assert run_cli("trace", "--out", str(run), str(script), cwd=tmp_path).returncode == 0
    result = run_cli("try", str(run), "--as-ddp", cwd=tmp_path)
    assert result.returncode == 2 and "not a DataParallel run" in result.stderr, result.stderr
    assert not (tmp_path / "run.trials").exists()


@pytest.mark.timeout(200)
def test_a_control_run_that_fails_is_exit_1_with_its_error(tmp_path):
    script = write_script(tmp_path / "job.py", "import torch\nprint(torch.ones(1))\n")
    run = tmp_path / "run"
    assert run_cli("trace", "--out", str(run), str(script), cwd=tmp_path).returncode == 0
    script.write_text("raise RuntimeError('the job is broken now')\n")  # the command no longer runs
    result = run_cli("try", str(run), "--set", "loader.num_workers=1", cwd=tmp_path, timeout=150)
    assert result.returncode == 1, result.stderr
    assert "The control run failed, so nothing can be measured" in result.stdout
    assert "RuntimeError: the job is broken now" in result.stdout


PLANTED = ["ddpdoctor", "trace", "--out", "x", "--", "bash", "-c", "echo owned > FILE; id"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    script = write_script(
        folder / "tiny.py",
        """
        import torch
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(12):
            opt.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
        """,
    )
    run = folder / "run"
    traced = run_cli("trace", "-q", "--out", str(run), "--wait", "1", "--warmup", "1", "--active", "2", str(script))
    assert traced.returncode == 0, traced.stderr
    assert read_json(run / "manifest.json")["command_mark"].startswith("hmac-sha256:")
    return run


def _plant(tiny_run: Path, tmp_path: Path, *, keep_mark: bool) -> tuple[Path, Path]:
    """A copy of a real run whose manifest names another command and directory (the mark left as it was, or
    removed): what someone could hand you."""
    run = Path(shutil.copytree(tiny_run, tmp_path / "handed"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    manifest = read_json(run / "manifest.json")
    manifest.update(command=PLANTED, cwd=str(elsewhere))
    if not keep_mark:
        del manifest["command_mark"]
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run, elsewhere


@pytest.mark.timeout(120)
@pytest.mark.parametrize("keep_mark", [True, False], ids=["edited", "unmarked"])
def test_a_planted_command_is_shown_and_not_run(tiny_run, tmp_path, keep_mark):
    run, elsewhere = _plant(tiny_run, tmp_path, keep_mark=keep_mark)
    result = run_cli("try", str(run), "--set", "torch.intra_op_threads=1", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert not (elsewhere / "FILE").exists()  # it ran before: "owned" in elsewhere/FILE
    assert not (tmp_path / "handed.trials").exists()
    # shown before anything runs: the command, the script it runs, and where
    assert f"runs again in {elsewhere}:" in result.stderr
    assert "the command after -- runs as you: bash -c 'echo owned > FILE; id'" in result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith(f"ddpdoctor: error: {run / 'manifest.json'}: command not run: ") and "--yes" in error
    assert ("does not match" if keep_mark else "carries no mark") in error


@pytest.mark.timeout(120)
def test_yes_runs_a_command_that_is_not_marked_after_showing_it(tiny_run, tmp_path):
    run, elsewhere = _plant(tiny_run, tmp_path, keep_mark=False)
    result = run_cli("try", str(run), "--set", "torch.intra_op_threads=1", "--yes", cwd=tmp_path, timeout=100)
    assert "the command after -- runs as you: bash -c 'echo owned > FILE; id'" in result.stderr
    assert "run with --yes although it carries no mark" in result.stderr
    assert (elsewhere / "FILE").read_text() == "owned\n"  # the user said yes: it ran, in its directory


@pytest.mark.timeout(120)
def test_at_a_terminal_try_asks_before_running_a_command_that_is_not_marked(tiny_run, tmp_path):
    import pty
    import subprocess
    import sys

    run, elsewhere = _plant(tiny_run, tmp_path, keep_mark=False)
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddpdoctor", "try", str(run), "--set", "torch.intra_op_threads=1"],
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    os.close(follower)
    os.write(leader, b"n\n")
    _, stderr = proc.communicate(timeout=100)
    os.close(leader)
    assert proc.returncode == 2, stderr
    assert "Run it? [y/N]" in stderr and "command not run (not confirmed)" in stderr
    assert not (elsewhere / "FILE").exists() and not (tmp_path / "handed.trials").exists()


@pytest.mark.timeout(120)
def test_a_manifest_whose_capture_is_a_list_is_one_line_exit_2(tiny_run, tmp_path):
    run = Path(shutil.copytree(tiny_run, tmp_path / "run"))
    manifest = read_json(run / "manifest.json")
    manifest["capture"] = [1, 2]
    (run / "manifest.json").write_text(json.dumps(manifest))
    result = run_cli("try", str(run), "--set", "torch.intra_op_threads=1", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip() == f"ddpdoctor: error: {run / 'manifest.json'}: capture: not a JSON object " + (
        "(the profiler schedule trace ran with)"
    )
