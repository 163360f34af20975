"""The SDC watch under FSDP2 (agent/replica_groups.py), on real processes (gloo): under HSDP the
ranks at one shard position witness each other, so a bit flipped in one rank's shard is named at
the next check; under plain FSDP no rank can witness another, and ``run.started`` says the watch
cannot check instead of checking nothing quietly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cliffguard.agent.config import AgentConfig
from cliffguard.agent.hooks import Agent
from cliffguard.agent.integrations.torchtitan_state import ParamsView
from cliffguard.agent.sinks import InMemorySink
from cliffguard.core.enums import EventType

STEPS, EVERY, FLIP_AT, FLIP_RANK = 16, 4, 6, 3


def _worker(rank: int, world: int, mesh_shape: tuple[int, ...], flip: bool, init_file: str, out_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        names = ("replicate", "shard")[-len(mesh_shape):]
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
        torch.manual_seed(0)  # FSDP2 does not broadcast: every rank builds the same model
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        fully_shard(model, mesh=mesh)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        sink = InMemorySink()
        # the agent sees the parameters as torchtitan's integration shows them (no per-rank norms of DTensor grads)
        agent = Agent(None, ParamsView(model), None, AgentConfig(run="sdc-fsdp", hist_every=0, heartbeat_s=60,
                                                                 calibration_s=0.05, param_check_every=EVERY), sink=sink)
        agent.start()
        for step in range(STEPS):
            if flip and rank == FLIP_RANK and step == FLIP_AT:
                with torch.no_grad():  # one mantissa bit of this rank's shard of the last weight
                    bits = model[2].weight.to_local().view(-1).view(torch.int32)
                    bits[1] ^= 1 << 20
            g = torch.Generator().manual_seed(100 * step + rank)  # every rank its own data, as in HSDP
            x = torch.randn(8, 4, generator=g)
            loss = model(x).pow(2).mean()
            agent.after_forward(loss)
            loss.backward()
            agent.after_backward()
            agent.before_optimizer_step()
            opt.step()
            opt.zero_grad(set_to_none=True)
            agent.after_step()
        agent.close()
        started = [e.data for e in sink.events if e.type is EventType.RUN_STARTED]
        checks = {e.step: e.data["param_check"] for e in sink.events
                  if e.type is EventType.STEP and "param_check" in e.data}
        Path(out_dir, f"{rank}.json").write_text(json.dumps({"started": started, "checks": checks}))
    finally:
        dist.destroy_process_group()


def _run(world: int, mesh_shape: tuple[int, ...], flip: bool, tmp_path: Path) -> list[dict]:
    mp.spawn(_worker, args=(world, mesh_shape, flip, str(tmp_path / "init"), str(tmp_path)), nprocs=world)
    return [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(world)]


@pytest.mark.slow
def test_under_hsdp_a_flipped_bit_in_one_shard_is_named_by_its_replicas(tmp_path) -> None:
    """A 3 x 2 mesh: shard 1 lives on ranks 1, 3, 5; rank 3's flip leaves 1 and 5 agreeing."""
    r = _run(6, (3, 2), True, tmp_path)
    checks = r[0]["checks"]
    assert r[0]["started"][0]["param_check_every"] == EVERY and "param_check_off" not in r[0]["started"][0]
    assert sorted(int(s) for s in checks) == list(range(0, STEPS, EVERY))
    assert all(checks[str(s)] == {"agree": True} for s in range(0, FLIP_AT + 1, EVERY))
    first_bad = (FLIP_AT // EVERY + 1) * EVERY
    bad = checks[str(first_bad)]
    assert bad["agree"] is False and bad["suspects"] == [FLIP_RANK] and bad["named"] is True
    assert sorted(map(sorted, bad["groups"])) == [[0, 2, 4], [1, 5], [3]]  # the witnesses, by equal hash
    assert bad["last_agreed"] == (FLIP_AT // EVERY) * EVERY


@pytest.mark.slow
def test_under_plain_fsdp_the_watch_says_it_cannot_check(tmp_path) -> None:
    r = _run(2, (2,), False, tmp_path)
    started = r[0]["started"][0]
    assert started["param_check_every"] == 0
    assert "every rank holds its own shard" in started["param_check_off"]
    assert r[0]["checks"] == {}
