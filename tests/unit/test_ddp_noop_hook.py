"""``ddp_noop_hook``: whether DDP's communication hook is torch's noop_hook, read from DDP's logging data in the
capture when the run is analysed (so a summary written before the flag existed has it too)."""

from __future__ import annotations

import pytest

from ddpdoctor.metrics.capture import ddp_noop_hook


def _capture(**logging_data) -> dict:
    return {"rank": 0, "ddp": [{"module": "Net", "logging_data": {"world_size": 2, **logging_data}}]}


@pytest.mark.parametrize(
    ("capture", "expected"),
    [
        (_capture(comm_hook="noop_hook"), True),
        (_capture(comm_hook="fp16_compress_hook"), False),
        (_capture(comm_hook="my_noop_hook_wrapper"), False),  # a hook of the job's own: it may communicate
        (_capture(), False),  # no hook: DDP's own all-reduce
        ({"rank": 0, "ddp": []}, None),  # no DDP module captured: unknown, not False
        (None, None),  # no capture (a plain trace)
    ],
)
def test_only_torchs_noop_hook_is_flagged(capture, expected):
    assert ddp_noop_hook(capture) is expected
