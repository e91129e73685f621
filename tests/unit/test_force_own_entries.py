"""``ddpdoctor trace --force`` deletes only regular files ddpdoctor writes, by type and name, and only the folders it
makes, once they hold nothing else (issue 23, item 3). A directory with a ddpdoctor-like name, a hidden name that is
not one of its temporaries, or a symbolic link anywhere it would touch: it refuses with one line naming the entry,
before deleting anything, and never follows the link."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ddpdoctor.cli.trace_cmd import _prepare_out, _prepare_rank_out
from ddpdoctor.errors import UsageError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import run_cli  # noqa: E402

TRACE0 = "rank0.1795974917739.pt.trace.json.gz"
TRACE1 = "rank1.1795974917721.pt.trace.json.gz"


def _run(out: Path) -> Path:
    """A finished 2-rank run directory as ddpdoctor leaves it, with a view's event files."""
    for folder in ("ranks", "nodes", "tensorboard/rank0", "tensorboard/rank1"):
        (out / folder).mkdir(parents=True)
    for name in (
        "manifest.json",
        "ranks/rank0.json",
        "ranks/rank1.json",
        "ranks/rank0.summary.json",
        "ranks/rank1.summary.json",
        "nodes/node0.json",
        "tensorboard/rank0/events.out.tfevents.1795974918.host.4242.0",
        "tensorboard/rank1/events.out.tfevents.1795974918.host.4242.1",
        TRACE0,
        TRACE1,
    ):
        (out / name).write_text("{}")
    return out


def _everything(out: Path) -> set[str]:
    return {str(p.relative_to(out)) for p in out.rglob("*")}


def _refused(out: Path, match: str, *, rank: int | None = None) -> str:
    before = _everything(out)
    with pytest.raises(UsageError) as info:
        if rank is None:
            _prepare_out(out, force=True, multi_node=False)
        else:
            _prepare_rank_out(out, rank, force=True)
    message = str(info.value)
    assert "\n" not in message and match in message, message
    assert _everything(out) == before  # nothing deleted, nothing made
    return message


def test_force_replaces_a_run_with_its_leftover_temporaries(tmp_path):
    out = _run(tmp_path / "run")
    for name in (
        ".manifest.json.a1b2c3d4.tmp",  # rundir.atomic_write_bytes
        f".{TRACE0}.k9_x0zz1.tmp",  # rundir.atomic_gzip_file
        ".rank0.q1w2e3r4.json",  # the profiler's export, before its rename
        ".rank0.q1w2e3r4.json.tmp",  # Kineto's own temporary
        ".ddpdoctor-write-test-123",
        "ranks/.rank0.json.zzzzzzzz.tmp",
        "ranks/.rank1.summary.json.abc_1234.tmp",
        "nodes/.node0.json.00000000.tmp",
    ):
        (out / name).write_text("partial")
    (out / "tensorboard" / ".rank0.old").mkdir()
    (out / "tensorboard" / ".rank0.old" / "events.out.tfevents.1.host.1.0").write_bytes(b"")
    (out / "tensorboard" / ".rank1.4242.tmp").mkdir()
    _prepare_out(out, force=True, multi_node=False)
    assert _everything(out) == {"ranks", "nodes"}  # made again, empty


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda o: (o / "rank0.5.pt.trace.json").mkdir(), id="directory named like a trace"),
        pytest.param(lambda o: (o / "manifest.json").unlink() or (o / "manifest.json").mkdir(), id="manifest dir"),
        pytest.param(lambda o: (o / "ranks" / ".backup.tmp").mkdir(), id="hidden .tmp directory in ranks"),
        pytest.param(lambda o: (o / "ranks" / ".keep.old" / "sub").mkdir(parents=True), id=".old dir in ranks"),
        pytest.param(lambda o: (o / "ranks" / ".backup.tmp").write_text("x"), id="hidden .tmp file not ours"),
        pytest.param(
            lambda o: (o / "ranks" / "rank0.json").unlink() or (o / "ranks" / "rank0.json").mkdir(),
            id="rank file is a directory",
        ),
        pytest.param(lambda o: (o / "tensorboard" / "rank0" / "sub").mkdir(), id="folder in an event folder"),
        pytest.param(
            lambda o: (o / "tensorboard" / ".rank0.old" / "notes").mkdir(parents=True),
            id="folder in a moved-aside event folder",
        ),
    ],
)
def test_force_refuses_a_directory_it_did_not_make(tmp_path, make):
    out = _run(tmp_path / "run")
    make(out)
    for entry in sorted(out.rglob("*"), key=lambda p: -len(p.parts)):
        if entry.is_dir() and not any(entry.iterdir()) and entry.name not in ("ranks", "nodes"):
            (entry / "thesis.tex").write_text("x")  # the user's work inside it
    _refused(out, "not ddpdoctor's")


def test_the_user_directory_named_like_a_trace_survives_with_its_file(tmp_path):
    out = _run(tmp_path / "run")
    (out / "rank0.5.pt.trace.json").mkdir()
    (out / "rank0.5.pt.trace.json" / "thesis.tex").write_text("x")
    message = _refused(out, "rank0.5.pt.trace.json")
    assert "a directory" in message
    assert (out / "rank0.5.pt.trace.json" / "thesis.tex").read_text() == "x"


def test_a_symlinked_ranks_folder_is_refused_and_nothing_is_deleted(tmp_path):
    out = _run(tmp_path / "run")
    elsewhere = tmp_path / "elsewhere"
    (out / "ranks").rename(elsewhere)
    (out / "ranks").symlink_to(elsewhere)
    message = _refused(out, "symbolic link")
    assert "ranks" in message
    assert (out / "nodes" / "node0.json").exists() and (elsewhere / "rank0.json").exists()


@pytest.mark.parametrize("where", [TRACE0, "manifest.json", "ranks/rank0.json", "tensorboard/rank0"])
def test_a_symlink_with_an_own_name_is_refused_and_its_target_kept(tmp_path, where):
    out = _run(tmp_path / "run")
    target = tmp_path / "important"
    if (out / where).is_dir():
        target.mkdir()
        (target / "events.out.tfevents.1.host.1.0").write_text("the user's")
        for f in (out / where).iterdir():
            f.unlink()
        (out / where).rmdir()
    else:
        target.write_text("the user's")
        (out / where).unlink()
    (out / where).symlink_to(target)
    _refused(out, "symbolic link")
    assert target.exists()


def test_in_rank_force_replaces_only_that_ranks_files(tmp_path):
    out = _run(tmp_path / "run")
    _prepare_rank_out(out, 0, force=True)
    left = _everything(out)
    assert "ranks/rank0.json" not in left and TRACE0 not in left and "ranks/rank0.summary.json" not in left
    assert {"ranks/rank1.json", TRACE1, "manifest.json", "nodes/node0.json"} <= left


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda o: (o / "rank0.5.pt.trace.json").mkdir(), id="directory named like a trace"),
        pytest.param(
            lambda o: (o / "ranks" / "rank0.json").unlink() or (o / "ranks" / "rank0.json").mkdir(),
            id="its rank file is a directory",
        ),
        pytest.param(lambda o: (o / "ranks" / ".keep.old").mkdir(), id="hidden directory in ranks"),
    ],
)
def test_in_rank_force_refuses_what_is_not_ours(tmp_path, make):
    out = _run(tmp_path / "run")
    make(out)
    _refused(out, "not ddpdoctor's", rank=0)


def test_in_rank_force_refuses_a_symlinked_ranks_folder(tmp_path):
    out = _run(tmp_path / "run")
    elsewhere = tmp_path / "elsewhere"
    (out / "ranks").rename(elsewhere)
    (out / "ranks").symlink_to(elsewhere)
    _refused(out, "symbolic link", rank=0)
    assert (elsewhere / "rank0.json").exists()


def test_the_command_refuses_in_one_line(tmp_path):
    out = _run(tmp_path / "run")
    (out / "rank0.5.pt.trace.json").mkdir()
    (out / "rank0.5.pt.trace.json" / "thesis.tex").write_text("x")
    script = tmp_path / "job.py"
    script.write_text("print('ran')\n")
    result = run_cli("trace", "--force", "--out", str(out), str(script), timeout=60)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "ran" not in result.stdout
    assert len(result.stderr.strip().splitlines()) == 1 and "rank0.5.pt.trace.json" in result.stderr
    assert os.path.exists(out / "rank0.5.pt.trace.json" / "thesis.tex") and (out / "manifest.json").exists()


def _with_a_second_group(out: Path) -> Path:
    """Another process group's files (rundir.group_dir): groups/group1.json and groups/group1/ in a run's layout."""
    group = out / "groups" / "group1"
    (group / "ranks").mkdir(parents=True)
    (out / "groups" / "group1.json").write_text("{}")
    (group / "ranks" / "rank0.json").write_text("{}")
    (group / "rank0.1795974919000.pt.trace.json.gz").write_text("{}")
    return out


def test_force_replaces_the_other_process_groups_files(tmp_path):
    out = _with_a_second_group(_run(tmp_path / "run"))
    _prepare_out(out, force=True, multi_node=False)
    assert _everything(out) == {"ranks", "nodes"}


def test_force_refuses_a_foreign_file_in_another_groups_folder(tmp_path):
    out = _with_a_second_group(_run(tmp_path / "run"))
    (out / "groups" / "group1" / "notes.txt").write_text("the user's")
    _refused(out, "groups/group1/notes.txt")
