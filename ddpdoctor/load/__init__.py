"""Read Kineto (torch.profiler) Chrome traces into pandas frames: ``load(path) -> Run``."""

from __future__ import annotations

from ddpdoctor.load.loader import load
from ddpdoctor.load.model import RankTrace, Run

__all__ = ["load", "Run", "RankTrace"]
