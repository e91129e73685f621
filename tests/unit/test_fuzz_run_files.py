"""Fuzzing the one reader of the run files with hypothesis (issue 23, item 7): a real rank file
(``ranks/rank<R>.json`` of samples/recorded/ddp_straggler, with the set-up records of a real DataLoader run and a
CUDA device's memory record in the shape ``capture/memory.py`` writes) has the value at any path of its JSON
tree replaced by a value of another type (a number, a huge integer, a string, a list, an object, null, a
profiled window of 10**15 steps); ``diagnose``, ``gate`` and ``compare`` of the run then never let anything out
but a ``DDPDoctorError`` (exit 2, one line), and every file left out is named.

Bounded (``max_examples``, no deadline); ``DDPDOCTOR_FUZZ_SCALE=20`` runs twenty times as many examples.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpdoctor.cli import main

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "samples" / "recorded" / "ddp_straggler"
SETUP_CAPTURES = REPO / "tests" / "fixtures" / "setup_captures.json"

SCALE = float(os.environ.get("DDPDOCTOR_FUZZ_SCALE", "1"))
FUZZ = settings(
    max_examples=int(20 * SCALE),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)

# Values of every other type, the awkward ones over-represented.
OTHER = st.sampled_from(
    [None, True, 0, -1, 5, 2**63, 10**15, 10**400, 1e15, -0.5, "", "x", "12", [], [1], ["x"], [[0, 10**15]], {},
     {"a": 1}, {"step": ["a"]}, [{}], [{"index": "x"}], "cuda:\u00b2", "cuda:" + "1" * 5000, {"1" * 5000: 1}]
)  # fmt: skip


@lru_cache(maxsize=1)
def seed_capture() -> dict[str, Any]:
    """Rank 1's real capture file, with every record the readers look into filled in."""
    capture = json.loads((RECORDED / "ranks" / "rank1.json").read_text())
    loaders = json.loads(SETUP_CAPTURES.read_text())["no_distributed_sampler"]["1"]
    capture["setup"] = loaders["setup"]
    capture["dp_steps"] = [
        {"step": 4, "gathered_bytes": 4096, "scatter_ms": 0.1, "replicate_ms": 0.2, "parallel_apply_ms": 1.0,
         "gather_ms": 0.3, "replicas": 2, "forwards": 1}
    ]  # fmt: skip
    series = {"step": [4, 5], "peak_allocated_bytes": [1 << 20, 1 << 21], "peak_reserved_bytes": [1 << 22] * 2}
    capture["memory"] = {
        "cuda_available": True,
        "devices": [
            {"device": "cuda:0", "index": 0, "name": "NVIDIA H100", "capacity_bytes": 80 << 30,
             "peak_allocated_bytes": 1 << 21, "peak_reserved_bytes": 1 << 22, "per_step": series}
        ],
    }  # fmt: skip
    return capture


def paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path of the JSON tree (the root excluded)."""
    out = [at] if at else []
    if isinstance(value, dict):
        for key, item in value.items():
            out += paths(item, (*at, key))
    elif isinstance(value, list):
        for i, item in enumerate(value[:3]):  # the first items of long lists (wall_ms) stand for the rest
            out += paths(item, (*at, i))
    return out


@lru_cache(maxsize=1)
def seed_paths() -> tuple[tuple[Any, ...], ...]:
    return tuple(paths(seed_capture()))


def mutate(capture: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(capture)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


MUTATIONS = st.lists(st.tuples(st.integers(0, 10**6), OTHER), min_size=1, max_size=3)


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("fuzz") / "run"
    shutil.copytree(RECORDED, run)
    (run / "ranks" / "rank1.json").write_text(json.dumps(seed_capture()))
    return run


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)  # anything but a DDPDoctorError (exit 2) would propagate here and fail the test
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err
    else:
        assert code in (0, 1), (code, err)
    return code, out, err


def test_the_seed_is_read_whole(base_run, capsys):
    code, out, _ = _run(["diagnose", str(base_run), "--format", "json"], capsys)
    run = json.loads(out)["run"]
    assert not [n for n in run["skipped"] + run["notes"] if "rank1.json" in n], run


@pytest.mark.timeout(600)
@FUZZ
@given(MUTATIONS)
def test_diagnose_gate_and_compare_survive_any_type_at_any_path(base_run, tmp_path, capsys, mutations):
    capture = seed_capture()
    for index, value in mutations:
        all_paths = paths(capture)
        if not all_paths:
            break
        capture = mutate(capture, all_paths[index % len(all_paths)], value)
    run = tmp_path / "run"
    if run.exists():
        shutil.rmtree(run)
    shutil.copytree(base_run, run)
    (run / "ranks" / "rank1.json").write_text(json.dumps(capture))

    code, out, _ = _run(["diagnose", str(run), "--format", "json"], capsys)
    if code != 2:
        doc = json.loads(out)
        assert [r["rank"] for r in doc["ranks"]] == [0, 1]  # the rank's trace is read whatever its rank file holds
    _run(["gate", str(run), "--baseline", str(base_run), "--format", "json"], capsys)
    _run(["compare", str(base_run), str(run), "--format", "json"], capsys)
