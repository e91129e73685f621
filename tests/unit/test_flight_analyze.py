"""ddpdoctor.flight.analyze over real dumps of real gloo jobs (tests/fixtures/flight, made by make.py): the culprit,
the collective the others wait in, the user-code frame, and no hang made of ordinary skew."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import msgspec
import pytest

from ddpdoctor.flight import analyze, find_dumps, frame_text
from ddpdoctor.flight.read import read_own_dump
from ddpdoctor.flight.verdict import KINDS

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "flight"
JOB = (FIXTURES / "job.py").read_text().splitlines()


def line_of(text: str) -> int:
    """The line of job.py holding ``text`` (the frames the dumps recorded point there)."""
    hits = [i + 1 for i, line in enumerate(JOB) if text in line]
    assert len(hits) == 1, text
    return hits[0]


def verdict(name: str, **kw):
    found = find_dumps(FIXTURES / name)
    return analyze(found.dumps, world_size=kw.pop("world_size", None), **kw)


def status_of(name: str):
    return {int(r): v for r, v in json.loads((FIXTURES / name / "status.json").read_text()).items()}


def test_rank_stuck_reading_data_is_the_culprit_and_the_other_waits_in_ddp_all_reduce():
    v = verdict("data_stuck")
    assert v.kind == "hang"
    assert v.culprits == (1,) and v.waiting == (0,)
    stuck = v.ranks[1]
    assert stuck.state == "outside" and stuck.phase == "data" and stuck.step == 6
    assert frame_text(stuck.frames[0]) == f"read_shard (job.py:{line_of('time.sleep(60)')})"
    assert v.ranks[0].state == "in_collective"
    c = v.collective
    assert (c.op, c.pg, c.backend, c.sizes, c.dtypes) == ("all_reduce", "default_pg", "gloo", ((5,),), ("Float",))
    assert c.seq_id == v.ranks[0].collective.seq_id
    assert frame_text(c.frame) == f"main (job.py:{line_of('loss.backward()')})"  # DDP's all-reduce, issued there
    assert v.summary.startswith(f"rank 1 is stuck in read_shard (job.py:{line_of('time.sleep(60)')})")
    assert f"rank 0 waits in all_reduce #{c.seq_id} (default_pg) [5] Float" in v.summary
    assert any("not all ranks joining collective" in e for e in v.evidence)


def test_four_ranks_one_culprit():
    v = verdict("four_ranks")
    assert v.kind == "hang" and v.culprits == (2,) and v.waiting == (0, 1, 3)
    assert v.ranks[2].phase == "data"
    assert frame_text(v.ranks[2].frames[0]) == f"read_shard (job.py:{line_of('time.sleep(60)')})"
    assert {v.ranks[r].state for r in (0, 1, 3)} == {"in_collective"}
    assert v.summary.startswith("rank 2 is stuck in read_shard") and "ranks 0, 1, 3 wait in all_reduce" in v.summary


def test_different_collectives_at_the_same_step_are_a_desync_naming_both_sides():
    v = verdict("desync_op")
    assert v.kind == "desync" and v.culprits == (0, 1)
    (m,) = v.mismatches
    assert m.kind == "op" and m.pg == "default_pg"
    assert m.by_rank == {0: "all_reduce [1] Float", 1: "broadcast [4] Float"}
    assert {v.ranks[r].state for r in (0, 1)} == {"in_collective"}
    assert f"rank 0: all_reduce [1] Float at metric_sync (job.py:{line_of('dist.all_reduce(torch.ones(1))')})" in (
        v.summary
    )
    assert f"rank 1: broadcast [4] Float at metric_sync (job.py:{line_of('dist.broadcast(')})" in v.summary
    assert v.summary.startswith(f"collective type mismatch at collective #{m.seq_id} (default_pg)")


def test_dtype_mismatch_that_gloo_completed_is_still_named():
    # float32 [4] against int32 [4]: the same bytes, so gloo completes it and rank 0 reads ints as floats
    for request in ("od0", "od1", "od2"):
        dumps = {r: read_own_dump(FIXTURES / "dtype_mismatch" / "dumps" / f"rank{r}.{request}.json") for r in (0, 1)}
        v = analyze(dumps, world_size=2)
        assert v.kind == "desync", request
        (m,) = v.mismatches
        assert m.kind == "dtype" and m.by_rank == {0: "all_reduce [4] Float", 1: "all_reduce [4] Int"}
        assert v.summary.startswith("dtype mismatch at collective")


def test_size_mismatch_on_gloo_aborts_a_rank_which_is_the_culprit():
    # gloo aborts rank 0 (gloo::EnforceNotMet, SIGABRT) before anything can dump; rank 1 loses its peer
    status = status_of("size_mismatch")
    assert status[0]["exit_code"] == -6
    for rank_status in (status, None):
        v = verdict("size_mismatch", world_size=2, rank_status=rank_status)
        assert v.kind == "crash" and v.culprits == (0,) and v.waiting == (1,), rank_status
        assert v.ranks[1].state == "consequence"
        assert v.collective.op == "all_reduce" and v.collective.sizes == ((8,),)
    assert "killed by SIGABRT" in verdict("size_mismatch", world_size=2, rank_status=status).summary


def test_rank_that_returned_early_while_the_other_waits_in_a_barrier():
    v = verdict("early_return")
    assert v.kind == "desync" and v.culprits == (1,) and v.waiting == (0,)
    assert v.ranks[1].state == "exited" and v.ranks[0].state == "in_collective"
    assert v.collective.op == "barrier"
    assert frame_text(v.collective.frame) == f"main (job.py:{line_of('rank 0 waits here for rank 1')})"
    (m,) = v.mismatches
    assert m.kind == "missing" and m.by_rank == {0: "barrier", 1: "nothing (returned from main)"}
    assert v.summary.startswith("rank 1 returned from main after step 10 without issuing barrier")


def test_crash_leads_and_the_peer_lost_connection_is_a_consequence():
    v = verdict("crash")
    assert v.kind == "crash" and v.culprits == (1,) and v.waiting == (0,)
    crashed, other = v.ranks[1], v.ranks[0]
    assert crashed.state == "crashed" and crashed.exception == "ValueError: bad sample in batch 4"
    assert (crashed.step, crashed.phase) == (4, "forward")
    assert frame_text(crashed.frames[0]) == f"main (job.py:{line_of('raise ValueError')})"
    assert other.state == "consequence" and "peer" in other.exception
    assert other.collective.op == "all_reduce"
    assert v.summary.startswith("rank 1 crashed at step 4 (forward): ValueError: bad sample in batch 4")


def test_healthy_job_dumped_mid_run_is_ok_never_a_hang():
    for request in ("od0", "od1", "od2"):
        dumps = {r: read_own_dump(FIXTURES / "healthy" / "dumps" / f"rank{r}.{request}.json") for r in (0, 1)}
        v = analyze(dumps, world_size=2)
        assert v.kind == "ok", (request, v.summary)
        assert v.culprits == () and v.mismatches == ()


def test_ranks_a_collective_apart_by_ordinary_skew_are_not_a_desync_or_hang():
    seen_apart = False
    for request in ("od0", "od1", "od2"):
        dumps = {r: read_own_dump(FIXTURES / "skew" / "dumps" / f"rank{r}.{request}.json") for r in (0, 1)}
        v = analyze(dumps, world_size=2)
        assert v.kind == "ok", (request, v.summary)
        seen_apart |= any("ordinary skew" in n for n in v.notes)
    assert seen_apart  # the recording did catch rank 1 a collective behind


def test_the_same_skew_after_a_hang_request_is_a_hang():
    # what tells skew from a hang is the evidence that a step never came (the request) or the wait's length
    dumps = {r: read_own_dump(FIXTURES / "skew" / "dumps" / f"rank{r}.od0.json") for r in (0, 1)}
    apart = analyze(dumps, world_size=2)
    if not any("ordinary skew" in n for n in apart.notes):
        pytest.skip("this recording's od0 caught the ranks together")
    assert analyze(dumps, world_size=2, hang_after_s=0).kind == "hang"


def test_torch_own_dump_files_of_a_stuck_job(tmp_path):
    # torch's own files (pickle and JSON) hold no stacks or steps: the culprit is the rank that never joined
    folder = tmp_path / "fr"
    shutil.copytree(FIXTURES / "data_stuck" / "torch", folder)
    found = find_dumps(folder)
    assert found.source == "torch" and sorted(found.dumps) == [0, 1] and not found.skipped
    created = max(e.time_created_ns for d in found.dumps.values() for rec in d.flight_recorder for e in rec.entries)
    for f in folder.iterdir():  # written 3 s after the last collective (a checkout gives the files its own time)
        os.utime(f, (created / 1e9 + 3, created / 1e9 + 3))
    found = find_dumps(folder)
    assert analyze(found.dumps, world_size=None).kind == "ok"  # nothing shows a hang yet
    for f in folder.iterdir():  # as torch writes them at the collective's timeout (60 s here)
        os.utime(f, (created / 1e9 + 61, created / 1e9 + 61))
    v = analyze(find_dumps(folder).dumps, world_size=None)
    assert v.kind == "hang" and v.culprits == (1,) and v.waiting == (0,)
    assert v.collective.op == "all_reduce"
    assert frame_text(v.collective.frame) == f"main (job.py:{line_of('loss.backward()')})"  # from the pickle
    assert any("torch's own dump files" in n for n in v.notes)


def test_torch_own_dump_of_a_desync(tmp_path):
    v = analyze(find_dumps(FIXTURES / "desync_op" / "torch").dumps, world_size=None)
    assert v.kind == "desync" and v.mismatches[0].by_rank == {0: "all_reduce [1] Float", 1: "broadcast [4] Float"}


def test_a_rank_without_a_dump_is_said_not_guessed():
    found = find_dumps(FIXTURES / "healthy")
    v = analyze({0: found.dumps[0]}, world_size=2)
    assert v.ranks[1].state == "no_dump"
    assert v.culprits == ()
    assert any("no dump from rank 1" in n for n in v.notes)


def test_kill_9_of_a_rank_without_dump_is_the_crash_and_sigterm_is_not():
    found = find_dumps(FIXTURES / "crash")
    survivor = {0: found.dumps[0]}
    killed = analyze(survivor, world_size=2, rank_status={1: {"status": "failed", "exit_code": -9}})
    assert killed.kind == "crash" and killed.culprits == (1,) and "SIGKILL" in killed.summary
    # rank 1 stopped with SIGTERM (by torchrun or ddpdoctor) is not a cause; rank 0's peer loss alone names no one
    stopped = analyze(survivor, world_size=2, rank_status={1: {"status": "failed", "exit_code": -15}})
    assert stopped.kind == "undecided" and stopped.culprits == () and stopped.waiting == (0,)


def _mutations(dump):
    """Odd but type-correct dumps: what a hand-edited, truncated or foreign file can hold."""
    yield msgspec.structs.replace(dump, threads=[])
    yield msgspec.structs.replace(dump, flight_recorder=[], fr_error="no Flight Recorder in this torch")
    for rec in dump.flight_recorder:
        yield msgspec.structs.replace(dump, flight_recorder=[msgspec.structs.replace(rec, pg_status={})])
        yield msgspec.structs.replace(
            dump, flight_recorder=[msgspec.structs.replace(rec, pg_status={"0": {"last_enqueued_collective": "x"}})]
        )
        yield msgspec.structs.replace(dump, flight_recorder=[msgspec.structs.replace(rec, entries=rec.entries[-1:])])
        yield msgspec.structs.replace(dump, flight_recorder=[msgspec.structs.replace(rec, pg_config={"": "junk"})])
        yield msgspec.structs.replace(dump, flight_recorder=[rec, rec])


@pytest.mark.parametrize("name", ["data_stuck", "crash", "desync_op", "early_return", "healthy"])
def test_odd_dumps_and_statuses_give_a_verdict_never_a_traceback(name):
    found = find_dumps(FIXTURES / name)
    statuses = [
        None,
        {0: {"status": None, "exit_code": "x"}},
        {1: {"status": "failed", "exit_code": None, "reason": None}},
        {5: {"status": "ok"}},
    ]
    for rank, dump in found.dumps.items():
        for odd in _mutations(dump):
            dumps = {**found.dumps, rank: odd}
            for world in (None, 1, 2, 3):
                for status in statuses:
                    v = analyze(dumps, world_size=world, rank_status=status)
                    assert v.kind in KINDS and v.summary
                    assert set(v.culprits) <= set(v.ranks)


def test_rank_that_ended_its_process_early_is_the_cause_of_its_peers_lost_connection():
    # rank 1 returned from main and its process ended (exit 0, no dump); rank 0's barrier lost its peer
    found = find_dumps(FIXTURES / "early_exit")
    assert sorted(found.dumps) == [0] and found.dumps[0].reason == "exception"
    v = analyze(
        found.dumps,
        world_size=2,
        rank_status={0: {"status": "failed", "exit_code": 1}, 1: {"status": "ok", "exit_code": 0}},
    )
    assert v.kind == "desync" and v.culprits == (1,) and v.waiting == (0,)
    assert v.ranks[0].state == "consequence" and v.ranks[1].state == "exited"
    assert v.collective.op == "barrier"
    assert frame_text(v.collective.frame) == f"main (job.py:{line_of('rank 0 waits here for rank 1')})"
    assert v.summary.startswith("rank 1 returned from main without issuing barrier #")
    assert v.mismatches[0].kind == "missing"


def test_every_rank_stuck_in_its_own_code_after_a_hang_request():
    v = verdict("all_stuck")
    assert v.kind == "hang" and v.culprits == (0, 1) and v.waiting == () and v.collective is None
    line = line_of("time.sleep(60)")
    assert v.summary.startswith(f"no rank is inside a collective; rank 0 in read_shard (job.py:{line})")
    # the same picture nobody asked about because of a hang: two ranks in their data code, which is no finding
    calm = {
        r: msgspec.structs.replace(d, reason="on_demand") for r, d in find_dumps(FIXTURES / "all_stuck").dumps.items()
    }
    assert analyze(calm, world_size=2).kind == "ok"


def test_a_stall_the_job_recovered_from_is_not_a_hang():
    """The ranks dumped at a stall (rank 1 in its own code, rank 0 waiting in all_reduce), then the job went on and
    every rank ended well: a long checkpoint or evaluation on one rank, not a hang; named a hang only while the job
    did not end well."""
    ok = {r: {"status": "ok", "exit_code": 0} for r in (0, 1)}
    v = verdict("data_stuck", rank_status=ok)
    assert v.kind == "ok" and v.culprits == () and any("not a hang" in n for n in v.notes)
    assert v.ranks[1].state == "outside"  # where they were is still there
    stopped = {0: {"status": "interrupted", "exit_code": 143}, 1: {"status": "hung", "exit_code": 143}}
    assert verdict("data_stuck", rank_status=stopped).kind == "hang"
    one_ok = {0: {"status": "ok", "exit_code": 0}}  # rank 1's end unknown
    assert verdict("data_stuck", rank_status=one_ok).kind == "hang"
