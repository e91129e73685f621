"""What ``load(use_summaries=True)`` keeps of each summary file (``ddpdoctor.load.kept``): the same values as the
file, compactly, and one clear error where a file left on disk changed before it was read again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ddpdoctor.errors import TraceError
from ddpdoctor.load import load
from ddpdoctor.load.kept import OnDisk
from ddpdoctor.metrics.analysis import analyze

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "samples" / "recorded" / "ddp_straggler"


def _file(run: Path, rank: int) -> dict:
    return json.loads((run / "ranks" / f"rank{rank}.summary.json").read_text())


def test_kept_summaries_hold_the_files_values(tmp_path: Path) -> None:
    copy = Path(shutil.copytree(SAMPLE, tmp_path / "run"))
    for rank in (0, 1):  # the recorded sample predates op_work
        path = copy / "ranks" / f"rank{rank}.summary.json"
        data = json.loads(path.read_text())
        data["op_work"] = {"aten::mm": [4.0, 2.0, 0.5 + rank], "aten::add": [1, 1, 0.25]}
        path.write_text(json.dumps(data))
    run = load(copy, use_summaries=True)
    assert run.ranks and all(rt.summary is not None and not rt.has_trace for rt in run.ranks)
    for rt in run.ranks:
        data = _file(copy, rt.rank)
        kept = rt.summary["timeline"]
        assert isinstance(kept, OnDisk) and dict(kept) == data["timeline"] and len(data["timeline"]["step"]) > 0
        kept = rt.summary["op_work"]
        assert isinstance(kept, OnDisk) and dict(kept) == data["op_work"] and len(data["op_work"]) > 0
        exposed = rt.summary["exposed_comm"]
        assert len(data["exposed_comm"]["start_us"]) > 0
        for key in ("start_us", "end_us"):
            assert isinstance(exposed[key], np.ndarray) and exposed[key].tolist() == data["exposed_comm"][key]


def test_a_summary_gone_before_its_timeline_is_read_is_one_error(tmp_path: Path) -> None:
    copy = Path(shutil.copytree(SAMPLE, tmp_path / "run"))
    run = load(copy, use_summaries=True)
    (copy / "ranks" / "rank0.summary.json").unlink()
    with pytest.raises(
        TraceError,
        match=r"rank0\.summary\.json: its timeline cannot be read \(.*\): the file changed while it was analysed",
    ):
        analyze(run).timeline.get()


def test_a_summary_s_trace_files_are_named_in_the_run_folder_as_path_names_them() -> None:
    from ddpdoctor.load.loader import _in_folder

    names = ["rank0.1.pt.trace.json.gz", "a/b.json", "a/b/", ".", "..", "", "a/.", "x//y", "/abs/t.json", "a/../b"]
    for root in (Path("."), Path("/"), Path("run"), Path("/tmp/run"), Path("a/b/")):
        in_root = _in_folder(root)
        assert [in_root(f) for f in names] == [str(root / Path(f).name) for f in names]


def test_a_timeline_not_as_ddpdoctor_writes_it_is_one_error_when_drawn(tmp_path: Path) -> None:
    """The timeline is left undecoded at load (its JSON syntax checked): one that is not a table of numbers is
    found when a report draws it, as one error naming the file, never drawn. (Before, the file was refused at
    load and the trace read: reading every timeline was half the decoding of 131,072 ranks.)"""
    copy = Path(shutil.copytree(SAMPLE, tmp_path / "run"))
    path = copy / "ranks" / "rank1.summary.json"
    data = json.loads(path.read_text())
    data["timeline"]["start_us"].pop()  # columns of different lengths
    path.write_text(json.dumps(data))
    run = load(copy, use_summaries=True)
    assert all(rt.summary is not None and not rt.has_trace for rt in run.ranks)
    with pytest.raises(TraceError, match=r"rank1\.summary\.json: its timeline cannot be read"):
        analyze(run).timeline.get()


def test_a_timeline_that_is_not_a_table_sends_the_rank_to_its_trace(tmp_path: Path) -> None:
    """A summary whose timeline or op_work is not a JSON object is refused as a whole, as the checked reader
    refuses it: the traces are read instead (the note says why)."""
    copy = Path(shutil.copytree(SAMPLE, tmp_path / "run"))
    path = copy / "ranks" / "rank1.summary.json"
    data = json.loads(path.read_text())
    data["op_work"] = [1, 2, 3]
    path.write_text(json.dumps(data))
    run = load(copy, use_summaries=True)
    assert sorted(rt.rank for rt in run.ranks) == [0, 1] and all(rt.has_trace for rt in run.ranks)
    assert any("rank1.summary.json: skipped" in n and "op_work" in n for n in run.skipped), run.skipped


def test_kept_summaries_share_the_strings_every_rank_repeats(tmp_path: Path) -> None:
    """The collectives' words and the metric names: one string for every rank, the same values in the same order
    as the files (a number in a text column stays the number; a rank with other metric names keeps its own)."""
    copy = Path(shutil.copytree(SAMPLE, tmp_path / "run"))
    path = copy / "ranks" / "rank1.summary.json"
    data = json.loads(path.read_text())
    data["collectives"]["kind"][0] = 1  # (not what ddpdoctor writes: still never replaced by a word)
    path.write_text(json.dumps(data))
    run = load(copy, use_summaries=True)
    first, second = (rt.summary for rt in run.ranks[:2])
    for rt in run.ranks:
        data = _file(copy, rt.rank)
        assert list(rt.summary["metrics"].items()) == list(data["metrics"].items())
        for key in ("kind", "issued_in"):
            got = rt.summary["collectives"][key]
            assert got == data["collectives"][key] and list(map(type, got)) == list(map(type, data["collectives"][key]))
    assert second["collectives"]["kind"][0] == 1 and type(second["collectives"]["kind"][0]) is int
    words = {id(w) for s in (first, second) for w in s["collectives"]["issued_in"] if w == "backward"}
    assert len(words) <= 1
    assert all(a is b for a, b in zip(first["metrics"], second["metrics"], strict=True))


def test_keep_shares_metric_names_only_where_they_are_the_same_in_the_same_order() -> None:
    from ddpdoctor.load.kept import Shared, keep

    shared = Shared()
    a = keep({"metrics": {"x_ms": 1.0, "y_ms": None}}, "a", shared)
    b = keep({"metrics": {"".join(["x", "_ms"]): 2.0, "".join(["y", "_ms"]): 3}}, "b", shared)
    c = keep({"metrics": {"".join(["y", "_ms"]): 4.0, "".join(["x", "_ms"]): 5.0}}, "c", shared)
    assert b["metrics"] == {"x_ms": 2.0, "y_ms": 3} and all(map(str.__eq__, b["metrics"], ["x_ms", "y_ms"]))
    assert [k for k in b["metrics"]][0] is [k for k in a["metrics"]][0]
    assert list(c["metrics"].items()) == [("y_ms", 4.0), ("x_ms", 5.0)]
