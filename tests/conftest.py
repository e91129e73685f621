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
