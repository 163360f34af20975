"""One rank of the torchtitan integration's 2-process test (tests/agent/integrations/test_torchtitan.py),
under torchrun on gloo: torchtitan's debug Llama (2 layers, FSDP over both ranks, on the CPU path of
trainer/demo_trainers/torchtitan_cpu.py) in a ``CliffguardTrainer`` per case, a spike and a scripted
rollback, what each rank saw written to ``OUT/<case>-rank<r>.json`` for the test to judge.

``python torchtitan_worker.py OUT CASE...``; a case is ``memory`` (rolled back from the memory ring,
validated on held-back batches), ``disk`` (no memory snapshots: rolled back from torchtitan's own
checkpoint, validated by torchtitan's validator), ``resume`` (a guarded trainer resumes from the
checkpoint of a run without cliffguard, which holds no guard state) or ``accum`` (two micro-batches a
step, the spike in the first of step 6: one verdict a step).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

from cliffguard.trainer.demo_trainers.torchtitan_cpu import TokenBatches, TokenTokenizer, on_cpu

on_cpu()

from torchtitan.components.checkpoint import CheckpointManager  # noqa: E402 - after the CPU patches
from torchtitan.components.optimizer import default_adamw  # noqa: E402
from torchtitan.components.validate import Validator  # noqa: E402
from torchtitan.models.llama3.config_registry import llama3_debugmodel  # noqa: E402
from torchtitan.trainer import Trainer  # noqa: E402

from cliffguard.agent.config import AgentConfig  # noqa: E402
from cliffguard.agent.guard import GuardConfig  # noqa: E402
from cliffguard.agent.integrations.torchtitan import CliffguardTrainer, guarded  # noqa: E402
from cliffguard.agent.recovery import KitConfig  # noqa: E402
from cliffguard.agent.sinks import InMemorySink  # noqa: E402
from cliffguard.core.enums import CommandType, EventType  # noqa: E402
from cliffguard.core.events import make_command  # noqa: E402
from cliffguard.core.spike import SpikeConfig  # noqa: E402

STEPS = 12
SPIKE_AT = 6
"""The agent step (0-based) whose batch is random tokens on every rank: the guard skips its update."""
ROLLBACK_AT, ROLLBACK_TO = 9, 4
RESUME_FROM = 4
"""The ``resume`` case: the guarded trainer resumes from an unguarded one's checkpoint of step 4."""
SEQ, BATCH, VOCAB = 32, 2, 2048


def batch_fn(position: int, rank: int, world: int, spike_at: int = SPIKE_AT) -> torch.Tensor:
    """Every sample one short cycle of tokens (learnt within a few steps); the spike's are random."""
    if position == spike_at:
        g = torch.Generator().manual_seed(1000 * position + rank)
        return torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return (torch.arange(SEQ + 1) % 16).expand(BATCH, SEQ + 1).contiguous()


class Commands:
    """Rank 0's command source: ``at[step]`` is handed out once while the agent is at that step."""

    def __init__(self, step) -> None:
        self.at: dict[int, list] = {}
        self.step = step

    def poll(self):
        return self.at.pop(self.step(), [])

    def close(self) -> None:
        pass


def digest(trainer) -> list[float]:
    """Every parameter, gathered (a collective: every rank calls it), as two sums: of the values and
    of their bits (any changed bit changes the second)."""
    values, bits = 0.0, 0
    for p in trainer.model_parts[0].parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        values += float(full.double().sum())
        bits += int(full.detach().float().view(torch.int32).long().sum())
    return [values, float(bits)]


def joined(self):
    """``init_distributed`` of every trainer: the first case's starts the group, the others join it."""
    if not dist.is_initialized():
        return Trainer.init_distributed(self)
    from torchtitan.distributed import ParallelDims

    return ParallelDims.from_config(self.config.parallelism, dist.get_world_size())


class Unguarded(Trainer):
    init_distributed = joined


class Recording(CliffguardTrainer):
    """The trainer, recording each boundary's weights and the spike step's update."""

    seen: dict
    init_distributed = joined

    def should_continue_training(self) -> bool:
        go = super().should_continue_training()
        if go:
            runs = self.seen["steps_run"]
            runs.append(self.step)
            self.seen["weights"].setdefault(str(self.step), digest(self))
            if self.step == ROLLBACK_TO and runs.count(ROLLBACK_TO) == 2:
                self.seen["after_rollback"] = digest(self)  # at the boundary the rollback moved back to
        return go

    def train_step(self, data_iterator) -> None:
        # torchtitan counts from 1 (its step is the agent's + 1 here); the spike runs once
        spike = self.agent.step == SPIKE_AT and "spike" not in self.seen
        before = digest(self) if spike else None
        super().train_step(data_iterator)
        if before is not None:
            self.seen["spike"] = [before, digest(self)]


def run_case(case: str, out: str) -> None:
    rank = int(os.environ["RANK"])  # torchtitan starts the process group itself
    torch.manual_seed(0)
    cfg = llama3_debugmodel()
    cfg.model_spec.model.layers = cfg.model_spec.model.layers[:2]
    cfg.tokenizer = TokenTokenizer.Config()
    cfg.dataloader = TokenBatches.Config(batch_fn=batch_fn)
    cfg.training.seq_len, cfg.training.local_batch_size, cfg.training.steps = SEQ, BATCH, STEPS
    if case == "accum":  # two micro-batches a step on each rank; the spike in the first of step 6
        cfg.training.global_batch_size, cfg.training.steps = BATCH * 2 * 2, 8
        cfg.dataloader = TokenBatches.Config(batch_fn=lambda p, r, w: batch_fn(p, r, w, spike_at=2 * SPIKE_AT))
    cfg.training.disable_cuda_graphs = True
    cfg.parallelism.spmd_backend = "partial_dtensor"
    cfg.optimizer = default_adamw(lr=3e-3)
    cfg.lr_scheduler.warmup_steps = 1
    cfg.lr_scheduler.decay_ratio = None
    cfg.dump_folder = os.path.join(out, case)
    cfg.checkpoint = CheckpointManager.Config(enable=True, interval=4, last_save_model_only=True)
    cfg.validator = Validator.Config(enable=False)
    if case == "disk":
        cfg.validator = Validator.Config(enable=True, freq=10**6, steps=2, dataloader=TokenBatches.Config(
            batch_fn=lambda p, r, w: batch_fn(100 + p, r, w), length=2))
    sink = InMemorySink()
    holder: dict = {}
    source = Commands(lambda: holder["t"].agent.step) if rank == 0 else None
    agent = AgentConfig(run=f"tt-{case}", heartbeat_s=60, calibration_s=0.05, command_tick_s=0.01,
                        guard=GuardConfig(spike=SpikeConfig(window=16, min_history=4)),
                        recovery=KitConfig(snapshot_every=0 if case == "disk" else 2, ring_size=8, val_every=0,
                                           pause_timeout_s=20))
    if case == "resume":  # 4 steps of torchtitan without cliffguard first, saved at step 4
        cfg.training.steps = RESUME_FROM
        cfg.checkpoint.last_save_model_only = False  # its last save is the one resumed from
        plain = Unguarded(cfg)
        try:
            plain.train()
        finally:
            plain.close()
        cfg.training.steps = RESUME_FROM + 2
    config = guarded(cfg, run=agent.run, agent=agent, sink=sink, command_source=source)
    if source is not None and case not in ("resume", "accum"):
        source.at[ROLLBACK_AT] = [make_command(CommandType.ROLLBACK, agent.run, {"to_step": ROLLBACK_TO, "lr_scale": 0.5})]
        source.at[1] = [make_command(CommandType.VALIDATE, agent.run)]
    trainer = Recording(config)
    trainer.seen = {"steps_run": [], "weights": {}}
    holder["t"] = trainer
    lrs: list[float] = []
    inner = trainer._inner_step

    def recording_step():
        lrs.append(trainer.optimizers.optimizers[0].param_groups[0]["lr"])
        return inner()

    trainer._inner_step = recording_step
    try:
        trainer.train()
    finally:
        trainer.close()
    events = list(sink.events)
    result = {
        **trainer.seen,
        "lrs": lrs,
        "lr_scale_applied": trainer.kit.lr_scale_applied,
        "final_step": trainer.step,
        "started": next((e.data for e in events if e.type is EventType.RUN_STARTED), None),
        "started_step": next((e.step for e in events if e.type is EventType.RUN_STARTED), None),
        "finished": next((e.data for e in events if e.type is EventType.RUN_FINISHED), None),
        "steps": [{"step": e.step, **{k: e.data.get(k) for k in ("loss", "grad_norm", "skipped", "lr", "lr_scale",
                                                                 "guard")}}
                  for e in events if e.type is EventType.STEP],
        "acks": [e.data for e in events if e.type is EventType.COMMAND_ACK],
        "checkpoints": [{"step": e.step, **e.data} for e in events if e.type is EventType.CHECKPOINT],
        "validations": [e.data for e in events if e.type is EventType.VALIDATION],
    }
    with open(os.path.join(out, f"{case}-rank{rank}.json"), "w") as f:
        json.dump(result, f)


def main() -> None:
    out, cases = sys.argv[1], sys.argv[2:]
    try:
        for case in cases:
            run_case(case, out)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
