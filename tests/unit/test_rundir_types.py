"""The run directory's shared files have one type each (rundir.RankCapture, RankSummary, Manifest): what the
capture wrote fits them, and what does not fit is left out with a note while the other files are used."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ddpdoctor import rundir, runfiles
from ddpdoctor._version import __version__

RECORDED = Path(__file__).resolve().parents[2] / "samples" / "recorded" / "ddp_straggler"
pytestmark = pytest.mark.skipif(not RECORDED.is_dir(), reason="samples/recorded/ddp_straggler is missing")


def test_a_recorded_run_fits_its_types():
    captures, manifest, notes = runfiles.read_run_files(RECORDED)
    assert notes == [] and sorted(captures) == [0, 1] and manifest["world_size"] == 2
    for rank in (0, 1):
        summary = rundir.read_json(rundir.summary_file(RECORDED, rank))
        assert runfiles.check(summary, rundir.RankSummary) is None
        assert runfiles.check(captures[rank], rundir.RankCapture) is None


def test_a_file_that_does_not_fit_is_left_out_with_a_note(tmp_path):
    run = Path(shutil.copytree(RECORDED, tmp_path / "run"))
    capture = json.loads((run / "ranks" / "rank1.json").read_text())
    capture["steps"]["wall_ms"] = "fast"
    (run / "ranks" / "rank1.json").write_text(json.dumps(capture))
    captures, _, notes = runfiles.read_run_files(run)
    assert sorted(captures) == [0]
    assert len(notes) == 1 and notes[0].startswith("ranks/rank1.json: skipped:") and "wall_ms" in notes[0]


def test_a_summary_with_columns_of_different_lengths_is_left_out(tmp_path):
    run = Path(shutil.copytree(RECORDED, tmp_path / "run"))
    path = rundir.summary_file(run, 0)
    summary = json.loads(path.read_text())
    summary["per_step"]["step_ms"] = summary["per_step"]["step_ms"][:-1]
    path.write_text(json.dumps(summary))
    found, notes = runfiles.read_summaries(run, __version__)
    assert sorted(found) == [1] and "different lengths" in notes[0]


def test_writing_checks_the_type_and_keeps_the_data(tmp_path):
    path = tmp_path / "ranks" / "rank0.json"
    assert runfiles.write_rank_capture(path, {"rank": 0, "world_size": 2, "steps": {"wall_ms": [1.0]}}) is None
    why = runfiles.write_rank_capture(path, {"rank": 0, "world_size": "two"})
    assert why is not None and "world_size" in why
    assert json.loads(path.read_text())["world_size"] == "two"  # what was measured is on disk all the same
