"""``ddpdoctor view``: user mistakes are one line and exit 2, before TensorBoard starts."""

from __future__ import annotations

import socket

import pytest
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


@pytest.mark.parametrize("host", ["bad..host", "a" * 300, "no-such-host.invalid", "192.0.2.1"])
@pytest.mark.parametrize("port", ["6006", "0"])
def test_a_bad_host_is_one_line(tmp_path, host, port):
    (tmp_path / "ranks").mkdir()
    result = run_cli("view", str(tmp_path), "--host", host, "--port", port, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("ddpdoctor: error: cannot listen on ") and "--host" in line, line
    assert not (tmp_path / "tensorboard").exists()


def test_the_banner_points_to_the_perfetto_export_of_this_run():
    from ddpdoctor.cli.view_cmd import banner

    url = "http://127.0.0.1:6006/"
    lines = banner("runs/my run", url, "127.0.0.1").splitlines()
    assert lines[0] == f"ddpdoctor: TensorBoard at {url} (Ctrl-C to stop)"
    (timeline,) = [line for line in lines if line.lstrip().startswith("timeline:")]
    # the command to copy, for this run (quoted for the shell), and where to open what it writes
    assert "ddpdoctor export 'runs/my run' --perfetto run.perfetto.json, then open it in ui.perfetto.dev" in timeline
    assert f"{url}#pytorch_profiler needs the internet" in timeline
    assert "warning" not in banner("r", url, "127.0.0.1") and "every network interface" in banner("r", url, "0.0.0.0")
