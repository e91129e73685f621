"""Wrongly typed capture and summary files (``ranks/rank<R>.json``, ``ranks/rank<R>.summary.json``) never end
in a traceback (issue 13, item 12): a summary that does not hold what ``summarize_rank`` writes is ignored and
the rank is analysed from its traces; a capture file's wrongly typed parts are left out of ``baseline``/``gate``
with a note naming the file, and the other ranks' files are read as usual."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.cli import main
from ddpdoctor.load import load
from ddpdoctor.metrics.summary import summarize_rank

HUGE = "1" + "0" * 400  # an integer JSON holds and a float cannot
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ddp_gloo_2rank"


def _capture(rank: int) -> dict:
    return {
        "schema_version": 1,
        "rank": rank,
        "world_size": 2,
        "status": "ok",
        "exit_code": 0,
        "backend": "gloo",
        "device": "cpu",
        "torch_version": "2.13.0",
        "schedule": {"wait": 1, "warmup": 1, "active": 3, "repeat": 2},
        "steps": {
            "source": "optimizer",
            "count": 20,
            "first": 1,
            "wall_ms": [30.0 + i % 3 for i in range(20)],
            "profiled": [[3, 5], [9, 11]],
        },
        "memory": {"devices": []},
        "gil": {"per_step": {"step": [3, 4, 5], "contention": [0.1, 0.2, 0.1]}},
    }


@pytest.fixture(scope="module")
def good_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run")
    for src in FIXTURE.glob("rank*.pt.trace.json.gz"):
        shutil.copy(src, out / src.name)
    (out / "ranks").mkdir()
    for rt in load(out).ranks:
        (out / "ranks" / f"rank{rt.rank}.json").write_text(json.dumps(_capture(rt.rank)))
        (out / "ranks" / f"rank{rt.rank}.summary.json").write_text(json.dumps(summarize_rank(rt)))
    return out


def _copy(good_run: Path, tmp_path: Path, name: str, edit) -> Path:
    run = tmp_path / "run"
    shutil.copytree(good_run, run)
    path = run / "ranks" / name
    data = json.loads(path.read_text())
    text = edit(data)
    path.write_text(text if isinstance(text, str) else json.dumps(data))
    return run


def _json_diagnose(capsys, run: Path) -> dict:
    capsys.readouterr()
    code = main(["diagnose", str(run), "--format", "json"])
    out, err = capsys.readouterr()
    assert code in (0, 1) and "Traceback" not in err, err
    return json.loads(out)


def _set(path: str, value):
    def edit(d):
        keys = path.split(".")
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value

    return edit


SUMMARY_EDITS = {
    "metrics a list": _set("metrics", [1, 2]),
    "metrics null": _set("metrics", None),
    "a number as a string": _set("metrics.step_ms_median", "12"),
    "a huge integer": lambda d: json.dumps(d).replace('"step_ms_median": ', f'"step_ms_median": {HUGE}, "x": '),
    "per_step of the wrong length": _set("per_step.step_ms", [1.0]),
    "per_step not a list": _set("per_step.step_ms", "abc"),
    "per_step null": _set("per_step", None),
    "steps as strings": lambda d: d["per_step"].__setitem__("step", ["a"] * len(d["per_step"]["step"])),
    "collectives a list": _set("collectives", [1]),
    "devices of numbers": _set("devices", [1]),
    "files a number": _set("files", 5),
}


@pytest.mark.parametrize("case", SUMMARY_EDITS)
def test_a_bad_summary_is_ignored_and_the_rank_read_from_its_traces(good_run, tmp_path, capsys, case):
    expected = _json_diagnose(capsys, good_run)
    run = _copy(good_run, tmp_path, "rank1.summary.json", SUMMARY_EDITS[case])
    got = _json_diagnose(capsys, run)
    pick = lambda doc: [(r["rank"], r.get("step_ms")) for r in doc["ranks"]]  # noqa: E731
    assert pick(got) == pick(expected)
    said = got["run"]["skipped"] + got["run"]["notes"]
    assert any("rank1.summary.json" in n and "trace is read instead" in n for n in said), said


CAPTURE_EDITS = {
    "steps a list": _set("steps", [1]),
    "wall_ms a string": _set("steps.wall_ms", "x"),
    "wall_ms of strings": _set("steps.wall_ms", ["1", "x"]),
    "a huge wall time": lambda d: json.dumps(d).replace('"wall_ms": [30.0', f'"wall_ms": [{HUGE}'),
    "first a string": _set("steps.first", "x"),
    "profiled windows of numbers": _set("steps.profiled", [5]),
    "memory a list": _set("memory", [1]),
    "rank a string": _set("rank", "x"),
    "world_size a string": _set("world_size", "x"),
    "setup a list": _set("setup", [1]),
}


@pytest.mark.parametrize("case", CAPTURE_EDITS)
def test_a_bad_capture_file_is_one_note_or_one_error_line(good_run, tmp_path, capsys, case):
    run = _copy(good_run, tmp_path, "rank1.json", CAPTURE_EDITS[case])
    capsys.readouterr()
    code = main(["baseline", str(run)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    if code == 2:
        assert len(err.strip().splitlines()) == 1 and "rank1.json" in err
    else:
        assert code == 0, err
        doc = json.loads(out)
        assert any("rank 1" in n or "rank1.json" in n for n in doc["notes"] + doc.get("incomplete", [])), doc["notes"]


NESTED_EDITS = {  # records inside a capture file that only one part reads: their bad values are left out
    "gil steps as strings": _set("gil", {"per_step": {"step": ["a"], "contention": ["b"]}}),
    "gil a list": _set("gil", [1]),
    "schedule of strings": _set("schedule", {"warmup": "x"}),
    "schedule a list": _set("schedule", [1]),
}


@pytest.mark.parametrize("case", NESTED_EDITS)
def test_bad_values_inside_a_capture_record_are_left_out(good_run, tmp_path, capsys, case):
    run = _copy(good_run, tmp_path, "rank1.json", NESTED_EDITS[case])
    capsys.readouterr()
    code = main(["baseline", str(run)])
    out, err = capsys.readouterr()
    assert code == 0 and "Traceback" not in err, err
    doc = json.loads(out)
    assert len(doc["samples"]["step_ms"]) >= 5  # both ranks' step times are still read
    if case.endswith("a list") or case.startswith("schedule"):  # the record alone is left out, and said so
        record = case.split()[0]
        assert any(n.startswith(f"ranks/rank1.json: {record} left out") for n in doc["notes"]), doc["notes"]
        assert not any("skipped" in n for n in doc["notes"]) and not doc.get("incomplete"), doc


# --- issue 23, item 7: wrongly typed nested values in a real rank file ---------------------------------------
RECORDED = Path(__file__).resolve().parents[2] / "samples" / "recorded" / "ddp_straggler"

NESTED_TYPE_EDITS = {  # (edit, the field the note must name); each crashed diagnose, gate or compare before
    "data_loaders a number": (_set("setup.data_loaders", 5), "setup.data_loaders"),
    "ddp_models a number": (_set("setup.ddp_models", 5), "setup.ddp_models"),
    "dp_steps a number": (_set("dp_steps", 5), "dp_steps"),
    "a loader's id a list": (
        _set("setup.data_loaders", [{"loader": [1], "batches_yielded": 3, "batch_size": 2}]),
        "setup.data_loaders[0].loader",
    ),
    "a digest a list": (
        _set("setup.data_loaders", [{"loader": 1, "batches_yielded": 3, "first_indices_digest": [1]}]),
        "setup.data_loaders[0].first_indices_digest",
    ),
    "memory.devices a number": (_set("memory.devices", 5), "memory.devices"),
    "memory.devices a string": (_set("memory.devices", "abc"), "memory.devices"),
    "a device index a string": (
        _set("memory.devices", [{"device": "cuda:0", "index": "x", "peak_reserved_bytes": 5}]),
        "memory.devices[0].index",
    ),
    "a device index a list": (
        _set("memory.devices", [{"device": "cuda:0", "index": [], "peak_reserved_bytes": 5}]),
        "memory.devices[0].index",
    ),
    "a device index an object": (
        _set("memory.devices", [{"device": "cuda:0", "index": {}, "peak_reserved_bytes": 5}]),
        "memory.devices[0].index",
    ),
    "a DDP model's device of 5,000 digits": (
        lambda d: d["setup"]["ddp_models"][0].__setitem__("device", "cuda:" + "1" * 5000),
        "setup.ddp_models[0].device",
    ),
    "a DDP model's device with a superscript digit": (
        lambda d: d["setup"]["ddp_models"][0].__setitem__("device", "cuda:\u00b2"),
        "setup.ddp_models[0].device",
    ),
    "a histogram key of 5,000 digits": (
        _set("setup.ddp_sync_rounds_per_step", {"1" * 5000: 3}),
        "setup.ddp_sync_rounds_per_step",
    ),
    "a profiled window of 10**15 steps": (_set("steps.profiled", [[0, 10**15]]), "steps"),
    "a profiled window beyond the recorded steps": (_set("steps.profiled", [[4, 7000]]), "steps"),
}


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("recorded") / "run"
    shutil.copytree(RECORDED, out)
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", NESTED_TYPE_EDITS)
def test_wrongly_typed_nested_values_are_a_note_naming_the_file_and_field(recorded_run, tmp_path, capsys, case):
    edit, field = NESTED_TYPE_EDITS[case]
    run = _copy(recorded_run, tmp_path, "rank1.json", edit)
    doc = _json_diagnose(capsys, run)
    said = doc["run"]["skipped"] + doc["run"]["notes"]
    assert any("rank1.json" in n and f"$.{field}" in n for n in said), said
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]  # the rank's trace is still read

    code = main(["gate", str(run), "--baseline", str(recorded_run), "--format", "json"])
    out, err = capsys.readouterr()
    assert code in (0, 1) and "Traceback" not in err, err
    notes = json.loads(out)["notes"]
    assert any("rank1.json" in n and f"$.{field}" in n for n in notes), notes

    code = main(["compare", str(recorded_run), str(run), "--format", "json"])
    out, err = capsys.readouterr()
    assert code in (0, 1) and "Traceback" not in err, err


_LIMITED = """import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # a loop sized by the file fails here, not the machine
from ddpdoctor.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.timeout(120)
def test_a_huge_profiler_warm_up_does_not_size_a_loop(recorded_run, tmp_path):
    # a schedule of valid types whose warm-up (2**30 steps) made a set of the steps before each window (23 GB)
    run = _copy(recorded_run, tmp_path, "rank1.json", _set("schedule.warmup", 2**30))
    argv = ["gate", str(run), "--baseline", str(recorded_run), "--format", "json"]
    proc = subprocess.run([sys.executable, "-c", _LIMITED, *argv], capture_output=True, text=True, timeout=100)
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["incomplete"] == [], proc.stdout
