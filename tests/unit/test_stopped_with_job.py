"""A job stopped from outside (Ctrl-C, `kill`, a scheduler's time limit) while a rank was stuck in a call that never
returns to Python: torchrun passes the SIGTERM on, the rank cannot act on it, and torchrun kills it. The rank leaves
its files unfinished, as a rank the OOM killer ended would, but it did not die of something of its own: its
launcher's exit status (ended by SIGTERM) says the job was stopped. Found on a PowerSGD job that hangs under gloo,
stopped by `timeout`: the report said "rank-died: killed (SIGKILL, the OOM killer)".

The other side: torchrun ends by the signal only when no rank failed before it (a rank's death ends torchrun with
a failure of its own, exit code 1), so a rank that died while the launcher failed is still rank-died."""

from __future__ import annotations

import pytest

from ddpdoctor import rundir
from ddpdoctor.capture import manifest as manifest_mod
from ddpdoctor.diagnosis import evaluate, load_rules
from ddpdoctor.flight.verdict import CollectiveRef, HealthVerdict, RankState
from ddpdoctor.liveness import stop_signal, stopped_with_job, stopped_with_job_signal
from ddpdoctor.metrics.health import health_metrics
from ddpdoctor.metrics.result import RunMetrics
from ddpdoctor.runfile_types import Frame
from ddpdoctor.table import Table

KILLED = "the rank process died without finishing (killed, or stopped by torchrun)"
HEALTH_RULES = {"rank-crashed", "job-failed-at-startup", "collective-hang", "collective-mismatch", "rank-died"}


def _manifest(node_exit: int, statuses=("failed", "failed"), reasons=(KILLED, KILLED)) -> dict:
    return {
        "world_size": len(statuses),
        "exit_code": node_exit,
        "nodes": [{"node_rank": 0, "exit_code": node_exit, "expected_ranks": list(range(len(statuses)))}],
        "ranks": [
            {"rank": r, "status": s, "reason": why, "steps": 3, "node_rank": 0}
            for r, (s, why) in enumerate(zip(statuses, reasons, strict=True))
        ],
    }


def _findings(manifest: dict, verdict=None):
    health, doc = health_metrics(manifest, {}, verdict)
    run = {"mode": "ddp", "world_size": manifest["world_size"], "backend": "gloo", "steps_analyzed": 0, **health}
    if doc is not None:
        run["health"] = doc
    ranks = [{"rank": e["rank"]} for e in manifest["ranks"]]
    metrics = RunMetrics(run=run, ranks=ranks, per_step=Table(), collectives=Table(), devices=Table())
    diagnosis = evaluate(load_rules(), metrics)
    return health, doc, [f.name for f in diagnosis.findings if f.name in HEALTH_RULES]


def _stuck_in_all_reduce() -> HealthVerdict:
    """Every rank's dump: inside all_reduce #31, issued alike (the verdict names no cause)."""
    coll = CollectiveRef("default_pg", 31, "all_reduce", "gloo", ((1024,),), ("Float",), Frame("/job.py", 45, "m"))
    states = {
        r: RankState(r, "in_collective", 3, "backward", 300.0, coll, (Frame("/job.py", 45, "m"),), None) for r in (0, 1)
    }
    summary = "every rank waits in all_reduce #31 (default_pg) [1024] Float, which they all issued alike"
    return HealthVerdict("undecided", (), (0, 1), coll, (), states, summary)


@pytest.mark.parametrize(
    "code, name", [(-15, "SIGTERM"), (-2, "SIGINT"), (-1, "SIGHUP"), (143, "SIGTERM"), (130, "SIGINT")]
)
def test_a_stop_signal_in_the_exit_status(code, name):
    assert stop_signal(code) == name


@pytest.mark.parametrize("code", [0, 1, 2, 124, 137, -9, -11, -6, 139, None, True, "-15"])
def test_other_exit_statuses_are_no_stop(code):
    assert stop_signal(code) is None  # SIGKILL, SIGSEGV, SIGABRT: a death, not a stop; 1: a rank failed


def test_the_reason_names_its_signal_and_nothing_else_is_read_as_one():
    assert stopped_with_job_signal(stopped_with_job("SIGTERM")) == "SIGTERM"
    assert stopped_with_job_signal(KILLED) is None
    assert stopped_with_job_signal("terminated by signal 15") is None


def test_ranks_that_ended_unfinished_when_the_launcher_was_stopped_are_no_death():
    health, doc, findings = _findings(_manifest(-15), _stuck_in_all_reduce())
    assert findings == [] and not health["rank_died"] and not health["job_failed"]
    note = next(n for n in doc["notes"] if "stopped" in n)
    assert note.startswith("ranks 0, 1 stopped with the job by SIGTERM (interrupted), not by a failure of their own")
    assert "their dumps: every rank waits in all_reduce #31" in note  # where they were, from the dumps
    assert {r["rank"]: r["state"] for r in doc["ranks"]} == {0: "in_collective", 1: "in_collective"}


def test_a_rank_that_died_while_the_launcher_failed_is_still_rank_died():
    """The same rank records with torchrun's failure (exit 1): a rank died first and torchrun ended the job."""
    health, _, findings = _findings(
        _manifest(1, ("failed", "failed"), (KILLED, "RuntimeError: Connection closed by peer"))
    )
    assert findings == ["rank-died"] and health["culprit_rank"] == 0


def test_a_launcher_killed_by_sigkill_is_no_stop():
    """SIGKILL to the launcher is a death too (the OOM killer picks large processes): the ranks stay unexplained."""
    health, _, findings = _findings(_manifest(-9))
    assert findings == ["rank-died"] and health["rank_died"]


def test_only_the_stopped_node_s_ranks_are_stopped():
    """Two nodes: node 1's launcher failed (its rank died), node 0's was stopped. Rank 1 is still the death."""
    manifest = _manifest(-15)
    manifest["nodes"].append({"node_rank": 1, "exit_code": 1, "expected_ranks": [1]})
    manifest["ranks"][1]["node_rank"] = 1
    health, _, findings = _findings(manifest)
    assert findings == ["rank-died"] and health["culprit_rank"] == 1


def test_ddpdoctor_s_own_stop_on_an_undecided_hang_says_so_not_no_failure():
    """--hang-timeout stopped the job on dumps that name no cause: the note says who stopped it and what the dumps
    showed (it said "stopped by a signal (interrupted), not by a failure")."""
    manifest = _manifest(
        124, ("interrupted", "interrupted"), ("waiting in all_reduce #31", "waiting in all_reduce #31")
    )
    manifest["health"] = {
        "kind": "undecided",
        "summary": "every rank waits in all_reduce #31 (default_pg) [1024] Float, which they all issued alike",
        "culprits": [],
        "waiting": [0, 1],
        "stopped_by": "stopped by ddpdoctor --hang-timeout 15",
    }
    _, doc, findings = _findings(manifest, _stuck_in_all_reduce())
    assert findings == []
    note = next(n for n in doc["notes"] if "stopped" in n)
    assert note == (
        "ranks 0, 1 stopped by ddpdoctor --hang-timeout 15 (interrupted): every rank waits in all_reduce #31"
        " (default_pg) [1024] Float, which they all issued alike"
    )
    assert "not by a failure" not in note


def _rank_file(out, rank: int, status: str) -> None:
    rundir.atomic_write_json(
        rundir.rank_file(out, rank),
        {
            "rank": rank,
            "world_size": 2,
            "node_rank": 0,
            "local_rank": rank,
            "hostname": "node-a",
            "pid": 100 + rank,
            "status": status,
            "exit_code": None,
            "error": None,
            "steps": {"source": "optimizer", "count": 3, "profiled": []},
            "trace_files": [],
            "started_at": 1000.0,
            "updated_at": 1004.0,
        },
    )


@pytest.mark.parametrize("node_exit, status", [(-15, "interrupted"), (1, "failed"), (-9, "failed")])
def test_the_manifest_records_ranks_stopped_with_their_launcher(tmp_path, node_exit, status):
    """What `ddpdoctor trace` writes (and prints at its end) for ranks whose files say "running" after the job."""
    for r in (0, 1):
        _rank_file(tmp_path, r, "running")
    rundir.atomic_write_json(
        tmp_path / rundir.NODES_DIR / "node0.json",
        {"node_rank": 0, "hostname": "node-a", "exit_code": node_exit, "expected_ranks": [0, 1], "command": []},
    )
    built = manifest_mod.build(tmp_path, mode="torchrun", command=["ddpdoctor", "trace"], config={}, launch="torchrun")
    assert [r["status"] for r in built["ranks"]] == [status, status]
    if status == "interrupted":
        assert built["ranks"][0]["reason"] == stopped_with_job("SIGTERM")
        _, _, findings = _findings(built)
        assert findings == []
    else:
        assert "died without finishing" in built["ranks"][0]["reason"]


def test_an_unfinished_rank_file_is_no_evidence_that_no_step_was_seen(tmp_path):
    """The stuck ranks' files were last written before their first step (steps: none, 0): the manifest does not
    say "no training step was detected" of a job whose ranks stepped 3 times before they hung; a finished file
    that saw no step still does."""
    for r in (0, 1):
        _rank_file(tmp_path, r, "running")
        data = rundir.read_json(rundir.rank_file(tmp_path, r))
        data["steps"] = {"source": "none", "count": 0, "profiled": []}
        rundir.atomic_write_json(rundir.rank_file(tmp_path, r), data)
    rundir.atomic_write_json(
        tmp_path / rundir.NODES_DIR / "node0.json",
        {"node_rank": 0, "hostname": "node-a", "exit_code": -15, "expected_ranks": [0, 1], "command": []},
    )

    def notes() -> list[str]:
        built = manifest_mod.build(tmp_path, mode="torchrun", command=["ddpdoctor"], config={}, launch="torchrun")
        return [n for n in built["notes"] if "no training step was detected" in n]

    assert notes() == []
    for r in (0, 1):
        data = rundir.read_json(rundir.rank_file(tmp_path, r))
        rundir.atomic_write_json(rundir.rank_file(tmp_path, r), {**data, "status": "ok", "exit_code": 0})
    assert len(notes()) == 1
