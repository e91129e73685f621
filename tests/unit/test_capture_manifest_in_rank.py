"""The manifest of an in-rank run (each rank started by a scheduler, no launcher and so no node files) assembles
itself from the rank files: exit status per rank, the job's exit code once every rank has ended."""

from __future__ import annotations

from ddpdoctor import rundir
from ddpdoctor.capture import manifest


def _rank(out, rank, status, exit_code, *, world_size=2):
    rundir.atomic_write_json(
        rundir.rank_file(out, rank),
        {
            "rank": rank,
            "world_size": world_size,
            "node_rank": 0,
            "local_rank": rank,
            "hostname": "node-a",
            "pid": 100 + rank,
            "status": status,
            "exit_code": exit_code,
            "error": None if exit_code in (0, None) else f"exit code {exit_code}",
            "steps": {"source": "optimizer", "count": 8, "profiled": [[3, 5]]},
            "trace_files": [],
            "started_at": 1000.0 + rank,
            "updated_at": 1010.0 + rank,
        },
    )


def _build(out):
    return manifest.build(out, mode="scheduler", command=["ddpdoctor", "trace"], config={}, launch="scheduler")


def test_partial_then_complete(tmp_path):
    _rank(tmp_path, 0, "ok", 0)
    partial = _build(tmp_path)
    assert partial["launch"] == "scheduler" and partial["world_size"] == 2 and partial["nodes"] == []
    assert partial["exit_code"] is None  # rank 1 has not written yet
    assert [r["status"] for r in partial["ranks"]] == ["ok", "failed"]
    assert partial["ranks"][1]["reason"].startswith("no data")

    _rank(tmp_path, 1, "running", None)
    running = _build(tmp_path)
    assert running["exit_code"] is None
    assert running["ranks"][1]["status"] == "running" and "still running" in running["ranks"][1]["reason"]

    _rank(tmp_path, 1, "ok", 0)
    done = _build(tmp_path)
    assert done["exit_code"] == 0 and [r["status"] for r in done["ranks"]] == ["ok", "ok"]
    assert done["started_at"] == 1000.0 and done["finished_at"] == 1011.0 and done["nnodes"] == 1


def test_failed_rank_sets_the_exit_code(tmp_path):
    _rank(tmp_path, 0, "ok", 0)
    _rank(tmp_path, 1, "failed", 3)
    built = _build(tmp_path)
    assert built["exit_code"] == 3
    assert built["ranks"][1]["status"] == "failed" and built["ranks"][1]["exit_code"] == 3


def test_rebuild_keeps_what_the_last_manifest_said(tmp_path):
    _rank(tmp_path, 0, "ok", 0)
    manifest.write(tmp_path, _build(tmp_path))
    _rank(tmp_path, 1, "ok", 0)
    rebuilt = manifest.rebuild(tmp_path)
    assert rebuilt["command"] == ["ddpdoctor", "trace"] and rebuilt["launch"] == "scheduler"
    assert rebuilt["exit_code"] == 0 and len(rebuilt["ranks"]) == 2


def test_a_trace_still_uncompressed_beside_its_gz_is_listed_once(tmp_path):
    """The rank file names ``X.json.gz`` before the rank removes ``X.json``: a manifest built in between lists the
    trace once (it listed both, and the traced Lightning job's rank 0 showed two trace files under load)."""
    (tmp_path / rundir.RANKS_DIR).mkdir()
    _rank(tmp_path, 0, "ok", 0, world_size=1)
    data = rundir.read_json(rundir.rank_file(tmp_path, 0))
    data["trace_files"] = ["rank0.1700000000000.pt.trace.json.gz"]
    rundir.atomic_write_json(rundir.rank_file(tmp_path, 0), data)
    (tmp_path / "rank0.1700000000000.pt.trace.json.gz").write_bytes(b"gz")
    (tmp_path / "rank0.1700000000000.pt.trace.json").write_text("{}")
    (tmp_path / "rank0.1700000000999.pt.trace.json").write_text("{}")  # a window the rank file never named
    built = _build(tmp_path)
    assert built["ranks"][0]["trace_files"] == [
        "rank0.1700000000000.pt.trace.json.gz",
        "rank0.1700000000999.pt.trace.json",
    ]


def test_a_window_the_jobs_end_cut_short_is_noted_and_a_whole_one_is_not(tmp_path):
    """--wait 1 --warmup 1 --active 5 profile steps 3-7; a job of 5 steps gets 3 of them (a larger --active would
    profile no more: the report says so, not "profile more steps (--active)")."""
    _rank(tmp_path, 0, "ok", 0)
    _rank(tmp_path, 1, "ok", 0)
    config = {"wait": 1, "warmup": 1, "active": 5, "repeat": 1}
    built = manifest.build(
        tmp_path, mode="scheduler", command=["ddpdoctor", "trace"], config=config, launch="scheduler"
    )
    (note,) = [n for n in built["notes"] if n.startswith(manifest.WINDOW_CUT)]
    assert "(steps 3-7), after 8 steps: 3 of its 5 steps were profiled" in note, note
    assert "(--wait 1 --warmup 1 skip the first 2)" in note, note
    whole = {**config, "active": 3}  # the window [3, 5] is all of --active 3
    built = manifest.build(tmp_path, mode="scheduler", command=["ddpdoctor", "trace"], config=whole, launch="scheduler")
    assert not [n for n in built["notes"] if n.startswith(manifest.WINDOW_CUT)], built["notes"]
