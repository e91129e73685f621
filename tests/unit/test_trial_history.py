"""The trials shown next to a run (RUN.trials/<n>/results.json, `ddpdoctor.trial.history`) come from files anyone
can edit: wrongly typed values are shown as unknown, never a traceback in `diagnose`."""

from __future__ import annotations

import json

import pytest

from ddpdoctor.trial.history import read_trials


@pytest.mark.parametrize(
    "trial",
    [
        {"settings": {"ddp.bucket_cap_mb": "2"}, "verdict": "helps", "rules": 5},
        {"settings": {"a": 1}, "measurement": {"metrics": 3, "findings_went_away": 7}},
        {"settings": [], "measurement": {"findings_appeared": {"x": 1}, "measured_gain_interval_ms": [1, "x"]}},
        {"settings": {"a": 1}, "measurement": {"metrics": [{"metric": "step_ms.median", "ratio": "0.9"}]}},
        {"error": 5, "rules": [{"rule": None, "estimated_gain_ms": "3"}]},
    ],
)
def test_wrongly_typed_values_are_shown_as_unknown(tmp_path, trial):
    session = tmp_path / "run.trials" / "1"
    session.mkdir(parents=True)
    (session / "results.json").write_text(json.dumps({"kind": "ddpdoctor-trials", "trials": [trial]}))
    rows, notes = read_trials(tmp_path / "run")
    assert len(rows) == 1 and notes == [], notes


def test_folders_that_are_not_sessions_are_left_alone(tmp_path):
    for name in ("²", "٣", "1"):
        (tmp_path / "run.trials" / name).mkdir(parents=True)
    (tmp_path / "run.trials" / "1" / "results.json").write_text(json.dumps({"kind": "ddpdoctor-trials", "trials": []}))
    assert read_trials(tmp_path / "run") == ([], [])
