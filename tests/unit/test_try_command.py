"""What `ddpdoctor try` runs: only a `ddpdoctor trace` command line that trace's own parser accepts, from an
absolute directory, and without asking only when it carries the mark of this user's own `trace` (an HMAC keyed by a
secret in $XDG_CONFIG_HOME/ddpdoctor). A run directory is data anyone can write (issue 23 items 4 and 14)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from ddpdoctor import rundir
from ddpdoctor.capture import command_mark
from ddpdoctor.errors import UsageError
from ddpdoctor.trial import plan


@pytest.fixture(autouse=True)
def config_home(tmp_path, monkeypatch):
    home = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    return home


def _run(tmp_path: Path, **manifest) -> Path:
    run = tmp_path / "run"
    (run / "ranks").mkdir(parents=True, exist_ok=True)
    (tmp_path / "train.py").write_text("print('hi')\n")
    data = {
        "schema_version": rundir.SCHEMA_VERSION,
        "command": ["ddpdoctor", "trace", "--out", "run", "--wait", "1", "train.py", "--lr", "0.1"],
        "cwd": str(tmp_path),
        "capture": {"wait": 1, "warmup": 2, "active": 5, "repeat": 1},
        "world_size": 1,
        "ranks": [],
        **manifest,
    }
    (run / "manifest.json").write_text(json.dumps(data))
    return run


def test_a_good_manifest_gives_the_command(tmp_path):
    cmd = plan.read_run(str(_run(tmp_path)))
    assert cmd.target == ("train.py", "--lr", "0.1") and cmd.own == ("--wait", "1") and cmd.cwd == tmp_path
    assert cmd.default_max_steps() == 1 + 2 + 5 + plan.STEPS_AFTER_WINDOW


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"capture": [1, 2]}, "capture"),
        ({"capture": "wait"}, "capture"),
        ({"command": ["python", "train.py"]}, "command"),
        ({"command": ["/bin/ddpdoctor", "trace", "train.py"]}, "command"),
        ({"command": "ddpdoctor trace train.py"}, "command"),
        ({"command": ["ddpdoctor", "trace", "--no-such-option", "train.py"]}, "command"),
        ({"command": ["ddpdoctor", "trace", "--help"]}, "command"),
        ({"command": ["ddpdoctor", "trace", "--hang-timeout", "nan", "train.py"]}, "command"),
        ({"command": ["ddpdoctor", "trace", "--set", "torch.intra_op_threads=" + "9" * 30, "train.py"]}, "command"),
        ({"command": ["ddpdoctor", "trace", "--out", "x"]}, "command"),
        ({"command": ["ddpdoctor", "trace", "--", "-m"]}, "command"),
        ({"command": ["ddpdoctor", "trace", "train.py", "a\x00b"]}, "command"),
        ({"cwd": "relative/dir"}, "cwd"),
        ({"cwd": 5}, "cwd"),
        ({"cwd": ["/tmp"]}, "cwd"),
    ],
)
def test_a_manifest_try_cannot_run_is_one_line_naming_the_field(tmp_path, fields, field):
    run = _run(tmp_path, **fields)
    with pytest.raises(UsageError) as raised:
        plan.read_run(str(run))
    message = str(raised.value)
    assert message.startswith(f"{run / 'manifest.json'}: {field}:") and "\n" not in message, message
    assert raised.value.exit_code == 2


def test_the_mark_holds_for_the_command_and_directory_trace_recorded(tmp_path, config_home):
    command = ["ddpdoctor", "trace", "--", "bash", "run.sh"]
    mark = command_mark.mark(command, "/work/job")
    assert mark and mark.startswith("hmac-sha256:")
    key = config_home / "ddpdoctor" / "trace-key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    assert command_mark.mark(command, "/work/job") == mark  # the same key next time
    manifest = {"command": command, "cwd": "/work/job", "command_mark": mark}
    assert command_mark.check(manifest) is None
    # any change to what would run, or where, breaks it
    for edited in (
        {**manifest, "cwd": "/tmp"},
        {**manifest, "command": ["ddpdoctor", "trace", "--", "bash", "-c", "id"]},
        {**manifest, "command_mark": mark[:-1] + ("0" if mark[-1] != "0" else "1")},
        {**manifest, "command_mark": "hmac-sha256:é"},
    ):
        assert "does not match" in command_mark.check(edited)
    assert "carries no mark" in command_mark.check({"command": command, "cwd": "/work/job"})


def test_another_users_key_does_not_verify(tmp_path, config_home, monkeypatch):
    manifest = {"command": ["ddpdoctor", "trace", "t.py"], "cwd": "/w"}
    manifest["command_mark"] = command_mark.mark(manifest["command"], "/w")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "someone-else"))
    assert command_mark.check(manifest) is not None and "no trace key" in command_mark.check(manifest)
    command_mark.mark(["x"], "/")  # this user gets a key of their own: still not the one that marked it
    assert "does not match" in command_mark.check(manifest)


def test_a_key_others_can_read_is_not_used(config_home):
    command_mark.mark(["ddpdoctor", "trace", "t.py"], "/w")
    key = config_home / "ddpdoctor" / "trace-key"
    os.chmod(key, 0o644)
    assert command_mark.mark(["ddpdoctor", "trace", "t.py"], "/w") is None  # and is not replaced
    assert key.exists() and "no trace key" in command_mark.check({"command_mark": "hmac-sha256:00"})


def test_no_home_to_keep_a_key_in_gives_no_mark(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(blocked))  # a file: the key's folder cannot be made
    assert command_mark.mark(["ddpdoctor", "trace", "t.py"], "/w") is None


def test_the_shown_command_cannot_hide_itself_from_the_terminal(tmp_path):
    """A planted argument with terminal escapes (erase the line, carriage return) is shown as text."""
    run = _run(tmp_path, command=["ddpdoctor", "trace", "--", "bash", "-c", "id\x1b[2K\r", "x"])
    lines = plan.describe(plan.read_run(str(run)))
    shown = "\n".join(lines)
    assert "\x1b" not in shown and "\r" not in shown and "\\x1b[2K\\x0d" in shown
    assert str(tmp_path) in shown and "bash -c" in shown


def test_as_ddp_does_not_start_as_many_ranks_as_a_rank_file_claims(tmp_path):
    from types import SimpleNamespace

    cmd = plan.read_run(str(_run(tmp_path)))
    analysis = SimpleNamespace(captures={0: {"dp": [{"device_ids": list(range(100_000))}]}})
    with pytest.raises(UsageError, match="lists 100000 devices; give the ranks with --nproc-per-node N"):
        plan.as_ddp(cmd, analysis, None)
    assert plan.as_ddp(cmd, analysis, 4).torchrun == ("--standalone", "--nproc-per-node", "4")
