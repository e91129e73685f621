"""The files of a job's other process groups (``groups/``, issue 23 item 1): ``trace --force`` replaces them with
the run and refuses, deleting nothing, when one holds a file of the user's; the manifest names the training group
and where it is, and the launcher (only it, once every rank ended) moves it to the top level."""

from __future__ import annotations

import json
import socket

import pytest

from ddpdoctor import rundir, runfiles
from ddpdoctor.capture import manifest
from ddpdoctor.cli.trace_cmd import _prepare_out
from ddpdoctor.errors import UsageError


def _run_with_groups(out):
    (out / "ranks").mkdir(parents=True)
    (out / "manifest.json").write_text("{}")
    (out / "ranks" / "rank0.json").write_text("{}")
    (out / "rank0.1795974917739.pt.trace.json.gz").write_bytes(b"")
    group = out / "groups" / "group1"
    (group / "ranks").mkdir(parents=True)
    (out / "groups" / "group1.json").write_text("{}")
    (group / "ranks" / "rank0.json").write_text("{}")
    (group / "ranks" / "rank0.summary.json").write_text("{}")
    (group / "rank0.1795974917740.pt.trace.json.gz").write_bytes(b"")
    return out


def test_force_replaces_a_run_whose_job_had_several_process_groups(tmp_path):
    out = _run_with_groups(tmp_path / "run")
    _prepare_out(out, force=True, multi_node=False)
    assert not (out / "groups").exists() and not (out / "ranks" / "rank0.json").exists()


@pytest.mark.parametrize("foreign", ["groups/notes.txt", "groups/group1/ranks/mine.txt", "groups/group1/plot.png"])
def test_force_refuses_when_a_group_folder_holds_a_foreign_file(tmp_path, foreign):
    out = _run_with_groups(tmp_path / "run")
    (out / foreign).write_text("the user's")
    with pytest.raises(UsageError, match="not ddpdoctor's"):
        _prepare_out(out, force=True, multi_node=False)
    assert (out / foreign).read_text() == "the user's"
    assert (out / "groups" / "group1" / "ranks" / "rank0.json").exists()


def _rank(folder, rank, *, steps, ddp, pid, world_size=2, status="ok"):
    trace = f"rank{rank}.{1795974917000 + pid}.pt.trace.json.gz"
    (folder / trace).write_bytes(b"")
    runfiles.write_rank_capture(
        rundir.rank_file(folder, rank),
        {
            "rank": rank,
            "world_size": world_size,
            "pid": pid,
            "hostname": socket.gethostname(),
            "status": status,
            "steps": {
                "source": "optimizer" if steps else "none",
                "count": steps,
                "profiled": [[3, 5]] if steps else [],
            },
            "ddp": [{"module": "Linear"}] if ddp else [],
            "trace_files": [trace],
        },
    )


def _record(out, name, world_size=2):
    (out / "groups" / name / "ranks").mkdir(parents=True, exist_ok=True)
    rundir.atomic_write_json(
        rundir.group_record(out, name), {"name": name, "dir": f"groups/{name}", "world_size": world_size}
    )


def _eval_at_top_training_in_group1(out):
    (out / "ranks").mkdir(parents=True)
    for r in (0, 1):
        _rank(out, r, steps=0, ddp=False, pid=100 + r)  # an evaluation took the top level first
    _record(out, "group1")
    for r in (0, 1):
        _rank(out / "groups" / "group1", r, steps=25, ddp=True, pid=200 + r)


def test_an_in_rank_run_names_the_training_group_where_it_is(tmp_path):
    """No launcher to move files (each rank wrote the manifest): the manifest says which group is the training
    one and where it is, and the top level is left as it is."""
    out = tmp_path / "run"
    _eval_at_top_training_in_group1(out)
    man = manifest.build(out, mode="scheduler", command=["x"], config={}, launch="scheduler")
    assert [(g["dir"], g["training"], g["steps"]) for g in man["groups"]] == [
        (".", False, 0),
        ("groups/group1", True, 25),
    ]
    assert any("the training one, groups/group1/" in n for n in man["notes"])
    assert manifest.read_rank_files(out)[0]["pid"] == 100


def test_the_launcher_moves_the_training_group_to_the_top_level(tmp_path):
    out = tmp_path / "run"
    _eval_at_top_training_in_group1(out)
    node = {"node_rank": 0, "hostname": socket.gethostname(), "exit_code": 0, "expected_ranks": [0, 1]}
    (out / "nodes").mkdir()
    (out / "nodes" / "node0.json").write_text(json.dumps(node))
    man = manifest.build(out, mode="spawn", command=["x"], config={}, launch="spawn")
    top = manifest.read_rank_files(out)
    assert {d["pid"] for d in top.values()} == {200, 201}
    assert all((out / d["trace_files"][0]).is_file() for d in top.values())
    moved = manifest.read_rank_files(out / "groups" / "group2")
    assert {d["pid"] for d in moved.values()} == {100, 101}
    assert all((out / "groups" / "group2" / d["trace_files"][0]).is_file() for d in moved.values())
    assert not (out / "groups" / "group1").exists()
    assert [(g["dir"], g["training"]) for g in man["groups"]] == [(".", True), ("groups/group2", False)]
    assert man["groups"][0]["name"] == "group1" and [r["rank"] for r in man["ranks"]] == [0, 1]


def test_nothing_moves_while_a_rank_is_still_running(tmp_path):
    out = tmp_path / "run"
    _eval_at_top_training_in_group1(out)
    _rank(out / "groups" / "group1", 1, steps=25, ddp=True, pid=201, status="running")
    (out / "nodes").mkdir()
    (out / "nodes" / "node0.json").write_text(
        json.dumps({"node_rank": 0, "hostname": socket.gethostname(), "exit_code": 0})
    )
    manifest.build(out, mode="spawn", command=["x"], config={}, launch="spawn")
    assert {d["pid"] for d in manifest.read_rank_files(out).values()} == {100, 101}
