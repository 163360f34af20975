"""What a Hugging Face ``Trainer`` logs, kept true across the kit's LR scale and rollbacks.

Two things the Trainer cannot know (both need the bound Trainer: ``cb.train(trainer)`` or
``cb.bind(trainer)``):

- **the applied LR**: the Trainer logs ``learning_rate`` from its scheduler, which the kit leaves
  unscaled (it scales the LR inside ``optimizer.step`` and puts it back, so no scheduler compounds
  it). ``log_applied_lr`` makes the Trainer's ``_get_learning_rate`` report the scheduler's LR
  times the scale the update just used, so every logger (W&B, TensorBoard, ``log_history``) sees
  the LR the weights moved with.
- **the logged loss average**: between two logging steps the Trainer sums each step's loss into
  ``_tr_loss`` and divides by the steps since ``_globalstep_last_logged``. ``LoggedLoss`` is that
  running sum as a stateful part of the kit's snapshots, so a rollback restores it with the
  weights: the steps rolled back drop out of the sum, and the next logged loss averages the steps
  of the timeline that stands. A rollback from a Trainer ``checkpoint-N`` (no such state in it)
  starts the sum afresh at the restored step (``after_rollback``).

Those are attributes of transformers' ``Trainer`` (``_tr_loss``, ``_total_loss_scalar``,
``_globalstep_last_logged``, ``_get_learning_rate``; transformers 5); a Trainer without them is
left as it is.
"""

from __future__ import annotations

from typing import Any

import torch

_LOSS_ATTRS = ("_tr_loss", "_total_loss_scalar", "_globalstep_last_logged")


def log_applied_lr(trainer: Any, scale: Any) -> None:
    """Make ``trainer`` log its scheduler's LR times ``scale()`` (the scale of the last update)."""
    inner = getattr(trainer, "_get_learning_rate", None)
    if inner is None or getattr(inner, "_cliffguard_applied", False):
        return

    def applied_lr() -> float:
        return float(inner()) * float(scale())

    applied_lr._cliffguard_applied = True  # type: ignore[attr-defined]
    trainer._get_learning_rate = applied_lr


class LoggedLoss:
    """The Trainer's running loss sum between logging steps, for the kit's snapshots."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self._loaded = False

    def _has_sum(self) -> bool:
        t = self.trainer
        return all(hasattr(t, a) for a in _LOSS_ATTRS) and isinstance(t._tr_loss, torch.Tensor)

    def state_dict(self) -> dict[str, Any]:
        if not self._has_sum():
            return {}
        t = self.trainer
        return {
            "tr_loss": t._tr_loss.detach().clone(),
            "total": float(t._total_loss_scalar),
            "last_logged": int(t._globalstep_last_logged),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state or not self._has_sum():
            return
        t = self.trainer
        t._tr_loss.copy_(state["tr_loss"])  # in place: the training loop holds this tensor
        t._total_loss_scalar = state["total"]
        t._globalstep_last_logged = state["last_logged"]
        self._loaded = True

    def after_rollback(self, step: int) -> None:
        """After a rollback to ``step``: when the restored state held no sum (a ``checkpoint-N``),
        drop what the sum holds (it mixes abandoned steps in) and count the next average from
        ``step``; the Trainer's whole-run ``train_loss`` then still counts the abandoned steps it
        had logged."""
        loaded, self._loaded = self._loaded, False
        if loaded or not self._has_sum():
            return
        self.trainer._tr_loss.zero_()
        self.trainer._globalstep_last_logged = step
