"""The fast paths of `diagnose` from per-rank summaries (issue 17): what a command imports, and that every fast
path gives what the plain one gives -- the summary reader against the checked slow reader, the rank table against
rich, the cross-rank sums against pandas' and numpy's own, the Python interval helpers against
``metrics.intervals``."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from ddpdoctor import rundir, runfiles
from ddpdoctor._version import __version__
from ddpdoctor.metrics import cross_rank as cr
from ddpdoctor.metrics import group_sums as gs
from ddpdoctor.metrics import intervals as iv
from ddpdoctor.report import console as report_console
from ddpdoctor.report import text
from ddpdoctor.table import column

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "samples" / "recorded" / "ddp_straggler"


def _modules_after(argv: list[str], tmp_path: Path) -> dict[str, bool]:
    """Run the CLI with ``argv`` in a fresh interpreter; which heavy modules it imported."""
    probe = (
        "import json, sys\n"
        "from ddpdoctor.cli import main\n"
        f"code = main({argv!r})\n"
        "mods = {m: m in sys.modules for m in ('pandas', 'numpy', 'numpy.ma', 'rich', 'ddpdoctor.load.decode',"
        " 'ddpdoctor.trial', 'ddpdoctor.compare', 'ddpdoctor.cli.trace_cmd', 'ddpdoctor.capture.manifest')}\n"
        "print(json.dumps({'code': code, 'mods': mods}), file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False
    )
    result = json.loads(proc.stderr.strip().splitlines()[-1])
    return {"code": result["code"], **result["mods"]}


def test_diagnose_from_summaries_imports_neither_pandas_nor_the_trace_decoder(tmp_path: Path) -> None:
    out = tmp_path / "report.txt"
    seen = _modules_after(["diagnose", str(SAMPLE), "--output", str(out)], tmp_path)
    assert seen["code"] in (0, 1) and out.read_text().startswith("ddpdoctor diagnosis")
    assert not seen["pandas"], "diagnose of a run with summaries imported pandas"
    assert not seen["numpy.ma"]  # ~10 ms: np.unique without a second output imports it
    assert not seen["ddpdoctor.load.decode"] and not seen["ddpdoctor.trial"] and not seen["ddpdoctor.compare"]
    assert not seen["ddpdoctor.cli.trace_cmd"]  # only the command that runs is registered


def test_diagnose_of_traces_it_did_not_record_does_not_import_the_capture_package(tmp_path: Path) -> None:
    """~4 ms of a cold start (its command marks import hashlib, hmac and secrets): reading a folder of traces needs
    only the manifest's notes, which live in ``rundir``."""
    from test_bad_traces import copy_fixture

    traces = copy_fixture(tmp_path / "traces")
    out = tmp_path / "report.json"
    seen = _modules_after(["diagnose", str(traces), "--format", "json", "--output", str(out)], tmp_path)
    assert seen["code"] in (0, 1) and out.read_text().startswith("{")
    assert not seen["ddpdoctor.capture.manifest"]


def test_help_imports_no_command_and_no_numpy(tmp_path: Path) -> None:
    seen = _modules_after(["--help"], tmp_path)
    assert seen["code"] == 0
    assert not any(v for k, v in seen.items() if k != "code"), seen


def test_help_lists_every_command_as_before(capsys) -> None:
    from ddpdoctor.cli import COMMANDS, build_parser

    capsys.readouterr()
    lazy = build_parser(None).format_help()
    full = build_parser().format_help()
    assert lazy == full
    assert all(name in lazy for name in COMMANDS)


# --- the summary reader ---------------------------------------------------------------------------------------
def _slow(run: Path) -> dict[int, dict]:
    out = {}
    for _, path in runfiles._rank_files(run, ".summary.json"):
        data, _ = runfiles._read_checked(path, rundir.RankSummary)
        if data is not None:
            out[data["rank"]] = data
    return out


def _world(tmp_path: Path, n: int) -> Path:
    """A copy of the sample with ``n`` ranks whose summaries all list one large process group."""
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run)
    src = {r: json.loads((run / "ranks" / f"rank{r}.summary.json").read_text()) for r in (0, 1)}
    for rank in range(n):
        data = json.loads(json.dumps(src[rank % 2]))
        data["rank"] = rank
        info = data["distributed_info"]
        info.update(rank=rank, world_size=n)
        info["pg_config"] = [{"pg_name": "0", "pg_size": n, "ranks": list(range(n))}]
        (run / "ranks" / f"rank{rank}.summary.json").write_text(json.dumps(data))
    return run


def test_summaries_read_fast_are_the_checked_ones(tmp_path: Path) -> None:
    for run in (SAMPLE, _world(tmp_path, 40)):
        fast, notes = runfiles.read_summaries(run, __version__)
        assert notes == [] and fast == _slow(run)


def test_the_shared_process_groups_are_decoded_once_and_compared_exactly(tmp_path: Path) -> None:
    run = _world(tmp_path, 120)  # a group text of 256 bytes or more is shared
    # rank 7 lists other groups (same length), rank 9 the same text with a key that only looks like the key
    for rank, edit in (
        (7, lambda d: d["distributed_info"]["pg_config"][0]["ranks"].reverse()),
        (9, lambda d: d.__setitem__("hostname", 'x"pg_config": ')),
    ):
        path = run / "ranks" / f"rank{rank}.summary.json"
        data = json.loads(path.read_text())
        edit(data)
        path.write_text(json.dumps(data))
    fast, _ = runfiles.read_summaries(run, __version__)
    assert fast == _slow(run)
    groups = [fast[r]["distributed_info"]["pg_config"] for r in (4, 5, 6)]
    assert groups[0] is groups[1] is groups[2]  # one object for the ranks that share the text
    assert fast[7]["distributed_info"]["pg_config"][0]["ranks"] == list(range(119, -1, -1))


@pytest.mark.parametrize(
    "bad",
    [
        ('"step_ms_median": ', '"step_ms_median": NaN, "x": '),
        ('"step_ms_median": ', '"step_ms_median": 1e400, "x": '),
        ('"step_ms_median": ', '"step_ms_median": "12", "x": '),
        ('"step_ms_median": ', '"step_ms_median": 1, "not_in_the_catalog": "text", "x": '),
        ('"step_ms_median": ', f'"step_ms_median": {10**400}, "x": '),
        ('"step_ms_median": ', f'"step_ms_median": {2**70}, "x": '),  # beyond int64: checked the slow way
    ],
)
def test_a_file_the_fast_reader_refuses_gets_the_checked_reader_s_verdict(tmp_path: Path, bad) -> None:
    run = _world(tmp_path, 4)
    path = run / "ranks" / "rank2.summary.json"
    path.write_text(path.read_text().replace(*bad, 1))
    fast, notes = runfiles.read_summaries(run, __version__)
    slow = _slow(run)
    assert fast == slow
    _, why = runfiles._read_checked(path, rundir.RankSummary)
    assert (why is None) == (2 in fast)
    assert notes == (
        [] if why is None else [f"ranks/rank2.summary.json: skipped: {why}; the rank's trace is read instead"]
    )


def test_captures_read_fast_are_the_checked_ones() -> None:
    fast, notes = runfiles.read_rank_captures(SAMPLE)
    slow = {}
    for _, path in runfiles._rank_files(SAMPLE, ".json"):
        data, _ = runfiles._read_checked(path, rundir.RankCapture)
        slow[data["rank"]] = data
    assert notes == [] and fast == slow


# --- the rank table -------------------------------------------------------------------------------------------
def _doc(rows: int, big: bool = False) -> dict:
    rng = np.random.default_rng(rows)
    ranks = []
    for r in range(rows):
        v = lambda: float(rng.random() * (1e4 if big else 100))  # noqa: E731
        ranks.append(
            {
                "rank": r * (1000 if big else 1),
                "step_ms": {"median": v(), "p90": None if r == 1 else v()},
                **{k: v() for k in ("dataloader_ms", "forward_ms", "backward_ms", "optimizer_ms", "comm_ms")},
                "exposed_comm_ms": v(),
                "overlap_ratio": rng.random(),
                "other_ms": v(),
                "gil_contention": None,
            }
        )
    return {"ranks": ranks}


@pytest.mark.parametrize(("rows", "big"), [(0, False), (1, False), (2, False), (37, False), (300, True)])
def test_the_rank_table_is_the_one_rich_draws(rows: int, big: bool) -> None:
    doc = _doc(rows, big)
    plain = io.StringIO()
    console = report_console.console(plain, text.WIDTH_NOT_A_TERMINAL)
    lines = text._rank_table_lines(doc, console)
    assert lines is not None
    if rows == 0:  # no rank with timings: no table at all, never one of dashes
        assert lines == [] and text._rank_table(doc) is None
        return
    drawn = io.StringIO()
    report_console.console(drawn, text.WIDTH_NOT_A_TERMINAL).print(text._rank_table(doc))
    assert "\n".join(lines) + "\n" == drawn.getvalue()


@pytest.mark.parametrize("rows", [1, 3, 40])
def test_the_memory_table_is_the_one_rich_draws(rows: int) -> None:
    rng = np.random.default_rng(rows)
    doc = {"ranks": []}
    for r in range(rows):
        devices = [
            {
                "device": f"cuda:{i}" if r % 5 else None,
                "peak_allocated_bytes": int(rng.integers(1, 2**34)),
                "peak_reserved_bytes": None if r % 3 == 1 else int(rng.integers(1, 2**36)),
                "capacity_bytes": None if r % 4 == 2 else 80 * 2**30,
            }
            for i in range(int(rng.integers(0, 3)))
        ]
        doc["ranks"].append({"rank": r, "devices": devices})
    if not any(r["devices"] for r in doc["ranks"]):
        return
    lines = text._memory_table_lines(doc, report_console.console(io.StringIO(), text.WIDTH_NOT_A_TERMINAL))
    assert lines is not None
    drawn = io.StringIO()
    report_console.console(drawn, text.WIDTH_NOT_A_TERMINAL).print(text._memory_table(doc))
    assert "\n".join(lines) + "\n" == drawn.getvalue()


def test_the_rank_table_is_left_to_rich_on_a_terminal_or_when_too_wide() -> None:
    doc = _doc(3, big=True)
    assert text._rank_table_lines(doc, Console(file=io.StringIO(), force_terminal=True)) is None
    assert text._rank_table_lines(doc, report_console.console(io.StringIO(), 40)) is None


# --- cross-rank sums and intervals ----------------------------------------------------------------------------
def test_group_sums_are_pandas_to_the_last_bit() -> None:
    rng = np.random.default_rng(0)
    for trial in range(40):
        n = int(rng.integers(1, 400))
        ids = np.sort(rng.integers(0, 9, n)) if trial % 2 else rng.integers(0, 9, n)
        values = rng.random(n) * 10.0 ** rng.integers(0, 6, n)
        if trial % 3 == 0:
            values[rng.random(n) < 0.1] = np.nan
        k = int(ids.max()) + 1
        present = np.bincount(ids, minlength=k) > 0
        expected = pd.Series(values).groupby(ids).sum().to_numpy()
        assert np.array_equal(gs.pandas_group_sum(values, ids, k)[present], expected)
        unsorted = pd.Series(values).groupby(ids, sort=False).transform("sum").to_numpy()
        assert np.array_equal(gs.pandas_group_sum(values, ids, k, sort=False)[ids], unsorted)


def test_segment_reductions_are_numpy_s_own() -> None:
    rng = np.random.default_rng(1)
    counts = rng.integers(0, 30, 50)
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    values = rng.random(int(counts.sum())) * 1e4
    seg = gs.Segments(first, counts)
    for fn in (np.sum, np.median):
        got = seg.reduce(fn, values)
        want = [
            fn(values[a : a + c]) if c else (0.0 if fn is np.sum else got[i])
            for i, (a, c) in enumerate(zip(first, counts, strict=True))
        ]
        assert np.array_equal(got, np.asarray(want), equal_nan=True)


def _waits_reference(colls, summaries):
    """The per-rank loop ``_per_rank_waits`` replaces (one rank at a time, ``metrics.intervals`` and numpy)."""
    per_rank, typical = {}, {}
    for s in summaries:
        steps = cr._analysed(s)
        mine = (colls["rank"] == s["rank"]) & np.isin(colls["step"], steps["step"])
        if not len(steps["step"]) or not mine.any():
            continue
        start, step = colls["start_us"][mine], colls["step"][mine]
        wait_ms = iv.coverage(iv.union(start, start + colls["wait_us"][mine]), steps["start_us"], steps["end_us"]) / 1e3
        uniq, inverse = np.unique(step, return_inverse=True)
        means = np.bincount(inverse, weights=colls["late_us"][mine]) / np.bincount(inverse)
        pos = np.minimum(np.searchsorted(uniq, steps["step"]), len(uniq) - 1)
        late = np.where(uniq[pos] == steps["step"], means[pos], 0.0)
        per_rank[s["rank"]] = {
            "collective_wait_ms": float(np.mean(wait_ms)),
            "late_arrival_ms": float(np.mean(late) / 1e3),
        }
        typical[s["rank"]] = float(np.median(wait_ms))
    return per_rank, typical


def test_per_rank_waits_are_the_per_rank_loop_s() -> None:
    rng = np.random.default_rng(3)
    for trial in range(30):
        ranks = int(rng.integers(1, 9))
        summaries, rows = [], []
        for r in range(ranks):
            n_steps = int(rng.integers(0, 12))
            lo = np.sort(rng.random(n_steps) * 1e4)
            hi = lo + rng.random(n_steps) * 2e3
            if trial % 5 == 0 and n_steps:
                lo[0] = np.nan
            analysed = (rng.random(n_steps) < 0.8).tolist()
            summaries.append(
                {
                    "rank": r,
                    "per_step": {
                        "step": list(range(n_steps)),
                        "start_us": lo.tolist(),
                        "end_us": hi.tolist(),
                        "analyzed": analysed,
                    },
                }
            )
            for _ in range(int(rng.integers(0, 30))):
                start = float(np.round(rng.random() * 1.2e4, int(rng.integers(0, 3))))
                wait = 0.0 if rng.random() < 0.2 else float(rng.random() * 500)
                rows.append((r, int(rng.integers(0, 14)), start, wait, float(rng.random() * 50)))
        rows.sort(key=lambda x: x[0])
        cols = list(zip(*rows, strict=True)) if rows else [[]] * 5
        colls = cr.Table(
            {
                "rank": np.array(cols[0], dtype=np.int64),
                "step": np.array(cols[1], dtype=np.int64),
                "start_us": np.array(cols[2], dtype=float),
                "wait_us": np.array(cols[3], dtype=float),
                "late_us": np.array(cols[4], dtype=float),
            }
        )
        per_rank: dict = {}
        typical = cr._per_rank_waits(colls, summaries, per_rank)
        want_rank, want_typical = _waits_reference(colls, summaries)
        assert json.dumps(per_rank) == json.dumps(want_rank) and json.dumps(typical) == json.dumps(want_typical)


def test_columns_are_inferred_as_a_dataframe_infers_them() -> None:
    cases = [[1, 2], [1, None], [1.5, None, 2], [True, False], [True, None], ["a", None], [None, None], [], [1, "a"]]
    for values in cases:
        got = column(values)
        want = pd.Series(values, dtype=None if values else object).to_numpy()
        if values:
            assert got.dtype == want.dtype or (got.dtype == object and want.dtype.kind in "OU")
        assert [x if x == x else None for x in got.tolist()] == [x if x == x else None for x in want.tolist()]


def test_per_step_is_made_on_first_use_and_pickles_as_a_table() -> None:
    import copy
    import pickle

    from ddpdoctor.metrics.result import LazyTable
    from ddpdoctor.pipeline import analyze_run
    from ddpdoctor.table import Table

    metrics = analyze_run(SAMPLE).metrics
    assert isinstance(metrics.per_step, LazyTable) and metrics.per_step._made is None  # diagnose never read it
    again = pickle.loads(pickle.dumps(metrics))
    assert type(again.per_step) is Table and again.to_json() == metrics.to_json()
    assert copy.deepcopy(metrics).to_json() == metrics.to_json()
    assert len(metrics.per_step) == 16 and metrics.per_step.columns[0] == "rank"  # 2 ranks x 8 steps


# --- tables of large runs -------------------------------------------------------------------------------------
def test_a_table_of_many_ranks_shows_the_ranks_worth_reading_and_says_which() -> None:
    from ddpdoctor.report.document import listed_ranks, rank_table

    few = _doc(32)
    assert listed_ranks(few) == (few["ranks"], None) and rank_table(few).note is None
    doc = _doc(4096)
    for r in doc["ranks"]:
        r["step_ms"]["median"] = 100.0 + (r["rank"] * 37) % 4096 / 100  # slowest 4095.., fastest 0..
        r["devices"] = [{"peak_reserved_bytes": 2**30 + r["rank"] % 1000, "peak_allocated_bytes": 1}]
    doc["findings"] = [{"ranks": [1234]}, {"ranks": list(range(4096))}]  # one named rank; one finding of all
    shown, note = listed_ranks(doc)
    by_time = sorted(doc["ranks"], key=lambda r: r["step_ms"]["median"])
    by_memory = sorted(doc["ranks"], key=lambda r: -r["devices"][0]["peak_reserved_bytes"])
    expected = {0, 1234} | {r["rank"] for r in by_time[-8:] + by_time[:3] + by_memory[:3]}
    assert [r["rank"] for r in shown] == sorted(expected)
    assert note.startswith(f"{len(expected)} of 4,096 ranks: the lowest rank, the 8 slowest and 3 fastest")
    table = rank_table(doc)
    assert [row[0] for row in table.rows] == [str(r) for r in sorted(expected)] and table.note == note


def test_a_hang_of_many_ranks_shows_the_ranks_not_waiting() -> None:
    from ddpdoctor.report.document import rank_table

    states = [{"rank": r, "state": "waiting" if r not in (77, 3001) else "running", "steps": 5} for r in range(4096)]
    doc = {"ranks": [{"rank": r} for r in range(4096)], "run": {"health": {"ranks": states}}}
    table = rank_table(doc)
    assert table.kind == "status" and [row[0] for row in table.rows] == ["0", "1", "2", "3", "77", "3001"]
    assert table.note == "6 of 4,096 ranks: those not waiting (up to 24) and the first 4 waiting; all in --format json"


def test_the_text_report_of_many_ranks_says_which_it_shows() -> None:
    doc = _doc(100)
    parts = text._rank_table_parts(doc)
    assert len(parts[3]) < 20 and parts[4].startswith(f"{len(parts[3])} of 100 ranks")
    out = io.StringIO()
    console = report_console.console(out, text.WIDTH_NOT_A_TERMINAL)
    text._print_table(console, text._rank_table_lines(doc, console, parts), lambda: None, parts[4])
    assert " ".join(out.getvalue().split()).endswith(f"({parts[4]})")  # after the table (folded at the width)


# --- the process's end ----------------------------------------------------------------------------------------
def test_the_command_ends_without_freeing_its_analysis_and_says_all_of_it(tmp_path: Path, capsys) -> None:
    from ddpdoctor.cli import main

    recorded = REPO / "samples" / "recorded" / "ddp_straggler"
    assert main(["diagnose", str(recorded), "--fail-on", "warning"]) == 1
    expected = capsys.readouterr().out
    # as a process (console_main: os._exit once stdout and stderr are flushed), the same report and exit status
    done = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "diagnose", str(recorded), "--fail-on", "warning"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and done.stdout == expected and done.stderr == ""
    out = tmp_path / "report.json"
    written = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "diagnose", str(recorded), "--format", "json", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert written.returncode == 0 and written.stderr == f"ddpdoctor: wrote the json report to {out}\n"
    assert json.loads(out.read_text())["findings"]  # complete, and in place
    # a command that keeps nothing exits as before (its atexit handlers run)
    probe = "import atexit, sys; atexit.register(lambda: print('atexit ran')); sys.argv = ['ddpdoctor', 'rules'];"
    rules = subprocess.run(
        [sys.executable, "-c", probe + " from ddpdoctor.cli import console_main; console_main()"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert rules.returncode == 0 and rules.stdout.rstrip().endswith("atexit ran")


def _priority_loop(sets: list[iv.Intervals]) -> list[iv.Intervals]:
    """Each set less the union of the sets before it, one set at a time (what ``iv.by_priority`` replaces)."""
    taken, out = iv.EMPTY, []
    for ivs in sets:
        out.append(iv.subtract(ivs, taken))
        taken = iv.union_all(taken, ivs)
    return out


def test_priority_in_one_sweep_is_the_set_by_set_loop_to_the_last_bit() -> None:
    rng = np.random.default_rng(7)
    for _ in range(2000):
        sets = []
        for _ in range(int(rng.integers(0, 9))):
            n = int(rng.integers(0, 12))
            # whole numbers make boundaries meet and repeat (touching, shared and nested intervals); tenths do not
            starts = rng.integers(0, 30, n).astype(float) if rng.random() < 0.5 else np.round(rng.uniform(0, 50, n), 1)
            sets.append(iv.union(starts, starts + rng.integers(0, 6, n)))
        for got, want in zip(iv.by_priority(sets), _priority_loop(sets), strict=True):
            assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), sets
    assert iv.by_priority([]) == []
    one = iv.union(np.array([0.0, 5.0]), np.array([2.0, 9.0]))
    first, second = iv.by_priority([one, iv.union(np.array([1.0]), np.array([7.0]))])
    assert first[0].tolist() == [0.0, 5.0] and second[0].tolist() == [2.0] and second[1].tolist() == [5.0]


def test_names_met_by_an_earlier_rank_get_the_same_flags_and_the_memory_is_bounded(monkeypatch):
    import re

    from ddpdoctor.metrics import phases

    pattern = re.compile(r"Backward\d*$")
    monkeypatch.setattr(phases, "_SEEN", {})
    first = ["aten::mm", "MmBackward0", "x"]
    second = ["MmBackward0", "aten::mm", "AddBackward1", "y"]  # two names the first rank had, in another order
    assert phases._name_flags(first, pattern).tolist() == [False, True, False, False]  # (and -1's False)
    assert phases._name_flags(second, pattern).tolist() == [True, False, True, False, False]
    seen = {"aten::mm": False, "MmBackward0": True, "x": False, "AddBackward1": True, "y": False}
    assert phases._SEEN[pattern] == seen
    monkeypatch.setattr(phases, "_SEEN_MAX", 4)  # more names than that: the next rank starts a new memory
    assert phases._name_flags(["zBackward", "q"], pattern).tolist() == [True, False, False]
    assert phases._SEEN[pattern] == {"zBackward": True, "q": False}
