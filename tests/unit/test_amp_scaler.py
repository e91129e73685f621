"""``capture.amp_scaler``: an iteration whose optimizer step a GradScaler skipped (overflowed gradients) is told,
so that the session ends it as the optimizer's step would have. Real ``torch.amp.GradScaler("cpu")`` and real
optimizer step hooks."""

from __future__ import annotations

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from ddpdoctor.capture import amp_scaler


def _loop(iterations: int, overflow: set[int], *, enabled: bool = True) -> tuple[list[int], list[int], int]:
    """(iterations whose step was told skipped, iterations whose optimizer stepped, steps counted)."""
    seen = [0]
    skipped: list[int] = []
    stepped: list[int] = []
    current = [0]
    handle = register_optimizer_step_post_hook(
        lambda *a: (seen.__setitem__(0, seen[0] + 1), stepped.append(current[0]))
    )
    assert amp_scaler.install(lambda: seen[0], lambda opt: skipped.append(current[0]))
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", enabled=enabled)
        for i in range(iterations):
            current[0] = i
            opt.zero_grad()
            loss = model(torch.randn(4, 8)).pow(2).mean()
            scaler.scale(loss * float("inf") if i in overflow else loss).backward()
            scaler.step(opt)
            scaler.update()
    finally:
        amp_scaler.uninstall()
        handle.remove()
    return skipped, stepped, seen[0]


def test_the_skipped_iterations_are_told_and_only_they():
    skipped, stepped, _ = _loop(8, {2, 3, 6})
    assert skipped == [2, 3, 6]
    assert stepped == [0, 1, 4, 5, 7]


def test_a_scaler_that_skips_nothing_tells_nothing():
    assert _loop(5, set())[0] == []
    assert _loop(5, set(), enabled=False)[0] == []  # a disabled scaler steps the optimizer itself


def test_uninstall_restores_the_scaler():
    from torch.amp.grad_scaler import GradScaler

    original = GradScaler.__dict__["step"]
    assert amp_scaler.install(lambda: 0, lambda opt: None)
    assert GradScaler.__dict__["step"] is not original
    amp_scaler.uninstall()
    assert GradScaler.__dict__["step"] is original


def test_an_error_of_the_callback_is_not_the_scripts():
    def boom(opt):
        raise RuntimeError("ours")

    assert amp_scaler.install(lambda: 0, boom)
    try:
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu")
        scaler.scale(model(torch.randn(2, 4)).sum() * float("inf")).backward()
        scaler.step(opt)  # skipped: the callback raises, the script does not see it
        scaler.update()
    finally:
        amp_scaler.uninstall()
