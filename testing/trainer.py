"""Small single-process trainers for the loop and command tests (world 1, CPU, in-memory sink)."""

from __future__ import annotations

from cliffguard.agent.config import AgentConfig
from cliffguard.agent.guard import GuardConfig
from cliffguard.agent.sinks import InMemorySink
from cliffguard.core.enums import EventType
from cliffguard.core.spike import SpikeConfig
from cliffguard.trainer.checkpoint import CheckpointConfig
from cliffguard.trainer.config import TrainConfig
from cliffguard.trainer.data import DataConfig
from cliffguard.trainer.model import GPTConfig


class FakeCommands:
    def __init__(self) -> None:
        self.queue: list = []
        self.polls = 0
        self.on_poll = None

    def poll(self):
        self.polls += 1
        if self.on_poll:
            self.on_poll(self)
        out, self.queue = self.queue, []
        return out

    def close(self) -> None:
        pass


def small_config(tmp_path, **kw) -> TrainConfig:
    guard = kw.pop("guard", GuardConfig(spike=SpikeConfig(window=16, min_history=8)))
    base = dict(run="loop", steps=12, global_batch=4, grad_accum=2, lr=3e-3, min_lr=3e-4, warmup_steps=2,
                out_dir=str(tmp_path), val_every=0, progress_every=0,
                model=GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16),
                data=DataConfig(seq_len=16, max_bytes=200_000, block_bytes=4096, apply_rules=False),
                checkpoint=CheckpointConfig(dir=str(tmp_path / "ckpt"), snapshot_every=2, memory_ring=8,
                                            ckpt_every=0, full_every=0),
                agent=AgentConfig(run="loop", hist_every=0, heartbeat_s=0.05, calibration_s=0.05,
                                  command_tick_s=0.02, guard=guard))
    base.update(kw)
    return TrainConfig(**base)


def make_trainer(cfg: TrainConfig):
    from accelerate import Accelerator

    from cliffguard.trainer.loop import Trainer

    sink, source = InMemorySink(), FakeCommands()
    return Trainer(cfg, Accelerator(cpu=True), sink=sink, command_source=source), sink, source


def step_events(sink):
    return [e for e in sink.events if e.type is EventType.STEP]
