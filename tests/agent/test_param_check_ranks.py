"""The SDC watch across three real DDP replicas (gloo, spawned processes): one bit flipped in one
rank's parameters is named in rank 0's step event at the next check, with the last step the
replicas agreed; before it every check agrees, and without a flip no check ever disagrees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from cliffguard.agent.config import AgentConfig
from cliffguard.agent.hooks import Agent
from cliffguard.agent.sinks import InMemorySink
from cliffguard.core.enums import EventType

WORLD, STEPS, EVERY, FLIP_AT, FLIP_RANK = 3, 22, 5, 12, 2


def _worker(rank: int, flip: bool, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        torch.manual_seed(rank)  # different inits: DDP's broadcast from rank 0 makes them replicas
        model = DDP(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        sink = InMemorySink()
        agent = Agent(None, model, opt, AgentConfig(run="sdc", hist_every=0, heartbeat_s=60, calibration_s=0.05,
                                                    param_check_every=EVERY), sink=sink)
        agent.start()
        for step in range(STEPS):
            if flip and rank == FLIP_RANK and step == FLIP_AT:
                with torch.no_grad():  # silent corruption: one mantissa bit of one weight, nothing else
                    bits = model.module[2].weight.view(-1).view(torch.int32)
                    bits[3] ^= 1 << 20
            g = torch.Generator().manual_seed(100 * step + rank)
            x = torch.randn(16, 4, generator=g)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
            agent.after_forward(loss)
            loss.backward()
            agent.after_backward()
            agent.before_optimizer_step()
            opt.step()
            opt.zero_grad(set_to_none=True)
            agent.after_step()
        agent.close()
        started = [e.data["param_check_every"] for e in sink.events if e.type is EventType.RUN_STARTED]
        checks = {e.step: e.data["param_check"] for e in sink.events
                  if e.type is EventType.STEP and "param_check" in e.data}
        Path(out_dir, f"{rank}.json").write_text(json.dumps({
            "started": started, "checks": checks, "params": [p.detach().flatten().tolist() for p in model.parameters()]}))
    finally:
        dist.destroy_process_group()


def _run(flip: bool, tmp_path: Path) -> list[dict]:
    mp.spawn(_worker, args=(flip, str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD)
    return [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.slow
def test_a_flipped_bit_on_one_replica_is_named_at_the_next_check(tmp_path) -> None:
    r0, r1, r2 = _run(True, tmp_path)
    checks = r0["checks"]
    assert sorted(int(s) for s in checks) == list(range(0, STEPS, EVERY))
    assert all(checks[str(s)] == {"agree": True} for s in range(0, FLIP_AT, EVERY))
    first_bad = (FLIP_AT // EVERY + 1) * EVERY
    assert checks[str(first_bad)] == {"agree": False, "suspects": [FLIP_RANK], "named": True,
                                      "groups": [[0, 1], [FLIP_RANK]], "last_agreed": 10, "mismatches": 1}
    # it stays diverged: DDP never re-syncs parameters (a flip in the lowest bits may round away; this one does not)
    assert checks[str(first_bad + EVERY)]["suspects"] == [FLIP_RANK]
    assert r1["checks"] == {} and r2["checks"] == {}  # rank 0 speaks for the run
    assert r0["started"] == [EVERY]  # run.started says the watch is on, and how often
    assert r0["params"] == r1["params"] != r2["params"]


@pytest.mark.slow
def test_healthy_replicas_always_agree(tmp_path) -> None:
    r0, r1, r2 = _run(False, tmp_path)
    assert list(r0["checks"].values()) == [{"agree": True}] * len(range(0, STEPS, EVERY))
    assert r0["params"] == r1["params"] == r2["params"]
