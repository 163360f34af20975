"""DeepSpeed: the recovery kit on a ``DeepSpeedEngine`` (extra ``cliffguard[deepspeed]``)::

    engine, *_ = deepspeed.initialize(model=model, config=ds_config, model_parameters=model.parameters())
    guard = attach(engine, run="my-run", loss_fn=lambda batch: loss_of(engine, batch))
    for batch in guard.batches(loader):          # commands at each optimizer-step boundary; ends on a stop
        engine.backward(loss_of(engine, batch))  # the loss recorded, then DeepSpeed's backward
        engine.step()                            # the guard, then DeepSpeed's step (or the update skipped)
    guard.close()

The engine's own ``backward`` and ``step`` are wrapped, so a DeepSpeed loop keeps its shape and
the kit (agent/recovery/kit.py) does the rest, as for every other loop:

- **guard enforced**: at each accumulation boundary ``step`` runs the agent's all-reduce and the
  guard; the kit's wrapper around ``engine.optimizer.step`` (the ZeRO optimizer's) then skips the
  update on every rank or applies it at the LR scale, and DeepSpeed's step does the rest of its
  bookkeeping (gradients cleared by the ZeRO optimizer's own ``zero_grad``, the scheduler, the
  counters), so ``engine.global_steps`` stays the agent's step. Clearing the gradients that way, not
  with ``engine.zero_grad()``, matters: under ZeRO-3 the engine's only drops ``param.grad`` and the
  skipped gradient leaks into the next update;
- **step events** with DeepSpeed's global gradient norm (``get_global_grad_norm``, read after the
  step; under ZeRO-2/3 the parameters hold no gradient for the agent to measure), the fp16 loss
  scale and DeepSpeed's own overflow skips (``skipped``), which feed the loss-scale rule;
- **rollback** from the memory ring of this rank's share of the engine (what DeepSpeed's own
  ``state_dict``/``load_state_dict`` give: the ZeRO partitions of the fp32 weights and optimizer
  state, the module's weights below ZeRO-3, the scheduler, the engine's counters, RNG, the guard),
  or from the engine's checkpoint tags (``save_checkpoint``/``load_checkpoint``, DeepSpeed's
  format; every save, the user's too, is a ``checkpoint`` event). What a configuration allows is
  declared in ``run.started`` (``config.rollback``, ``rollback_plan``): an offloaded or elastic
  ZeRO state is never restored from memory, only from disk or not at all;
- **validation** on ``val_batches`` (every rank the same count: ZeRO-3's forward is collective),
  else on held-back training batches, with ``loss_fn(batch) -> loss``.

DeepSpeed's ``PipelineEngine`` trains through ``train_batch`` and is refused (``ValueError``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist

from cliffguard.agent.collectors.mfu import ModelShape
from cliffguard.agent.config import AgentConfig
from cliffguard.agent.hooks import Agent
from cliffguard.agent.integrations.batch_tokens import batch_tokens
from cliffguard.agent.integrations.deepspeed_state import (
    CLIENT_KEY,
    EngineCheckpoints,
    EngineState,
    RollbackPlan,
    rollback_plan,
)
from cliffguard.agent.integrations.settings import agent_wiring
from cliffguard.agent.recovery import KitConfig, RecoveryKit
from cliffguard.agent.replica_groups import zero_layout
from cliffguard.core.enums import CheckpointKind, EventType

log = logging.getLogger(__name__)

LossFn = Callable[[Any], torch.Tensor]


def _tokens(batch: Any) -> int:
    first = batch[0] if isinstance(batch, (list, tuple)) and batch else batch
    if isinstance(first, dict):
        first = first.get("input_ids", next(iter(first.values()), None))
    return int(first.numel()) if isinstance(first, torch.Tensor) else 0


def _shape(module: torch.nn.Module, seq_len: int) -> ModelShape:
    """The model's shape from its ``.config``, counting ZeRO-3's partitioned parameters whole
    (``ds_numel``: their local tensors are empty placeholders)."""
    shape = ModelShape.infer(module, seq_len)
    return dataclasses.replace(shape, n_params=sum(int(getattr(p, "ds_numel", p.numel())) for p in module.parameters()))


class DeepSpeedGuard:
    """See the module docstring. Every rank builds one, after ``deepspeed.initialize``."""

    def __init__(self, engine: Any, *, run: str | None = None, config: AgentConfig | None = None,
                 config_path: str | None = None, loss_fn: LossFn | None = None,
                 val_batches: Iterable[Any] | None = None, kit_config: KitConfig | None = None,
                 save_dir: str | None = None, seq_len: int | None = None, shape: ModelShape | None = None,
                 sink: Any = None, kafka: Any = None, secret: Any = None, command_source: Any = None) -> None:
        from deepspeed.runtime.pipe.engine import PipelineEngine

        if isinstance(engine, PipelineEngine):
            raise ValueError("a DeepSpeed PipelineEngine trains through train_batch(): cliffguard cannot guard "
                             "its steps (attach to a DeepSpeedEngine without pipeline parallelism)")
        name = run or (config.run if config is not None else None)
        if not name:
            raise ValueError("run: name the run (or pass an AgentConfig)")
        self.engine = engine
        self.loss_fn, self.val_batches = loss_fn, val_batches
        agent_config, agent_kwargs = agent_wiring(name, config, config_path, sink=sink, kafka=kafka, secret=secret,
                                                  command_source=command_source)
        if shape is None and seq_len is not None:
            shape = _shape(engine.module, seq_len)
        self.agent = Agent(None, engine.module, engine.optimizer, agent_config, shape=shape, **agent_kwargs)
        # the SDC watch's witnesses: the engine is not DDP-wrapped, so the agent cannot see them itself
        self.agent.probe.declare_layout(zero_layout(int(engine.zero_optimization_stage()), self.agent.world))
        self.plan: RollbackPlan = rollback_plan(engine, save_dir)
        kit_cfg = kit_config if kit_config is not None else agent_config.recovery
        if not self.plan.memory:
            kit_cfg = dataclasses.replace(kit_cfg, snapshot_every=0)  # no memory snapshot: never loaded back
        self.checkpoints = EngineCheckpoints(None, engine, save_dir)
        self._state = state = EngineState(engine, self.agent)
        validate = self._validate if val_batches is not None else None
        if self.plan.memory or not self.plan.disk:
            self.kit = RecoveryKit(self.agent, engine.module, engine.optimizer, config=kit_cfg, state=state,
                                   loss_fn=loss_fn, validate_fn=validate, checkpoint_fn=self._checkpoint)
            if self.plan.memory:
                self.checkpoints.inner = self.kit.store
                self.kit.store = self.checkpoints  # the ring first, then the engine's checkpoint tags
        else:  # disk only: the engine's tags are the store (the kit then keeps no ring)
            self.kit = RecoveryKit(self.agent, engine.module, engine.optimizer, config=kit_cfg, state=state,
                                   store=self.checkpoints, loss_fn=loss_fn, validate_fn=validate,
                                   checkpoint_fn=self._checkpoint)
        if not self.plan.memory:
            log.warning("cliffguard: this DeepSpeed configuration cannot be rolled back in memory (%s): rollback "
                        "%s", self.plan.reason, "from the engine's checkpoints only" if self.plan.disk else
                        "unavailable (pass save_dir= to roll back from the engine's checkpoints)")
        self.kit.on_command = lambda cmd, outcome, before: self._stop_if_broken()
        self.kit.on_timeout = lambda timeout, before: self._stop_if_broken()
        self._at_boundary = True
        self._batch_tokens = 0
        self._inner_backward, self._inner_step = engine.backward, engine.step
        self._inner_save = engine.save_checkpoint
        engine.backward, engine.step = self._backward, self._step
        engine.save_checkpoint = self._save_checkpoint
        self.agent.set_step(int(engine.global_steps))
        self._watching = self.agent.watch_data() is not None  # [agent.data_watch], off the training thread

    def start(self) -> DeepSpeedGuard:
        """``run.started`` with the kit's capabilities and what a rollback can restore here."""
        e = self.engine
        self.kit.start(global_batch=int(e.train_batch_size()), config={
            "integration": "deepspeed", "zero_stage": int(e.zero_optimization_stage()),
            "gradient_accumulation_steps": int(e.gradient_accumulation_steps()),
            "rollback": self.plan.mode, **({"rollback_limit": self.plan.reason} if self.plan.reason else {})})
        return self

    # ------------------------------------------------------------------ the loop
    def batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        """The loader's micro-batches (each fetch timed as data wait); before each optimizer step's
        first one, the step boundary: commands applied, a pause or hold waited out. Ends when the
        loader does or a command stops the run."""
        for batch in self.agent.wrap_loader(loader):
            if self._at_boundary:
                self._at_boundary = False
                if not self.kit.at_boundary():
                    return
            self.kit.remember(batch)
            self._batch_tokens = _tokens(batch)
            if self._watching:
                self._observe(batch)
            yield batch

    def _observe(self, batch: Any) -> None:
        found = batch_tokens(batch)
        if found is None:  # not [B, T] token ids: nothing for the data watch to read
            self._watching = False
            log.info("cliffguard: the data watch is off for this run: its batches hold no [B, T] integer token ids")
            return
        self.agent.observe_batch(found[0], attention_mask=found[1])

    @property
    def step(self) -> int:
        """The step the loop runs next (moves back on a rollback)."""
        return self.agent.step

    def _backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        self.agent.after_forward(loss, tokens=self._batch_tokens)
        out = self._inner_backward(loss, *args, **kwargs)
        self.agent.after_backward()
        return out

    def _step(self, *args: Any, **kwargs: Any) -> Any:
        e = self.engine
        if not e.is_gradient_accumulation_boundary():
            return self._inner_step(*args, **kwargs)  # mid-accumulation: no update to judge
        lr = float(e.get_lr()[0])  # before the scheduler moves it
        applied = self.kit.before_optimizer_step()
        if not applied and getattr(e.optimizer, "overflow", False):
            # the skipped optimizer step does not recompute it: the previous step's fp16 overflow would
            # make DeepSpeed count this skip as one of its own (skipped_steps, no scheduler step)
            e.optimizer.overflow = False
        # the kit's wrapper around e.optimizer.step skips the update or scales its LR; DeepSpeed's step
        # then clears the gradients and moves the scheduler and its counters either way
        out = self._inner_step(*args, **kwargs)
        overflow = bool(getattr(e.optimizer, "overflow", False)) if applied else False
        extra: dict[str, Any] = {}
        norm = e.get_global_grad_norm() if applied and not overflow else None
        if norm is not None:
            extra["grad_norm"] = float(norm)
        scale = 1.0
        if e.fp16_enabled():
            # the engine's own reading (its monitor's): the scaler's current scale, after this step's update
            scale = float(e._get_optimizer_loss_scale() or 1.0)
            extra["overflow_skips"] = int(e.skipped_steps)
        self.agent.after_step(skipped=not applied or overflow, loss_scale=scale, lr=lr * self.kit.lr_scale_applied,
                              extra=extra)
        self._at_boundary = True
        return out

    def _stop_if_broken(self) -> None:
        """After a command or a timeout policy: a rollback whose checkpoint failed to load part-way
        left weights of one step beside an optimizer of another, so the run fails (run.failed) here."""
        if self._state.broken and not self.kit.stop_reason:
            log.error("cliffguard: %s; stopping the run", self._state.broken)
            self.kit.fail(self._state.broken)

    # ------------------------------------------------------------------ checkpoints
    def _save_checkpoint(self, save_dir: str, tag: str | None = None, client_state: dict | None = None,
                         *args: Any, **kwargs: Any) -> Any:
        """The engine's save (every rank), with the guard's state in its client state, noted as a
        rollback target and reported as a ``checkpoint`` event."""
        step = self.agent.step
        tag = tag or f"global_step{self.engine.global_steps}"  # DeepSpeed's own default tag
        client = {**(client_state or {}), CLIENT_KEY: {"agent": self.agent.state_dict(), "step": step}}
        out = self._inner_save(save_dir, tag, client, *args, **kwargs)
        if self.checkpoints.save_dir is None:
            self.checkpoints.save_dir = str(save_dir)
        self.checkpoints.note_saved(step, str(save_dir), str(tag))
        if self.agent.rank == 0:
            self.agent.emit(EventType.CHECKPOINT, {
                "kind": CheckpointKind.FULL.value, "path": f"{save_dir}/{tag}", "bytes": 0, "sha256": "",
                "seconds": 0.0, "verified": True, "detail": "saved by DeepSpeed (engine.save_checkpoint)"}, step=step)
        return out

    def _checkpoint(self, step: int, kind: CheckpointKind) -> None:
        if self.checkpoints.save_dir is not None and (kind is not CheckpointKind.MEMORY or not self.plan.memory):
            self.engine.save_checkpoint(self.checkpoints.save_dir, tag=f"cliffguard-step{step}")
        elif self.plan.memory:
            self.kit.snapshot()  # a full checkpoint asked of a run with no save_dir: the ring's, as the kit does
        else:
            raise RuntimeError("no checkpoint can be taken: memory is not allowed here and no save_dir is known")

    # ------------------------------------------------------------------ validation
    @torch.no_grad()
    def _validate(self, batches: int | None) -> tuple[float, int]:
        if self.loss_fn is None:
            raise RuntimeError("val_batches need a loss_fn(batch) -> loss")
        module = self.engine.module
        was_training = module.training
        module.eval()
        total = torch.zeros(2, dtype=torch.float64)
        try:
            for batch in self.val_batches or ():
                if batches and total[1] >= batches:
                    break
                total[0] += float(self.loss_fn(batch))
                total[1] += 1.0
            if dist.is_initialized():
                dist.all_reduce(total)  # the mean over every rank's batches
        finally:
            module.train(was_training)
        if total[1] == 0:
            raise RuntimeError("no validation data: the validation batches are empty")
        return float(total[0] / total[1]), int(total[1])

    # ------------------------------------------------------------------ the end
    def close(self, error: BaseException | str | None = None) -> None:
        """``run.finished`` with the final loss (``run.failed`` with ``error``), then everything closed."""
        failed = error or (self.kit.stop_reason if self.kit.stop_reason.startswith("failed:") else None)
        if failed:
            self.agent.close(failed)
        else:
            self.agent.close(final_loss=self.agent.global_loss)

    def __enter__(self) -> DeepSpeedGuard:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(exc)


def attach(engine: Any, *, run: str | None = None, **kwargs: Any) -> DeepSpeedGuard:
    """The agent and the recovery kit on ``engine``, started. Settings (Kafka, keys, ``[agent]``)
    come from ``CLIFFGUARD_CONFIG`` and the ``CLIFFGUARD_*`` environment like every process's;
    ``kwargs`` go to ``DeepSpeedGuard`` (``loss_fn``, ``val_batches``, ``save_dir``, ``kit_config``, ...)."""
    return DeepSpeedGuard(engine, run=run, **kwargs).start()
