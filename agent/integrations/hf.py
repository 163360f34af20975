"""Hugging Face ``Trainer`` integration (``transformers`` is imported only here).

First version: the duck-typed callback moved from agent/integrations.py unchanged; replaced by a
real ``TrainerCallback`` on the recovery kit.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from agent.hooks import Agent, AgentConfig
from agent.integrations.accelerate import _scalar
from agent.modes import PAUSED, RUNNING
from core.enums import AckStatus, CommandType, EventType

log = logging.getLogger(__name__)


class CliffguardCallback:
    """Hugging Face ``TrainerCallback``, duck-typed (see the module docstring)."""

    def __init__(self, config: AgentConfig, *, seq_len: int | None = None, sink: Any = None, kafka: Any = None,
                 secret: Any = None, command_source: Any = None, command_every: int = 1) -> None:
        if command_every < 1:
            raise ValueError("command_every: must be >= 1")
        self.config = config
        self.seq_len = seq_len
        self._agent_kwargs = {"sink": sink, "kafka": kafka, "secret": secret, "command_source": command_source}
        self.command_every = command_every
        self.agent: Agent | None = None
        self.optimizer: Any = None
        self._validate_cmd: Any = None

    # Events the Trainer calls that need nothing from us.
    def _noop(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        return control

    on_init_end = on_epoch_begin = on_epoch_end = on_substep_end = on_pre_optimizer_step = _noop
    on_optimizer_step = on_save = on_prediction_step = on_predict = _noop

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kwargs: Any) -> Any:
        self.optimizer = optimizer
        self.agent = Agent(None, model, optimizer, self.config, seq_len=self.seq_len, **self._agent_kwargs)
        world = max(1, int(getattr(args, "world_size", 1) or 1))
        batch = int(getattr(args, "per_device_train_batch_size", 0) or 0) * int(
            getattr(args, "gradient_accumulation_steps", 1) or 1) * world
        self.agent.start(global_batch=batch, config={"learning_rate": getattr(args, "learning_rate", None),
                                                     "max_steps": getattr(state, "max_steps", None)})
        return control

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        # The scheduler rewrote the LR after the last step; scale it for this step (no compounding).
        scale = self.agent.lr_scale.value if self.agent is not None else 1.0
        if scale != 1.0 and self.optimizer is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = group["lr"] * scale
        return control

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> Any:
        loss = _scalar(logs or {}, "loss")
        if self.agent is not None and loss is not None:
            self.agent.report_step(loss, step=int(state.global_step), lr=_scalar(logs or {}, "learning_rate"),
                                   grad_norm=_scalar(logs or {}, "grad_norm"))
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.agent is None or int(state.global_step) % self.command_every:
            return control
        cmds, _ = self.agent.exchange()
        paused = False
        while True:
            for cmd in cmds:
                paused = self._apply(cmd, control, paused)
            if not paused:
                break
            if self.agent.modes.mode is not PAUSED:
                self.agent.modes.move(PAUSED)
            time.sleep(self.config.command_tick_s)
            cmds, _ = self.agent.exchange()
        if self.agent.modes.mode is PAUSED:
            self.agent.modes.move(RUNNING)
        return control

    def _apply(self, cmd: Any, control: Any, paused: bool) -> bool:
        agent = self.agent
        assert agent is not None
        t = cmd.type
        if t is CommandType.PAUSE:
            agent.ack(cmd, AckStatus.APPLIED, "paused")
            return True
        if t is CommandType.RESUME:
            agent.ack(cmd, AckStatus.APPLIED, "resumed")
            return False
        if t is CommandType.STOP:
            control.should_training_stop = True
            agent.ack(cmd, AckStatus.APPLIED, "should_training_stop set")
            return False
        if t is CommandType.VALIDATE:
            control.should_evaluate = True
            self._validate_cmd = cmd  # acked when the evaluation comes back (on_evaluate)
            return False  # evaluation runs when the step ends, so a pause is released for it
        if t is CommandType.CHECKPOINT_NOW:
            control.should_save = True
            agent.ack(cmd, AckStatus.APPLIED, "should_save set")
            return paused
        if t is CommandType.SET_LR_SCALE:
            try:
                agent.lr_scale.set(cmd.args.get("lr_scale"))
            except ValueError as exc:
                agent.ack(cmd, AckStatus.REJECTED, f"invalid args: {exc}")
                return paused
            agent.ack(cmd, AckStatus.APPLIED, f"lr_scale={agent.lr_scale.value:g}")
            return paused
        agent.ack(cmd, AckStatus.FAILED, f"{t} is not supported by the Hugging Face callback")
        return paused

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict | None = None, **kwargs: Any) -> Any:
        val = _scalar(metrics or {}, "eval_loss")
        if self.agent is not None and val is not None and self.agent.rank == 0:
            data: dict[str, Any] = {"val_loss": val, "batches": len(kwargs.get("eval_dataloader") or [])}
            if self._validate_cmd is not None:
                data["cmd"] = self._validate_cmd.id
            self.agent.emit(EventType.VALIDATION, data, step=int(state.global_step))
        if self._validate_cmd is not None and self.agent is not None:
            self.agent.ack(self._validate_cmd, AckStatus.APPLIED, f"eval_loss={val}")
            self._validate_cmd = None
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.agent is not None:
            self.agent.close()
        return control
