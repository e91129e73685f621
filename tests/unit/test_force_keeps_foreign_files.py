"""``ddpdoctor trace --force`` replaces only the files ddpdoctor wrote (issue 13, item 1): a file of the user's
inside ``ranks/``, ``nodes/`` or ``tensorboard/`` makes it refuse, and nothing is deleted."""

from __future__ import annotations

import pytest

from ddpdoctor import owned
from ddpdoctor.cli.trace_cmd import _prepare_out
from ddpdoctor.errors import UsageError


def _run(out):
    (out / "ranks").mkdir(parents=True)
    (out / "nodes").mkdir()
    (out / "tensorboard" / "rank0").mkdir(parents=True)
    (out / "manifest.json").write_text("{}")
    (out / "ranks" / "rank0.json").write_text("{}")
    (out / "ranks" / "rank0.summary.json").write_text("{}")
    (out / "nodes" / "node0.json").write_text("{}")
    (out / "tensorboard" / "rank0" / "events.out.tfevents.1.host.1.0").write_bytes(b"")
    (out / "rank0.1795974917739.pt.trace.json.gz").write_bytes(b"")
    return out


def test_force_replaces_a_ddpdoctor_run(tmp_path):
    out = _run(tmp_path / "run")
    _prepare_out(out, force=True, multi_node=False)
    assert not (out / "manifest.json").exists() and not list(out.glob("rank*.pt.trace.json.gz"))
    assert not (out / "ranks" / "rank0.json").exists()


@pytest.mark.parametrize(
    "foreign", ["ranks/notes.txt", "nodes/keep.json", "tensorboard/mine.txt", "tensorboard/rank0/plot.png"]
)
def test_force_refuses_when_a_subfolder_holds_a_foreign_file(tmp_path, foreign):
    out = _run(tmp_path / "run")
    (out / foreign).write_text("the user's")
    with pytest.raises(UsageError, match="not ddpdoctor's"):
        _prepare_out(out, force=True, multi_node=False)
    assert (out / foreign).read_text() == "the user's"
    assert (out / "manifest.json").exists() and (out / "ranks" / "rank0.json").exists()  # nothing deleted
    assert out / foreign.split("/")[0] not in owned.ddpdoctor_owned(out)
