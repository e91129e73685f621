"""The words of a verdict (``flight.analyze``): ranks, where a rank was, what it was doing, how it ended."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddpdoctor.flight.verdict import CONSEQUENCE, CRASHED, EXITED, IN_COLLECTIVE, OUTSIDE, RankState, frame_text


def rank_list(ranks: list[int] | tuple[int, ...]) -> str:
    """``0, 2, 5``."""
    return ", ".join(str(r) for r in sorted(ranks))


def short(text: str | None, limit: int = 200) -> str:
    """The first line of an exception's text, at most ``limit`` characters ("an error" without one)."""
    if not text:
        return "an error"
    line = text.strip().splitlines()[0] if text.strip() else text
    return line if len(line) <= limit else line[: limit - 1] + "…"


def frames_short(s: RankState, n: int = 2) -> str:
    """The rank's innermost ``n`` user frames, innermost first."""
    if not s.frames:
        return "code the dump has no stack of"
    return " ← ".join(frame_text(f) for f in s.frames[:n])


def where(s: RankState) -> str:
    """`` in <frames>`` where the dump has a stack."""
    return f" in {frames_short(s)}" if s.frames else ""


def at_step(s: RankState) -> str:
    """`` at step N (phase)`` as far as known."""
    if s.step is None and not s.phase:
        return ""
    if s.phase and s.phase != "outside":
        return f" at step {s.step} ({s.phase})" if s.step is not None else f" ({s.phase})"
    return f" at step {s.step}" if s.step is not None else ""


def doing(s: RankState) -> str:
    """What the rank was doing at its dump, as a clause ("it waits in ...")."""
    if s.state == OUTSIDE:
        if not s.frames:
            return "it is in no collective (no stack in its dump)"
        return f"it is in its own code, {frames_short(s)}{at_step(s)}"
    if s.state == EXITED:
        return "it returned from main"
    if s.state == IN_COLLECTIVE:
        return f"it waits in {s.collective.describe() if s.collective else 'another collective'}"
    if s.state in (CRASHED, CONSEQUENCE):
        return f"it raised {short(s.exception)}"
    return "it left no dump"


def who(ranks: list[int] | tuple[int, ...]) -> str:
    """``rank 3`` / ``ranks 0, 2``."""
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_list(ranks)}"


def pronoun(ranks: list[int]) -> str:
    """``it`` / ``they``."""
    return "it" if len(ranks) == 1 else "they"


def verb(ranks: list[int], one: str, many: str) -> str:
    """The verb form for one rank or several."""
    return one if len(ranks) == 1 else many


def collective(s: RankState) -> str:
    """The collective the rank is in, described, or "a collective"."""
    return s.collective.describe() if s.collective else "a collective"


def after(s: RankState) -> str:
    """`` after step N`` where known."""
    return f" after step {s.step}" if s.step is not None else ""


SIGNALS = {
    2: "SIGINT",
    4: "SIGILL",
    6: "SIGABRT",
    7: "SIGBUS",
    8: "SIGFPE",
    9: "SIGKILL",
    11: "SIGSEGV",
    15: "SIGTERM",
}


def stopped(exit_code: Any) -> bool:
    """Ended by SIGTERM / SIGINT: stopped (by torchrun after a peer failed, by ddpdoctor, by the user), not crashed."""
    return isinstance(exit_code, int) and exit_code in (-15, -2, 128 + 15, 128 + 2)


def exit_text(exit_code: Any) -> str:
    """How a process ended, from its exit code: "killed by SIGKILL (...)", "exited with code 1"."""
    if isinstance(exit_code, int) and exit_code < 0:
        name = SIGNALS.get(-exit_code, f"signal {-exit_code}")
        hint = " (out of memory, or kill -9)" if exit_code == -9 else ""
        return f"killed by {name}{hint}"
    if isinstance(exit_code, int):
        return f"exited with code {exit_code}"
    return "died without finishing"


def exit_of(status: Mapping[str, Any]) -> str:
    """`` (exit code N)`` where the manifest has one."""
    code = status.get("exit_code")
    return f" (exit code {code})" if isinstance(code, int) else ""
