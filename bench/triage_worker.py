"""One rank of a bench.triage job: a plain data-parallel loop with the agent, the recovery kit and
one injected fault (see bench/triage.py). Writes what it saw to ``<out_dir>/<rank>.json``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bench.triage_controller import InProcessController
from cliffguard.agent.config import AgentConfig
from cliffguard.agent.guard import GuardConfig
from cliffguard.agent.hooks import Agent
from cliffguard.agent.recovery import KitConfig, RecoveryKit
from cliffguard.agent.sinks import InMemorySink
from cliffguard.controller.recovery_types import RecoveryConfig
from cliffguard.core.enums import EventType
from cliffguard.core.restart_plan import NODE_ENV
from cliffguard.core.spike import SpikeConfig

EVERY = 5
"""The SDC watch's period (steps)."""
FAULT_AT = 22
STEPS = {"clean": 40, "data": 30, "transient": 30, "bad_rank": 26, "sdc": 40}
BAD_RANK = 1
RECOVERY = RecoveryConfig(stable_window=4, recover_window=6, command_timeout_s=20, validate_timeout_s=20)
"""Short windows: a run of 40 steps has stable checkpoints to roll back to."""


def _batch(step: int, shard: int, fault: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + shard)
    x = torch.randn(8, 4, generator=g)
    y = x.sum(dim=1, keepdim=True)
    poisoned = fault == "data" and step == FAULT_AT and shard == BAD_RANK
    return x, y * 1000 if poisoned else y


class Loop:
    def __init__(self, rank: int, world: int, fault: str) -> None:
        self.rank, self.world, self.fault = rank, world, fault
        torch.manual_seed(0)  # one initialisation on every rank: replicas from the start
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.sink = InMemorySink()
        run = f"triage-{fault}"
        self.ctl = InProcessController(self.sink, run, RECOVERY) if rank == 0 else None
        cfg = AgentConfig(run=run, hist_every=0, heartbeat_s=60, calibration_s=0.05, command_tick_s=0.01,
                          param_check="on", param_check_every=EVERY,
                          guard=GuardConfig(spike=SpikeConfig(window=16, min_history=6), hold_timeout_s=2.0,
                                            on_timeout="resume"),
                          recovery=KitConfig(snapshot_every=2, ring_size=16, pause_timeout_s=5.0, val_every=0))
        self.agent = Agent(None, self.model, self.opt, cfg, sink=self.sink, command_source=self.ctl)
        self.excluded: set[int] = set()
        self.fed: list[tuple[int, int]] = []  # (step, sample id) as fed, replays included
        self.first_pass: set[int] = set()  # steps whose transient fault already fired
        self.kit = RecoveryKit(self.agent, self.model, self.opt, rerun_fn=self.rerun, validate_fn=self.validate,
                               sample_ids_fn=lambda step, shard: [self.sample_id(step, shard)],
                               exclude_samples=self.excluded.update)

    @staticmethod
    def sample_id(step: int, shard: int) -> int:
        return 100 * step + shard

    def forward_backward(self, step: int, shard: int, sync: bool) -> torch.Tensor:
        x, y = _batch(step, shard, self.fault)
        out = self.model(x)
        if self.rank == BAD_RANK and step >= FAULT_AT and (
                self.fault == "bad_rank" or (self.fault == "transient" and step == FAULT_AT and step not in self.first_pass)):
            out = out * 1000  # this rank's arithmetic is wrong: every time (bad rank) or once (transient)
            self.first_pass.add(step)
        loss = torch.nn.functional.mse_loss(out, y)
        loss.backward()
        if sync:
            for p in self.model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= self.world
        return loss

    def rerun(self, step: int, shard: int, sync: bool) -> tuple[torch.Tensor, float]:
        loss = self.forward_backward(step, shard, sync)
        return loss, float(torch.cat([p.grad.flatten() for p in self.model.parameters()]).norm())

    def validate(self, batches: int | None) -> float:
        g = torch.Generator().manual_seed(7)
        x = torch.randn(64, 4, generator=g)
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(self.model(x), x.sum(dim=1, keepdim=True)))

    def flip(self, step: int) -> None:
        """The SDC: one mantissa bit of the last rank's first weight, before step FAULT_AT, once."""
        if self.fault == "sdc" and self.rank == self.world - 1 and step == FAULT_AT and step not in self.first_pass:
            self.first_pass.add(step)
            with torch.no_grad():
                self.model[0].weight.view(-1).view(torch.int32)[0] ^= 1 << 20

    def run(self) -> dict[str, Any]:
        self.kit.start()
        applied: dict[int, bool] = {}
        trace: dict[int, list[float]] = {}
        t0 = time.monotonic()
        while self.agent.step < STEPS[self.fault] and (b := self.kit.at_boundary()):
            self.flip(b.step)
            shard = self.rank if self.sample_id(b.step, self.rank) not in self.excluded else self.rank + 50
            self.fed.append((b.step, self.sample_id(b.step, shard)))  # a listed batch: the sampler draws another
            loss = self.forward_backward(b.step, shard, sync=True)
            self.agent.after_forward(loss)
            self.agent.after_backward()
            before = [p.detach().clone() for p in self.model.parameters()]
            self.kit.before_optimizer_step()
            self.opt.step()
            applied[b.step] = any(not torch.equal(a, p) for a, p in zip(before, self.model.parameters(), strict=True))
            self.opt.zero_grad()
            self.agent.after_step()
            trace[self.agent.step] = self.params()
        wall = time.monotonic() - t0
        self.agent.close()
        return self.report(applied, trace, wall)

    def params(self) -> list[float]:
        return torch.cat([p.detach().flatten() for p in self.model.parameters()]).tolist()

    def report(self, applied: dict[int, bool], trace: dict[int, list[float]], wall: float) -> dict[str, Any]:
        events = self.sink.events
        listed_at = {sid: e.step for e in events if e.type is EventType.STEP_TRIAGED for sid in e.data["sample_ids"]}
        # a listed batch fed again after the step it was listed at (a replay the bad-batch list must prevent)
        replayed = sum(1 for i, (step, sid) in enumerate(self.fed) if sid in listed_at
                       and any(s == listed_at[sid] for s, _ in self.fed[:i]))
        steps = [e for e in events if e.type is EventType.STEP]
        return {
            "triaged": [{"step": e.step, **e.data} for e in events if e.type is EventType.STEP_TRIAGED],
            "checks": [{"step": e.step, **e.data["param_check"]} for e in steps if "param_check" in e.data],
            "commands": [{"type": str(c.type), "args": dict(c.args)} for c in (self.ctl.sent if self.ctl else [])],
            "story": self.ctl.story() if self.ctl else [],
            "applied": applied, "final": self.params(), "trace": trace if self.fault == "clean" else {},
            "replayed": replayed, "excluded": sorted(self.excluded),
            "step_s": wall / max(len(self.fed), 1),
        }


def worker(rank: int, fault: str, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    os.environ[NODE_ENV] = f"node-{rank}"  # one node per rank: an eviction names the bad rank's
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        report = Loop(rank, world, fault).run()
        Path(out_dir, f"{rank}.json").write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()
