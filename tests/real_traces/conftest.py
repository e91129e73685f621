"""The recorded GPU traces in ``../shared/traces`` (relative to the repository root); tests skip without
them."""

from __future__ import annotations

from pathlib import Path

import pytest

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    if not TRACES.is_dir():
        pytest.skip(f"real GPU traces not found at {TRACES}")
    return TRACES


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "real_traces" in str(item.fspath):
            item.add_marker(pytest.mark.real_traces)
