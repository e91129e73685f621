"""A script's own torch.profiler while a ddpdoctor session profiles the process: it records nothing, works as an
object (tables, exports, handlers) and touches neither the session's recording nor its trace's metadata
(capture/other_profiler.py). Real torch profilers, in this process."""

from __future__ import annotations

import json

import pytest
import torch
from torch.autograd import profiler as autograd_profiler
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
from torch.profiler import profiler as torch_profiler

from ddpdoctor.capture import other_profiler


def _work() -> None:
    a = torch.randn(32, 32)
    (a @ a).relu().sum()


@pytest.fixture
def session_profiler():
    ours = profile(activities=[ProfilerActivity.CPU])
    places: list[str] = []
    other_profiler.install(lambda p: p is ours or ours.profiler is p, places.append)
    try:
        ours.start()
        yield ours, places
    finally:
        other_profiler.uninstall()


def test_a_script_profiler_records_nothing_while_the_session_profiles(session_profiler, tmp_path):
    ours, places = session_profiler
    handler_dir = tmp_path / "tb"
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
        on_trace_ready=tensorboard_trace_handler(str(handler_dir)),
        profile_memory=True,
    ) as theirs:
        for _ in range(5):
            _work()
            theirs.step()
    with autograd_profiler.profile() as legacy:
        _work()
    legacy.export_chrome_trace(str(tmp_path / "legacy.json"))
    theirs.export_memory_timeline(str(tmp_path / "memory.html"))  # nothing recorded: nothing written, no error
    ours.stop()

    assert len(theirs.events()) == 0 and len(theirs.key_averages()) == 0
    assert len(legacy.key_averages()) == 0 and isinstance(legacy.key_averages().table(), str)
    written = list(handler_dir.iterdir()) + [tmp_path / "legacy.json"]
    assert len(written) == 2 and not (tmp_path / "memory.html").exists()
    for path in written:  # the handler's and the script's exports: valid traces without events, saying why
        data = json.loads(path.read_text())
        assert data["traceEvents"] == [] and "ddpdoctor trace" in data["otherData"]["ddpdoctor"]
    # the session recorded all along, the script's profilers' work included, and kept its own metadata
    names = [e.name for e in ours.events()]
    assert "aten::matmul" in names and "aten::relu" in names
    # and no step range of the script's profiler in it: each would be one more step analysed (Lightning's
    # profiler="pytorch" doubled them)
    assert not [n for n in names if n.startswith("ProfilerStep")], names  # (the session's own has no schedule here)
    ours.export_chrome_trace(str(tmp_path / "ours.json"))
    assert "profile_memory" not in json.loads((tmp_path / "ours.json").read_text())
    # where each started, in this file (torch.profiler makes a new one each cycle: the session reports each place
    # once)
    assert places and all(p.startswith("test_other_profiler.py:") for p in places)
    assert len(set(places)) == 2, places


def test_the_session_own_profiler_is_not_idled(session_profiler):
    ours, places = session_profiler
    ours.stop()
    ours.start()  # a new cycle: a new profile object, the session's own
    _work()
    ours.stop()
    assert places == [] and any(e.name == "aten::relu" for e in ours.events())


def test_uninstall_gives_torch_back_its_methods_and_profilers_record_again():
    originals = {
        name: autograd_profiler.profile.__dict__[name]
        for name in ("_prepare_trace", "_start_trace", "__exit__", "export_chrome_trace")
    }
    kineto_original = torch_profiler._KinetoProfile.__dict__["add_metadata_json"]
    other_profiler.install(lambda p: False, lambda where: None)
    assert autograd_profiler.profile.__dict__["_prepare_trace"] is not originals["_prepare_trace"]
    other_profiler.uninstall()
    assert {name: autograd_profiler.profile.__dict__[name] for name in originals} == originals
    assert torch_profiler._KinetoProfile.__dict__["add_metadata_json"] is kineto_original
    with profile(activities=[ProfilerActivity.CPU]) as theirs:
        _work()
    assert any(e.name == "aten::relu" for e in theirs.events())


PREPARED_BEFORE = """
import torch
from torch.profiler import ProfilerActivity, profile, schedule
from ddpdoctor.capture import other_profiler

def work():
    a = torch.randn(32, 32)
    (a @ a).relu().sum()

theirs = profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=2, repeat=1))
theirs.start()  # in its warm-up: prepared before the session began (a rank's session starts at its process group)
ours = profile(activities=[ProfilerActivity.CPU])
places = []
other_profiler.install(lambda p: p is ours or ours.profiler is p, places.append)
ours.start()
for _ in range(4):
    work()
    theirs.step()
theirs.stop()
ours.stop()
other_profiler.uninstall()
print(len(theirs.events()), len(places), any(e.name == "aten::relu" for e in ours.events()))
"""


def test_a_script_profiler_prepared_before_the_session_stands_aside_when_it_starts_recording():
    """mp.spawn ranks whose worker profiles from before init_process_group: their profiler was prepared before the
    rank's session began, and started recording over the session's without a word (its tables empty)."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", PREPARED_BEFORE], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["0", "1", "True"], run.stdout
