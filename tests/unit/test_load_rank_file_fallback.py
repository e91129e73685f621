"""A rank whose ``ranks/rank<R>.json`` is missing, unreadable or claims another rank is still read from its trace
(issue 23, item 9): ``diagnose`` analyses both ranks of the recorded straggler run, finds the straggler, and says
that rank 1 was read from its trace file alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ddpdoctor.cli import main

RECORDED = Path(__file__).resolve().parents[2] / "samples" / "recorded" / "ddp_straggler"


def _missing(path: Path) -> None:
    path.unlink()


def _invalid(path: Path) -> None:
    path.write_text("{")


def _claims_rank_0(path: Path) -> None:
    data = json.loads(path.read_text())
    data["rank"] = 0
    path.write_text(json.dumps(data))


def _claims_rank_5(path: Path) -> None:
    data = json.loads(path.read_text())
    data["rank"] = 5
    path.write_text(json.dumps(data))


def _wrongly_typed(path: Path) -> None:
    data = json.loads(path.read_text())
    data["setup"]["data_loaders"] = 5
    path.write_text(json.dumps(data))


RANK_FILE = {
    "missing": _missing,
    "invalid": _invalid,
    "claims rank 0": _claims_rank_0,
    "claims rank 5": _claims_rank_5,
    "wrongly typed": _wrongly_typed,
}
WHY = {"missing": "is missing", "claims rank 5": "states rank 5"}  # the others: "was left out (above)"


@pytest.mark.parametrize("summary", ["without its summary", "with its summary"])
@pytest.mark.parametrize("case", RANK_FILE)
def test_a_rank_without_a_valid_rank_file_is_read_from_its_trace(tmp_path, capsys, case, summary):
    run = tmp_path / "run"
    shutil.copytree(RECORDED, run)
    RANK_FILE[case](run / "ranks" / "rank1.json")
    if summary == "without its summary":
        (run / "ranks" / "rank1.summary.json").unlink()
    capsys.readouterr()
    code = main(["diagnose", str(run), "--format", "json"])
    out, err = capsys.readouterr()
    assert code in (0, 1) and "Traceback" not in err, err
    doc = json.loads(out)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    # both ranks' collectives matched, so the straggler (rank 1, read from its trace) is still named
    straggler = next(f for f in doc["findings"] if f["name"] == "rank-straggler")
    assert straggler["ranks"] == [1]
    trace = next(RECORDED.glob("rank1.*.pt.trace.json.gz")).name
    said = doc["run"]["skipped"] + doc["run"]["notes"]
    why = f"ranks/rank1.json {WHY.get(case, 'was left out (above)')}"
    assert any(f"rank 1 is read from its trace alone ({trace})" in n and n.endswith(why) for n in said), said
