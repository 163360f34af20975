"""The objective: validation-loss drop over a fixed window of steps from one common checkpoint.

The common start is made once per study: a short warm-up run of the bundled trainer (its own run
id ``<study>-warmup``) that ends with a full disk checkpoint (``trainer/checkpoint.py``) and the
validation loss there, kept in ``<out_dir>/<study>-warmup/``. A second worker or a restarted
study finds it and reuses it. Each trial is a monitored run ``<study>-t<N>`` of the same
``Trainer`` in this process (one CPU process, no torchrun: the model is tiny and a trial's
startup stays under a second): it restores the start's weights and Adam moments, sets the trial's
lr, global batch and betas, skips the samples the warm-up consumed, and trains ``window`` steps
with the agent attached (events to Kafka when a broker is configured). Validation every
``report_every`` steps is reported to Optuna (median pruning); a diverged run (``divergence.py``)
raises ``optuna.TrialPruned``. The value is ``start_val_loss - final_val_loss`` (maximized).

The in-process guard is report-only in trials: skipping the updates of a bad learning rate would
hide exactly what the search must see.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cliffguard.agent.config import AgentConfig
from cliffguard.agent.data_watch.config import DataWatchConfig
from cliffguard.agent.guard import GuardConfig
from cliffguard.core.declared import bounded, check_declared
from cliffguard.core.enums import CheckpointKind
from cliffguard.core.kafka_config import KafkaConfig
from cliffguard.core.settings import config_to_dict
from cliffguard.core.spike import SpikeConfig
from cliffguard.hpo.divergence import DivergenceCheck
from cliffguard.hpo.space import SearchSpace, TrialParams
from cliffguard.trainer.checkpoint import CheckpointConfig, CheckpointManager
from cliffguard.trainer.config import TrainConfig
from cliffguard.trainer.data import DataConfig
from cliffguard.trainer.loop import Trainer
from cliffguard.trainer.model import GPTConfig


@dataclass(kw_only=True, slots=True)
class HpoConfig:
    study: str = "hpo"
    window: int = bounded(3000, ge=1)
    """Optimizer steps each trial trains from the common start."""
    warmup: int = bounded(50, ge=1, why="the common start is the warm-up's checkpoint")
    """Steps of the warm-up run that makes the common start (once per study)."""
    warmup_lr: float = 3e-3
    warmup_batch: int = 16
    report_every: int = bounded(0, ge=0)
    """Validation (reported to the pruner) every this many steps; 0 = window // 4."""
    rise_margin: float = 0.5
    """A loss this fraction above the start's validation loss is divergence."""
    seed: int = 1337
    threads: int = bounded(1, ge=1)
    out_dir: str = "runs"
    model: GPTConfig = field(default_factory=lambda: GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=64))
    data: DataConfig = field(default_factory=lambda: DataConfig(seq_len=64, max_bytes=1_000_000))
    space: SearchSpace = field(default_factory=SearchSpace)
    spike: SpikeConfig = field(default_factory=SpikeConfig)
    kafka: KafkaConfig | None = None
    """Broker of the monitoring stream; None = events kept in memory (``sinks``)."""
    faults: dict[int, list[str]] = field(default_factory=dict)
    """Fault specs per trial number (trainer/faults.py), for demos and tests of pruning."""

    def __post_init__(self) -> None:
        check_declared(self)

    @property
    def every(self) -> int:
        return self.report_every or max(1, self.window // 4)


class WindowTrainer(Trainer):
    """The bundled Trainer plus two hooks: validation at the last step, and a per-validation /
    per-step callback that may raise (``optuna.TrialPruned``) to end the run as failed."""

    def __init__(self, *args: Any, on_val: Any = None, on_loss: Any = None, save_at_end: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_val, self.on_loss, self.save_at_end = on_val, on_loss, save_at_end
        self.val_history: list[tuple[int, float]] = []
        self.kit.on_periodic_validation = self._validated

    def _validated(self, step: int, loss: float) -> None:
        self.val_history.append((step, loss))
        if self.on_val is not None:
            self.on_val(step, loss)

    def train_step(self) -> dict[str, Any]:
        data = super().train_step()
        if self.on_loss is not None:
            self.on_loss(self.step, data["loss"])
        if self.step == self.cfg.steps:  # the kit validates before a step, so never after the last
            self._validated(self.step, self.kit.run_validation())
            if self.save_at_end:  # while the writer still runs (run() closes it)
                self.checkpoint(CheckpointKind.FULL)
        return data


def _accelerator(threads: int) -> Any:
    from accelerate import Accelerator

    torch.set_num_threads(threads)
    return Accelerator(cpu=True)


def train_config(cfg: HpoConfig, run: str, *, steps: int, lr: float, global_batch: int, val_every: int) -> TrainConfig:
    out = Path(cfg.out_dir)
    guard = GuardConfig(enabled=False, spike=cfg.spike)
    return TrainConfig(
        run=run, steps=steps, lr=lr, min_lr=lr / 10, warmup_steps=min(20, steps // 10), global_batch=global_batch,
        seed=cfg.seed, val_every=val_every, progress_every=0, threads=cfg.threads, out_dir=str(out),
        model=cfg.model, data=cfg.data, kafka=cfg.kafka,
        checkpoint=CheckpointConfig(dir=str(out / run / "checkpoints"), writer="thread"),
        # a trial is judged by its validation loss; its batches are the study's data, not a run to watch
        agent=AgentConfig(run=run, heartbeat_s=5.0, guard=guard, data_watch=DataWatchConfig(enabled=False)),
    )


class StartMismatch(ValueError):
    """The study's saved common start was made with other settings."""


@dataclass(frozen=True, slots=True)
class Start:
    dir: Path
    step: int
    val_loss: float
    samples: int
    """Training samples the warm-up consumed (trials skip them)."""


def start_shape(cfg: HpoConfig) -> dict[str, Any]:
    """What the common start depends on: a study reused with other values must not share it."""
    return json.loads(json.dumps({"model": config_to_dict(cfg.model), "data": config_to_dict(cfg.data),
                                  "warmup": cfg.warmup, "warmup_lr": cfg.warmup_lr,
                                  "warmup_batch": cfg.warmup_batch, "seed": cfg.seed}))


def common_start(cfg: HpoConfig, sink_factory: Any = None) -> Start:
    """The study's starting checkpoint: made by a warm-up run, or found from an earlier one."""
    run = f"{cfg.study}-warmup"
    run_dir = Path(cfg.out_dir) / run
    meta_path = run_dir / "start.json"
    shape = start_shape(cfg)
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("shape") != shape:
            raise StartMismatch(f"--study: the common start in {run_dir} was made for another model/data/warm-up "
                             "(use another --study or --out-dir)")
        return Start(run_dir / "checkpoints", int(meta["step"]), float(meta["val_loss"]), int(meta["samples"]))
    tc = train_config(cfg, run, steps=cfg.warmup, lr=cfg.warmup_lr, global_batch=cfg.warmup_batch, val_every=0)
    trainer = WindowTrainer(tc, _accelerator(cfg.threads), sink=sink_factory(run) if sink_factory else None,
                            save_at_end=True)
    trainer.run()
    val_loss = trainer.val_history[-1][1]
    samples = cfg.warmup * cfg.warmup_batch
    meta_path.write_text(json.dumps({"step": trainer.step, "val_loss": val_loss, "samples": samples, "shape": shape}))
    return Start(Path(tc.checkpoint.dir), trainer.step, val_loss, samples)


def load_start(start: Start) -> dict[str, Any]:
    mgr = CheckpointManager(CheckpointConfig(dir=str(start.dir), writer="thread"), 0, 1, lambda _payload: None)
    try:
        _step, state, _source, _detail = mgr.restore_latest()
    finally:
        mgr.close()
    return state


class Objective:
    """``study.optimize(Objective(cfg, start))``: one monitored trial run per call."""

    def __init__(self, cfg: HpoConfig, start: Start, sink_factory: Any = None) -> None:
        self.cfg, self.start = cfg, start
        self.sink_factory = sink_factory
        self.state = load_start(start)

    def run_id(self, number: int) -> str:
        return f"{self.cfg.study}-t{number}"

    def __call__(self, trial: Any) -> float:
        import optuna

        cfg = self.cfg
        params = cfg.space.suggest(trial)
        run = self.run_id(trial.number)
        trial.set_user_attr("run", run)
        tc = train_config(cfg, run, steps=cfg.window, lr=params.lr, global_batch=params.global_batch,
                          val_every=cfg.every)
        tc = dataclasses.replace(tc, faults=list(cfg.faults.get(trial.number, [])))
        check = DivergenceCheck(self.start.val_loss, cfg.spike, cfg.rise_margin)

        def pruned(why: str, step: int) -> None:
            trial.set_user_attr("pruned_reason", f"step {step}: {why}")
            raise optuna.TrialPruned(f"step {step}: {why}")

        def on_loss(step: int, loss: float) -> None:
            why = check.observe(loss)
            if why is not None:
                pruned(why, step)

        def on_val(step: int, loss: float) -> None:
            why = check.beyond_start(loss)
            if why is not None:
                pruned(why, step)
            trial.report(self.start.val_loss - loss, step)
            if step < cfg.window and trial.should_prune():
                pruned("below the median of earlier trials", step)

        trainer = WindowTrainer(tc, _accelerator(cfg.threads), sink=self.sink_factory(run) if self.sink_factory else None,
                                on_val=on_val, on_loss=on_loss)
        self._enter(trainer, params)
        trainer.run()
        final = trainer.val_history[-1][1]
        if not math.isfinite(final):
            pruned("non-finite final validation loss", trainer.step)
        return self.start.val_loss - final

    def _enter(self, trainer: WindowTrainer, params: TrialParams) -> None:
        """The common start's weights and Adam moments, then this trial's betas and data position."""
        trainer.raw_model.load_state_dict(self.state["model"])
        # load_state_dict aliases the tensors it is given: every trial gets its own copy.
        trainer.optimizer.load_state_dict(copy.deepcopy(self.state["optimizer"]))
        for group in trainer.optimizer.param_groups:
            group["betas"] = (params.beta1, params.beta2)
        trainer.sampler.skip(0, self.start.samples)
