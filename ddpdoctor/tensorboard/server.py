"""Start TensorBoard on one run directory, in this process: what ``ddpdoctor view`` runs.

The logdir is the run directory itself, so TensorBoard shows its profiler traces (PyTorch Profiler tab, worker
``rank<R>``), the event files under ``tensorboard/rank<R>`` (Scalars, Text) and the ``ddpdoctor`` dashboard.
"""

from __future__ import annotations

import errno
import os
import re
import socket
from pathlib import Path

from ddpdoctor import escape
from ddpdoctor.errors import DDPDoctorError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 6006


def check_port_free(host: str, port: int) -> None:
    """A one-line ``DDPDoctorError`` when ``host:port`` cannot be listened on (taken, or a bad address); port 0
    (any free port) checks the address only."""
    shown = escape.terminal(host)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise DDPDoctorError(f"cannot listen on {shown}: {exc.strerror} (--host)") from None
    except (UnicodeError, ValueError):  # the IDNA codec refuses it: empty or over-long labels ("bad..host")
        raise DDPDoctorError(f"cannot listen on {shown}: not a valid host name or address (--host)") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As the server will: SO_REUSEADDR, so a port in TIME_WAIT after a previous run still counts as free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise DDPDoctorError(f"port {port} on {shown} is already in use; pick another with --port") from None
            raise DDPDoctorError(f"cannot listen on {shown}:{port}: {exc.strerror or exc} (--host)") from None


def unreadable_traces(run_dir: Path) -> list[str]:
    """Why each trace under ``run_dir`` that the PyTorch Profiler tab would list cannot be read, one line each
    (ddpdoctor's own reader: a corrupt or truncated gzip file, a file that is not JSON)."""
    from ddpdoctor.errors import TraceError
    from ddpdoctor.load.readfile import read_bytes

    found = []
    for path in sorted(run_dir.rglob("*.pt.trace.json*")):
        if not _TRACE.search(path.name) or any(part.startswith(".") for part in path.relative_to(run_dir).parts):
            continue
        if not path.is_file():
            continue
        try:
            read_bytes(path)
        except TraceError as exc:
            found.append(str(exc))
    return found


_TRACE = re.compile(r"\.pt\.trace\.json(\.gz)?$")


def start(logdir: Path, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> str:
    """Start TensorBoard in a background thread of this process and return its URL."""
    # The profiler plugin logs every file it parses (INFO), and a trace it cannot parse as a warning with chained
    # tracebacks from its worker processes: ddpdoctor says that in one line itself (``unreadable_traces``).
    os.environ.setdefault("TORCH_PROFILER_LOG_LEVEL", "ERROR")
    from tensorboard import default, program

    tb = program.TensorBoard(plugins=default.get_plugins())
    # --load_fast=false: TensorBoard's Python reader, not its separate data-server process. ddpdoctor's event files
    # are a few KB per rank, read at once either way; with the default ("auto") TensorBoard starts that process and
    # prints "NOTE: Using experimental fast data loading logic" on every start.
    tb.configure(
        # --reload_multifile: the series events (tensorboard/live.py) grow beside the run's own event files
        argv=[
            None,
            "--logdir",
            str(logdir),
            "--host",
            host,
            "--port",
            str(port),
            "--load_fast=false",
            "--reload_multifile=true",
        ]
    )
    try:
        return tb.launch()
    except program.TensorBoardServerException as exc:
        raise DDPDoctorError(f"TensorBoard could not start: {exc.msg}") from None
