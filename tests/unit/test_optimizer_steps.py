"""A trace whose profiler was never stepped (one ``with torch.profiler.profile():`` around the loop, then
``export_chrome_trace``): its steps are told by the optimizer's ``Optimizer.step#<class>.step`` ranges
(``load.frames._optimizer_steps``), not the whole window analysed as one step.

Every trace here is recorded for real, by a plain profiler around a small training loop on CPU.
"""

from __future__ import annotations

import json
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from ddpdoctor.load import load
from ddpdoctor.metrics import analyze

ITERATIONS = 6


def _net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))


def _iteration(model: torch.nn.Module, *optimizers: torch.optim.Optimizer) -> None:
    for opt in optimizers:
        opt.zero_grad()
    model(torch.randn(16, 32)).pow(2).mean().backward()
    for opt in optimizers:
        opt.step()


def _record(path: Path, body: Any, stepped: bool = False, all_threads: bool = False) -> Path:
    """``body(prof)`` under one plain profiler, exported as ``path`` (a chrome trace). ``stepped``: with a schedule,
    whose ``prof.step()`` marks ProfilerStep#N (without one, torch marks no step)."""
    torch.manual_seed(0)
    kwargs: dict[str, Any] = {}
    if stepped:
        kwargs["schedule"] = torch.profiler.schedule(wait=0, warmup=1, active=ITERATIONS - 1, repeat=1)
    if all_threads:
        kwargs["experimental_config"] = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    with torch.profiler.profile(**kwargs) as prof:
        body(prof)
    if not stepped:
        prof.export_chrome_trace(str(path))
    return path


def _events(path: Path, name: str) -> list[dict[str, Any]]:
    events = json.loads(path.read_text())["traceEvents"]
    return sorted((e for e in events if e.get("name") == name and e.get("ph") == "X"), key=lambda e: e["ts"])


def _plain_loop(prof: Any) -> None:
    """The loop, calling ``prof.step()`` after each optimizer step (which marks nothing without a schedule)."""
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(ITERATIONS):
        _iteration(model, opt)
        prof.step()


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _record(tmp_path_factory.mktemp("plain") / "trace.json", _plain_loop)


def test_the_steps_run_from_one_optimizer_steps_end_to_the_next(plain: Path) -> None:
    run = load(plain)
    steps = run.ranks[0].tables.steps
    ends = [e["ts"] + e["dur"] for e in _events(plain, "Optimizer.step#SGD.step")]
    assert len(ends) == ITERATIONS
    assert steps["step"].tolist() == list(range(1, ITERATIONS))
    # contiguous, each from an optimizer step's end to the next one's (µs, as the trace states them)
    assert steps["ts_us"].tolist() == pytest.approx(ends[:-1], abs=1e-3)
    assert steps["end_us"].tolist() == pytest.approx(ends[1:], abs=1e-3)
    metrics = analyze(run)
    assert metrics.ranks[0]["steps_analyzed"] == ITERATIONS - 1
    step_ms = [(b - a) / 1e3 for a, b in zip(ends[:-1], ends[1:], strict=True)]
    assert metrics.ranks[0]["step_ms_mean"] == pytest.approx(sum(step_ms) / len(step_ms), rel=1e-6)
    notes = " ".join(run.notes)
    assert "each step is taken from the end of one optimizer step" in notes
    assert "analysed as one step" not in notes


def test_profiler_steps_win_over_the_optimizers(tmp_path: Path) -> None:
    folder = tmp_path / "stepped"

    def stepped(prof: Any) -> None:
        prof.on_trace_ready = torch.profiler.tensorboard_trace_handler(str(folder))
        _plain_loop(prof)

    _record(tmp_path / "unused.json", stepped, stepped=True)
    run = load(folder)
    assert len(run.ranks[0].tables.steps) >= ITERATIONS - 1
    steps = run.ranks[0].tables.steps
    assert all(str(n).startswith("ProfilerStep#") for n in steps["name"].tolist())
    assert "optimizer step" not in " ".join(run.notes)


def test_one_optimizer_step_leaves_the_window_one_step(tmp_path: Path) -> None:
    def once(prof: Any) -> None:
        model = _net()
        _iteration(model, torch.optim.SGD(model.parameters(), lr=0.01))

    run = load(_record(tmp_path / "once.json", once))
    assert len(run.ranks[0].tables.steps) == 0
    assert "analysed as one step" in " ".join(run.notes)
    assert analyze(run).ranks[0]["steps_analyzed"] == 1


class _Wrapper(torch.optim.Optimizer):
    """An optimizer that steps another (a ZeroRedundancyOptimizer, a Lookahead): two ranges, one nested."""

    def __init__(self, inner: torch.optim.Optimizer) -> None:
        self.inner = inner
        super().__init__(inner.param_groups, {})

    def step(self, closure: Any = None) -> None:
        self.inner.step()


def test_a_wrapped_optimizer_counts_once(tmp_path: Path) -> None:
    def wrapped(prof: Any) -> None:
        model = _net()
        opt = _Wrapper(torch.optim.SGD(model.parameters(), lr=0.01))
        for _ in range(ITERATIONS):
            _iteration(model, opt)

    path = _record(tmp_path / "wrapped.json", wrapped)
    assert len(_events(path, "Optimizer.step#SGD.step")) == ITERATIONS  # the inner ones are recorded too
    steps = load(path).ranks[0].tables.steps
    assert len(steps) == ITERATIONS - 1
    assert set(map(str, steps["name"].tolist())) == {"Optimizer.step#_Wrapper.step"}


def test_a_second_optimizer_in_the_same_iteration_stays_inside_the_steps(tmp_path: Path) -> None:
    """A dense and a sparse optimizer (or any two classes) stepping every iteration: one step an iteration."""

    def two(prof: Any) -> None:
        model = _net()
        first, second = list(model.parameters())[:2], list(model.parameters())[2:]
        adam, sgd = torch.optim.Adam(first, lr=1e-3), torch.optim.SGD(second, lr=0.01)
        for _ in range(ITERATIONS):
            _iteration(model, adam, sgd)

    steps = load(_record(tmp_path / "two.json", two)).ranks[0].tables.steps
    assert len(steps) == ITERATIONS - 1
    assert set(map(str, steps["name"].tolist())) == {"Optimizer.step#Adam.step"}


def test_the_training_threads_optimizer_not_a_helpers(tmp_path: Path) -> None:
    """A helper thread stepping an optimizer of its own once (a probe) does not cut the loop's steps."""

    def helper(prof: Any) -> None:
        model = _net()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        probe = _net()
        other = threading.Thread(target=_iteration, args=(probe, torch.optim.SGD(probe.parameters(), lr=0.1)))
        for i in range(ITERATIONS):
            _iteration(model, opt)
            if i == 2:
                other.start()
                other.join()

    path = _record(tmp_path / "helper.json", helper, all_threads=True)
    assert len(_events(path, "Optimizer.step#SGD.step")) == ITERATIONS + 1
    steps = load(path).ranks[0].tables.steps
    assert len(steps) == ITERATIONS - 1
    assert len(set(steps["tid"].tolist())) == 1


def test_summarised_ranks_keep_the_note(plain: Path) -> None:
    run = load(plain, summarize=True)
    assert run.ranks[0].tables is None and run.ranks[0].facts is not None
    assert run.ranks[0].facts.optimizer_steps
    assert "each step is taken from the end of one optimizer step" in " ".join(run.notes)


def test_a_scheduled_profiler_never_stepped_has_only_step_zero(tmp_path: Path) -> None:
    """With a schedule but no prof.step(), torch marks ProfilerStep#0 over the whole recording: no step either."""
    path = tmp_path / "unstepped.json"

    def unstepped(prof: Any) -> None:
        model = _net()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(ITERATIONS):
            _iteration(model, opt)

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Profiler won't be using warmup": recording from the start needs none
        schedule = torch.profiler.schedule(wait=0, warmup=0, active=1)
    with torch.profiler.profile(schedule=schedule) as prof:
        unstepped(prof)
    prof.export_chrome_trace(str(path))
    assert [e["name"] for e in json.loads(path.read_text())["traceEvents"] if "ProfilerStep" in e.get("name", "")] == [
        "ProfilerStep#0"
    ]
    run = load(path)
    assert len(run.ranks[0].tables.steps) == ITERATIONS - 1
    assert "each step is taken from the end of one optimizer step" in " ".join(run.notes)


def test_each_span_has_its_training_thread(tmp_path: Path) -> None:
    """Two recordings of one rank whose loops ran on different threads (a restarted process, a loop in a thread):
    each span's steps come from its own thread, none is left out."""
    first = _record(tmp_path / "a.json", _plain_loop)
    other = threading.Thread(target=_record, args=(tmp_path / "b.json", _plain_loop))
    other.start()
    other.join()
    tids = [{e["tid"] for e in _events(p, "Optimizer.step#SGD.step")} for p in (first, tmp_path / "b.json")]
    assert len(tids[0]) == len(tids[1]) == 1 and tids[0] != tids[1]
    folder = tmp_path / "rank"
    folder.mkdir()
    for n, path in enumerate((first, tmp_path / "b.json")):
        (folder / f"worker0.{n + 1}.pt.trace.json").write_text(path.read_text())
    run = load(folder)
    assert len(run.ranks) == 1 and len(run.ranks[0].files) == 2
    steps = run.ranks[0].tables.steps
    assert len(steps) == 2 * (ITERATIONS - 1)
    assert len(set(steps["span"].tolist())) == 2 and len(set(steps["tid"].tolist())) == 2


# A profiler stepped, but not once an iteration: the steps are the profiler's, and a note says what each one holds.


def _stepped_run(tmp_path: Path, every: int = 1, per_iteration: int = 1, iterations: int = 12, **kw: Any) -> Path:
    """A real trace of a scheduled profiler whose ``prof.step()`` is called ``per_iteration`` times an iteration
    (once after the backward, once after the optimizer when 2), or once every ``every`` iterations."""
    folder = tmp_path / f"every{every}-per{per_iteration}"
    torch.manual_seed(0)
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    optimizers = [opt, *kw.get("more", ())]
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=8, repeat=1)
    with torch.profiler.profile(
        schedule=schedule, on_trace_ready=torch.profiler.tensorboard_trace_handler(str(folder))
    ) as prof:
        for i in range(iterations):
            for o in optimizers:
                o.zero_grad()
            model(torch.randn(16, 32)).pow(2).mean().backward()
            if per_iteration == 2:
                prof.step()
            for o in optimizers:
                o.step()
            if (i + 1) % every == 0:
                prof.step()
    return folder


def _step_notes(run: Any) -> list[str]:
    return [n for n in run.notes if "ProfilerStep#N" in n and "optimizer step" in n]


def test_a_profiler_stepped_every_second_iteration_is_noted(tmp_path: Path) -> None:
    folder = _stepped_run(tmp_path, every=2, iterations=20)
    run = load(folder)
    assert all(str(n).startswith("ProfilerStep#") for n in run.ranks[0].tables.steps["name"].tolist())
    (note,) = _step_notes(run)
    assert "each ProfilerStep#N holds about 2 optimizer steps" in note
    assert "covers 2 of them" in note
    summarised = load(folder, summarize=True)  # the facts kept in place of the tables say the same
    assert summarised.ranks[0].tables is None
    assert _step_notes(summarised) == [note]


def test_a_profiler_stepped_twice_an_iteration_is_noted(tmp_path: Path) -> None:
    (note,) = _step_notes(load(_stepped_run(tmp_path, per_iteration=2)))
    assert "about 2 ProfilerStep#N ranges to one optimizer step" in note
    assert "call prof.step() once, after optimizer.step()" in note


def test_a_profiler_stepped_once_an_iteration_has_no_such_note(tmp_path: Path) -> None:
    run = load(_stepped_run(tmp_path))
    assert len(run.ranks[0].tables.steps) >= 7
    assert _step_notes(run) == []


def test_two_optimizer_classes_stepping_each_iteration_are_one_step(tmp_path: Path) -> None:
    """An Adam beside the SGD, both stepping every iteration: one optimizer step an iteration (the first class's)."""
    extra = torch.optim.Adam([torch.nn.Parameter(torch.zeros(3))], lr=1e-3)
    run = load(_stepped_run(tmp_path, more=[extra]))
    assert _step_notes(run) == []


def test_a_job_without_an_optimizer_has_no_such_note(tmp_path: Path) -> None:
    folder = tmp_path / "manual"
    torch.manual_seed(0)
    model = _net()
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=4, repeat=1)
    with torch.profiler.profile(
        schedule=schedule, on_trace_ready=torch.profiler.tensorboard_trace_handler(str(folder))
    ) as prof:
        for _ in range(6):
            model.zero_grad()
            model(torch.randn(16, 32)).pow(2).mean().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.01 * p.grad
            prof.step()
    run = load(folder)
    assert len(run.ranks[0].tables.steps) >= 4
    assert _step_notes(run) == []


def test_ranks_ddpdoctor_recorded_have_no_such_note(tmp_path: Path) -> None:
    """``ddpdoctor trace`` marks one step an iteration itself; its ranks are not second-guessed."""
    from ddpdoctor.load.consistency import optimizer_steps_per_step_by_rank, run_notes

    run = load(_stepped_run(tmp_path, every=2, iterations=20))
    assert _step_notes(run)
    per_step, _ = optimizer_steps_per_step_by_rank(run.ranks, frozenset({0}))
    assert [n for n in run_notes(run.ranks, 1, "distributedInfo", per_step) if "ProfilerStep#N" in n] == []


# Recordings of one rank that number the same steps again (a second profiler, a restarted job, or two runs' traces
# in one folder) are analysed together, and a note says so.


def _repeated_note(run: Any) -> list[str]:
    return [n for n in run.notes if "more than once (each profiler counts its steps from 0)" in n]


def test_two_profilers_into_one_folder_are_noted(tmp_path: Path) -> None:
    """Run twice into one ``tensorboard_trace_handler`` folder (as a job run again with the same log folder)."""
    first = _stepped_run(tmp_path / "a")
    second = _stepped_run(tmp_path / "b")
    folder = tmp_path / "both"
    folder.mkdir()
    for n, path in enumerate([*first.iterdir(), *second.iterdir()]):
        (folder / f"worker0.{n + 1}.pt.trace.json").write_bytes(path.read_bytes())
    run = load(folder)
    assert len(run.ranks) == 1 and len(set(run.ranks[0].tables.steps["span"].tolist())) == 2
    (note,) = _repeated_note(run)
    assert note.startswith("rank(s) 0: recorded ProfilerStep#1-8 more than once")
    assert "put each run's traces in a folder of its own" in note
    assert _repeated_note(load(folder, summarize=True)) == [note]


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events")  # torch's, on a schedule that repeats
def test_the_windows_of_one_repeating_schedule_are_not_noted(tmp_path: Path) -> None:
    """``schedule(repeat=2)``: two recordings of one profiler, whose step numbers go on."""
    folder = tmp_path / "repeat"
    torch.manual_seed(0)
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=2)
    with torch.profiler.profile(
        schedule=schedule, on_trace_ready=torch.profiler.tensorboard_trace_handler(str(folder))
    ) as prof:
        for _ in range(12):
            _iteration(model, opt)
            prof.step()
    run = load(folder)
    assert len(set(run.ranks[0].tables.steps["span"].tolist())) == 2
    assert _repeated_note(run) == []


def test_compare_reads_the_work_per_step_of_plain_traces(tmp_path: Path) -> None:
    """``compare``'s snapshot of a plain trace carries its optimizer steps per step; the analysis has it too."""
    from ddpdoctor.compare.inputs import read_input

    every2 = _stepped_run(tmp_path / "a", every=2, iterations=20)
    once = _stepped_run(tmp_path / "b")
    assert analyze(load(every2)).run["optimizer_steps_per_step"] == pytest.approx(2.0)
    assert read_input(str(every2)).environment["optimizer_steps_per_step"] == pytest.approx(2.0)
    assert read_input(str(once)).environment["optimizer_steps_per_step"] == pytest.approx(1.0)


def _scaled_run(folder: Path, every: int) -> Path:
    """A GradScaler loop whose gradients overflow in iterations 2-6 (it skips ``optimizer.step()`` there, as the
    first iterations of an fp16 job often do), ``prof.step()`` every ``every`` iterations."""
    torch.manual_seed(0)
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=8, repeat=1)
    with torch.profiler.profile(
        schedule=schedule, on_trace_ready=torch.profiler.tensorboard_trace_handler(str(folder))
    ) as prof:
        for i in range(10 * every):
            opt.zero_grad()
            loss = model(torch.randn(16, 32)).pow(2).mean()
            scaler.scale(loss * float("inf") if 2 * every <= i < 7 * every else loss).backward()
            scaler.step(opt)
            scaler.update()
            if (i + 1) % every == 0:
                prof.step()
    return folder


def test_iterations_a_grad_scaler_skipped_still_count(tmp_path: Path) -> None:
    """Most profiled iterations skipped their optimizer step: still one iteration a step, and no note says
    otherwise (the scaler's updates count them)."""
    folder = _scaled_run(tmp_path / "scaled", every=1)
    events = [e["name"] for p in folder.iterdir() for e in json.loads(p.read_text())["traceEvents"]]
    assert events.count("Optimizer.step#SGD.step") < events.count("aten::_amp_update_scale_") == 8
    run = load(folder)
    assert _step_notes(run) == []
    assert analyze(run).run["optimizer_steps_per_step"] == pytest.approx(1.0)
    twice = load(_scaled_run(tmp_path / "scaled2", every=2))  # two iterations a step, some skipped: still 2
    assert analyze(twice).run["optimizer_steps_per_step"] == pytest.approx(2.0)
    assert "holds about 2 optimizer steps" in " ".join(_step_notes(twice))


def test_a_never_stepped_profiler_counts_the_iterations_a_grad_scaler_skipped(tmp_path: Path) -> None:
    """No ProfilerStep, and a GradScaler that skipped the optimizer in 3 of 8 iterations: the steps run from one
    scale update to the next (one an iteration), not from one optimizer step to the next (which would merge the
    skipped iterations into their neighbours' steps)."""

    def scaled(prof: Any) -> None:
        model = _net()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = torch.amp.GradScaler("cpu")
        for i in range(8):
            opt.zero_grad()
            loss = model(torch.randn(16, 32)).pow(2).mean()
            scaler.scale(loss * float("inf") if i in (2, 3, 4) else loss).backward()
            scaler.step(opt)
            scaler.update()

    path = _record(tmp_path / "scaled.json", scaled)
    assert len(_events(path, "Optimizer.step#SGD.step")) == 5
    updates = [e["ts"] + e["dur"] for e in _events(path, "aten::_amp_update_scale_")]
    assert len(updates) == 8
    run = load(path)
    steps = run.ranks[0].tables.steps
    assert steps["end_us"].tolist() == pytest.approx(updates[1:], abs=1e-3)
    assert "of one GradScaler update to the next" in " ".join(run.notes)
    assert analyze(run).ranks[0]["steps_analyzed"] >= 5


def test_a_grad_scaler_that_skipped_nothing_leaves_the_optimizers_steps(tmp_path: Path) -> None:
    def scaled(prof: Any) -> None:
        model = _net()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = torch.amp.GradScaler("cpu")
        for _ in range(ITERATIONS):
            opt.zero_grad()
            scaler.scale(model(torch.randn(16, 32)).pow(2).mean()).backward()
            scaler.step(opt)
            scaler.update()

    steps = load(_record(tmp_path / "clean.json", scaled)).ranks[0].tables.steps
    assert len(steps) == ITERATIONS - 1
    assert set(map(str, steps["name"].tolist())) == {"Optimizer.step#SGD.step"}
