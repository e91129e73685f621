"""A real 2-rank gloo job, run now (not a recording): its dumps read and analysed as the launcher will."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import pytest

from ddpdoctor.flight import analyze, find_dumps, frame_text

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "flight"


def _make():
    spec = importlib.util.spec_from_file_location("flight_make", FIXTURES / "make.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fr_status(found) -> dict:  # noqa: ANN001
    """Each rank's Flight Recorder status per group and its last entries (seq, op, state)."""
    return {
        r: [
            (rec.pg_status, [(e.collective_seq_id, e.profiling_name, e.state) for e in rec.entries][-3:])
            for rec in d.flight_recorder
        ]
        for r, d in found.dumps.items()
    }


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_live_job_stuck_in_data_reading(tmp_path):
    rc = _make().make("data_stuck", _port(), tmp_path / "run")
    assert rc == 0
    found = find_dumps(tmp_path / "run")
    assert found.request == "hang1" and sorted(found.dumps) == [0, 1]
    v = analyze(found.dumps, world_size=2)
    # (what the dumps showed, when not a hang: a clean-clone suite of 2026-12-05 read "undecided" once)
    shown = (v.summary, v.notes, {r: (s.state, s.step, s.phase) for r, s in v.ranks.items()}, _fr_status(found))
    assert v.kind == "hang" and v.culprits == (1,) and v.waiting == (0,), shown
    assert frame_text(v.ranks[1].frames[0]).startswith("read_shard (job.py:")
    assert v.collective.op == "all_reduce" and v.ranks[0].state == "in_collective"
    # torch's own files of the same job give the same culprit once they are as old as a timeout
    torch_files = find_dumps(tmp_path / "run" / "torch")
    assert sorted(torch_files.dumps) == [0, 1]
    assert analyze(torch_files.dumps, world_size=None, hang_after_s=1).culprits == (1,)
