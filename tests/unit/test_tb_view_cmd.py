"""``ddpdoctor view``: user mistakes are one line and exit 2, before TensorBoard starts."""

from __future__ import annotations

import socket

from helpers import run_cli


def test_not_a_run_directory(tmp_path):
    result = run_cli("view", str(tmp_path), timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"ddpdoctor: error: {tmp_path}: not a ddpdoctor run directory (no manifest.json or ranks/ in it)"
    ]


def test_port_taken(tmp_path):
    (tmp_path / "ranks").mkdir()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli("view", str(tmp_path), "--port", str(port), timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"ddpdoctor: error: port {port} on 127.0.0.1 is already in use; pick another with --port"
    ]
    assert not (tmp_path / "tensorboard").exists()  # nothing written for a server that never started


def test_listed_in_help():
    result = run_cli("--help", timeout=60)
    assert result.returncode == 0 and "view" in result.stdout
    result = run_cli("view", "--help", timeout=60)
    assert "--port" in result.stdout and "--host" in result.stdout and "127.0.0.1" in result.stdout
