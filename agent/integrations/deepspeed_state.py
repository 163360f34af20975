"""What a rollback restores on a ``DeepSpeedEngine``, and from where (agent/integrations/deepspeed.py).

``EngineState`` is the kit's snapshotter: this rank's share of the engine through DeepSpeed's own
``state_dict``/``load_state_dict``; ``EngineCheckpoints`` is the kit's store: the memory ring, then
the engine's checkpoint tags; ``rollback_plan`` says which of the two a configuration allows.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from cliffguard.agent.hooks import Agent
from cliffguard.agent.recovery.state import rng_state, set_rng_state
from cliffguard.agent.recovery.store import StateStore
from cliffguard.core.enums import CheckpointKind

log = logging.getLogger(__name__)

COUNTERS = ("global_steps", "global_samples", "skipped_steps", "micro_steps")
"""The engine's counters a rollback puts back (its ``load_checkpoint`` restores the same)."""
CLIENT_KEY = "cliffguard"
"""Where a checkpoint's ``client_state`` keeps the guard's window and the LR scale."""


@dataclass(frozen=True, slots=True)
class RollbackPlan:
    memory: bool
    """This rank's share of the engine can be snapshotted and loaded back in memory."""
    disk: bool
    """The engine's checkpoint tags can be loaded (a save directory is known)."""
    reason: str
    """Why memory is not allowed, in words ('' when it is)."""

    @property
    def mode(self) -> str:
        return ("memory and disk" if self.disk else "memory") if self.memory else ("disk only" if self.disk else "none")


def rollback_plan(engine: Any, save_dir: str | None) -> RollbackPlan:
    """What the engine's configuration lets a rollback restore. The ZeRO optimizer's ``state_dict``
    holds this rank's partition only when the checkpoint is rigid; an elastic one is merged from
    every rank's at load, and an offloaded one lives in CPU or NVMe buffers the optimizer swaps:
    neither has been verified bit-for-bit from memory, so they restore from disk or not at all."""
    why = []
    if engine.zero_optimization_stage() in (1, 2) and engine.zero_elastic_checkpoint():
        why.append("zero_optimization.elastic_checkpoint merges every rank's partition at load")
    for name, part in (("offload_optimizer", engine.zero_offload_optimizer()), ("offload_param", engine.zero_offload_param())):
        device = str(getattr(getattr(part, "device", None), "value", getattr(part, "device", "none")))
        if part is not None and device != "none":
            why.append(f"zero_optimization.{name} to {device}")
    return RollbackPlan(memory=not why, disk=save_dir is not None, reason="; ".join(why))


class EngineState:
    """The kit's ``Snapshotter`` for a ``DeepSpeedEngine``: this rank's share, through DeepSpeed's
    own ``state_dict``/``load_state_dict`` (they know the partition layout; a copy by hand would
    not), or a checkpoint tag loaded with ``load_checkpoint`` (a state ``{"step", "disk"}``)."""

    def __init__(self, engine: Any, agent: Agent) -> None:
        from deepspeed.runtime.base_optimizer import ZeROOptimizer

        self.engine, self.agent = engine, agent
        self.broken = ""
        """Why the engine may hold a mix of two steps (a checkpoint that failed to load part-way)."""
        self.stage = int(engine.zero_optimization_stage())
        self._partitioned = isinstance(engine.optimizer, ZeROOptimizer)  # ZeRO 1-3 and the bf16 optimizer

    def capture(self, step: int) -> dict[str, Any]:
        e = self.engine
        state: dict[str, Any] = {"step": step, "optimizer": e.optimizer.state_dict(), "rng": rng_state(),
                                 "agent": self.agent.state_dict(), "engine": {c: getattr(e, c) for c in COUNTERS}}
        # ZeRO-3's module holds empty placeholders: its weights are the optimizer's fp32 partitions
        state["model"] = e.module.state_dict() if self.stage < 3 else "ZeRO-3 partitions"
        if e.lr_scheduler is not None:
            state["scheduler"] = e.lr_scheduler.state_dict()
        return state

    def load(self, state: dict[str, Any]) -> int:
        if "disk" in state:
            return self._load_tag(state)
        e = self.engine
        if self.stage < 3:
            e.module.load_state_dict(state["model"])
        if self._partitioned:
            # a list indexed by data-parallel rank, as load_checkpoint passes it; a rigid ZeRO load reads
            # only this rank's entry, and from_fp32 copies the saved fp32 partition (no bit16 rounding)
            world = dist.get_world_size() if dist.is_initialized() else 1
            e.optimizer.load_state_dict([state["optimizer"]] * world, load_optimizer_states=True,
                                        load_from_fp32_weights=True)
        else:
            e.optimizer.load_state_dict(state["optimizer"])
        if e.lr_scheduler is not None and "scheduler" in state:
            e.lr_scheduler.load_state_dict(state["scheduler"])
        for c, v in state["engine"].items():
            setattr(e, c, v)
        set_rng_state(state["rng"])
        self.agent.load_state_dict(state["agent"])
        return int(state["step"])

    def _load_tag(self, state: dict[str, Any]) -> int:
        save_dir, tag = state["disk"]
        try:
            path, client = self.engine.load_checkpoint(save_dir, tag=tag)
        except Exception as exc:
            # load_checkpoint loads the module before the optimizer: a failure after it leaves the
            # weights of one step beside the optimizer of another, so the run must not go on
            self.broken = f"DeepSpeed checkpoint {tag!r} failed to load part-way ({type(exc).__name__}: {exc})"
            raise
        if path is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint {tag!r} in {save_dir}")
        if client and CLIENT_KEY in client:
            self.agent.load_state_dict(client[CLIENT_KEY]["agent"])
        return int(state["step"])


class EngineCheckpoints:
    """A ``StateStore``: ``inner`` (the kit's ring store, None when memory is not allowed) first, then
    the engine's checkpoint tags this run saved, each labelled with the step it was taken before."""

    def __init__(self, inner: StateStore | None, engine: Any, save_dir: str | None) -> None:
        self.inner, self.engine, self.save_dir = inner, engine, save_dir
        self.tags: dict[int, tuple[str, str]] = {}

    def note_saved(self, step: int, save_dir: str, tag: str) -> None:
        self.tags[int(step)] = (str(save_dir), str(tag))

    def _disk(self) -> dict[int, tuple[str, str]]:
        return {s: t for s, t in self.tags.items() if os.path.isdir(os.path.join(*t))}

    def available_steps(self) -> list[int]:
        memory = self.inner.available_steps() if self.inner is not None else []
        return sorted(set(memory) | set(self._disk()))

    def restore(self, step: int, discard_newer: bool = True) -> tuple[dict[str, Any], str]:
        if self.inner is not None and step in self.inner.available_steps():
            return self.inner.restore(step, discard_newer)
        where = self._disk().get(step)
        if where is None:
            raise KeyError(f"step {step}: not in the memory ring nor a DeepSpeed checkpoint (have {self.available_steps()})")
        if discard_newer:
            self.discard_after(step)
        # what load_checkpoint puts back, named for the ack (agent/recovery/restored.py): not the RNG
        state = {"step": step, "disk": where, "model": where, "optimizer": where, "agent": where}
        if self.engine.lr_scheduler is not None:
            state["scheduler"] = where
        return state, f"disk ({where[1]})"

    def discard_after(self, step: int) -> None:
        if self.inner is not None:
            self.inner.discard_after(step)
        self.tags = {s: t for s, t in self.tags.items() if s <= step}  # the files stay; we forget them

    def on_step(self, step: int, state_fn: Callable[[], dict[str, Any]]) -> list[CheckpointKind]:
        return self.inner.on_step(step, state_fn) if self.inner is not None else []

    def save(self, step: int, state: dict[str, Any], kind: CheckpointKind | str = CheckpointKind.MEMORY) -> None:
        if self.inner is not None and kind == CheckpointKind.MEMORY:
            self.inner.save(step, state, kind)
        elif self.save_dir is not None:
            self.engine.save_checkpoint(self.save_dir, tag=f"cliffguard-step{step}")
