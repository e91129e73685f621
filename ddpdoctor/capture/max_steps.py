"""``trace --max-steps N``: end the job cleanly at the step boundary after step N, on every rank.

Every rank counts the same steps (the first optimizer's ``step()``, or ``ddpdoctor.step()``), so every rank stops
at the same boundary: after its step N all of step N's collectives have completed on every rank (a rank cannot
finish backward's all-reduce alone) and none of step N+1's has started, so no rank is left waiting for another.

The stop is :class:`StopTraining`, a ``SystemExit(0)`` raised from the step hook: it unwinds the script as
``sys.exit(0)`` would (``finally`` blocks and context managers run; ``except Exception`` does not catch it), the
runner records exit 0 and the manifest says who stopped the job.
"""

from __future__ import annotations


class StopTraining(SystemExit):
    """Raised at the step boundary after step ``steps`` (exit status 0)."""

    def __init__(self, steps: int) -> None:
        super().__init__(0)
        self.steps = steps


def stopped_by(steps: int) -> str:
    """How the rank file and the manifest say it."""
    return f"ddpdoctor --max-steps {steps}"
