"""Where a piece of work's time went: named steps, in the order they ran, in milliseconds."""

from __future__ import annotations

import time
from collections.abc import Mapping


class Laps:
    """A stopwatch: each `lap` adds the time since the previous one (or since it was made) to a step."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, step: str) -> None:
        now = time.perf_counter()
        self.ms[step] = round(self.ms.get(step, 0.0) + (now - self._last) * 1000, 1)
        self._last = now

    def add_steps(self, prefix: str, steps: Mapping[str, float] | None) -> None:
        """Steps timed elsewhere (the JVM's, in ms), each as ``prefix.step``; not counted as a lap."""
        for step, ms in (steps or {}).items():
            self.ms[f"{prefix}.{step}"] = round(float(ms), 1)
