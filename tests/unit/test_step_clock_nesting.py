"""An optimizer that steps another inside its own step (ZeroRedundancyOptimizer around its local Adam, a wrapper
such as a LARS/Lookahead shell) ends the iteration when the OUTER step ends (issue 26 item 1): torch's global step
hooks fire for the inner optimizer first, and counting it put the outer step's parameter broadcasts into the next
step. Hooks installed as the capture session installs them (pre- and post-hook)."""

from __future__ import annotations

import sys

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from ddpdoctor.capture.step_clock import StepClock


@pytest.fixture
def clock():
    clock = StepClock()
    events: list[str] = []

    def on_pre(optimizer, args, kwargs):
        clock.optimizer_started(optimizer, sys._getframe(1))

    def on_post(optimizer, args, kwargs):
        if clock.counts_optimizer(optimizer):
            events.append(f"tick after {type(optimizer).__name__}")
            clock.tick("optimizer", recording=False)

    handles = [register_optimizer_step_pre_hook(on_pre), register_optimizer_step_post_hook(on_post)]
    clock.events = events  # type: ignore[attr-defined]
    yield clock
    for h in handles:
        h.remove()


class Wrapper(torch.optim.Optimizer):
    """Steps an inner optimizer, then does its own work (what ZeRO's parameter broadcasts are)."""

    def __init__(self, params, after=None):
        params = list(params)
        super().__init__(params, {})
        self.inner = torch.optim.Adam(params, lr=1e-3)
        self.after = after or (lambda: None)

    def step(self, closure=None):
        self.inner.step()
        self.after()


def _backward(model: torch.nn.Module) -> None:
    model(torch.randn(4, 8)).sum().backward()


def test_the_outer_step_ends_the_iteration(clock):
    model = torch.nn.Linear(8, 2)
    seen: list[int] = []
    opt = Wrapper(model.parameters(), after=lambda: seen.append(clock.iteration))
    for _ in range(5):
        _backward(model)
        opt.step()
    assert clock.count == 5
    # the wrapper's own work after the inner step still belongs to the iteration it ends
    assert seen == [0, 1, 2, 3, 4]
    assert clock.events == ["tick after Wrapper"] * 5


def test_an_inner_step_that_raised_does_not_stop_the_counting(clock):
    model = torch.nn.Linear(8, 2)
    boom = {"on": True}

    def after():
        if boom.pop("on", False):
            raise RuntimeError("found inf")

    opt = Wrapper(model.parameters(), after=after)
    _backward(model)
    with pytest.raises(RuntimeError):
        opt.step()  # neither post-hook ran: the wrapper's entry is left behind
    plain = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        _backward(model)
        plain.step()
    assert clock.count == 3


def test_zero_redundancy_optimizer_counts_its_outer_step():
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    clock = StepClock()
    names: list[str] = []

    def on_pre(optimizer, args, kwargs):
        clock.optimizer_started(optimizer, sys._getframe(1))

    def on_post(optimizer, args, kwargs):
        if clock.counts_optimizer(optimizer):
            names.append(type(optimizer).__name__)
            clock.tick("optimizer", recording=False)

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    handles = [register_optimizer_step_pre_hook(on_pre), register_optimizer_step_post_hook(on_post)]
    try:
        model = torch.nn.Linear(8, 2)
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
        for _ in range(3):
            _backward(model)
            opt.step()
    finally:
        for h in handles:
            h.remove()
        dist.destroy_process_group()
    assert names == ["ZeroRedundancyOptimizer"] * 3
