"""Hugging Face ``Trainer`` integration: ``Trainer(..., callbacks=[CliffguardHFCallback(run="my-run")])``.

A real ``transformers.TrainerCallback`` (``transformers`` is imported only in this module) driving
the recovery kit (agent/recovery/kit.py), so the Trainer gets what every loop gets:

- **step events every step**, from ``on_step_end`` with the loss the callback captures from the
  model's forward (a forward hook): HF's ``logging_steps`` does not limit what the rules see;
- **the guard enforced**: ``on_pre_optimizer_step`` runs the agent's all-reduce and the guard, and
  the kit's wrapper around the Trainer's ``optimizer.step`` skips a bad update on every rank;
- **lr_scale applied** inside that same ``optimizer.step`` (the scheduler's LR times the scale for
  the update, then put back) and reported as applied (``kit.lr_scale_applied``); with the Trainer
  bound, its own logs show that applied LR too, and a rollback takes the rolled-back steps out of
  its logged loss average (agent/integrations/hf_logs.py);
- **commands** at each step end: ``pause`` holds inside the callback (heartbeats go on) through a
  ``validate`` until the controller's verdict; ``validate`` runs on the eval set when the callback
  knows the Trainer (``cb.train(trainer)`` or ``cb.bind(trainer)``, which uses ``evaluate()``),
  else on a held-back slice of recent training batches, and a failure is a ``failed`` ack, never a
  crash; ``rollback`` restores model, optimizer, scheduler and RNG from the kit's memory ring and
  rewinds ``state.global_step`` (the data goes on: the bad window is skipped, PaLM-style);
  ``checkpoint_now`` asks the Trainer to save; a step older than the ring is restored from the
  Trainer's own ``checkpoint-N`` (agent/integrations/hf_checkpoints.py); ``stop`` sets ``should_training_stop``;
- **checkpoint events** from ``on_save`` (the Trainer's ``checkpoint-N`` directories) besides the
  ring's memory snapshots;
- **run.failed** on an exception when training runs through ``cb.train(trainer)``, and at process
  exit if training ended without ``on_train_end``;
- **settings** from the same file and environment as every cliffguard process
  (agent/integrations/settings.py: ``CLIFFGUARD_CONFIG``, ``CLIFFGUARD_KAFKA__BOOTSTRAP``,
  ``CLIFFGUARD_COMMAND_SECRET``, ``[agent]``); a loud warning when the broker is only the default
  address or no command secret is set (the run then declares no capabilities: report-only).
"""

from __future__ import annotations

import atexit
import logging
import re
from typing import Any

import torch
from transformers import TrainerCallback

from cliffguard.agent.config import AgentConfig
from cliffguard.agent.hooks import Agent
from cliffguard.agent.integrations.hf_checkpoints import TrainerCheckpoints
from cliffguard.agent.integrations.hf_logs import LoggedLoss, log_applied_lr
from cliffguard.agent.integrations.settings import agent_wiring
from cliffguard.agent.recovery.kit import RecoveryKit
from cliffguard.core.enums import CheckpointKind, EventType

log = logging.getLogger(__name__)

_NOT_INPUTS = ("num_items_in_batch", "return_dict", "output_attentions", "output_hidden_states")
_CONTROL_FLAGS = ("should_log", "should_evaluate", "should_save", "should_epoch_stop", "should_training_stop")
"""What the Trainer decided for this step, kept across a validation the kit runs inside it."""


def _run_id(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:64] or "hf-run"


def _loss_of(output: Any) -> torch.Tensor | None:
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    return loss if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None


class CliffguardHFCallback(TrainerCallback):
    """See the module docstring. ``config`` wins over the settings files; ``run`` names the run
    (default: the Trainer's ``run_name``). ``sink``/``kafka``/``secret``/``command_source`` are
    passed to the ``Agent`` (tests and explicit setups)."""

    def __init__(self, config: AgentConfig | None = None, *, run: str | None = None, config_path: str | None = None,
                 seq_len: int | None = None, sink: Any = None, kafka: Any = None, secret: Any = None,
                 command_source: Any = None) -> None:
        super().__init__()
        self.config = config
        self.run = run
        self.config_path = config_path
        self.seq_len = seq_len
        self._agent_kwargs = {"sink": sink, "kafka": kafka, "secret": secret, "command_source": command_source}
        self.trainer: Any = None
        self.agent: Agent | None = None
        self.kit: RecoveryKit | None = None
        self.checkpoints: TrainerCheckpoints | None = None
        self._hook: Any = None
        self._grad_accum = 1
        self._lr = 0.0
        self._no_loss_warned = False
        self._in_evaluate = False
        self._save_requested = False
        self._logged_loss: LoggedLoss | None = None

    # ------------------------------------------------------------------ wiring
    def bind(self, trainer: Any) -> CliffguardHFCallback:
        """Know the Trainer: ``validate`` then runs ``trainer.evaluate()`` when it has an eval set."""
        self.trainer = trainer
        return self

    def train(self, trainer: Any, **kwargs: Any) -> Any:
        """``trainer.train(**kwargs)``, bound, with ``run.failed`` sent if it raises."""
        self.bind(trainer)
        try:
            return trainer.train(**kwargs)
        except BaseException as exc:
            self.close(exc)
            raise

    def close(self, error: BaseException | str | None = None) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.agent is not None:
            self.agent.close(error)

    def _settings(self, args: Any) -> tuple[AgentConfig, dict[str, Any]]:
        run = self.run or (self.config.run if self.config is not None else _run_id(str(args.run_name or "hf-run")))
        return agent_wiring(run, self.config, self.config_path, **self._agent_kwargs)

    # ------------------------------------------------------------------ training begins / ends
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       lr_scheduler: Any = None, **kwargs: Any) -> Any:
        config, agent_kwargs = self._settings(args)
        self.agent = Agent(None, model, optimizer, config, seq_len=self.seq_len, **agent_kwargs)
        extra: dict[str, Any] = {}
        if self.trainer is not None:  # bound: its logs follow the LR scale and the rollbacks
            self._logged_loss = extra["logged loss"] = LoggedLoss(self.trainer)
        else:
            log.info("cliffguard: the Trainer is not bound (cb.train(trainer) or cb.bind(trainer)): validation "
                     "uses held-back training batches, and the Trainer's own logs show the unscaled LR")
        self.kit = RecoveryKit(self.agent, model, optimizer, lr_scheduler, validate_fn=self._validate,
                               loss_fn=self._held_back_loss, checkpoint_fn=self._checkpoint, extra_state=extra)
        if self.trainer is not None:
            kit = self.kit
            log_applied_lr(self.trainer, lambda: kit.lr_scale_applied)
        self.checkpoints = TrainerCheckpoints(self.kit.store, model, self.agent.rank)
        self.kit.store = self.checkpoints  # the ring first, then the Trainer's own checkpoint-N
        self.agent.set_step(int(state.global_step))
        self._grad_accum = max(1, int(getattr(args, "gradient_accumulation_steps", 1) or 1))
        self._hook = model.register_forward_hook(self._on_forward, with_kwargs=True)
        self.agent.watch_data()  # [agent.data_watch]: each training micro-batch's ids, off the training thread
        world = max(1, int(getattr(args, "world_size", 1) or 1))
        batch = int(getattr(args, "per_device_train_batch_size", 0) or 0) * self._grad_accum * world
        self.kit.start(global_batch=batch, config={"learning_rate": getattr(args, "learning_rate", None),
                                                   "max_steps": getattr(state, "max_steps", None),
                                                   "integration": "hf"})
        atexit.register(self._at_exit)
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.close()
        return control

    def _at_exit(self) -> None:
        if self.agent is not None and not self.agent.closed:
            self.close("training ended without on_train_end (an exception in the Trainer?)")

    # ------------------------------------------------------------------ one step
    def _on_forward(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        if not (module.training and torch.is_grad_enabled()) or self.agent is None or self.kit is None:
            return
        loss = _loss_of(output)
        if loss is None:
            return
        # With num_items_in_batch the model returns this micro-batch's share of the step's mean.
        share = kwargs.get("num_items_in_batch") is not None
        ids = kwargs.get("input_ids")
        self.agent.after_forward(loss * self._grad_accum if share else loss,
                                 tokens=int(ids.numel()) if isinstance(ids, torch.Tensor) else 0)
        if isinstance(ids, torch.Tensor) and ids.dim() == 2:
            mask = kwargs.get("attention_mask")
            self.agent.observe_batch(ids, attention_mask=mask if isinstance(mask, torch.Tensor) else None)
        self.kit.remember({k: v for k, v in kwargs.items() if k not in _NOT_INPUTS and isinstance(v, torch.Tensor)})

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any) -> Any:
        if self.kit is None or self.agent is None:
            return control
        if not self.agent.saw_loss:
            if not self._no_loss_warned:
                self._no_loss_warned = True
                log.warning("cliffguard: the model's forward returned no loss; the guard cannot judge the steps")
            return control
        self.kit.before_optimizer_step()
        if optimizer is not None:
            self._lr = float(optimizer.param_groups[0]["lr"]) * self.agent.lr_scale.value
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        agent, kit = self.agent, self.kit
        if agent is None or kit is None:
            return control
        if agent.saw_loss:
            agent.after_step(lr=self._lr)
        else:
            agent.set_step(agent.step + 1)
        if not kit.at_boundary():
            control.should_training_stop = True
        if self._save_requested:  # checkpoint_now: the Trainer saves right after this callback
            self._save_requested = False
            control.should_save = True
        if int(state.global_step) != agent.step:  # a rollback moved the step back
            state.global_step = agent.step
            if self._logged_loss is not None:
                self._logged_loss.after_rollback(agent.step)
        return control

    # ------------------------------------------------------------------ what the kit calls back
    def _validate(self, batches: int | None) -> tuple[float, int]:
        trainer = self.trainer
        if trainer is not None and getattr(trainer, "eval_dataset", None) is not None:
            self._in_evaluate = True
            # evaluate() logs, and the Trainer's callback handler clears should_log on every log: the
            # step's own training log (decided before this callback ran) must still happen
            flags = {k: getattr(trainer.control, k) for k in _CONTROL_FLAGS}
            try:
                metrics = trainer.evaluate()
            finally:
                self._in_evaluate = False
                for k, v in flags.items():
                    setattr(trainer.control, k, v)
            val = metrics.get("eval_loss")
            if val is None:
                raise RuntimeError("evaluate() returned no eval_loss")
            return float(val), len(trainer.get_eval_dataloader())
        assert self.kit is not None
        return self.kit.validate_held_back(batches)

    def _held_back_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        assert self.agent is not None
        model = self.agent.model
        device = next(model.parameters()).device
        out = model(**{k: v.to(device) for k, v in batch.items()})
        loss = _loss_of(out)
        if loss is None:
            raise RuntimeError("the model returns no loss for a held-back batch (no labels?)")
        return loss

    def _checkpoint(self, step: int, kind: CheckpointKind) -> None:
        assert self.kit is not None
        if kind is CheckpointKind.MEMORY:
            self.kit.snapshot()
        else:
            self._save_requested = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        path = f"{args.output_dir}/checkpoint-{state.global_step}"
        if self.checkpoints is not None:
            self.checkpoints.note_saved(int(state.global_step), path)
        if self.agent is not None and self.agent.rank == 0:
            self.agent.emit(EventType.CHECKPOINT, {"kind": CheckpointKind.FULL.value, "path": path, "bytes": 0,
                                                   "sha256": "", "seconds": 0.0, "verified": True,
                                                   "detail": "saved by the Hugging Face Trainer"},
                            step=int(state.global_step))
        return control

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict | None = None, **kwargs: Any) -> Any:
        # A validation the kit asked for is reported by the kit (with its command id).
        val = (metrics or {}).get("eval_loss")
        if self._in_evaluate or self.agent is None or self.agent.rank != 0 or not isinstance(val, (int, float)):
            return control
        n = len(kwargs.get("eval_dataloader") or [])
        self.agent.emit(EventType.VALIDATION, {"val_loss": float(val), "batches": n}, step=int(state.global_step))
        return control
"""The former name, kept while README.md's snippets import it (prefer ``CliffguardHFCallback``)."""
