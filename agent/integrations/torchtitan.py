"""torchtitan: the recovery kit inside its ``Trainer`` (extra ``cliffguard[torchtitan]``). In a config module::

    from cliffguard.agent.integrations.torchtitan import guarded
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    def llama3_guarded():
        return guarded(llama3_debugmodel(), run="llama3-debug")

then ``torchrun ... -m torchtitan.train --module my_configs --config llama3_guarded``: the config
builds ``CliffguardTrainer``, torchtitan's ``Trainer`` with the kit (agent/recovery/kit.py) at its
seams, and torchtitan's own loop otherwise unchanged:

- **step boundary** (``should_continue_training``, before each step): the controller's commands,
  a pause or hold waited out, memory snapshots; a rollback moves ``trainer.step`` back;
- **step events** with the global loss (each micro-batch's, from ``forward_backward_step``) and
  torchtitan's global gradient norm (what ``clip_grad_norm_`` returned; FSDP's sharded gradients
  are not the agent's to measure);
- **guard enforced**: ``self.optimizers.step()`` (right after the clip) runs the guard first and skips
  the update on every rank, or applies it at the LR scale (each optimizer's LR times ``lr_scale``
  for the step, then put back); the step's loss check that would stop a run on a non-finite loss
  is let pass when the guard skipped that update;
- **rollback** from the memory ring (the FSDP shards, the optimizers, the LR schedulers, the
  trainer's step, the guard) or from the checkpointer's saved steps (``checkpointer.load``, the
  loader excepted: it goes on, as after a memory rollback); every save of the checkpointer is a
  ``checkpoint`` event, carries the guard's state and, unless model-only, is a rollback target (a
  checkpoint saved without cliffguard loads without it);
- **validation** with torchtitan's validator when ``validator.enable``, else on held-back training
  batches.

Pipeline parallelism is refused when the config is made (``ValueError``): its schedule runs the
forward and backward of several model parts in one call, where no step of it can be guarded.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any

import torch
import tyro
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.trainer import Trainer

from cliffguard.agent.collectors.mfu import ModelShape
from cliffguard.agent.config import AgentConfig
from cliffguard.agent.hooks import Agent
from cliffguard.agent.integrations.batch_tokens import batch_tokens
from cliffguard.agent.integrations.settings import agent_wiring
from cliffguard.agent.integrations.torchtitan_seams import grad_norms, validator_loss
from cliffguard.agent.integrations.torchtitan_state import (
    AGENT_KEY,
    AgentStateful,
    ParamsView,
    TitanCheckpoints,
    TitanState,
    folder_bytes,
    load_tolerating_no_guard,
    save_full,
)
from cliffguard.agent.recovery import RecoveryKit
from cliffguard.core.enums import CheckpointKind, EventType

log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class GuardSettings:
    """The ``cliffguard`` section of a guarded torchtitan config."""

    run: str = ""
    """The run's id (required)."""
    config_path: str | None = None
    """cliffguard's TOML file (default: ``CLIFFGUARD_CONFIG``); the ``CLIFFGUARD_*`` environment overrides it."""
    agent: Annotated[AgentConfig | None, tyro.conf.Suppress] = None
    """An ``AgentConfig`` to use instead of the settings' ``[agent]`` section (set in code)."""
    sink: Annotated[Any, tyro.conf.Suppress] = None
    """Where events go instead of Kafka (tests: an ``InMemorySink``)."""
    command_source: Annotated[Any, tyro.conf.Suppress] = None
    """Where rank 0 reads commands instead of Kafka (tests)."""


def _check_guardable(config: Trainer.Config) -> None:
    if config.parallelism.pipeline_parallel_degree > 1:
        raise ValueError(
            "cliffguard cannot guard a torchtitan run with pipeline parallelism "
            f"(parallelism.pipeline_parallel_degree={config.parallelism.pipeline_parallel_degree}): its schedule "
            "runs every stage's forward and backward in one call, so no update can be judged or rolled back "
            "whole; train without it, or run unguarded")
    if not config.cliffguard.run:
        raise ValueError("cliffguard.run: name the run")


def _guarded_lr(trainer: CliffguardTrainer) -> float:
    return float(trainer.lr_schedulers.schedulers[0].get_last_lr()[0])


class CliffguardTrainer(Trainer):
    """torchtitan's ``Trainer`` with the recovery kit at its seams (see the module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        cliffguard: GuardSettings = field(default_factory=GuardSettings)

        def __post_init__(self) -> None:
            Trainer.Config.__post_init__(self)  # slots: the zero-argument super() has no class cell here
            _check_guardable(self)

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        settings = config.cliffguard
        agent_config, wiring = agent_wiring(settings.run, settings.agent, settings.config_path, sink=settings.sink,
                                            command_source=settings.command_source)
        model = self.model_parts[0]
        self.agent = Agent(None, ParamsView(model), None, agent_config, shape=self._shape(), **wiring)
        self._state = TitanState(self, self.agent)
        validate = self._validate_with_validator if config.validator.enable else None
        kit_cfg = agent_config.recovery
        memory, disk = kit_cfg.snapshot_every > 0, bool(self.checkpointer.enable)
        # no memory snapshots: the checkpointer's steps are the store (the kit then keeps no ring)
        self.checkpoints = TitanCheckpoints(None, self.checkpointer) if disk else None
        self.kit = RecoveryKit(self.agent, model, self.optimizers, config=kit_cfg, state=self._state,
                               store=None if memory else self.checkpoints, loss_fn=self._held_back_loss,
                               validate_fn=validate, checkpoint_fn=self._checkpoint,
                               wrap_optimizer=False)  # the container's own param groups carry no LR: see _step
        self.rollback = ("memory and disk" if disk else "memory") if memory else ("disk only" if disk else "none")
        """Where a rollback can restore from (``run.started``'s ``config.rollback``)."""
        if self.checkpoints is not None:
            if memory:
                self.checkpoints.inner = self.kit.store
                self.kit.store = self.checkpoints  # the ring first, then the checkpointer's steps
            self.checkpointer.states[AGENT_KEY] = AgentStateful(self.agent)  # the guard rides every save
            self._inner_save, self._inner_load = self.checkpointer.save, self.checkpointer.load
            self.checkpointer.save, self.checkpointer.load = self._save, self._load
        self.kit.on_command = lambda cmd, outcome, before: self._stop_if_broken()
        self.kit.on_timeout = lambda timeout, before: self._stop_if_broken()
        self._inner_step = self.optimizers.step
        self.optimizers.step = self._step
        self._started = False
        self._applied = False
        self._lr = 0.0
        self._watching = True

    def _shape(self) -> ModelShape:
        cfg = self.model_config
        layers = getattr(cfg, "layers", None) or []
        attention = getattr(layers[0], "attention", None) if layers else None
        heads = int(getattr(attention, "n_heads", 0) or 0)
        head_dim = int(getattr(attention, "head_dim", 0) or (getattr(cfg, "dim", 0) // heads if heads else 0))
        n_params = sum(p.numel() for p in self.model_parts[0].parameters())
        return ModelShape(n_params, len(layers), heads, head_dim, self.config.training.seq_len)

    # ------------------------------------------------------------------ the loop's seams
    def should_continue_training(self) -> bool:
        """The step boundary, before each step: commands, holds, snapshots. False ends the loop."""
        if not self._started:
            self._start()
        if self.step >= self.config.training.steps:
            return False
        boundary = self.kit.at_boundary()
        if not boundary:
            return False
        self.step = boundary.step  # back after a rollback (the agent's counter is the one counter)
        return True

    def _start(self) -> None:
        """``run.started``, once torchtitan has loaded the checkpoint it resumes from."""
        self._started = True
        self.agent.set_step(self.step)
        c, dims = self.config, self.parallel_dims
        batch = c.training.global_batch_size
        if batch < 0:
            batch = c.training.local_batch_size * (dims.dp_replicate * dims.dp_shard)
        self.kit.start(global_batch=int(batch), config={
            "integration": "torchtitan", "model": f"{c.model_spec.name} {c.model_spec.flavor}",
            "parallelism": {"dp_replicate": dims.dp_replicate, "dp_shard": dims.dp_shard, "tp": dims.tp,
                            "cp": dims.cp, "pp": dims.pp, "ep": dims.ep},
            "gradient_accumulation_steps": int(self.gradient_accumulation_steps),
            "rollback": self.rollback,
            "validation": "torchtitan validator" if c.validator.enable else "held-back training batches"})

    def train_step(self, data_iterator: Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]) -> None:
        norms: list[torch.Tensor] = []
        self._applied = False
        try:
            with grad_norms(norms):
                super().train_step(self._observed(data_iterator))
        except RuntimeError as exc:
            # torchtitan stops on a non-finite loss after the step; the guard skipped that update
            if self._applied or "Loss is not finite" not in str(exc):
                raise
        extra = {"grad_norm": float(norms[-1])} if norms else {}
        self.agent.after_step(skipped=not self._applied, lr=self._lr, extra=extra)

    def _observed(self, data_iterator: Iterator[Any]) -> Iterator[Any]:
        """The step's micro-batches: each fetch timed as data wait, kept for validation, watched."""
        while True:
            with self.agent.data_wait():
                batch = next(data_iterator)
            self.kit.remember(batch)
            if self._watching:
                self._observe(batch)
            yield batch

    def _observe(self, batch: Any) -> None:
        input_dict = batch[0] if isinstance(batch, tuple) else batch
        found = batch_tokens({"input_ids": input_dict.get("input")} if isinstance(input_dict, dict) else batch)
        if found is None:
            self._watching = False
            log.info("cliffguard: the data watch is off for this run: its batches hold no [B, T] integer token ids")
            return
        self.agent.observe_batch(found[0])

    def forward_backward_step(self, *, input_dict: Any, labels: Any, global_valid_tokens: torch.Tensor) -> torch.Tensor:
        loss = super().forward_backward_step(input_dict=input_dict, labels=labels,
                                             global_valid_tokens=global_valid_tokens)
        # torchtitan's loss is this rank's sum over the global token count; the agent wants this
        # rank's mean (it averages the ranks' on its one all-reduce)
        local = (labels != IGNORE_INDEX).sum().clamp(min=1)
        self.agent.after_forward(loss.detach() * global_valid_tokens / local, tokens=int(labels.numel()))
        self.agent.after_backward()
        return loss

    def _step(self, closure: Any = None) -> None:
        """``self.optimizers.step()``: the guard, then the update it allows at the LR scale."""
        self._lr = _guarded_lr(self)
        self._applied = self.kit.before_optimizer_step()
        if not self._applied:
            return None  # the scheduler still moves on, as after any skipped step
        groups = [g for opt in self.optimizers.optimizers for g in opt.param_groups]
        lrs = [g["lr"] for g in groups]
        for g in groups:
            g["lr"] = self.kit.scaled_lr(g["lr"])
        self._lr = self.kit.scaled_lr(self._lr)
        try:
            return self._inner_step()
        finally:
            for g, lr in zip(groups, lrs, strict=True):
                g["lr"] = lr

    def _stop_if_broken(self) -> None:
        if self._state.broken and not self.kit.stop_reason:
            log.error("cliffguard: %s; stopping the run", self._state.broken)
            self.kit.fail(self._state.broken)

    # ------------------------------------------------------------------ checkpoints
    def _save(self, curr_step: int, last_step: bool = False) -> bool:
        """The checkpointer's save; a written one is a ``checkpoint`` event and a rollback target."""
        t0 = time.monotonic()
        saved = self._inner_save(curr_step, last_step)
        if not saved or self.checkpoints is None:
            return saved
        full = not (last_step and self.checkpointer.last_save_model_only)
        if full:
            self.checkpoints.note_saved(curr_step)
        if self.agent.rank == 0:
            path = self.checkpoints.path(curr_step)
            self.agent.emit(EventType.CHECKPOINT, {
                "kind": CheckpointKind.FULL.value, "path": path, "bytes": folder_bytes(path), "sha256": "",
                "seconds": round(time.monotonic() - t0, 3), "verified": full,
                "detail": "saved by torchtitan's checkpointer" + ("" if full else " (model only: no rollback target)")},
                step=curr_step)
        return saved

    def _load(self, step: int = -1) -> bool:
        return load_tolerating_no_guard(self._inner_load, self.checkpointer, step)

    def _checkpoint(self, step: int, kind: CheckpointKind) -> None:
        if kind is CheckpointKind.MEMORY or self.checkpoints is None:
            self.kit.snapshot()
        else:
            save_full(self.checkpointer, step)

    # ------------------------------------------------------------------ validation
    @torch.no_grad()
    def _held_back_loss(self, batch: Any) -> torch.Tensor:
        input_dict, labels = batch
        input_dict = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in input_dict.items()}
        seen = self.ntokens_seen
        inputs, labels, extra = self.post_dataloading_process(input_dict, labels.to(self.device))
        self.ntokens_seen = seen  # a validation batch is no training token
        with self.train_context():
            pred = self.model_parts[0](inputs, **extra)
            tokens = (labels != IGNORE_INDEX).sum().clamp(min=1)
            loss, _ = self.loss_fn(pred, labels, tokens)
        return loss

    def _validate_with_validator(self, batches: int | None) -> tuple[float, int]:
        return validator_loss(self.validator, self.metrics_processor, self.model_parts, self.step), \
            int(self.config.validator.steps)

    # ------------------------------------------------------------------ the end
    def close(self) -> None:
        """``run.finished`` (``run.failed`` when torchtitan closes while an error is raised), then torchtitan's."""
        try:
            if not self.agent.closed:
                error = sys.exc_info()[1] or (self.kit.stop_reason if self.kit.stop_reason.startswith("failed:")
                                              else None)
                if error:
                    self.agent.close(error)
                else:  # the last step event's loss (the probe's own is reset once a step closes)
                    self.agent.close(final_loss=(self.agent.last or {}).get("loss"))
        finally:
            super().close()


def guarded(config: Trainer.Config, *, run: str, **settings: Any) -> CliffguardTrainer.Config:
    """``config`` (a torchtitan ``Trainer.Config``) made to build a ``CliffguardTrainer`` for ``run``;
    ``settings`` are ``GuardSettings``'s other fields."""
    if type(config) is not Trainer.Config:
        raise ValueError(f"guarded() takes a torchtitan Trainer.Config, not a {type(config).__qualname__} "
                         "(a Trainer subclass's config: subclass CliffguardTrainer instead)")
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
    return CliffguardTrainer.Config(**fields, cliffguard=GuardSettings(run=run, **settings))
