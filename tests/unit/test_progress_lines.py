"""What ddpdoctor says while long work runs (issue 27, "while it runs"): after a traced job's window is written,
that the job runs on and that `diagnose` works on what was written; `try` numbers its trials and says when each
ended; `diagnose` shows trace loading on stderr only once it takes more than a couple of seconds. And a run
directory's own record folders are not offered as "folders with traces"."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from ddpdoctor.capture import progress
from ddpdoctor.cli.diagnose_cmd import Progress
from ddpdoctor.errors import TraceError


def _config(**kw):
    base = dict(repeat=1, max_steps=None)
    return SimpleNamespace(**{**base, **kw})


def test_after_the_last_window_the_job_runs_on_and_diagnose_works():
    text = progress.next_text(_config(), windows_written=1, iteration=13, out="/runs/x")
    assert text is not None
    assert "runs on to its own end, not profiled" in text and "Ctrl-C stops it" in text and "--max-steps N" in text
    assert "`ddpdoctor diagnose /runs/x` works on what is written now" in text


def test_max_steps_names_the_step_the_job_ends_at():
    text = progress.next_text(_config(max_steps=40), windows_written=1, iteration=13, out="o")
    assert text is not None and "runs on to step 40 (--max-steps)" in text and "Ctrl-C" not in text


def test_nothing_when_max_steps_ends_the_job_at_this_window():
    assert progress.next_text(_config(max_steps=13), windows_written=1, iteration=13, out="o") is None


def test_more_windows_to_come_is_said_once():
    for repeat in (0, 3):  # until the end (--every), or 3 windows
        first = progress.next_text(_config(repeat=repeat), windows_written=1, iteration=13, out="o")
        assert first is not None and "more windows to come" in first and "diagnose o" in first
        assert progress.next_text(_config(repeat=repeat), windows_written=2, iteration=20, out="o") is None
    last = progress.next_text(_config(repeat=3), windows_written=3, iteration=30, out="o")
    assert last is not None and "runs on to its own end" in last


def _trial_run(settings, out: Path, *, ok: bool = True):
    from ddpdoctor.trial.execute import TrialRun

    out.mkdir(parents=True, exist_ok=True)
    return TrialRun(settings, out, out.with_suffix(".log"), 0 if ok else 1, 12.4, None if ok else "the job failed")


def test_try_numbers_its_trials_and_says_when_each_ended(tmp_path, monkeypatch):
    import ddpdoctor.trial as trial

    calls = []

    def fake_run(cmd, folder, settings, *, max_steps, timeout_s, label=None):
        calls.append(settings)
        name = label or ("control" if not settings else "-".join(f"{k}={v}" for k, v in settings.items()))
        return _trial_run(settings, folder / name, ok=settings != {"ddp.bucket_cap_mb": "100"})

    monkeypatch.setattr(trial, "run_trial", fake_run)
    monkeypatch.setattr(trial.measure_mod, "read", lambda out, rules: (None, None))
    monkeypatch.setattr(trial.measure_mod, "measure", lambda controls, b, foreign, spawns_processes: None)
    said: list[str] = []
    cmd = SimpleNamespace(run=tmp_path / "run")
    settings = [{"ddp.bucket_cap_mb": "50"}, {"ddp.bucket_cap_mb": "100"}]
    monkeypatch.setattr(trial.Session, "to_json", lambda self: {})
    trial.run_session(cmd, tmp_path, settings, max_steps=20, timeout_s=60, rules=None, progress=said.append)
    assert len(calls) == 4
    assert said == [
        "control, before the trials: 20 steps, no knob (2 trial(s) and a second control follow)",
        "control: done in 12 s",
        "trial 1/2: ddp.bucket_cap_mb=50, 20 steps",
        "trial 1/2: done in 12 s",
        "trial 2/2: ddp.bucket_cap_mb=100, 20 steps",
        "trial 2/2: done in 12 s, failed: the job failed",
        "control, after the trials (load that changed meanwhile shows as a drift between the two controls)",
        "control, after the trials: done in 12 s",
    ]
    assert json.loads((tmp_path / "results.json").read_text()) == {}


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_diagnose_progress_is_silent_for_quick_loads():
    stream, clock = io.StringIO(), _Clock()
    p = Progress(stream, tty=False, clock=clock)
    for done in range(1, 9):
        clock.now += 0.2
        p(done, 8, f"rank{done}")
    assert stream.getvalue() == ""


def test_diagnose_progress_of_a_small_run_stays_off_a_log():
    stream, clock = io.StringIO(), _Clock()
    p = Progress(stream, tty=False, clock=clock)
    for done in range(1, 3):  # 2 ranks, 10 s each (a loaded machine)
        clock.now += 10
        p(done, 2, f"rank{done - 1}")
    assert stream.getvalue() == ""


def test_diagnose_progress_after_two_seconds_in_a_log():
    stream, clock = io.StringIO(), _Clock()
    p = Progress(stream, tty=False, clock=clock)
    for done in range(1, 41):  # 40 ranks, 0.25 s each: 10 s
        clock.now += 0.25
        p(done, 40, f"rank{done - 1}")
    assert stream.getvalue().splitlines() == [  # one line every 5 s, not one per rank
        "ddpdoctor: loading traces: 8/40 rank(s) after 2 s (last: rank7)",
        "ddpdoctor: loading traces: 28/40 rank(s) after 7 s (last: rank27)",
        "ddpdoctor: loaded the traces of 40 rank(s) in 10 s; analysing",
    ]
    assert "\r" not in stream.getvalue()


def test_diagnose_progress_at_a_terminal_is_redrawn_and_cleared():
    stream, clock = io.StringIO(), _Clock()
    p = Progress(stream, tty=True, clock=clock)
    for done in range(1, 6):
        clock.now += 1.0
        p(done, 5, f"rank{done - 1}")
    text = stream.getvalue()
    assert "\n" not in text and text.startswith("\rloading traces: 2/5 rank1")
    assert text.endswith("\r" + " " * 70 + "\r")  # nothing left on the line after the load


def test_run_records_are_not_folders_with_traces(tmp_path):
    from ddpdoctor.load.discover import trace_files

    run = tmp_path / "run"
    for folder, name in (("nodes", "node0.json"), ("ranks", "rank0.json"), ("dumps", "rank0.exit-1.json")):
        (run / folder).mkdir(parents=True)
        (run / folder / name).write_text("{}")
    with pytest.raises(TraceError) as info:
        trace_files(run)
    assert str(info.value) == f"{run}: no trace files (*.pt.trace.json[.gz], *.json[.gz]) in this folder"
    (run / "traces").mkdir()
    (run / "traces" / "rank0.1.pt.trace.json.gz").write_bytes(b"")
    with pytest.raises(TraceError, match="folders below it with traces: traces$"):
        trace_files(run)
