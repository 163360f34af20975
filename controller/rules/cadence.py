"""How often a run logs: the typical step gap between consecutive points (pure, no I/O).

The loss rules define their windows and smoothing in steps (their evidence is counted in
points); this turns steps into points. Trainers log every step, every 10-50 steps, or (exported W&B charts) at irregular gaps;
the median of the newest ``keep`` gaps is robust to the odd long gap of a sampled export and
follows a run that changes its logging interval.
"""

from __future__ import annotations

from collections import deque
from statistics import median
from typing import Any


class StepCadence:
    def __init__(self, keep: int = 33) -> None:
        self._gaps: deque[int] = deque(maxlen=keep)
        self._last: int | None = None
        self._interval: float | None = None

    def observe(self, step: int) -> int:
        """Record ``step``; the gap to the previous point (1 for the first or a rewind)."""
        last = self._last
        self._last = step
        if last is None or step <= last:
            return 1
        gap = step - last
        gaps = self._gaps
        if len(gaps) < (gaps.maxlen or 0) or gaps[0] != gap:
            self._interval = None  # else the gap leaving is the one coming: the same median
        gaps.append(gap)
        return gap

    @property
    def interval(self) -> float:
        """Median gap in steps (1 until two points are seen)."""
        if self._interval is None:
            self._interval = float(median(self._gaps)) if self._gaps else 1.0
        return self._interval

    def points(self, steps: int, minimum: int = 1) -> int:
        """Points covering about ``steps`` steps, at least ``minimum``."""
        return max(minimum, int(round(steps / self.interval)))

    def state_dict(self) -> dict[str, Any]:
        return {"gaps": list(self._gaps), "last": self._last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._gaps = deque((int(g) for g in state.get("gaps", [])), maxlen=self._gaps.maxlen)
        self._last = state.get("last")
        self._interval = None
