"""The bundled trainer's side of the command protocol: the recovery kit (agent/recovery/kit.py)
over the trainer's own parts.

Every command, the boundary wait and the hold / controller-silence timeouts are the kit's, the
same code every other loop runs. What the bundled trainer brings: its ``CheckpointManager``
(trainer/checkpoint.py: the memory ring plus verified disk checkpoints) as the kit's store, its
whole-state capture (model, optimizer, schedule, sampler, RNG, agent, loss scaler), its fixed
validation set, and its sampler's ``skip`` for a rollback's ``skip_data``. It sets the LR itself
each step (trainer/loop.py, via ``kit.scaled_lr``), so the kit does not wrap its optimizer.

What each command does (the protocol agreed with the controller):

- ``pause``: hold at this boundary (heartbeats say ``paused``); keep polling.
- ``resume``: train on (also clears a guard hold).
- ``validate {batches?}``: forward-only on the fixed validation set with the current, frozen
  weights -> a ``validation`` event with ``cmd`` = the command id; the run stays in its mode.
- ``rollback {to_step, lr_scale, skip_data?}``: restore the checkpoint labelled ``to_step`` (the
  state before that step ran) from the memory ring when it is there, else from disk; then set
  ``lr_scale`` (absolute, cumulative — applied after the restored state, never overwritten by it),
  skip the ``[first, stop)`` sample window if given, and CONTINUE training (no separate resume).
  Ack ``applied`` with the source, or ``failed`` when the step is not available (the run is
  ``paused``, so the controller can pick an older step).
- ``set_lr_scale {lr_scale}``: from the next step on.
- ``checkpoint_now {kind?}``: a checkpoint of the current state (default ``full``); the
  ``checkpoint`` event with ``verified`` follows when the background writer has checked it.
- ``stop``: end the run cleanly after this boundary (``run.finished``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import torch

from cliffguard.agent.hooks import Agent
from cliffguard.agent.recovery.kit import RecoveryKit
from cliffguard.core.enums import CheckpointKind
from cliffguard.trainer.checkpoint import CheckpointManager
from cliffguard.trainer.config import TrainConfig
from cliffguard.trainer.data import Sampler
from cliffguard.trainer.rerun import StepRerun


class Trainer(Protocol):
    """What the kit needs from the bundled trainer (trainer/loop.py's ``Trainer``)."""

    agent: Agent
    cfg: TrainConfig
    model: torch.nn.Module
    optimizer: Any
    ckpt: CheckpointManager
    sampler: Sampler
    step: int

    def capture_state(self) -> dict[str, Any]: ...

    def load_state(self, state: dict[str, Any]) -> None: ...

    def val_loss(self, batches: int | None = None) -> tuple[float, int]: ...

    def checkpoint(self, kind: CheckpointKind) -> None: ...

    def param_digest(self) -> str: ...


class _TrainerState:
    """The kit's ``Snapshotter`` over the trainer's own capture/load."""

    def __init__(self, tr: Trainer) -> None:
        self.tr = tr

    def capture(self, step: int) -> dict[str, Any]:
        return self.tr.capture_state()

    def load(self, state: dict[str, Any]) -> int:
        self.tr.load_state(state)
        return self.tr.step


class TrainerCommands(RecoveryKit):
    """The bundled trainer's ``CommandTarget``: the kit with the trainer's parts."""

    def __init__(self, tr: Trainer, *, on_restore: Callable[[int], None] | None = None,
                 rerun: StepRerun | None = None) -> None:
        # the boundary validates on the trainer's own fixed set, every [train] val_every: asked for, and
        # its cost is [train] val_batches x val_batch_size forward passes, so no share limit applies
        config = dataclasses.replace(tr.agent.config.recovery, val_every=tr.cfg.val_every, val_max_share=0.0)
        # triage ([agent.recovery] triage_max_steps): the kit re-runs a critical step with ``rerun``
        # (trainer/rerun.py); a shard it finds bad gets sampling weight 0, never drawn again
        super().__init__(tr.agent, tr.model, tr.optimizer, config=config, store=tr.ckpt, state=_TrainerState(tr),
                         validate_fn=tr.val_loss, skip_data=tr.sampler.skip, checkpoint_fn=self._checkpoint,
                         on_restore=on_restore, wrap_optimizer=False,
                         rerun_fn=rerun.rerun if rerun is not None else None,
                         sample_ids_fn=rerun.sample_ids if rerun is not None else None,
                         exclude_samples=lambda ids: tr.sampler.flag(ids, 0.0))
        self.tr = tr

    def _checkpoint(self, step: int, kind: CheckpointKind) -> None:
        self.tr.checkpoint(kind)

    def rollback_detail(self) -> str:
        return f"; param_digest={self.tr.param_digest()}" if self.tr.cfg.debug_digests else ""
