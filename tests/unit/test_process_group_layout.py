"""The folders of a job's other process groups (``groups/``, issue 23 item 1) are ddpdoctor's: ``trace --force``
replaces them with the run, and refuses, deleting nothing, when one holds a file of the user's."""

from __future__ import annotations

import pytest

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
