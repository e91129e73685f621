"""Pytest configuration shared by all tests. Helpers live in tests/helpers.py (`from helpers import run_cli`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Make tests/helpers.py and tests/dp_harness.py importable from every test folder.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import run_cli  # noqa: E402


@pytest.fixture
def cli():
    return run_cli


def pytest_configure(config):
    """Every trace the tests run writes its command mark's key (``ddpdoctor.capture.command_mark``) under a
    temporary ``XDG_CONFIG_HOME``, never into the real ``~/.config/ddpdoctor`` of whoever runs the suite."""
    import os

    # Tests send Ctrl-C (SIGINT) to the jobs and views they start. A suite started in the background of a
    # non-interactive shell (`bash .ci/run &`, nohup) inherits SIGINT ignored, and so would every process it starts:
    # Python keeps an ignored SIGINT ignored, and the job never sees the Ctrl-C (2026-12-04: three tests hung until
    # their timeouts that way). Its own handler is reset to the default at exec, so this restores it for them.
    import signal
    import tempfile

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if "DDPDOCTOR_TEST_CONFIG_HOME" not in os.environ:
        home = tempfile.mkdtemp(prefix="ddpdoctor-test-config-")
        os.environ["DDPDOCTOR_TEST_CONFIG_HOME"] = home
        os.environ["XDG_CONFIG_HOME"] = home


def pytest_unconfigure(config):
    import os
    import shutil

    home = os.environ.get("DDPDOCTOR_TEST_CONFIG_HOME", "")
    if home.startswith(tempfile_prefix()) and os.environ.get("XDG_CONFIG_HOME") == home:
        shutil.rmtree(home, ignore_errors=True)


def tempfile_prefix() -> str:
    import os
    import tempfile

    return os.path.join(tempfile.gettempdir(), "ddpdoctor-test-config-")
