"""A step's observers (device memory, the series, the set-up checks, DDP's logging data, the host's load...) never
break the script's training: one that raises is recorded once in the rank file's ``capture_errors`` and the step
goes on. They run inside the script's ``optimizer.step()``, where any exception of ours was the script's."""

from __future__ import annotations

import json
from pathlib import Path

from torch.profiler import ProfilerAction

from ddpdoctor import rundir
from ddpdoctor.capture.config import CaptureConfig
from ddpdoctor.capture.session import Session


class Profiler:
    """Stands in for the session's torch.profiler.profile: never in a window."""

    current_action = ProfilerAction.NONE
    steps = 0

    def step(self) -> None:
        self.steps += 1


def test_an_observer_that_raises_leaves_the_steps_to_go_on(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    session = Session(CaptureConfig(out=str(out), quiet=True))
    session._prof = Profiler()

    def broken() -> None:
        raise KeyError("loader")

    session.setup.on_optimizer_step = broken  # an observer's bug on an unusual job
    for _ in range(3):
        session.step("optimizer")
    assert session.clock.iteration == 3 and session._prof.steps == 3
    failed = [e for e in session.capture_errors if e.startswith("set-up at a step failed")]
    assert failed == ["set-up at a step failed (step 1): KeyError: 'loader'"], session.capture_errors
    session.write_rank_file()
    assert failed[0] in json.loads(rundir.rank_file(out, 0).read_text())["capture_errors"]
