"""Bad input to `ddpdoctor trace`: one clear line, exit 2, no traceback, nothing of the user's overwritten."""

from __future__ import annotations

import os

import pytest
from helpers import run_cli, write_script

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _one_error_line(result):
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ddpdoctor: error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_missing_script(tmp_path):
    assert "no such file" in _one_error_line(run_cli("trace", "--out", str(tmp_path / "r"), "nope.py"))


def test_syntax_error(tmp_path):
    # exit 1 as `python bad.py` would (issue 13, item 11), one line, nothing written
    script = write_script(tmp_path / "bad.py", "x = 1\ndef f(:\n    pass\n")
    result = run_cli("trace", "--out", str(tmp_path / "r"), str(script))
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ddpdoctor: error: ") and "Traceback" not in result.stderr
    assert "bad.py:2" in lines[0] and "SyntaxError" in lines[0]
    assert not (tmp_path / "r").exists()


def test_unknown_flag(tmp_path):
    script = write_script(tmp_path / "ok.py", "print('hi')\n")
    assert "--frobnicate" in _one_error_line(run_cli("trace", "--frobnicate", str(script)))


def test_missing_module(tmp_path):
    assert "no_such_mod" in _one_error_line(
        run_cli("trace", "--out", str(tmp_path / "r"), "-m", "no_such_mod")
    )


@pytest.mark.skipif(
    os.geteuid() == 0, reason="root can write anywhere; covered by the file-as-out case below"
)
def test_unwritable_out(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    script = write_script(tmp_path / "ok.py", "print('hi')\n")
    assert "cannot write" in _one_error_line(run_cli("trace", "--out", str(locked / "r"), str(script)))


def test_out_is_a_file(tmp_path):
    target = tmp_path / "file"
    target.write_text("precious")
    script = write_script(tmp_path / "ok.py", "print('hi')\n")
    assert "not a directory" in _one_error_line(run_cli("trace", "--out", str(target), str(script)))
    assert target.read_text() == "precious"


def test_out_under_a_file_cannot_be_created(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    script = write_script(tmp_path / "ok.py", "print('hi')\n")
    assert "cannot write" in _one_error_line(run_cli("trace", "--out", str(blocker / "r"), str(script)))


def test_refuses_existing_run_without_force(tmp_path):
    script = write_script(tmp_path / "ok.py", "print('hi')\n")
    out = tmp_path / "run"
    assert run_cli("trace", "--out", str(out), str(script)).returncode == 0
    before = (out / "manifest.json").read_bytes()
    assert "--force" in _one_error_line(run_cli("trace", "--out", str(out), str(script)))
    assert (out / "manifest.json").read_bytes() == before
    (out / "notes.txt").write_text("the user's own file")
    forced = run_cli("trace", "--force", "--out", str(out), str(script))
    assert forced.returncode == 2 and "not ddpdoctor's" in forced.stderr  # never deletes what is not ours
    (out / "notes.txt").unlink()
    assert run_cli("trace", "--force", "--out", str(out), str(script)).returncode == 0


def test_refuses_foreign_directory(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "data.csv").write_text("1,2")
    script = write_script(tmp_path / "ok.py", "print('hi')\n")
    _one_error_line(run_cli("trace", "--out", str(out), str(script)))
    assert (out / "data.csv").read_text() == "1,2"
