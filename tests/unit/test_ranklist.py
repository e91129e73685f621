"""Compact rank lists (issue 29 item 2): a process group's ranks written as ``[[first, last], ...]`` ranges in each
rank's summary (not every rank in every rank's file, O(ranks²)), read back by the loader as one shared
``RankRanges``; older summaries with plain lists still load; ranges that are not ranges are one error line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ddpdoctor import ranklist
from ddpdoctor.load import load
from ddpdoctor.metrics.summary import summarize_rank
from ddpdoctor.ranklist import RankRanges
from ddpdoctor.values import jsonable
from tests.helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "samples" / "recorded" / "ddp_straggler"


@pytest.mark.parametrize(
    ("ranks", "written"),
    [
        (list(range(131072)), [[0, 131071]]),
        ([0, 1, 2, 5, 6, 9], [[0, 2], [5, 6], [9, 9]]),
        ([3], [[3, 3]]),
        ([2, 1, 0], [2, 1, 0]),  # not ascending: kept as it is, order and all
        ([0, 0, 1], [0, 0, 1]),
        ([], []),
        (["a"], ["a"]),
    ],
)
def test_compact_round_trip(ranks: list, written: list) -> None:
    out = ranklist.compact(ranks)
    assert out == written
    assert len(json.dumps(out)) < 40 or out == ranks
    back = ranklist.read(json.loads(json.dumps(out)), "f: ranks") if all(isinstance(r, int) for r in ranks) else ranks
    assert list(back) == ranks and back == ranks and len(back) == len(ranks)


def test_rank_ranges_is_a_read_only_sequence_without_the_ranks() -> None:
    r = ranklist.read([[0, 3], [10, 11]], "f: ranks")
    assert isinstance(r, RankRanges)
    assert r == [0, 1, 2, 3, 10, 11] and r[4] == 10 and r[-1] == 11 and r[1:3] == [1, 2]
    assert 11 in r and 5 not in r and 12 not in r and -1 not in r
    assert jsonable({"ranks": r}) == {"ranks": [[0, 3], [10, 11]]}
    big = ranklist.read([[0, 131071]], "f: ranks")
    assert len(big) == 131072 and 131071 in big and big.__sizeof__() < 1000


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ([[3, 1]], "range [3, 1] is not ascending"),
        ([[0, 4], [2, 6]], "range [2, 6] is not ascending after rank 4"),
        ([[0, 1, 2]], "[0, 1, 2] is not a [first, last] range"),
        ([[0, "x"]], "is not a [first, last] range"),
        ([0, [1, 2]], "[1, 2] is not a rank"),
        ("0-7", "a rank list is a list, not str"),
    ],
)
def test_bad_rank_lists_name_the_field(value: object, says: str) -> None:
    with pytest.raises(ranklist.BadRankList, match=r"^rank3\.summary\.json: pg_config\[0\]\.ranks: ") as e:
        ranklist.read(value, "rank3.summary.json: pg_config[0].ranks")
    assert says in str(e.value) and "\n" not in str(e.value)


def _run_with_group(tmp_path: Path, n: int, ranks_of: object) -> Path:
    """The recorded sample with each rank's summary stating one process group of ``n`` ranks as ``ranks_of``."""
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run)
    for rank in (0, 1):
        path = run / "ranks" / f"rank{rank}.summary.json"
        data = json.loads(path.read_text())
        data["distributed_info"]["pg_config"] = [{"pg_name": "0", "pg_size": n, "ranks": ranks_of}]
        path.write_text(json.dumps(data))
    return run


def test_a_summary_states_a_group_as_ranges() -> None:
    run = load(SAMPLE, use_summaries=False)
    rt = run.ranks[0]
    rt.distributed_info = {**rt.distributed_info, "pg_config": [{"pg_name": "0", "ranks": list(range(4096))}]}
    written = summarize_rank(rt, None)["distributed_info"]["pg_config"]
    assert written == [{"pg_name": "0", "ranks": [[0, 4095]]}]


def test_the_loader_reads_ranges_as_one_shared_object_and_plain_lists_as_before(tmp_path: Path) -> None:
    old = load(_run_with_group(tmp_path / "old", 4096, list(range(4096))), use_summaries=True)
    new = load(_run_with_group(tmp_path / "new", 4096, [[0, 4095]]), use_summaries=True)
    old_groups = [rt.distributed_info["pg_config"][0]["ranks"] for rt in old.ranks]
    new_groups = [rt.distributed_info["pg_config"][0]["ranks"] for rt in new.ranks]
    assert old_groups[0] == list(range(4096)) and isinstance(old_groups[0], list)
    assert isinstance(new_groups[0], RankRanges) and new_groups[0] is new_groups[1]
    assert new_groups[0] == old_groups[0]
    assert [rt.summary is not None for rt in new.ranks] == [True, True]  # read from the summaries


@pytest.mark.timeout(120)
def test_diagnose_of_a_summary_with_bad_ranges_is_one_line_exit_2(tmp_path: Path) -> None:
    run = _run_with_group(tmp_path, 8, [[0, 3], [2, 7]])
    proc = run_cli("diagnose", str(run), timeout=110)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "ranks/rank0.summary.json: distributed_info.pg_config[0].ranks: range [2, 7]" in lines[0]
