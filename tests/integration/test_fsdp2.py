"""Issue 26 item 10: real FSDP2 (fully_shard) jobs on CPU + gloo, traced and diagnosed.

- One unit for the whole model (``fully_shard(model)`` alone): ``fsdp-one-large-unit`` fires, says it is the only
  unit, that gloo all-reduces instead of reduce-scattering and that on CPU the time is not gained (no gain claimed).
- One unit per block with explicit prefetch, traced beside a CPU burner: no FSDP finding (the negative case under
  load), the NCCL-only FSDP rules say why they are not evaluated, the per-unit table lists every unit.
- The per-unit exposed all-gather and reduce times agree with the job's own wall clock of the same collectives in
  the same steps (tests/integration/fsdp2_job.py: the time its training thread sat in each collective's wait; on
  CPU FSDP2 blocks in every collective, so all of it is exposed): the median difference over ranks and steps is
  within 1 ms + 15% of the job's time, per unit and kind. The job's clock also runs while the loaded host keeps
  its thread off a CPU after the collective ended (0.1-0.3 ms unloaded, up to ~0.9 ms beside the burner here, more
  on a busy CI host): the job measures that time (its training thread's schedstat run_delay inside wait()), and
  the lower bound leaves it out.

Two traced jobs of 8 steps (a few seconds each), shared by the tests of this module.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from helpers import REPO, cpu_burner, run_cli

pytestmark = [pytest.mark.integration]

JOB = REPO / "tests" / "integration" / "fsdp2_job.py"
WINDOW = ["--wait", "1", "--warmup", "1", "--active", "4"]
ABS_MS, REL = 1.0, 0.15  # unloaded the medians differ by 0.1-0.3 ms; beside a burner on a busy host by up to ~0.9


def _traced(out: Path, *job_args: str) -> dict:
    traced = run_cli(
        "trace", "-q", "--out", str(out), *WINDOW, "--standalone", "--nproc-per-node", "2",
        str(JOB), "--steps", "8", "--timings", str(out.parent / f"{out.name}.timings"), *job_args,
        timeout=150,
    )  # fmt: skip
    assert traced.returncode == 0, traced.stderr[-3000:]
    diagnosed = run_cli("diagnose", str(out), "--format", "json", timeout=90)
    assert diagnosed.returncode == 0, diagnosed.stderr[-3000:]
    return json.loads(diagnosed.stdout)


@pytest.fixture(scope="module")
def root_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("fsdp2") / "root"
    return out, _traced(out, "--wrap", "root")


@pytest.fixture(scope="module")
def blocks_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("fsdp2") / "blocks"
    with cpu_burner(1):
        return out, _traced(out, "--wrap", "blocks", "--prefetch")


@pytest.fixture(scope="module")
def embed_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("fsdp2") / "embed"
    return out, _traced(out, "--wrap", "blocks", "--embed", "16384")


def _finding(report: dict, name: str) -> dict | None:
    return next((f for f in report["findings"] if f["name"] == name), None)


@pytest.mark.timeout(300)
def test_one_unit_for_the_root_gets_the_wrap_granularity_finding(root_job: tuple[Path, dict]) -> None:
    _, report = root_job
    assert report["run"]["parallelism"] == "fsdp2"
    assert [u["unit"] for u in report["run"]["fsdp_units"]] == ["(root)"]
    f = _finding(report, "fsdp-one-large-unit")
    assert f is not None, [x["name"] for x in report["findings"]]
    assert f["ranks"] == [0, 1]
    assert "FSDP unit (root) holds 100% of the parameters" in f["message"]
    assert "It is the only unit" in f["message"]
    assert "gloo has no reduce-scatter" in f["message"] and "On CPU" in f["message"]
    assert "fully_shard(block)" in f["recommendation"]
    assert f["estimated_gain_ms"] is None  # on CPU wrapping per block does not make the step faster
    # its 18 tensors (4 per block, the head's 2), the largest (a block's 256x512 weight) 1/8 of the parameters
    shares = f["evidence"]["fsdp_largest_unit_tensor_share"]
    assert set(shares) == {"0", "1"} and all(abs(s - 131072 / 1053194) < 0.01 for s in shares.values()), shares


@pytest.mark.timeout(300)
def test_a_unit_of_one_large_tensor_gets_no_wrap_granularity_finding(embed_job: tuple[Path, dict]) -> None:
    # the user wrapped every block and the 16384 x 256 embedding on its own: the embedding's unit holds 80% of the
    # parameters in one tensor, which no fully_shard call can split; "call fully_shard on each block" would be
    # advice they already followed, and the unit cannot be made smaller
    _, report = embed_job
    units = {u["unit"]: u for u in report["run"]["fsdp_units"]}
    assert units["emb"]["param_share"] > 0.75 and "blocks.3" in units
    assert _finding(report, "fsdp-one-large-unit") is None, [x["name"] for x in report["findings"]]
    why = {p["name"]: p["reason"] for p in report["passed_reasons"]}["fsdp-one-large-unit"]
    assert why.startswith("FSDP unit emb holds 80% of the parameters, but one parameter tensor of it holds 80%"), why
    assert "(1 tensor(s) in the unit)" in why and "fully_shard cannot split a tensor" in why


@pytest.mark.timeout(300)
def test_per_block_units_with_prefetch_get_no_fsdp_finding_under_load(blocks_job: tuple[Path, dict]) -> None:
    out, report = blocks_job
    assert report["run"]["parallelism"] == "fsdp2"
    assert not [f["name"] for f in report["findings"] if f["name"].startswith("fsdp-")]
    units = {u["unit"]: u for u in report["run"]["fsdp_units"]}
    assert set(units) == {"blocks.0", "blocks.1", "blocks.2", "blocks.3", "(root)"}
    assert max(u["param_share"] for u in units.values()) < 0.3
    reasons = {n["name"]: n["reason"] for n in report["not_evaluated"]}
    for name in ("fsdp-exposed-all-gather", "fsdp-exposed-reduce-scatter"):
        assert reasons[name] == "applies to nccl runs; this run uses gloo"
    assert "fsdp-one-large-unit" in report["passed"]
    text = run_cli("diagnose", str(out), timeout=90).stdout
    assert "FSDP2 units" in text and "blocks.3" in text and "gloo has no reduce-scatter" in text


def _per_step_pairs(out: Path) -> dict[tuple[str, str], list[tuple[float, float, float, float]]]:
    """(ddpdoctor's exposed ms, the job's blocked-in-wait ms, the part of that the host kept the thread off a CPU,
    the job's whole call ms) of each (unit, kind), one per rank and analysed step: ddpdoctor's from the rank's
    summary of that one step (``summarize_rank(..., step_range)``), the job's from its records of the job step whose
    job_step_<i> mark lies in that step's window."""
    from ddpdoctor.load import load
    from ddpdoctor.metrics import analyze
    from ddpdoctor.metrics.summary import summarize_rank

    run = load(out, workers=1)
    per_step = analyze(run).per_step.records()
    pairs: dict[tuple[str, str], list[tuple[float, float, float, float]]] = {}
    for rt in run.ranks:
        names, starts = rt.tables.ops["name"].values(), rt.tables.ops["ts_us"]
        marks = {
            int(n.rsplit("_", 1)[1]): float(t)
            for n, t in zip(names, starts, strict=True)
            if str(n).startswith("job_step_")
        }
        records = [
            json.loads(line) for line in (out.parent / f"{out.name}.timings.rank{rt.rank}").read_text().splitlines()
        ]
        windows = [r for r in per_step if r["rank"] == rt.rank and r["analyzed"]]
        assert len(windows) == 4
        for w in windows:
            job_step = next(i for i, t in marks.items() if w["start_us"] <= t < w["end_us"])
            table = summarize_rank(rt, run.capture.get(rt.rank), (w["step"], w["step"]))["fsdp_units"]
            for i, unit in enumerate(table["unit"]):
                for kind, column in (("all_gather", "allgather_exposed_ms"), ("reduce", "reduce_exposed_ms")):
                    mine = [r for r in records if (r["step"], r["unit"], r["kind"]) == (job_step, unit, kind)]
                    waited, whole = sum(r["wait_ms"] for r in mine), sum(r["ms"] for r in mine)
                    held = sum(r["held_ms"] for r in mine)
                    pairs.setdefault((unit, kind), []).append((table[column][i], waited, held, whole))
    return pairs


@pytest.mark.timeout(300)
@pytest.mark.parametrize("job", ["root_job", "blocks_job"])
def test_exposed_time_per_unit_matches_the_jobs_own_clock(job: str, request: pytest.FixtureRequest) -> None:
    out, _ = request.getfixturevalue(job)
    pairs = _per_step_pairs(out)
    assert len(pairs) >= 2, "no FSDP2 unit measured"
    for key, values in pairs.items():
        # The median over ranks and steps: a step where the loaded host kept the training thread off its CPU after
        # the collective ended (the job's clock runs on; the collective's does not) does not decide it. The job's
        # clock has two readings: the time blocked in wait(), and the whole call. The collective runs on gloo's
        # thread from when it is issued, inside the call, so ddpdoctor's exposed time lies between them: on a quiet
        # host both are close, on a loaded one a training thread kept off its CPU between issuing and waiting
        # (clone runs of 2026-12-03/04: ddpdoctor 14.0 ms against 8.0 ms blocked in wait()) counts in the call and
        # in the collective's run, not in the wait.
        # The lower bound takes off the time the host kept the training thread off a CPU inside wait() (schedstat's
        # run_delay: woken when the collective ended, it waited for a CPU), which is in the job's clock but not in
        # the collective's span. On a quiet host it is ~0.
        median = statistics.median
        tol = ABS_MS + REL * median([waited for _, waited, _, _ in values])
        assert median([ours - (waited - held) for ours, waited, held, _ in values]) >= -tol, (key, values)
        assert median([ours - whole for ours, _, _, whole in values]) <= tol, (key, values)
