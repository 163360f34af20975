"""Lightning: ``Trainer(callbacks=[CliffguardLightningCallback(run="my-run")])`` (extra ``cliffguard[lightning]``).

A real ``pytorch_lightning.Callback`` driving the recovery kit (agent/recovery/kit.py), so a
LightningModule gets what every other loop gets, from the same implementation:

- **guard enforced**: the agent's all-reduce and the guard run in ``on_before_optimizer_step``
  (after Lightning's closure: forward and backward), and the optimizer's ``step`` skips a bad
  update on every rank;
- **commands at step boundaries** (``on_train_batch_start``): pause held (heartbeats go on) through
  validation until the controller's verdict, rollback from the kit's memory ring (model, optimizer,
  scheduler, RNG), ``lr_scale`` applied inside the optimizer step and reported as applied,
  ``checkpoint_now`` as a ring snapshot, ``stop`` as ``trainer.should_stop``; memory checkpoints
  reported as ``checkpoint`` events, so stable rollback targets exist;
- **validation** on ``val_batches`` when given, else on the trainer's validation dataloader when it
  has one, else on the last training batches (held back on CPU); never a crash: without data the
  validate command is acked ``failed``;
- **periodic validation** every ``[agent.recovery] val_every`` steps, by the kit (the same
  validation as the command's, so the controller's baseline and a spike's verdict compare alike);
- **run.failed** on an exception (``on_exception``), run.finished at the end of fitting;
- Kafka, the command secret and ``[agent]`` from the settings every process reads
  (agent/integrations/settings.py: ``CLIFFGUARD_CONFIG`` < ``CLIFFGUARD_*`` env), with a loud
  warning when nothing would reach a controller; without a secret the run declares no command.

``shape`` (or ``seq_len`` with a module that has a ``.config``) gives MFU its FLOPs per token.
``loss_fn(module, batch) -> loss`` is how a batch is validated; the default calls the module's
``training_step`` (its ``self.log`` muted) and takes the tensor or its ``"loss"``. ``pytorch_lightning``
is imported only here. Gradient accumulation is supported (one step per optimizer step); Lightning's
LBFGS-style optimizers that call the closure several times are not.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from typing import Any

import pytorch_lightning as pl
import torch

from cliffguard.agent.collectors.mfu import ModelShape
from cliffguard.agent.config import AgentConfig
from cliffguard.agent.hooks import Agent
from cliffguard.agent.integrations.batch_tokens import batch_tokens
from cliffguard.agent.integrations.settings import agent_wiring
from cliffguard.agent.recovery import KitConfig, RecoveryKit

log = logging.getLogger(__name__)

LossFn = Callable[[Any, Any], torch.Tensor]


def _tokens(batch: Any) -> int:
    first = batch[0] if isinstance(batch, (list, tuple)) and batch else batch
    if isinstance(first, dict):
        first = first.get("input_ids", next(iter(first.values()), None))
    return int(first.numel()) if isinstance(first, torch.Tensor) else 0


def _has_int_tensor(batch: Any) -> bool:
    parts = list(batch.values()) if isinstance(batch, dict) else list(batch) if isinstance(batch, (list, tuple)) else [batch]
    return any(isinstance(p, torch.Tensor) and not p.is_floating_point() for p in parts)


def _global_batch(trainer: Any) -> int:
    """Samples per optimizer step over every rank, from the train loader's batch size (0 = not
    known: a loader of whole batches, ``batch_size=None``, or an iterable of another kind)."""
    size = getattr(getattr(trainer, "train_dataloader", None), "batch_size", None)
    if not isinstance(size, int) or size <= 0:
        return 0
    accumulate = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
    return size * max(1, accumulate) * max(1, int(getattr(trainer, "world_size", 1) or 1))


def training_step_loss(module: Any, batch: Any) -> torch.Tensor:
    """The module's ``training_step`` loss on ``batch``, with its logging muted (a validation run
    between steps is not a training step to log)."""
    module.log = module.log_dict = lambda *a, **k: None  # instance attributes shadow the methods
    try:
        out = module.training_step(batch, 0)
    finally:
        del module.log, module.log_dict
    loss = out["loss"] if isinstance(out, dict) else out
    if not isinstance(loss, torch.Tensor):
        raise RuntimeError("training_step returned no loss tensor: give CliffguardLightningCallback a loss_fn")
    return loss


class CliffguardLightningCallback(pl.Callback):
    """See the module docstring. ``config`` wins over the settings' ``[agent]``; ``run`` names the run;
    ``sink``/``kafka``/``secret``/``command_source`` go to the ``Agent`` (tests, explicit setups)."""

    def __init__(self, config: AgentConfig | None = None, *, run: str | None = None, config_path: str | None = None,
                 loss_fn: LossFn | None = None, val_batches: Iterable[Any] | None = None, kit_config: KitConfig | None = None, seq_len: int | None = None, shape: ModelShape | None = None,
                 sink: Any = None, kafka: Any = None, secret: Any = None, command_source: Any = None) -> None:
        super().__init__()
        self.run = run or (config.run if config is not None else None)
        if not self.run:
            raise ValueError("run: name the run (or pass an AgentConfig)")
        self.config, self.config_path = config, config_path
        self.loss_fn = loss_fn or training_step_loss
        self.val_batches = val_batches
        self.kit_config = kit_config
        self.seq_len, self.shape = seq_len, shape
        self._agent_kwargs = {"sink": sink, "kafka": kafka, "secret": secret, "command_source": command_source}
        self.agent: Agent | None = None
        self.kit: RecoveryKit | None = None
        self._module: Any = None
        self._trainer: Any = None
        self._at_boundary = True  # the next batch opens an optimizer step (not mid-accumulation)
        self._stepped = False
        self._lr = 0.0
        self._watching = False

    # ------------------------------------------------------------------ wiring
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.kit is not None:
            return
        optimizer = trainer.optimizers[0]
        scheduler = trainer.lr_scheduler_configs[0].scheduler if trainer.lr_scheduler_configs else None
        config, agent_kwargs = agent_wiring(self.run, self.config, self.config_path, **self._agent_kwargs)
        self.agent = Agent(None, pl_module, optimizer, config, seq_len=None if self.shape else self.seq_len,
                           shape=self.shape, **agent_kwargs)
        self._module, self._trainer = pl_module, trainer
        self.kit = RecoveryKit(self.agent, pl_module, optimizer, scheduler, config=self.kit_config,
                               loss_fn=self._loss, validate_fn=self._validate if self._has_val_data() else None,
                               wrap_optimizer=True)
        optimizer.step = self._closure_first(optimizer.step)
        self._watching = self.agent.watch_data() is not None  # [agent.data_watch], off the training thread
        self.kit.start(global_batch=_global_batch(trainer),
                       config={"integration": "lightning", "max_steps": trainer.max_steps})

    @staticmethod
    def _closure_first(kit_step: Callable[..., Any]) -> Callable[..., Any]:
        """Lightning calls ``optimizer.step(closure)`` and the closure runs the forward, the backward
        and ``on_before_optimizer_step`` (where the guard decides): so run it first, then the kit's
        step, which skips the update or applies it at the LR scale."""

        @functools.wraps(kit_step)
        def step(closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            kit_step(**kwargs)
            return loss

        return step

    # ------------------------------------------------------------------ per step
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        kit = self.kit
        assert kit is not None and self.agent is not None
        if self._at_boundary:
            self._at_boundary = False
            if not kit.at_boundary():
                trainer.should_stop = True
        kit.remember(batch)
        self._batch_tokens = _tokens(batch)
        if self._watching:
            self._observe(batch)

    def _observe(self, batch: Any) -> None:
        assert self.agent is not None
        found = batch_tokens(batch)
        if found is None:
            self._watching = False
            # a batch with integer tensors the watch could not place may be token data in another shape:
            # say so; a batch of floats (a regression, images) is not text, and the watch has nothing to do
            say = log.warning if _has_int_tensor(batch) else log.info
            say("cliffguard: the data watch is off for this run: its batches hold no [B, T] integer token ids "
                "(a tensor, a mapping with 'input_ids', or a tuple starting with one); call "
                "cb.agent.observe_batch(ids) from training_step instead, or set [agent.data_watch] enabled = false")
            return
        ids, mask = found
        self.agent.observe_batch(ids, attention_mask=mask)

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        assert self.agent is not None
        self.agent.after_forward(loss, tokens=self._batch_tokens)

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        assert self.agent is not None
        self.agent.after_backward()

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        assert self.kit is not None
        self._lr = float(optimizer.param_groups[0]["lr"])  # before the scheduler moves it
        self.kit.before_optimizer_step()
        self._stepped = True

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self._stepped:
            return  # mid-accumulation: the optimizer step is still to come
        assert self.kit is not None and self.agent is not None
        self._stepped = False
        self._at_boundary = True
        self.agent.after_step(lr=self._lr * self.kit.lr_scale_applied)

    # ------------------------------------------------------------------ validation
    def _loss(self, batch: Any) -> torch.Tensor:
        assert self._trainer is not None
        return self.loss_fn(self._module, self._trainer.strategy.batch_to_device(batch))

    def _val_source(self) -> Iterable[Any] | None:
        if self.val_batches is not None:
            return self.val_batches
        loaders = getattr(self._trainer, "val_dataloaders", None)
        if isinstance(loaders, (list, tuple)):
            loaders = loaders[0] if loaders else None
        return loaders

    def _has_val_data(self) -> bool:
        return self._val_source() is not None

    @torch.no_grad()
    def _validate(self, batches: int | None) -> tuple[float, int]:
        source = self._val_source()
        module = self._module
        was_training = module.training
        module.eval()
        total, n = 0.0, 0
        try:
            for batch in source or ():
                if batches and n >= batches:
                    break
                total += float(self._loss(batch))
                n += 1
        finally:
            module.train(was_training)
        if n == 0:
            raise RuntimeError("no validation data: the validation batches are empty")
        return total / n, n

    # ------------------------------------------------------------------ the end
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self.agent is not None:
            self.agent.close(error=exception)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.agent is None or self.kit is None:
            return
        failed = self.kit.stop_reason.startswith("failed:")
        if failed:
            self.agent.close(error=self.kit.stop_reason)
        else:
            self.agent.close(final_loss=self.agent.global_loss)
"""The former name, kept while README.md's snippets import it (prefer ``CliffguardLightningCallback``)."""
