"""Warmup + cosine learning rate, times an ``lr_scale`` that lives apart from the schedule.

The LR of step ``s`` is ``schedule.lr_at(s) * lr_scale.value * fault_factor(s)``, written into
every param group at the start of each step. Nothing is accumulated in the optimizer's
``lr`` field, so:

- restoring the optimizer's state (whose param groups hold the *old* LR) cannot leak an old
  scale into the next step: the LR is recomputed before every step;
- restoring the schedule cannot overwrite the scale (llm-foundry #194: a scheduler whose
  restored state reset the LR multiplier after a rollback). The scale is its own object
  (``LRScale`` in agent/lr_scale.py, owned by the agent) with its own ``state_dict``; a rollback
  restores it from the checkpoint and *then* applies the command's value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class WarmupCosine:
    lr: float
    min_lr: float
    warmup_steps: int
    total_steps: int

    def lr_at(self, step: int) -> float:
        if self.warmup_steps > 0 and step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (self.lr - self.min_lr)

    def describe(self) -> dict[str, Any]:
        return {"kind": "warmup_cosine", "lr": self.lr, "min_lr": self.min_lr,
                "warmup_steps": self.warmup_steps, "total_steps": self.total_steps}

    def state_dict(self) -> dict[str, Any]:
        # The schedule is a pure function of the step; its "state" is its definition, saved so a
        # restore can tell a checkpoint from another schedule. It holds no scale on purpose.
        return self.describe()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "warmup_cosine":
            raise ValueError(f"scheduler state: unknown kind {state.get('kind')!r}")
