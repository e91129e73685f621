"""``--force`` and the ranks' dumps (``dumps/rank<R>.<id>.json``, ``dumps/request.json``, issue 24): they are
ddpdoctor's files, replaced with the run; a foreign file among them keeps everything; an in-rank ``--force`` replaces
only that rank's dumps."""

from __future__ import annotations

import pytest

from ddpdoctor.cli.trace_cmd import _prepare_out, _prepare_rank_out
from ddpdoctor.errors import UsageError


def _run(out):
    (out / "ranks").mkdir(parents=True)
    (out / "dumps").mkdir()
    for name in (
        "manifest.json",
        "ranks/rank0.json",
        "ranks/rank1.json",
        "dumps/request.json",
        "dumps/rank0.hang-1796161114-3.json",
        "dumps/rank1.hang-1796161114-3.json",
        "dumps/rank1.exception-1796161114508.json",
        "dumps/.rank0.signal-1796161114508.json.a1b2c3d4.tmp",  # an unfinished atomic write
        "dumps/.request.json.zz_y0001.tmp",
    ):
        (out / name).write_text("{}")
    return out


def _everything(out):
    return {str(p.relative_to(out)) for p in out.rglob("*")}


def test_force_replaces_a_run_with_its_dumps(tmp_path):
    out = _run(tmp_path / "run")
    _prepare_out(out, force=True, multi_node=False)
    assert not (out / "dumps").exists()
    assert not any(name.startswith("dumps") for name in _everything(out))


@pytest.mark.parametrize("name", ["notes.txt", "rank0.json.bak", "rank0.Hang.json", "rank0..json"])
def test_force_keeps_everything_when_dumps_holds_a_foreign_file(tmp_path, name):
    out = _run(tmp_path / "run")
    (out / "dumps" / name).write_text("mine")
    before = _everything(out)
    with pytest.raises(UsageError) as info:
        _prepare_out(out, force=True, multi_node=False)
    assert name in str(info.value) and "\n" not in str(info.value)
    assert _everything(out) == before


def test_in_rank_force_replaces_only_that_ranks_dumps(tmp_path):
    out = _run(tmp_path / "run")
    _prepare_rank_out(out, 1, force=True)
    left = _everything(out)
    assert "dumps/rank1.hang-1796161114-3.json" not in left and "dumps/rank1.exception-1796161114508.json" not in left
    assert {"dumps/rank0.hang-1796161114-3.json", "dumps/request.json", "ranks/rank0.json"} <= left
