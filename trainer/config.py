"""The trainer's configuration: one validated dataclass tree, saved with the run as JSON.

``TrainConfig`` owns the loop's own knobs and nests each component's config (model, data,
checkpoints, agent, Kafka). ``cliffguard train`` builds it from TOML < env < flags, writes it to
``<out_dir>/<run>/config.json`` and every torchrun worker reads that file back
(``TrainConfig.from_dict``), so all ranks run exactly the configuration that was saved.
The deployment's shared sections arrive resolved (``[spike]`` and ``[policy]`` in
``agent.guard``, ``[kafka]`` as ``kafka``); the command secret is never part of it: the workers
get it in their environment (``trainer/run.py``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cliffguard.agent.config import AgentConfig
from cliffguard.core.admission import AdmissionConfig
from cliffguard.core.declared import bounded, check_declared
from cliffguard.core.kafka_config import KafkaConfig
from cliffguard.core.settings import config_to_dict
from cliffguard.trainer.checkpoint import CheckpointConfig
from cliffguard.trainer.data import DataConfig
from cliffguard.trainer.elastic import ElasticConfig
from cliffguard.trainer.model import GPTConfig


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    run: str = "run"
    """Run id (Kafka key, commands must name it)."""
    steps: int = bounded(300, ge=1)
    """Optimizer steps to train."""
    global_batch: int = 16
    """Sequences per optimizer step over all ranks and micro-batches."""
    grad_accum: int = bounded(1, ge=1)
    """Micro-batches per optimizer step on each rank (global_batch must divide by world*grad_accum)."""
    lr: float = 3e-3
    """Peak learning rate (after warmup)."""
    min_lr: float = 3e-4
    """Learning rate at the end of the cosine decay."""
    warmup_steps: int = bounded(20, ge=0)
    """Linear warmup steps."""
    weight_decay: float = 0.1
    """AdamW weight decay."""
    bf16: bool = False
    """Run forward/backward under bf16 autocast."""
    seed: int = 1337
    """Seeds the model init and torch's RNG (the data order has its own seed in [data])."""
    val_every: int = 50
    """Run validation every this many steps (0 = only on command) for a healthy baseline."""
    val_batches: int = 4
    """Held-out batches per validation."""
    val_batch_size: int = 8
    """Sequences per validation batch."""
    loss_scaling: bool = False
    """Gradient-histogram adaptive loss scaling with skip-on-overflow (trainer/loss_scale.py); for
    fp16-style training. Off by default: fp32/bf16 need no scale and it costs a host sync per step."""
    clip_layer_norm: float = bounded(0.0, ge=0)
    """Per-layer gradient clipping threshold (0 = off)."""
    progress_every: int = 10
    """Print a progress line (rank 0) every this many steps (0 = never)."""
    faults: list[str] = field(default_factory=list)
    """Fault specs for demos/tests, e.g. nan@40, corrupt@30, lr_blowup@300x50:20, slow_rank@1:0.05."""
    resume: bool = False
    """Start from the newest usable disk checkpoint under the checkpoint dir (a restarted job)."""
    debug_digests: bool = False
    """Add param_digest/rng_digest to step events (tests of exact rollback; costs a host copy)."""
    sample_log: bool = False
    """Rank 0 appends every step's sample ids (all ranks) and loss to ``<run_dir>/samples.jsonl``
    (trainer/record.py ``SampleLog``): what an exact resume is checked against."""
    threads: int = bounded(1, ge=1)
    """torch threads per process on CPU (several processes share the cores)."""
    out_dir: str = "runs"
    """Run directory root: <out_dir>/<run>/ holds config.json, checkpoints and spill files."""
    model: GPTConfig = field(default_factory=GPTConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpoint: CheckpointConfig | None = None
    """Checkpoint settings; default: CheckpointConfig(dir=<out_dir>/<run>/checkpoints)."""
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    """Elastic runs (torchrun --nnodes MIN:MAX): batch policy, LR rule, timeouts (trainer/elastic.py)."""
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    """The launcher's check of the suspect-node list before its node joins (core/admission.py)."""
    agent: AgentConfig | None = None
    """Agent settings; its run id is always this config's run."""
    kafka: KafkaConfig | None = None
    """Broker settings; None = no monitoring stream (events are dropped)."""

    def __post_init__(self) -> None:
        check_declared(self)
        if self.global_batch < 1 or self.global_batch % self.grad_accum:
            raise ValueError("global_batch: must be a positive multiple of grad_accum")
        if not 0 < self.min_lr <= self.lr:
            raise ValueError("min_lr: must be > 0 and <= lr")
        if self.val_every < 0 or self.val_batches < 1 or self.val_batch_size < 1:
            raise ValueError("val_every: must be >= 0 (val_batches, val_batch_size >= 1)")
        from cliffguard.trainer.faults import FaultSpec
        from cliffguard.trainer.hang_faults import HangFault, is_hang_fault

        for spec in self.faults:
            try:
                HangFault.parse(spec) if is_hang_fault(spec) else FaultSpec.parse(spec)
            except ValueError as exc:
                raise ValueError(f"faults: {exc}") from None
        if self.data.seq_len > self.model.block_size:
            raise ValueError("data: seq_len exceeds the model's block_size")
        if self.checkpoint is None:
            self.checkpoint = CheckpointConfig(dir=str(Path(self.out_dir) / self.run / "checkpoints"))
        if self.agent is None:
            self.agent = AgentConfig(run=self.run)
        elif self.agent.run != self.run:
            self.agent = dataclasses.replace(self.agent, run=self.run)
        if not self.agent.spill_dir:
            self.agent = dataclasses.replace(self.agent, spill_dir=str(Path(self.out_dir) / self.run))

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.run

    def micro_batch(self, world: int) -> int:
        per_rank, rem = divmod(self.global_batch, world * self.grad_accum)
        if rem or per_rank < 1:
            raise ValueError(f"global_batch: {self.global_batch} does not split into {world} ranks x {self.grad_accum} micro-batches")
        return per_rank

    def to_dict(self) -> dict[str, Any]:
        return config_to_dict(self)

    def save(self, path: str | Path) -> None:
        """Written whole or not at all: the launchers of an elastic run's nodes share one file, and
        a worker restarted meanwhile must read the old one or the new one, never half of it."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True))
        os.replace(tmp, path)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        return _build(cls, data)

    @classmethod
    def load(cls, path: str | Path) -> TrainConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))


def _build(cls: type, data: Any) -> Any:
    """A (nested) config dataclass from plain data; unknown keys are an error naming them."""
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__}: expected a table, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"{sorted(unknown)[0]}: unknown field of {cls.__name__}")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        target = _dataclass_in(hints[key])
        kwargs[key] = _build(target, value) if target is not None and isinstance(value, dict) else value
    return cls(**kwargs)


def _dataclass_in(hint: Any) -> type | None:
    if dataclasses.is_dataclass(hint):
        return hint
    for arg in typing.get_args(hint):
        if dataclasses.is_dataclass(arg):
            return arg
    return None
