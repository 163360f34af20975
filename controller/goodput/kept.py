"""The kept timeline: the productive and data-wait time of the steps kept so far, and at marks
(a checkpoint's step, every ``mark_every`` steps), so a redo knows what it loses."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Kept:
    """Cumulative kept time: seconds and GPU-seconds of productive and data wait, and steps."""

    prod: float = 0.0
    wait: float = 0.0
    prod_gpu: float = 0.0
    wait_gpu: float = 0.0
    steps: float = 0.0

    def row(self) -> list[float]:
        return [self.prod, self.wait, self.prod_gpu, self.wait_gpu, self.steps]


class KeptTimeline:
    def __init__(self, max_marks: int) -> None:
        self.max_marks = max_marks
        self.now = Kept()
        self.marks: list[list[float]] = []
        """[step, *Kept.row()] before that step ran, ascending."""

    def add(self, prod: float, wait: float, world: int) -> None:
        k = self.now
        k.prod += prod
        k.wait += wait
        k.prod_gpu += prod * world
        k.wait_gpu += wait * world
        k.steps += 1

    def mark(self, step: int, next_step: int) -> None:
        """Remember the kept time before ``step``, if it is the kept timeline's next step."""
        if step != next_step or (self.marks and self.marks[-1][0] >= step):
            return
        self.marks.append([float(step), *(round(x, 6) for x in self.now.row())])  # µs: a smaller saved state
        del self.marks[: -self.max_marks]

    def rewind(self, step: int, first_step: int, next_step: int) -> tuple[list[float], bool]:
        """Steps from ``step`` on are redone: (what they had kept, as ``Kept.row()``; whether it
        was interpolated between marks rather than read at one)."""
        cum, exact = self._at(step, first_step, next_step)
        lost = [max(0.0, a - b) for a, b in zip(self.now.row(), cum, strict=True)]
        self.now = Kept(*cum)
        self.marks = [m for m in self.marks if m[0] <= step]
        return lost, exact

    def _at(self, step: int, first_step: int, next_step: int) -> tuple[list[float], bool]:
        floor = [float(first_step), 0.0, 0.0, 0.0, 0.0, 0.0]
        i = bisect.bisect_right([m[0] for m in self.marks], step)
        prev = self.marks[i - 1] if i else floor
        if prev[0] == step:
            return list(prev[1:]), True
        if step < prev[0]:  # before the run's first booked step: everything is lost
            return [0.0] * 5, True
        nxt = self.marks[i] if i < len(self.marks) else [float(next_step), *self.now.row()]
        frac = (step - prev[0]) / (nxt[0] - prev[0]) if nxt[0] > prev[0] else 1.0
        return [p + (q - p) * frac for p, q in zip(prev[1:], nxt[1:], strict=True)], False

    def state_dict(self) -> dict[str, Any]:
        return {"now": self.now.row(), "marks": [list(m) for m in self.marks]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.now = Kept(*(float(x) for x in state["now"]))
        self.marks = [[float(x) for x in m] for m in state["marks"]]
