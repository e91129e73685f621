"""The step timeline (issue 27): what the summaries record (bounded), how the run's timeline is laid out (clocks
aligned as the cross-rank analysis aligns them, collectives split into waiting and transfer, median and worst
step), and where the SVG marks each finding: on the rank and the step it concerns, and nowhere when the step does
not show it."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import numpy as np
import pytest

from ddpdoctor.export.perfetto import clock_offsets as perfetto_offsets
from ddpdoctor.metrics import timeline as mt
from ddpdoctor.metrics.cross_rank import all_collectives, clock_offsets, cross_rank
from ddpdoctor.report import palette
from ddpdoctor.report import timeline as rt

SHIFT = 5_000_000.0  # rank 1's clock runs 5 s ahead of rank 0's
MS = 1000.0


def _summary(rank: int, steps: dict[int, float], straggler: bool) -> dict:
    """A rank of a 2-rank job: rank 1 sleeps 40 ms at the start of every step (the straggler), rank 0 waits for it
    in the step's all-reduce. Times in the rank's own clock (rank 1: + SHIFT). ``steps``: step -> duration (ms)."""
    off = SHIFT if rank == 1 else 0.0
    per_step = {"step": [], "start_us": [], "end_us": [], "analyzed": [], "step_ms": []}
    colls = {"step": [], "kind": [], "index": [], "start_us": [], "end_us": [], "dur_us": []}
    tl = {"step": [], "lane": [], "start_us": [], "end_us": []}

    def lane(step: int, name: str, a: float, b: float) -> None:
        tl["step"].append(step)
        tl["lane"].append(name)
        tl["start_us"].append(a + off)
        tl["end_us"].append(b + off)

    for step, dur in steps.items():
        t = step * 1_000 * MS
        per_step["step"].append(step)
        per_step["start_us"].append(t + off)
        per_step["end_us"].append(t + dur * MS + off)
        per_step["analyzed"].append(True)
        per_step["step_ms"].append(dur)
        if straggler:  # sleeps 40 ms, forward, backward, then a 5 ms all-reduce ending at t + 60 ms
            lane(step, "forward", t + 40 * MS, t + 45 * MS)
            lane(step, "backward", t + 45 * MS, t + 55 * MS)
            start = t + 55 * MS
        else:  # forward, backward, then waits in the all-reduce from t + 20 ms to t + 60 ms
            lane(step, "forward", t, t + 10 * MS)
            lane(step, "backward", t + 10 * MS, t + 20 * MS)
            lane(step, "exposed_comm", t + 20 * MS, t + 60 * MS)
            start = t + 20 * MS
        lane(step, "optimizer", t + 60 * MS, t + 65 * MS)
        end = t + 60 * MS
        for key, value in (("step", step), ("kind", "all_reduce"), ("index", 0)):
            colls[key].append(value)
        colls["start_us"].append(start + off)
        colls["end_us"].append(end + off)
        colls["dur_us"].append(end - start)
    return {"rank": rank, "per_step": per_step, "collectives": colls, "timeline": tl}


STEPS = {1: 100.0, 2: 101.0, 3: 150.0}


@pytest.fixture(scope="module")
def summaries():
    return [_summary(0, STEPS, straggler=False), _summary(1, STEPS, straggler=True)]


@pytest.fixture(scope="module")
def built(summaries):
    return mt.build(summaries, all_collectives(summaries))


def _finding(name: str, ranks: list[int], id_: str = "DDP000") -> SimpleNamespace:
    return SimpleNamespace(id=id_, name=name, ranks=ranks, severity="warning")


def test_one_clock_alignment_for_the_analysis_the_timeline_and_perfetto(summaries, built):
    offsets, unmatched = clock_offsets(summaries)
    assert offsets == {0: 0.0, 1: SHIFT} and unmatched == []
    assert perfetto_offsets(summaries) == (offsets, unmatched)
    assert built["offsets_us"] == offsets
    # the cross-rank analysis sees rank 1 late on this clock: 35 ms at every all-reduce
    per_rank, _run = cross_rank(summaries)
    assert per_rank[1]["late_arrival_ms"] == pytest.approx(35.0)


def test_median_and_worst_step_on_one_clock(built):
    assert [(s["label"], s["step"]) for s in built["steps"]] == [("median step", 2), ("worst step", 3)]
    median = built["steps"][0]
    r0, r1 = median["ranks"]
    assert r0["start_us"] == pytest.approx(r1["start_us"])  # aligned: without it rank 1 would be 5 s away
    assert median["t1_us"] - median["t0_us"] == pytest.approx(101 * MS)
    assert built["step_walls_ms"] == {"median": pytest.approx(101.0), "worst": pytest.approx(150.0), "steps": 3}


def test_collectives_split_into_waiting_for_peers_and_transfer(built):
    r0, r1 = built["steps"][0]["ranks"]
    t = 2_000 * MS
    parts0 = {part: (a, b, late) for _k, _i, part, a, b, late in r0["comm"]}
    # rank 0 entered at 20 ms and waited for rank 1 until the 5 ms transfer (the shortest duration) began
    assert parts0["wait"][:2] == pytest.approx((t + 20 * MS, t + 55 * MS))
    assert parts0["transfer"][:2] == pytest.approx((t + 55 * MS, t + 60 * MS))
    parts1 = {part: (a, b, late) for _k, _i, part, a, b, late in r1["comm"]}
    assert "wait" not in parts1  # the last to arrive waits for no one
    assert parts1["transfer"][:2] == pytest.approx((t + 55 * MS, t + 60 * MS))  # on rank 0's clock
    assert parts1["transfer"][2] == pytest.approx(35 * MS) and parts0["transfer"][2] == 0.0


NS = "{http://www.w3.org/2000/svg}"


def _groups(svg: str) -> dict[str, ET.Element]:
    """Each rank's lane group of one step's SVG, by rank."""
    root = ET.fromstring(svg)
    return {g.get("data-rank"): g for g in root.iter(f"{NS}g") if g.get("class") == "tl-rank"}


def _marks(group: ET.Element) -> list[ET.Element]:
    return [g for g in group.iter(f"{NS}g") if g.get("class") == "tl-mark"]


def _parts(group: ET.Element) -> set[str]:
    return {m.get("data-part") for m in _marks(group)}


def _words(group: ET.Element) -> str:
    return " ".join(group.itertext())


def test_straggler_marked_on_its_own_lane_where_it_arrives_and_on_the_others_wait(built):
    finding = _finding("rank-straggler", [1], "DDP003")
    for step in built["steps"]:
        svg = rt.svg(step, [finding])
        ET.fromstring(svg)  # well-formed
        groups = _groups(svg)
        assert set(groups) == {"0", "1"}
        assert _parts(groups["1"]) == {"late-arrival"} and _parts(groups["0"]) == {"wait-caused"}
        (mark,) = _marks(groups["1"])
        assert (mark.get("data-rule"), mark.get("data-rank"), mark.get("data-step")) == (
            "rank-straggler",
            "1",
            str(step["step"]),
        )
        # the line stands at rank 1's arrival, 55 ms into the step on the shared axis
        x = float(mark.find(f"{NS}line").get("x1"))
        span = step["t1_us"] - step["t0_us"]
        expected = rt.LABEL_W + 55 * MS / span * (rt.WIDTH - rt.LABEL_W - rt.RIGHT)
        assert x == pytest.approx(expected, abs=0.15)
        assert "arrives 35.0 ms late" in _words(groups["1"]) and "waits 35.0 ms for rank(s) 1" in _words(groups["0"])


def test_no_straggler_mark_where_the_named_rank_is_not_late(summaries):
    # the same job with the finding naming rank 0, which arrives first everywhere: nothing to point at
    step = mt.build(summaries)["steps"][0]
    svg = rt.svg(step, [_finding("rank-straggler", [0])])
    assert 'data-part="late-arrival"' not in svg and 'data-part="wait-caused"' not in svg


def test_exposed_allreduce_after_backward_marked_on_the_finding_ranks_only(built):
    step = built["steps"][0]
    svg = rt.svg(step, [_finding("poor-comm-compute-overlap", [0], "DDP002")])
    groups = _groups(svg)
    assert _parts(groups["0"]) == {"exposed-comm"} and _marks(groups["1"]) == []
    assert "40.0 ms of communication exposed, 35.0 ms of it waiting for peers" in _words(groups["0"])

    # exposed communication only before backward starts (e.g. a broadcast in forward) is not this finding's place
    def before_backward(r: dict) -> list:
        t = r["start_us"]
        return [["exposed_comm", t, t + 5 * MS], ["backward", t + 10 * MS, t + 20 * MS]]

    early = {**step, "ranks": [{**r, "compute": before_backward(r)} for r in step["ranks"]]}
    assert "tl-mark" not in rt.svg(early, [_finding("poor-comm-compute-overlap", [])])


def test_dataparallel_gather_marked_on_gpu0():
    step = {
        "label": "median step",
        "step": 4,
        "t0_us": 0.0,
        "t1_us": 50 * MS,
        "ranks": [
            {
                "rank": 0,
                "start_us": 0.0,
                "end_us": 50 * MS,
                "compute": [["forward", 0.0, 30 * MS]],
                "comm": [],
                "gather": [[25 * MS, 30 * MS]],
            }
        ],
    }
    svg = rt.svg(step, [_finding("dp-gathers-large-outputs", [], "DDP018")])
    assert re.search(r'data-rule="dp-gathers-large-outputs" data-rank="0" data-step="4" data-part="gather"', svg)
    assert "gather on GPU 0: 5.0 ms" in svg
    no_gather = {**step, "ranks": [{**step["ranks"][0], "gather": []}]}
    assert "tl-mark" not in rt.svg(no_gather, [_finding("dp-gathers-large-outputs", [])])


def test_lanes_are_drawn_per_rank_in_the_palette_colours(built):
    svg = rt.svg(built["steps"][0])
    groups = _groups(svg)
    lanes = {
        rank: {e.get("data-lane") for e in g.iter(f"{NS}rect") if e.get("data-lane")} for rank, g in groups.items()
    }
    assert lanes["0"] == {"idle", "forward", "backward", "exposed_comm", "optimizer", "wait", "transfer"}
    assert lanes["1"] == {"idle", "forward", "backward", "optimizer", "transfer"}
    for lane in ("forward", "exposed_comm", "wait", "transfer", "idle"):
        assert f'fill="{palette.color(lane)}" data-lane="{lane}"' in svg


def test_median_and_worst_are_two_panels_chosen_with_radio_buttons(built):
    html = rt.render(built, [_finding("rank-straggler", [1])])
    assert html.count('type="radio"') == 2 and html.count(" checked") == 1
    assert re.findall(r'<div class="tl-panel" data-step="(\d)">', html) == ["2", "3"]
    assert "median step (step 2, 101.0 ms)" in html and "worst step (step 3, 150.0 ms)" in html
    assert "<script" not in html and "http" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_older_capture_says_the_timeline_was_not_recorded(summaries):
    old = [{k: v for k, v in s.items() if k != "timeline"} for s in summaries]
    built = mt.build(old)
    assert built["recorded"] is False
    assert "not recorded by this capture" in rt.render(built)


def test_record_is_bounded_and_keeps_the_slowest_step():
    n = 40
    steps = {
        "step": np.arange(n),
        "start_us": np.arange(n) * 1e5,
        "end_us": np.arange(n) * 1e5 + 9e4,
        "analyzed": np.ones(n, dtype=bool),
        "step_ms": np.full(n, 90.0),
    }
    steps["step_ms"][17] = 300.0
    # 200 tiny backward pieces per step and an exposed comm that overlaps them: exclusive, bounded
    a = np.concatenate([np.arange(200) * 400.0 + s * 1e5 for s in range(n)])
    lanes = {"backward": (a, a + 200.0), "exposed_comm": (np.arange(n) * 1e5, np.arange(n) * 1e5 + 1000.0)}
    rec = mt.record(lanes, steps)
    kept = sorted(set(rec["step"]))
    assert len(kept) == mt.MAX_STEPS and 17 in kept
    for s in kept:
        for name in ("backward", "exposed_comm"):
            n_seg = sum(1 for st, ln in zip(rec["step"], rec["lane"], strict=True) if st == s and ln == name)
            assert 0 < n_seg <= mt.MAX_SEGMENTS
    # exposed comm claims its time first: no backward piece starts inside [step start, +1 ms)
    for st, ln, x in zip(rec["step"], rec["lane"], rec["start_us"], strict=True):
        if ln == "backward":
            assert x - st * 1e5 >= 1000.0


def test_the_capture_summary_files_carry_the_timeline_through_the_loader(tmp_path):
    """What a rank writes (``summarize_rank``) read back from ``ranks/rank<R>.summary.json`` gives the timeline the
    traces give: the loader keeps the field."""
    import json
    import shutil
    from pathlib import Path

    from ddpdoctor.load import load
    from ddpdoctor.metrics.analysis import analyze
    from ddpdoctor.metrics.summary import summarize_rank

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "ddp_gloo_2rank"
    run = load(fixture)
    from_traces = analyze(run).timeline.get()
    assert from_traces["recorded"] and from_traces["steps"]
    copy = Path(shutil.copytree(fixture, tmp_path / "run"))
    for rank in run.ranks:
        summary = summarize_rank(rank, run.capture.get(rank.rank))
        assert 0 < len(summary["timeline"]["step"]) <= mt.MAX_STEPS * len(mt.LANES) * mt.MAX_SEGMENTS
        (copy / "ranks" / f"rank{rank.rank}.summary.json").write_text(json.dumps(summary))
    loaded = load(copy, use_summaries=True)
    assert all(rt.summary is not None and not rt.has_trace for rt in loaded.ranks)
    assert analyze(loaded).timeline.get() == from_traces


def test_record_keeps_dataparallels_gather_beside_the_phases():
    steps = {
        "step": np.array([3, 4]),
        "start_us": np.array([0.0, 1e5]),
        "end_us": np.array([9e4, 1.9e5]),
        "analyzed": np.array([False, True]),
        "step_ms": np.array([90.0, 90.0]),
    }
    lanes = {"forward": (np.array([1e5]), np.array([1.5e5]))}
    gather = (np.array([2e4, 1.4e5]), np.array([2.5e4, 1.45e5]))  # one in each step: the unanalysed one is left out
    rec = mt.record(lanes, steps, gather)
    rows = list(zip(rec["step"], rec["lane"], rec["start_us"], rec["end_us"], strict=True))
    assert rows == [(4, "forward", 1e5, 1.5e5), (4, "dp_gather", 1.4e5, 1.45e5)]  # overlaps forward: its own lane


def test_a_large_run_draws_the_ranks_the_findings_name_within_the_cap():
    n = mt.MAX_RANKS + 8
    summaries = [_summary(r, {1: 100.0}, straggler=r == n - 3) for r in range(n)]
    lazy = mt.LazyTimeline(summaries, all_collectives(summaries))
    plain = [row["rank"] for row in lazy.get()["steps"][0]["ranks"]]
    focused = lazy.get([n - 3])
    shown = [row["rank"] for row in focused["steps"][0]["ranks"]]
    assert len(plain) == len(shown) == mt.MAX_RANKS and n - 3 not in plain and n - 3 in shown
    html = rt.render(focused, [_finding("rank-straggler", [n - 3])])
    assert f"{mt.MAX_RANKS} of {n} ranks shown" in html
    assert f'data-rank="{n - 3}" data-step="1" data-part="late-arrival"' in html


@pytest.mark.parametrize("span_us", [5e4, 1.5e8, 1.7e18, 1e300, float("inf"), 0.0])
def test_the_time_axis_has_at_most_eleven_ticks_however_long_the_step(span_us):
    """A 150 s step, or a broken trace's clock (the fuzzer's step of 1.7e18 us built 1.7e8 ticks and ran the
    process out of memory): at most 10 intervals, the last tick at or below the step's end."""
    lines = rt._axis(span_us, lambda t: t, 0.0, 2)
    grid = [line for line in lines if "tl-grid" in line]
    assert 1 <= len(grid) <= 11, len(grid)
    labels = [float(m) for m in re.findall(r">([0-9.e+]+)</text>", "".join(lines))]
    if 0 < span_us < float("inf"):
        assert len(grid) >= 2 and labels[-1] <= span_us / 1e3 + 1e-9 and labels[-1] * 11 > span_us / 1e3


def test_a_gloo_collective_is_late_from_the_calls_as_the_analysis_counts_it(summaries):
    # rank 1's gloo thread started the all-reduce 30 ms after rank 1 called it (at t + 25 ms, 5 ms after rank 0's
    # call): the timeline says 5 ms late, as cross_rank does, not the 35 ms between the two ranges' starts
    called = []
    for s in summaries:
        c = dict(s["collectives"])
        start = np.asarray(c["start_us"])
        c["arrival_us"] = (start if s["rank"] == 0 else start - 30 * MS).tolist()
        called.append({**s, "collectives": c})
    step = mt.build(called, all_collectives(called))["steps"][0]
    lates = {row["rank"]: {part: late for _k, _i, part, _a, _b, late in row["comm"]} for row in step["ranks"]}
    assert lates[1]["transfer"] == pytest.approx(5 * MS) and lates[0]["transfer"] == 0.0
    per_rank, _run = cross_rank(called)
    assert per_rank[1]["late_arrival_ms"] == pytest.approx(5.0)
    # one rank's call unknown: the starts for every rank, as the analysis
    called[0]["collectives"]["arrival_us"] = [None] * len(called[0]["collectives"]["step"])
    step = mt.build(called, all_collectives(called))["steps"][0]
    row1 = next(row for row in step["ranks"] if row["rank"] == 1)
    assert [late for *_x, late in row1["comm"]] == [pytest.approx(35 * MS)]
