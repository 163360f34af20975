"""Re-run attribution across two real ranks (gloo, spawned processes): a poisoned shard is data (the
excess follows it to the other rank), a rank that computes wrong numbers on every shard is a bad
rank (the excess stays on it). Each worker runs a plain DP loop with the recovery kit."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cliffguard.agent.config import AgentConfig
from cliffguard.agent.guard import GuardConfig
from cliffguard.agent.hooks import Agent
from cliffguard.agent.recovery import KitConfig, RecoveryKit
from cliffguard.agent.sinks import InMemorySink
from cliffguard.core.enums import EventType
from cliffguard.core.restart_plan import NODE_ENV
from cliffguard.core.spike import SpikeConfig

WORLD, STEPS, FAULT_AT = 2, 26, 20


def _batch(step: int, shard: int, fault: str):
    g = torch.Generator().manual_seed(1000 * step + shard)
    x = torch.randn(8, 4, generator=g)
    y = x.sum(dim=1, keepdim=True)
    poisoned = fault == "data" and step == FAULT_AT and shard == 1
    return x, y * 1000 if poisoned else y


def _worker(rank: int, fault: str, init_file: str, out_dir: str) -> None:
    os.environ[NODE_ENV] = f"node-{rank}"  # one node per rank: the bad rank's node is what an eviction leaves out
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        cfg = AgentConfig(run=f"triage-{fault}", hist_every=0, heartbeat_s=60, calibration_s=0.05,
                          command_tick_s=0.01,
                          guard=GuardConfig(spike=SpikeConfig(window=16, min_history=6), hold_timeout_s=0.5,
                                            on_timeout="resume"),
                          recovery=KitConfig(snapshot_every=2, ring_size=4, pause_timeout_s=0))
        sink = InMemorySink()
        agent = Agent(None, model, opt, cfg, sink=sink)

        def forward_backward(step: int, shard: int, sync: bool) -> torch.Tensor:
            x, y = _batch(step, shard, fault)
            out = model(x)
            if fault == "bad_rank" and rank == 1 and step >= FAULT_AT:
                out = out * 1000  # this rank's arithmetic is wrong, whatever it is given
            loss = torch.nn.functional.mse_loss(out, y)
            loss.backward()
            if sync:
                for p in model.parameters():
                    dist.all_reduce(p.grad)
                    p.grad /= WORLD
            return loss

        def rerun(step: int, shard: int, sync: bool):
            loss = forward_backward(step, shard, sync)
            return loss, float(torch.cat([p.grad.flatten() for p in model.parameters()]).norm())

        kit = RecoveryKit(agent, model, opt, rerun_fn=rerun, sample_ids_fn=lambda step, shard: [100 * step + shard])
        kit.start()
        applied = {}
        while agent.step < STEPS and (b := kit.at_boundary()):
            loss = forward_backward(b.step, rank, sync=True)
            agent.after_forward(loss)
            agent.after_backward()
            before = model.weight.detach().clone()
            kit.before_optimizer_step()
            opt.step()
            applied[b.step] = not torch.equal(before, model.weight)
            opt.zero_grad()
            agent.after_step()
        agent.close()
        triaged = [{"step": e.step, **e.data} for e in sink.events if e.type is EventType.STEP_TRIAGED]
        Path(out_dir, f"{rank}.json").write_text(json.dumps({
            "triaged": triaged, "applied": applied, "bad": sorted(kit.triage.bad.sample_ids),
            "weight": model.weight.flatten().tolist()}))
    finally:
        dist.destroy_process_group()


def _run(fault: str, tmp_path: Path) -> list[dict]:
    mp.spawn(_worker, args=(fault, str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD)
    return [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.parametrize(("fault", "cls", "rank"), [("data", "data", 1), ("bad_rank", "bad_rank", 1)])
def test_the_class_and_the_rank_across_two_ranks(fault, cls, rank, tmp_path) -> None:
    r0, r1 = _run(fault, tmp_path)
    first = r0["triaged"][0]
    assert (first["step"], first["class"], first["rank"]) == (FAULT_AT, cls, rank)
    assert first["reruns"] == 2 and len(first["evidence"]["swapped"]["loss"]) == WORLD
    assert not r0["applied"][str(FAULT_AT)] and not r1["applied"][str(FAULT_AT)], "a bad update was applied"
    assert r0["weight"] == r1["weight"], "the replicas diverged"
    assert r1["triaged"] == [], "only rank 0 reports"
    if fault == "data":
        assert r0["bad"] == r1["bad"] == [100 * FAULT_AT + 1]  # every rank knows the bad shard
        assert all(r0["applied"][str(s)] for s in range(FAULT_AT + 1, STEPS))
    else:
        assert r0["bad"] == [] and all(t["class"] == "bad_rank" for t in r0["triaged"])
        assert all(t["node"] == "node-1" for t in r0["triaged"])  # said by the bad rank itself
