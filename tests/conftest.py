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
    import tempfile

    if "DDPDOCTOR_TEST_CONFIG_HOME" not in os.environ:
        home = tempfile.mkdtemp(prefix="ddpdoctor-test-config-")
        os.environ["DDPDOCTOR_TEST_CONFIG_HOME"] = home
        os.environ["XDG_CONFIG_HOME"] = home
