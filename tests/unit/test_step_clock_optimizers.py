"""Steps are counted from the optimizers the job actually steps (issue 23, item 6): a new optimizer built during the
run takes over, two optimizers stepped in one iteration count one step, one built and never stepped changes
nothing. Real torch optimizers, through torch's global optimizer step hook as the capture session installs it."""

from __future__ import annotations

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from ddpdoctor.capture.step_clock import StepClock


@pytest.fixture
def clock():
    clock = StepClock()

    def on_step(optimizer, args, kwargs):
        if clock.counts_optimizer(optimizer):
            clock.tick("optimizer", recording=False)

    handle = register_optimizer_step_post_hook(on_step)
    yield clock
    handle.remove()


def _backward(model: torch.nn.Module) -> None:
    model(torch.randn(4, 8)).sum().backward()


def test_a_new_optimizer_built_at_step_3_keeps_steps_counted(clock):
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(40):
        if step == 3:
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)  # the SGD one is dropped
        _backward(model)
        optimizer.step()
    assert clock.count == 40


def test_a_new_optimizer_while_the_old_one_is_still_held(clock):
    """The old optimizer kept alive (a list of them, a checkpoint dict): the new one takes over once it stepped
    twice with the old one silent, so at most the first of its steps is not an iteration boundary."""
    model = torch.nn.Linear(8, 2)
    kept = [torch.optim.SGD(model.parameters(), lr=0.01)]
    for step in range(40):
        if step == 3:
            kept.append(torch.optim.Adam(model.parameters(), lr=1e-3))
        _backward(model)
        kept[-1].step()
    assert clock.count == 39


def test_two_optimizers_stepped_in_one_iteration_count_one_step(clock):
    gen, disc = torch.nn.Linear(8, 2), torch.nn.Linear(8, 2)
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3)
    for _ in range(20):
        _backward(disc)
        opt_d.step()
        _backward(gen)
        opt_g.step()
    assert clock.count == 20


def test_a_wrapper_stepping_the_optimizer_inside_it_counts_one_step(clock):
    """ZeroRedundancyOptimizer-style: the outer optimizer's step runs the inner one's (both hooks fire)."""

    class Wrapper(torch.optim.Optimizer):
        def __init__(self, params, inner_cls, **kwargs):
            params = list(params)
            super().__init__(params, {})
            self.inner = inner_cls(params, **kwargs)

        def step(self, closure=None):
            return self.inner.step(closure)

    model = torch.nn.Linear(8, 2)
    optimizer = Wrapper(model.parameters(), torch.optim.SGD, lr=0.01)
    for _ in range(15):
        _backward(model)
        optimizer.step()
    assert clock.count == 15


def test_an_optimizer_built_and_never_stepped_changes_nothing(clock):
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    spare = torch.optim.Adam(model.parameters(), lr=1e-3)  # noqa: F841 - built, never stepped
    for _ in range(12):
        _backward(model)
        optimizer.step()
    assert clock.count == 12


def test_an_optimizer_stepped_every_other_iteration_beside_the_marking_one(clock):
    """A GAN whose generator steps every second iteration, the discriminator every one (it steps first)."""
    gen, disc = torch.nn.Linear(8, 2), torch.nn.Linear(8, 2)
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.01)
    opt_d = torch.optim.SGD(disc.parameters(), lr=0.01)
    for step in range(20):
        _backward(disc)
        opt_d.step()
        if step % 2 == 0:
            _backward(gen)
            opt_g.step()
    assert clock.count == 20


def test_a_step_that_may_not_count_never_takes_over_from_the_marker():
    """Another thread's optimizer (an EMA or a probe in a helper thread) stepping twice between two of the training
    loop's steps once took over as the marker, and the loop's steps stopped counting (2 of 12 counted)."""
    clock = StepClock()
    main = torch.optim.SGD(torch.nn.Linear(8, 2).parameters(), lr=0.01)
    helper = torch.optim.SGD(torch.nn.Linear(8, 2).parameters(), lr=0.01)
    counted = 0
    for _ in range(12):
        counted += clock.counts_optimizer(main)
        for _ in range(3):
            assert not clock.counts_optimizer(helper, may_count=False)
    assert counted == 12
    # allowed to count (the same thread's optimizer), it takes over as before
    assert not clock.counts_optimizer(helper) and clock.counts_optimizer(helper)
