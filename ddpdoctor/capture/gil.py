"""GIL contention per step, measured with gilknocker (a maintained Rust probe).

gilknocker runs a native thread that repeatedly tries to take the GIL and reports the fraction of time it had to
wait (0-1). It runs only during the profiled window, so steps outside it pay nothing.
"""

from __future__ import annotations

import threading
from typing import Any

# Poll every 100 µs for 10 ms, then sleep 10 ms: half the window sampled. A 1 ms poll missed most of the
# contention of four threads running tiny ops (0.03 vs 0.17 measured on the same run), 100 µs did not.
_POLL_US, _SAMPLE_US, _SLEEP_US = 100, 10_000, 10_000


def _native_threads() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class GilProbe:
    def __init__(self, enabled: bool = True) -> None:
        self._knocker: Any = None
        self.reason: str | None = None
        self.series: dict[str, list] = {"step": [], "contention": [], "threads": [], "native_threads": []}
        if not enabled:
            self.reason = "disabled with --no-gil"
            return
        try:
            from gilknocker import KnockKnock
        except ImportError as exc:  # pragma: no cover - it is a dependency
            self.reason = f"gilknocker not importable: {exc}"
            return
        self._factory = KnockKnock

    @property
    def available(self) -> bool:
        return self.reason is None

    @property
    def running(self) -> bool:
        return self._knocker is not None

    def start(self) -> None:
        if not self.available or self._knocker is not None:
            return
        self._knocker = self._factory(
            polling_interval_micros=_POLL_US,
            sampling_interval_micros=_SAMPLE_US,
            sleeping_interval_micros=_SLEEP_US,
        )
        self._knocker.start()

    def sample(self, step: int) -> None:
        if self._knocker is None:
            return
        self.series["step"].append(step)
        self.series["contention"].append(round(float(self._knocker.contention_metric), 4))
        self.series["threads"].append(threading.active_count())
        self.series["native_threads"].append(_native_threads())
        self._knocker.reset_contention_metric()

    def stop(self) -> None:
        if self._knocker is not None:
            try:
                self._knocker.stop()
            finally:
                self._knocker = None

    def to_json(self) -> dict[str, Any]:
        return {
            "probe": "gilknocker",
            "available": self.available,
            "reason": self.reason,
            "per_step": self.series,
        }
