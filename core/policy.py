"""The rollback policy, shared by the controller's recovery state machine and the trainer's local
hold-timeout fallback, so both roll back to the same kind of step with the same LR cut.

- Target: the newest candidate checkpoint step at or before the excursion's first step. The
  controller's candidates are its *stable* checkpoints; the trainer, acting alone because the
  controller is unreachable, uses the checkpoints it holds.
- LR: each rollback multiplies the run's ``lr_scale`` by ``lr_factor`` (PaLM-style halving),
  cumulatively; commands carry the absolute scale.
"""

from __future__ import annotations

from collections.abc import Iterable

LR_FACTOR = 0.5
"""Default LR multiplier per rollback."""

COMMAND_TTL_S = 60.0
"""Default lifetime of a signed command: a trainer refuses it as expired afterwards."""


def rollback_step(candidates: Iterable[int], onset: int) -> int | None:
    """The newest candidate step at or before ``onset``; None when there is none."""
    eligible = [s for s in candidates if s <= onset]
    return max(eligible) if eligible else None


def rolled_back_lr_scale(current: float, lr_factor: float = LR_FACTOR) -> float:
    """The ``lr_scale`` after one more rollback."""
    if not 0 < lr_factor <= 1:
        raise ValueError("lr_factor: must be in (0, 1]")
    return current * lr_factor
