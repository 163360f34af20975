"""One rank of the DeepSpeed integration's 2-process test (tests/agent/integrations/test_deepspeed.py),
under torchrun on gloo: a real ``DeepSpeedEngine`` per case, the guard attached, a spike and a scripted
rollback, what each rank saw written to ``OUT/<case>-rank<r>.json`` for the test to judge.

``python deepspeed_worker.py OUT CASE...``; a case is ``stage2``, ``stage3``, ``offload-disk``
(ZeRO-2 with its optimizer offloaded: declared disk-only, rolled back from the engine's own tag)
``elastic`` (ZeRO-2 with an elastic checkpoint and no save_dir: declared with no rollback) or
``accum`` (ZeRO-2, two micro-batches a step, the spike in the first of step 6: one verdict a step)
or ``fp16`` (ZeRO-2 with a dynamic loss scale that starts far too high: DeepSpeed's overflow skips).
"""

from __future__ import annotations

import json
import os
import sys

import deepspeed
import torch
import torch.distributed as dist

from cliffguard.agent.config import AgentConfig
from cliffguard.agent.guard import GuardConfig
from cliffguard.agent.integrations.deepspeed import DeepSpeedGuard
from cliffguard.agent.recovery import KitConfig
from cliffguard.agent.sinks import InMemorySink
from cliffguard.core.enums import CommandType, EventType
from cliffguard.core.events import make_command
from cliffguard.core.spike import SpikeConfig
from tests.agent.integrations.deepspeed_cpu import fp16_everywhere, without_shm_build

SPIKE_AT = 6
"""The step whose batch is multiplied by 1000 (on every rank): the guard skips its update."""
ROLLBACK_AT, ROLLBACK_TO = 9, 4
"""The rollback is polled during step 9 (applied at the boundary after it) and restores step 4."""


class Commands:
    """Rank 0's command source: ``at[step]`` is handed out once while the agent is at that step."""

    def __init__(self, guard_step) -> None:
        self.at: dict[int, list] = {}
        self.step = guard_step

    def poll(self):
        return self.at.pop(self.step(), [])

    def close(self) -> None:
        pass


class RecordingSGD(torch.optim.SGD):
    """SGD that records the LR each update ran with (under ZeRO, DeepSpeed's optimizer calls it)."""

    def step(self, closure=None):
        self.seen = [*getattr(self, "seen", []), self.param_groups[0]["lr"]]
        return super().step(closure)


def full_weights(engine) -> list[float]:
    from deepspeed.utils import safe_get_full_fp32_param

    return torch.cat([safe_get_full_fp32_param(p).flatten() for p in engine.module.parameters()]).tolist()


def run_case(case: str, out: str) -> None:
    rank = dist.get_rank()
    stage = 3 if case == "stage3" else 2
    accumulate = 2 if case == "accum" else 1
    spike_at = -1 if case == "fp16" else SPIKE_AT * accumulate  # the micro-batch: the first of step 6
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = RecordingSGD(model.parameters(), lr=0.05)
    zero: dict = {"stage": stage}
    if case == "offload-disk":
        zero["offload_optimizer"] = {"device": "cpu"}  # with the torch optimizer, not DeepSpeedCPUAdam (a JIT op)
    if case == "elastic":
        zero["elastic_checkpoint"] = True
    fp16 = {"fp16": {"enabled": True, "initial_scale_power": 20, "loss_scale_window": 100}} if case == "fp16" else {}
    if fp16:
        fp16_everywhere()
    ds_config = {**fp16, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": accumulate,
                 "zero_optimization": zero, "steps_per_print": 10_000,
                 "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False,
                 "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.05, "warmup_max_lr": 0.05,
                                                             "warmup_num_steps": 1}}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config, dist_init_required=False)
    def forward(x: torch.Tensor) -> torch.Tensor:
        return engine(x.half()).float() if case == "fp16" else engine(x)

    sink = InMemorySink()
    holder: dict = {}
    source = Commands(lambda: holder["guard"].step) if rank == 0 else None
    cfg = AgentConfig(run=f"ds-{case}", heartbeat_s=60, calibration_s=0.05, command_tick_s=0.01,
                      guard=GuardConfig(spike=SpikeConfig(window=16, min_history=4)),
                      recovery=KitConfig(snapshot_every=2, ring_size=8, val_every=0, pause_timeout_s=20))
    save_dir = os.path.join(out, f"ckpt-{case}") if case == "offload-disk" else None
    g = torch.Generator().manual_seed(100 + rank)
    data = [torch.randn(8, 4, generator=g) for _ in range(4 if case == "elastic" else 16)]
    val = [(x, x.sum(1, keepdim=True)) for x in data[:2]]
    guard = DeepSpeedGuard(engine, config=cfg, sink=sink, command_source=source, save_dir=save_dir, val_batches=val,
                           loss_fn=lambda b: torch.nn.functional.mse_loss(forward(b[0]), b[1]))
    holder["guard"] = guard
    if source is not None and case in ("stage2", "stage3", "offload-disk"):
        source.at[ROLLBACK_AT] = [make_command(CommandType.ROLLBACK, cfg.run, {"to_step": ROLLBACK_TO, "lr_scale": 0.5})]
        source.at[1] = [make_command(CommandType.VALIDATE, cfg.run)]  # on val_batches, every rank's forward
    guard.start()
    at_boundary: dict[int, list[float]] = {}
    after_rollback: list[float] | None = None
    steps_run: list[int] = []
    for i, x in enumerate(guard.batches(data)):
        step = guard.step
        if step == ROLLBACK_TO and steps_run.count(ROLLBACK_TO) == 1:
            after_rollback = full_weights(engine)  # at the boundary the rollback moved back to
        steps_run.append(step)
        at_boundary.setdefault(step, full_weights(engine))
        if case == "offload-disk" and step == ROLLBACK_TO and steps_run.count(step) == 1:
            engine.save_checkpoint(save_dir)  # the user's own save: a rollback target on disk
        y = x.sum(1, keepdim=True) * (1000.0 if i == spike_at else 1.0)  # the spike on every rank's batch
        engine.backward(torch.nn.functional.mse_loss(forward(x), y))
        before = full_weights(engine)
        engine.step()
        if case == "accum":
            at_boundary.setdefault("micro", []).append([before, full_weights(engine)])
        if i == spike_at:
            at_boundary["spike_after"] = full_weights(engine)
            at_boundary["spike_before"] = before
    guard.close()
    events = [e for e in sink.events]
    result = {
        "steps_run": steps_run,
        "weights": {str(k): v for k, v in at_boundary.items()},
        "after_rollback": after_rollback,
        "lrs": getattr(optimizer, "seen", []),
        "lr_scale_applied": guard.kit.lr_scale_applied,
        "global_steps": engine.global_steps,
        "started": next((e.data for e in events if e.type is EventType.RUN_STARTED), None),
        "steps": [{"step": e.step, **{k: e.data.get(k) for k in ("loss", "grad_norm", "skipped", "lr", "lr_scale",
                                                                 "loss_scale", "overflow_skips", "guard")}}
                  for e in events if e.type is EventType.STEP],
        "acks": [e.data for e in events if e.type is EventType.COMMAND_ACK],
        "checkpoints": [e.data for e in events if e.type is EventType.CHECKPOINT],
        "validations": [e.data for e in events if e.type is EventType.VALIDATION],
    }
    with open(os.path.join(out, f"{case}-rank{rank}.json"), "w") as f:
        json.dump(result, f)


def main() -> None:
    out, cases = sys.argv[1], sys.argv[2:]
    dist.init_process_group("gloo")
    without_shm_build()
    try:
        for case in cases:
            run_case(case, out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
