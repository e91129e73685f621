"""Issue 25 item 2: compare's headline and "better" column say whether a difference is larger than the runs' own
step-to-step noise (a bootstrap interval of B/A, as the gate's), and the step numbers are named for what they are."""

from __future__ import annotations

from helpers import step_snapshot

from ddpdoctor.compare import compare


def _run(median: float, seed: int, spread: float = 0.15):
    return step_snapshot(median, seed, spread)


def test_two_runs_of_one_command_make_no_faster_claim():
    # on a busy machine two runs of one command land 3% apart; the steps within each spread by 15%
    a, b = _run(100, 1), _run(103, 2)
    c = compare(a, b)
    speed = c.headline[0]
    assert abs(c.row("step_ms.median").ratio - 1) > 0.02  # the medians differ by more than the old 2% cut
    assert "faster per step" not in speed and "within the runs' own step-to-step noise" in speed, speed
    assert "interval" in speed
    assert c.row("step_ms.median").better is None and c.row("step_ms.p90").better is None


def test_a_real_speed_up_is_claimed_with_its_interval():
    c = compare(_run(160, 3, 0.05), _run(90, 4, 0.05))
    speed = c.headline[0]
    assert "B is 1.7" in speed and "faster per step" in speed and "interval" in speed, speed
    assert c.row("step_ms.median").better == "B"


def test_the_step_numbers_are_named_for_what_they_are():
    speed = compare(_run(100, 1), _run(100, 2)).headline[0]
    assert "wall time per step" in speed and "slowest rank" in speed and "diagnose" in speed, speed
