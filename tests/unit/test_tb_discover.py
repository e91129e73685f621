"""The dashboard finds every run directory under a logdir, and serves a run only by a name it found."""

from __future__ import annotations

import os

import pytest

from ddpdoctor.tensorboard.discover import find_runs, resolve_run


def _run(path, marker="manifest.json"):
    path.mkdir(parents=True, exist_ok=True)
    if marker == "manifest.json":
        (path / "manifest.json").write_text("{}")
    else:
        (path / "ranks").mkdir()
    return path


def test_finds_runs_by_manifest_or_ranks_folder_at_any_depth(tmp_path):
    _run(tmp_path / "exp1")
    _run(tmp_path / "sweep" / "lr0.1", marker="ranks")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("not a run")
    runs = find_runs(tmp_path)
    assert runs == {
        "exp1": (tmp_path / "exp1").resolve(),
        "sweep/lr0.1": (tmp_path / "sweep" / "lr0.1").resolve(),
    }


def test_the_logdir_itself_is_run_dot_and_its_insides_are_not_runs(tmp_path):
    _run(tmp_path)
    _run(tmp_path / "tensorboard" / "rank0")  # ddpdoctor's own event folder, never a run
    _run(tmp_path / "nested")  # inside a run: not searched
    assert list(find_runs(tmp_path)) == ["."]


def test_hidden_folders_and_symlinks_are_not_followed(tmp_path):
    outside = _run(tmp_path / "outside")
    logdir = tmp_path / "logdir"
    logdir.mkdir()
    _run(logdir / ".cache" / "old")
    os.symlink(outside, logdir / "link")
    assert find_runs(logdir) == {}


@pytest.mark.parametrize("name", ["../outside", "/etc", "outside", "", None, "exp1/../../outside"])
def test_a_request_cannot_name_a_path_outside_the_runs_found(tmp_path, name):
    _run(tmp_path / "outside")
    logdir = tmp_path / "logdir"
    _run(logdir / "exp1")
    assert resolve_run(logdir, name) is None
    assert resolve_run(logdir, "exp1") == (logdir / "exp1").resolve()


def test_missing_logdir_has_no_runs(tmp_path):
    assert find_runs(tmp_path / "nope") == {}
