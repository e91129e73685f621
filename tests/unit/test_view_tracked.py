"""``view`` never writes into a run directory that git tracks (the bundled samples: the checkout would turn dirty)
or that it cannot write: it serves a copy under the user's cache instead (issue 27)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers import SAMPLES

from ddpdoctor.cli import view_cmd

STRAGGLER = SAMPLES / "recorded" / "ddp_straggler"


def _git(cwd, *args):
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_run_committed_to_git_is_kept_unchanged_and_an_untracked_one_is_not(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(STRAGGLER, repo / "runs" / "committed")
    shutil.copytree(STRAGGLER, repo / "runs" / "scratch")
    _git(repo, "init", "-q")
    _git(repo, "add", "runs/committed")
    _git(repo, "-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-qm", "a run")
    assert view_cmd._keep_unchanged(repo / "runs" / "committed") == "tracked by git"
    assert view_cmd._keep_unchanged(repo / "runs" / "scratch") is None
    assert view_cmd._keep_unchanged(tmp_path) is None  # not in a repository at all


def test_the_served_copy_is_in_the_cache_and_leaves_the_run_as_it_was(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    run = tmp_path / "run"
    shutil.copytree(STRAGGLER, run)
    (run / "tensorboard").mkdir()
    (run / "tensorboard" / "old").write_text("x")
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    copy = view_cmd._served_copy(run)
    assert copy.is_relative_to(tmp_path / "cache" / "ddpdoctor" / "view") and copy.name == "run"
    assert (copy / "manifest.json").read_bytes() == (run / "manifest.json").read_bytes()
    assert not (copy / "tensorboard").exists()
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
    assert view_cmd._served_copy(run) == copy  # made afresh, in the same place


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_view_of_a_committed_run_serves_a_copy_and_the_checkout_stays_clean(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(STRAGGLER, repo / "run")
    _git(repo, "init", "-q")
    _git(repo, "add", "run")
    _git(repo, "-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-qm", "a run")
    text = _view_banner(repo / "run", tmp_path / "cache")
    assert "TensorBoard at" in text, text
    assert f"ddpdoctor export {repo / 'run'} --perfetto run.perfetto.json, then open it in ui.perfetto.dev" in text
    assert "tracked by git: it stays as it is" in text, text
    status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], capture_output=True, text=True)
    assert status.stdout == "" and not (repo / "run" / "tensorboard").exists()
    assert list((tmp_path / "cache" / "ddpdoctor" / "view").glob("*/run/tensorboard/rank0/events.out.tfevents.*"))


def _view_banner(run: Path, cache: Path, as_user: list[str] = ()) -> str:
    """What ``ddpdoctor view RUN --port 0`` prints up to its banner's last line (then it is stopped like Ctrl-C);
    ``as_user``: a command the view runs under (setpriv to another user)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_CACHE_HOME": str(cache)}
    proc = subprocess.Popen(
        [*as_user, sys.executable, "-m", "ddpdoctor", "view", str(run), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    lines = []
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.lstrip().startswith("timeline:"):  # the banner's last line
                break
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
    return "".join(lines)


NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _nobody_can_run_ddpdoctor() -> bool:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return False
    probe = subprocess.run([*NOBODY, sys.executable, "-c", "import ddpdoctor.cli"], capture_output=True, cwd="/")
    return probe.returncode == 0


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.skipif(not _nobody_can_run_ddpdoctor(), reason="needs root, setpriv, and ddpdoctor readable by nobody")
def test_view_of_a_run_it_cannot_write_serves_a_copy_and_leaves_the_run_as_it_was():
    """A run directory of another user (root's, mode 755) viewed by an unprivileged user (uid 65534): `view`
    cannot write its event files there, says so, and serves a copy from that user's cache."""
    top = Path(tempfile.mkdtemp(prefix="ddpdoctor-view-"))  # not under pytest's tmp_path: root's, mode 700
    try:
        top.chmod(0o755)
        run = top / "run"
        shutil.copytree(STRAGGLER, run)
        for p in [run, *run.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        cache = top / "cache"
        cache.mkdir()
        os.chown(cache, 65534, 65534)
        before = sorted((p.relative_to(run), p.stat().st_mtime_ns) for p in run.rglob("*"))
        text = _view_banner(run, cache, NOBODY)
        assert "TensorBoard at" in text, text
        assert "not writable: it stays as it is" in text, text
        assert sorted((p.relative_to(run), p.stat().st_mtime_ns) for p in run.rglob("*")) == before
        assert not (run / "tensorboard").exists()
        events = list((cache / "ddpdoctor" / "view").glob("*/run/tensorboard/rank0/events.out.tfevents.*"))
        assert events and all(e.stat().st_uid == 65534 for e in events)
    finally:
        shutil.rmtree(top, ignore_errors=True)
