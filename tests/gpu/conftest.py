"""tests/gpu: the GPU checks (marked ``gpu``, skipped without CUDA) and the unit tests of their logic (run
everywhere). The modules here are imported by name (``import gpu_evaluate``), as the scripts import them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

SKIP_REASON = (
    "no CUDA device: the GPU checks need a GPU machine (bash tests/gpu/run.sh there; see the README, Development)"
)


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu_items and not _cuda_available():
        skip = pytest.mark.skip(reason=SKIP_REASON)
        for item in gpu_items:
            item.add_marker(skip)
