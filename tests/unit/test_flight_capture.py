"""The pieces of a rank's dump (capture/flight.py) that need no job: stacks, torch's entries as a dump lists them,
requests that are not well formed."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import msgspec

from ddpdoctor.capture import flight
from ddpdoctor.runfile_types import FlightEntry


def test_the_dumping_thread_lists_the_callers_frames_not_ddpdoctors():
    def user_code():
        return flight.thread_stacks()

    main = user_code()[0]
    assert main["main"] and main["ident"] == threading.get_ident()
    assert main["frames"][-1]["name"] == "user_code"  # thread_stacks itself is left out
    assert main["frames"][-1]["file"].endswith("test_flight_capture.py")


def test_torchs_entries_are_listed_with_frames_outermost_first_and_no_zero_times():
    raw = {
        "collective_seq_id": 4,
        "profiling_name": "gloo:all_reduce",
        "state": "scheduled",
        "retired": False,
        "input_sizes": [[4]],
        "input_dtypes": ["Float"],
        "time_discovered_started_ns": 0,
        "time_discovered_completed_ns": None,
        "thread_id": "1403",  # a field of torch's that the dump leaves out
        "frames": [
            {"name": "all_reduce", "filename": "/torch/distributed/distributed_c10d.py", "line": 2800},
            {"name": "main", "filename": "/job/train.py", "line": 14},
            {"name": "<module>", "filename": "/job/train.py", "line": 30},
        ],
    }
    entry = msgspec.convert(flight._entry(raw), FlightEntry)
    assert [f.name for f in entry.frames] == ["<module>", "main", "all_reduce"]
    assert entry.time_discovered_started_ns is None and entry.collective_seq_id == 4
    assert "thread_id" not in flight._entry(raw)


def test_a_request_without_a_valid_id_is_ignored_with_one_line(tmp_path, capsys):
    session = SimpleNamespace(out=tmp_path, root=tmp_path, rank=3, claimed=True)
    dumper = flight.Dumper(session)  # type: ignore[arg-type]
    path = flight.request_path(tmp_path)
    path.parent.mkdir()
    for body in ('{"id": "../../etc/x", "reason": "hang"}', "not json", '["id"]'):
        path.write_text(body)
        assert dumper._read_request(path) is None
    err = capsys.readouterr().err
    assert err.count("ddpdoctor: warning: rank 3:") == 3 and "Traceback" not in err
    path.write_text(json.dumps({"id": "abc-1", "reason": "something else"}))
    assert dumper._read_request(path) == {"id": "abc-1", "reason": "on_demand"}
