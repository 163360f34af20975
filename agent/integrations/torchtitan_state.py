"""What a rollback restores on a torchtitan ``Trainer``, and from where (agent/integrations/torchtitan.py).

``TitanState`` is the kit's snapshotter: the kit's own ``LoopState`` over torchtitan's stateful parts
(the FSDP model's sharded state dict, the optimizers container's flat one, the LR schedulers, the
trainer's step and token count, the guard), or a step of torchtitan's checkpointer loaded back
(a state ``{"step", "disk"}``). ``TitanCheckpoints`` is the kit's store: the memory ring first, then
the checkpointer's saved steps. ``AgentStateful`` puts the guard's window and the LR scale into
torchtitan's checkpoints, so a rollback or a resume from one brings them back too.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException

from cliffguard.agent.hooks import Agent
from cliffguard.agent.recovery.state import LoopState
from cliffguard.agent.recovery.store import StateStore
from cliffguard.core.enums import CheckpointKind

log = logging.getLogger(__name__)

AGENT_KEY = "cliffguard"
"""The key of the guard's state among the checkpointer's ``states``."""
NOT_ROLLED_BACK = ("dataloader",)
"""What a rollback from disk leaves as it is: the loader goes on past the rolled-back window (its
batches are not replayed), as after a rollback from memory, so both restore the same parts."""


class AgentStateful:
    """The agent as one of torchtitan's checkpointed ``Stateful`` parts."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def state_dict(self) -> dict[str, Any]:
        return self.agent.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.agent.load_state_dict(state_dict)


class _Param:
    """A parameter as the agent sees it under FSDP: its size, its device, no gradient. The agent's
    own norms would mix FSDP's sharded DTensor gradients with plain tensors; the step event takes
    torchtitan's global norm from ``clip_grad_norm_`` instead (as DeepSpeed's under ZeRO)."""

    __slots__ = ("_p",)
    grad = None
    requires_grad = True

    def __init__(self, p: torch.Tensor) -> None:
        self._p = p

    @property
    def device(self) -> torch.device:
        return self._p.device

    def numel(self) -> int:
        return self._p.numel()  # a DTensor's numel is the whole parameter's

    @property
    def param(self) -> torch.Tensor:
        """The parameter itself: the SDC watch hashes its local shard (agent/replica_groups.py)."""
        return self._p


class ParamsView:
    """The model, as the agent sees it (``named_parameters``/``parameters`` of ``_Param``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._named = [(n, _Param(p)) for n, p in model.named_parameters() if p.requires_grad]

    def named_parameters(self) -> list[tuple[str, Any]]:
        return list(self._named)

    def parameters(self) -> Any:
        return iter([p for _, p in self._named])


def sync_lrs(lr_schedulers: Any) -> None:
    """Each optimizer's LR as its scheduler says now. torchtitan's ``LRSchedulersContainer``
    restores ``last_epoch`` only; the param groups would keep the LR of the step before the load."""
    for scheduler in lr_schedulers:
        for group, lr in zip(scheduler.optimizer.param_groups, scheduler.get_last_lr(), strict=True):
            group["lr"] = lr


class TitanState:
    """The kit's ``Snapshotter`` for a torchtitan trainer (see the module docstring)."""

    def __init__(self, trainer: Any, agent: Agent) -> None:
        assert len(trainer.model_parts) == 1, "one model part: pipeline parallelism is refused with the config"
        self.trainer = trainer
        self.loop = LoopState(trainer.model_parts[0], trainer.optimizers, trainer.lr_schedulers, agent,
                              extra={"train_state": trainer})
        self.broken = ""
        """Why the model may hold a mix of two steps (a checkpoint that failed to load part-way)."""

    def capture(self, step: int) -> dict[str, Any]:
        return self.loop.capture(step)

    def load(self, state: dict[str, Any]) -> int:
        if "disk" in state:
            return self._load_step(int(state["disk"]))
        step = self.loop.load(state)
        sync_lrs(self.trainer.lr_schedulers)
        return step

    def _load_step(self, step: int) -> int:
        ckpt = self.trainer.checkpointer
        kept = list(ckpt.exclude_from_loading)
        ckpt.exclude_from_loading = [*kept, *(k for k in NOT_ROLLED_BACK if k in ckpt.states and k not in kept)]
        try:
            loaded = ckpt.load(step=step)
        except Exception as exc:
            # DCP loads every part in one read: a failure may leave some parts of each step
            self.broken = f"torchtitan checkpoint step-{step} failed to load ({type(exc).__name__}: {exc})"
            raise
        finally:
            ckpt.exclude_from_loading = kept
        if not loaded:
            raise RuntimeError(f"torchtitan found no checkpoint step-{step} in {ckpt.folder}")
        sync_lrs(self.trainer.lr_schedulers)
        return int(self.trainer.step)


class TitanCheckpoints:
    """A ``StateStore``: ``inner`` (the kit's ring store) first, then the steps the checkpointer saved
    in this run, each labelled with the step it was taken before (torchtitan's ``step-N`` holds the
    state after N steps: the boundary before step N)."""

    def __init__(self, inner: StateStore | None, checkpointer: Any) -> None:
        self.inner, self.checkpointer = inner, checkpointer
        self.saved: set[int] = set()

    def note_saved(self, step: int) -> None:
        self.saved.add(int(step))

    def path(self, step: int) -> str:
        return os.path.join(str(self.checkpointer.folder), f"step-{step}")

    def _disk(self) -> list[int]:
        # a step folder without DCP's metadata is a save that did not finish (or one purged since)
        return [s for s in self.saved if os.path.isfile(os.path.join(self.path(s), ".metadata"))]

    def available_steps(self) -> list[int]:
        memory = self.inner.available_steps() if self.inner is not None else []
        return sorted(set(memory) | set(self._disk()))

    def restore(self, step: int, discard_newer: bool = True) -> tuple[dict[str, Any], str]:
        if self.inner is not None and step in self.inner.available_steps():
            return self.inner.restore(step, discard_newer)
        if step not in self._disk():
            raise KeyError(f"step {step}: not in the memory ring nor a torchtitan checkpoint "
                           f"(have {self.available_steps()})")
        if discard_newer:
            self.discard_after(step)
        path = self.path(step)
        # what checkpointer.load puts back, named for the ack (agent/recovery/restored.py)
        state = {"step": step, "disk": step, "model": path, "optimizer": path, "scheduler": path, "agent": path}
        return state, f"disk (step-{step})"

    def discard_after(self, step: int) -> None:
        if self.inner is not None:
            self.inner.discard_after(step)
        self.saved = {s for s in self.saved if s <= step}  # the folders stay; we forget them

    def on_step(self, step: int, state_fn: Callable[[], dict[str, Any]]) -> list[CheckpointKind]:
        return self.inner.on_step(step, state_fn) if self.inner is not None else []

    def save(self, step: int, state: dict[str, Any], kind: CheckpointKind | str = CheckpointKind.MEMORY) -> None:
        if self.inner is not None and kind == CheckpointKind.MEMORY:
            self.inner.save(step, state, kind)
        else:
            save_full(self.checkpointer, step)


def save_full(checkpointer: Any, step: int) -> None:
    """A full checkpoint of ``step`` now, whatever its interval says: torchtitan's forced save is its
    last-step save, model-only when ``last_save_model_only``, which is no rollback target."""
    if not checkpointer.enable:
        raise RuntimeError("no disk checkpoint: torchtitan's checkpoint.enable is off")
    model_only = checkpointer.last_save_model_only
    checkpointer.last_save_model_only = False
    try:
        checkpointer.save(step, last_step=True)
    finally:
        checkpointer.last_save_model_only = model_only


def load_tolerating_no_guard(load: Callable[[int], bool], checkpointer: Any, step: int = -1) -> bool:
    """``checkpointer.load``; a checkpoint without the guard's state (an unguarded run's, resumed with
    cliffguard on) loads without it, the guard's window then starting afresh."""
    try:
        return load(step)
    except (RuntimeError, CheckpointException) as exc:  # DCP gathers every rank's error into the latter
        # raised while DCP plans the read, before any state is touched: the retry is safe
        if f"Missing key in checkpoint state_dict: {AGENT_KEY}." not in str(exc):
            raise
    log.warning("cliffguard: the checkpoint holds no guard state (saved without cliffguard); loading the rest, "
                "the guard's window starts afresh and the LR scale at 1")
    kept = list(checkpointer.exclude_from_loading)
    checkpointer.exclude_from_loading = [*kept, AGENT_KEY]
    try:
        return load(step)
    finally:
        checkpointer.exclude_from_loading = kept


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)
