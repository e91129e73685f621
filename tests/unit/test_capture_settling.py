"""The end of a traced script: garbage collection stays off until gloo's threads have had ``SETTLE_S`` since the
last collective could have been issued (runner._Settling), while the rank writes its files meanwhile."""

from __future__ import annotations

import gc
import time

import pytest

from ddpdoctor.capture import ddp as ddp_capture
from ddpdoctor.capture import runner


@pytest.fixture(autouse=True)
def _restore(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(ddp_capture, "destroy_started", None)
    was = gc.isenabled()
    yield
    gc.enable() if was else gc.disable()


def test_gc_is_off_for_the_whole_settling_time_from_the_end_of_the_script() -> None:
    gc.enable()
    t0 = time.monotonic()
    settling = runner._Settling()
    assert not gc.isenabled()
    settling.wait()
    assert time.monotonic() - t0 >= runner.SETTLE_S * 0.99
    assert gc.isenabled()


def test_time_spent_writing_counts_towards_it() -> None:
    settling = runner._Settling()
    time.sleep(runner.SETTLE_S)  # the rank writing its files
    t0 = time.monotonic()
    settling.wait()
    assert time.monotonic() - t0 < 0.05


def test_counted_from_the_scripts_destroy_process_group_once_every_group_is_gone(monkeypatch) -> None:
    monkeypatch.setattr(runner, "_process_group_alive", lambda: False)
    ddp_capture.destroy_started = time.monotonic() - runner.SETTLE_S
    t0 = time.monotonic()
    runner._Settling().wait()
    assert time.monotonic() - t0 < 0.05


def test_not_when_a_process_group_is_still_alive(monkeypatch) -> None:
    monkeypatch.setattr(runner, "_process_group_alive", lambda: True)
    ddp_capture.destroy_started = time.monotonic() - 10
    t0 = time.monotonic()
    runner._Settling().wait()
    assert time.monotonic() - t0 >= runner.SETTLE_S * 0.99


def test_gc_left_off_when_it_was_off() -> None:
    gc.disable()
    runner._Settling().wait()
    assert not gc.isenabled()
