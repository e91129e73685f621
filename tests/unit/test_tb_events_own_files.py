"""``view`` (``write_events``) deletes only the event files it wrote, never through a link (issue 23, item 2): a
symlinked ``tensorboard/`` or ``tensorboard/rank<R>`` is refused in one line with nothing touched, and the user's
own files inside ``tensorboard/rank<R>/`` are kept when the event files are written again."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from ddpdoctor.errors import DDPDoctorError
from ddpdoctor.tensorboard.events import write_events

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import run_cli  # noqa: E402

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "ddp_gloo_2rank"
pytestmark = pytest.mark.skipif(not FIXTURE.is_dir(), reason="recorded fixture ddp_gloo_2rank is missing")


@pytest.fixture
def run_dir(tmp_path):
    return Path(shutil.copytree(FIXTURE, tmp_path / "run"))


def _events(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("events.out.tfevents.*"))


def test_a_symlinked_tensorboard_folder_is_refused_and_the_files_behind_it_kept(run_dir, tmp_path):
    outside = tmp_path / "outside_tb"
    (outside / "rank0").mkdir(parents=True)
    (outside / "rank0" / "important.txt").write_text("the user's")
    (run_dir / "tensorboard").symlink_to("../outside_tb")
    with pytest.raises(DDPDoctorError) as info:
        write_events(run_dir)
    assert "symbolic link" in str(info.value) and "tensorboard" in str(info.value) and "\n" not in str(info.value)
    assert (outside / "rank0" / "important.txt").read_text() == "the user's"
    assert sorted(p.name for p in outside.rglob("*")) == ["important.txt", "rank0"]  # nothing written there


def test_a_symlinked_rank_folder_is_refused_and_its_target_kept(run_dir, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "events.out.tfevents.1.host.1.0").write_text("the user's own log")
    (run_dir / "tensorboard").mkdir()
    (run_dir / "tensorboard" / "rank0").symlink_to(target)
    with pytest.raises(DDPDoctorError, match="symbolic link"):
        write_events(run_dir)
    assert (target / "events.out.tfevents.1.host.1.0").read_text() == "the user's own log"


def test_the_users_files_in_an_event_folder_are_kept_when_written_again(run_dir):
    folder = run_dir / "tensorboard" / "rank0"
    write_events(run_dir)
    first = _events(folder)
    (folder / "notes.txt").write_text("the user's")
    (folder / "plots").mkdir()
    (folder / "plots" / "loss.png").write_bytes(b"png")
    write_events(run_dir)
    assert (folder / "notes.txt").read_text() == "the user's"
    assert (folder / "plots" / "loss.png").read_bytes() == b"png"
    assert len(_events(folder)) == 1  # the old event file replaced, not added to
    assert len(first) == 1
    assert not [p for p in (run_dir / "tensorboard").iterdir() if p.name.startswith(".")]  # no temporaries left


def test_a_folder_named_like_the_old_aside_folder_is_kept(run_dir):
    write_events(run_dir)
    aside = run_dir / "tensorboard" / ".rank0.old"
    aside.mkdir()
    (aside / "mine.txt").write_text("the user's")
    write_events(run_dir)
    assert (aside / "mine.txt").read_text() == "the user's"


@pytest.mark.timeout(90)
def test_view_refuses_a_symlinked_tensorboard_folder_in_one_line(run_dir, tmp_path):
    outside = tmp_path / "outside_tb"
    (outside / "rank0").mkdir(parents=True)
    (outside / "rank0" / "important.txt").write_text("the user's")
    (run_dir / "tensorboard").symlink_to("../outside_tb")
    result = run_cli("view", str(run_dir), "--port", "0", timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "symbolic link" in result.stderr
    assert (outside / "rank0" / "important.txt").read_text() == "the user's"


def test_a_file_named_tensorboard_is_refused_and_kept(run_dir):
    (run_dir / "tensorboard").write_text("the user's notes")
    with pytest.raises(DDPDoctorError, match="a file, not a folder"):
        write_events(run_dir)
    assert (run_dir / "tensorboard").read_text() == "the user's notes"
