"""The run's cumulative LR multiplier: one object, owned by the ``Agent``, read by everything else.

Rollbacks and ``set_lr_scale`` commands set it (commands carry the absolute value); the loop
multiplies the scheduled LR by it at the start of every step; the step event reports it. It is
checkpointed on its own (``state_dict``) and never through a scheduler, so restoring a
scheduler cannot reset it (see trainer/schedule.py).
"""

from __future__ import annotations

import math
from typing import Any


def check_lr_scale(value: Any) -> float:
    """``value`` as a float if it is a usable LR scale (positive, finite); else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"lr_scale: must be a number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"lr_scale: must be a positive finite number, got {value!r}")
    return float(value)


class LRScale:
    """The cumulative LR multiplier set by rollbacks and ``set_lr_scale``; checkpointed on its own."""

    def __init__(self, value: float = 1.0) -> None:
        self._value = check_lr_scale(value)

    @property
    def value(self) -> float:
        return self._value

    def set(self, value: float) -> None:
        self._value = check_lr_scale(value)

    def state_dict(self) -> dict[str, Any]:
        return {"value": self._value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.set(state["value"])
