"""One colour per part of a step, the same in every chart: the HTML report's bars and timeline, and the dashboard
(``tensorboard/report.py`` hands ``PHASES`` to its charts as ``phase_colors``). A part keeps its colour whichever
parts a run has (exposed communication is red in every run)."""

from __future__ import annotations

# metric key (as ``metrics.catalog`` names the breakdown and DataParallel stages) -> colour
PHASES: dict[str, str] = {
    "dataloader_ms": "#edc948",  # data wait: yellow
    "forward_ms": "#4e79a7",  # blue
    "backward_ms": "#59a14f",  # green
    "optimizer_ms": "#b07aa1",  # purple
    "exposed_comm_ms": "#e15759",  # red
    "other_ms": "#c9c3bf",  # idle or other work: grey
    "dp_scatter_ms": "#9c755f",
    "dp_replicate_ms": "#76b7b2",
    "dp_parallel_apply_ms": "#86bcb6",
    "dp_gather_ms": "#d37295",
    "dp_backward_reduce_ms": "#8cd17d",
    # communication on the timeline's comm lane
    "comm_transfer": "#f28e2b",  # data moving: orange
    "comm_wait": "#ffbe7d",  # waiting for late peers: light orange
}
# the timeline's lanes (``metrics.timeline``) by their metric key
LANE_KEYS = {
    "dataloader": "dataloader_ms",
    "forward": "forward_ms",
    "backward": "backward_ms",
    "optimizer": "optimizer_ms",
    "exposed_comm": "exposed_comm_ms",
    "idle": "other_ms",
    "dp_gather": "dp_gather_ms",
    "transfer": "comm_transfer",
    "wait": "comm_wait",
}
FALLBACK = "#9e9e9e"


def color(key: str) -> str:
    """The colour of a step part, by its metric key (``forward_ms``) or lane (``forward``)."""
    return PHASES.get(key) or PHASES.get(LANE_KEYS.get(key, ""), FALLBACK)
