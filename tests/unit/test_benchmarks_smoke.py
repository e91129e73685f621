"""The benchmark harness (benchmarks/) imports and its pieces run on a small real run in seconds; the numbers
themselves are only meaningful from `python benchmarks/run.py`."""

from __future__ import annotations

import gzip
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ddp_gloo_2rank"
sys.path.insert(0, str(BENCH))

import bench_common  # noqa: E402
import bench_floor  # noqa: E402
import bench_scale  # noqa: E402
import run as harness  # noqa: E402


def test_every_benchmark_is_listed(capsys: pytest.CaptureFixture[str]) -> None:
    assert harness.main(["--list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == [
        "floor",
        "hta",
        "memory",
        "large",
        "capture",
        "scale",
        "gate-memory",
        "flight",
        "dask",
        "gate-noise",
        "gil",
        "series",
    ]


def test_a_line_says_pass_or_miss_against_its_target() -> None:
    report = bench_common.Report(stream=open("/dev/null", "w"))  # noqa: SIM115
    assert report.add("a", 1.2, target=("<=", 1.3)).status == "PASS"
    assert report.add("b", 1.4, target=("<=", 1.3)).status == "MISS"
    assert report.add("c", 12.0, target=(">=", 10.0)).line().split()[1:4] == ["12.0x", "(target", ">="]
    assert report.add("e", 1.022, target=("<=", 1.02)).line().split()[1:5] == ["1.022x", "(target", "<=", "1.020x)"]
    assert report.skip("d", "no traces").status == "SKIP"


def test_diagnose_and_the_floor_process_are_timed_on_a_real_run() -> None:
    result = bench_floor.compare(FIXTURE, reps=1, warm=False)
    assert result["files"] == 4 and result["largest_rank_mb"] > 0
    assert all(result[k] > 0 for k in ("diagnose_s", "floor_s"))


def test_the_floor_decodes_the_fields_ddpdoctor_reads() -> None:
    """The floor process must decode what ddpdoctor's schema decodes, no less (or it is no floor), no more."""
    import floor_process

    from ddpdoctor.load import schema

    assert [t.__struct_config__.tag for t in floor_process.EVENT_TYPES] == [
        t.__struct_config__.tag for t in schema.EVENT_TYPES
    ]
    pairs = [*zip(schema.EVENT_TYPES, floor_process.EVENT_TYPES, strict=True)]
    pairs += [(getattr(schema, name), getattr(floor_process, name)) for name in ("Args", "MemoryArgs", "MetaArgs")]
    for ours, floor in pairs:
        assert floor.__struct_fields__ == ours.__struct_fields__
        assert floor.__struct_encode_fields__ == ours.__struct_encode_fields__
        assert [str(t) for t in floor.__annotations__.values()] == [str(t) for t in ours.__annotations__.values()]
    header = set(schema.Header.__struct_fields__)
    assert header == set(floor_process.Trace.__struct_fields__)


def test_the_floor_process_counts_the_events_of_a_real_trace() -> None:
    files = sorted(FIXTURE.glob("*.pt.trace.json*"))
    out = subprocess.run([sys.executable, str(bench_floor.FLOOR), *map(str, files)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    n = sum(
        len(json.loads(gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes())["traceEvents"])
        for p in files
    )
    assert int(out.stdout) == n > 0


def test_a_synthetic_run_from_real_summaries_is_diagnosed_in_a_child(tmp_path: Path) -> None:
    from ddpdoctor.load import load
    from ddpdoctor.metrics.summary import summarize_rank

    source = tmp_path / "source"
    shutil.copytree(FIXTURE, source)
    run = load(source)
    for rt in run.ranks:  # the capture writes these at the end of a real run; the fixture predates them
        summary = summarize_rank(rt, run.capture.get(rt.rank))
        (source / "ranks" / f"rank{rt.rank}.summary.json").write_text(json.dumps(summary))
    synthetic = bench_scale.synthesize(8, source, tmp_path / "scale-8")
    manifest = json.loads((synthetic / "manifest.json").read_text())
    assert manifest["world_size"] == 8 and "synthetic-from-real" in manifest["notes"][0]
    assert json.loads((synthetic / "ranks" / "rank7.summary.json").read_text())["rank"] == 7
    child = bench_common.run_child([str(bench_common.CHILD), "summaries", str(synthetic)])
    assert child["work_s"] > 0 and child["peak_rss_kb"] >= child["baseline_rss_kb"] > 0


def test_the_flight_recorder_cost_is_measured_on_the_same_loop_with_and_without() -> None:
    import bench_flight

    result = bench_flight.compare(rounds=1, steps=20)
    assert result["plain_step_us"] > 0 and result["recorded_step_us"] > 0
    assert result["ratio"] == result["recorded_step_us"] / result["plain_step_us"]


def test_the_series_cost_is_said_pass_only_when_its_whole_interval_is_within_the_limit() -> None:
    import bench_series

    assert bench_series.verdict(0.995, 1.009) == "PASS"
    assert bench_series.verdict(1.011, 1.03) == "MISS"
    assert bench_series.verdict(0.99, 1.02) == "UNSURE"  # a noisy run: neither shown nor ruled out
    mid, lo, hi = bench_series.interval([1.0 + 0.001 * (i % 7) for i in range(200)])
    assert lo <= mid <= hi and 1.0 <= lo and hi <= 1.006
    assert bench_series.interval([2.0] * 10, statistics.fmean) == (2.0, 2.0, 2.0)


def test_the_series_cost_is_measured_against_the_bare_loop_in_one_run() -> None:
    import bench_series

    r = bench_series.measure(rounds=6, block=2, width=64, stretch=20, stretch_ms=1200)
    for key in ("on_cpu_ratio", "off2_cpu_ratio", "on_wall_ratio", "off2_wall_ratio", "added", "own_us"):
        mid, lo, hi = r[key]
        assert 0 < lo <= mid <= hi, key
    assert r["added"][0] > 1 and r["own_us"][0] > 0 and r["writer_us"] > 0 and r["off_cpu_us"] > 0
    # every recorded step written: the warm-up's, the rounds' and the stretch's
    assert r["rows"] == r["steps_recorded"] >= 20 + 6 * 2 + 20


def test_the_always_on_requirement_needs_the_direct_cost_within_it_and_no_ratio_beyond_it() -> None:
    from bench_series import always_on_verdict

    direct = (1.006, 1.0055, 1.0061)
    assert always_on_verdict(direct, [(1.001, 0.994, 1.0102), (1.002, 0.995, 1.016)]) == "PASS"  # a noisy ratio
    assert always_on_verdict(direct, [(1.02, 1.008, 1.03)]) == "UNSURE"  # more than the direct timing sees
    assert always_on_verdict(direct, [(1.03, 1.015, 1.04)]) == "MISS"
    assert always_on_verdict((1.012, 1.011, 1.013), [(1.0, 0.99, 1.01)]) == "MISS"  # the work alone is too much
    assert always_on_verdict((1.009, 1.008, 1.011), [(1.0, 0.99, 1.01)]) == "UNSURE"
