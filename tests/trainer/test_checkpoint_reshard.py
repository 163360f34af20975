"""Resharding round trip: a checkpoint saved at world 4 (parameters and AdamW moments as DTensors
sharded over the ranks, written collectively by CheckpointManager) loads at world 2 and at 3,
both resharded into the new mesh (``load_resharded``) and as full state (``restore``); a state
that does not fit the checkpoint is refused naming the tensor."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cliffguard.trainer.checkpoint import CheckpointConfig, CheckpointManager
from cliffguard.trainer.checkpoint_io import ReshardError, ckpt_path, load_resharded
from cliffguard.trainer.model import GPT, GPTConfig

pytestmark = pytest.mark.slow
SMALL = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8)


def reference(cfg: GPTConfig = SMALL) -> tuple[dict, dict]:
    """Full model and optimizer state after one AdamW step (the same in every process)."""
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, 256, (2, 8))
    model(x, x)[1].backward()
    opt.step()
    return model.state_dict(), opt.state_dict()


def sharded(model_sd: dict, optim_sd: dict, mesh, zero: bool = False) -> dict:
    """Row-sharded DTensors (uneven shards included) of every tensor with a dimension."""
    from torch.distributed.tensor import Shard, distribute_tensor

    def shard(t: torch.Tensor) -> torch.Tensor:
        t = torch.zeros_like(t) if zero else t
        return distribute_tensor(t, mesh, [Shard(0)]) if t.dim() else t.clone()

    state = {i: {k: shard(v) for k, v in s.items()} for i, s in optim_sd["state"].items()}
    return {"model": {k: shard(v) for k, v in model_sd.items()},
            "optimizer": {"state": state, "param_groups": optim_sd["param_groups"]}}


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _assert_same(got: torch.Tensor, want: torch.Tensor, name: object) -> None:
    """Bitwise equal, or a message that tells a last-bit difference from a misplaced shard."""
    if torch.equal(got, want):
        return
    if got.shape != want.shape:
        raise AssertionError(f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}")
    diff = (got - want).abs()
    rows = diff.reshape(diff.shape[0], -1).amax(1).nonzero().flatten().tolist() if diff.dim() else []
    raise AssertionError(f"{name}: max |diff| {diff.max().item():.3g}, rows that differ {rows[:20]}"
                         f"{' …' if len(rows) > 20 else ''} of {want.shape[0] if want.dim() else 0}")


def _worker(rank: int, world: int, root: str, phase: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    # four processes on a CI runner's two cores: one thread each rather than oversubscribed pools
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/store-{phase}-{world}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        # the reference is read, not recomputed: a backward pass is not bitwise reproducible across
        # processes whose BLAS picks a different thread count under load (CI saw wte differ in the
        # last bits), and this test is about the bytes surviving a reshard, not about determinism
        model_sd, optim_sd = torch.load(f"{root}/reference.pt", weights_only=False)
        cfg = CheckpointConfig(dir=f"{root}/ckpt")
        if phase == "save":
            state = {**sharded(model_sd, optim_sd, mesh), "rng": {"torch": torch.full((4,), float(rank))}}
            m = CheckpointManager(cfg, rank, world, run_id="reshard")
            m.save(10, state, "full")
            m.close()
            return
        # resharded into this world's mesh, collectively
        target = sharded(model_sd, optim_sd, mesh, zero=True)
        got = load_resharded(ckpt_path(Path(root) / "ckpt", 10, "full", "reshard"), target, rank, dist.group.WORLD)
        for k, v in model_sd.items():
            assert got["model"][k].to_local().shape[0] <= -(-v.shape[0] // world) if v.dim() else True
            _assert_same(_full(got["model"][k]), v, k)
        for i, s in optim_sd["state"].items():
            for k, v in s.items():
                _assert_same(_full(got["optimizer"]["state"][i][k]), v, (i, k))
        assert got["optimizer"]["param_groups"] == optim_sd["param_groups"]
        # as full state, with no collective (what the replicated trainer restores from)
        m = CheckpointManager(cfg, rank, world, run_id="reshard")
        state, source = m.restore(10, discard_newer=False)
        m.close()
        assert source == "disk"
        for k, v in model_sd.items():
            _assert_same(state["model"][k], v, k)
        for i, s in optim_sd["state"].items():
            for k, v in s.items():
                _assert_same(state["optimizer"]["state"][i][k], v, (i, k))
        assert torch.equal(state["rng"]["torch"], torch.full((4,), float(rank)))  # rank < 4: its own
    finally:
        dist.destroy_process_group()


def test_saved_at_world_4_loads_resharded_at_2_and_3(tmp_path):
    # spawned, not forked: a fork of the test process copies the locks its other threads (a Kafka
    # client's, the OpenMP pool's) held at that moment, and a child could wait on one forever
    torch.save(reference(), tmp_path / "reference.pt")
    mp.start_processes(_worker, args=(4, str(tmp_path), "save"), nprocs=4, start_method="spawn")
    path = ckpt_path(tmp_path / "ckpt", 10, "full", "reshard")
    assert (path.with_name(path.name + ".json")).exists()
    assert sorted(p.name for p in path.iterdir()) == [".metadata", *(f"__{r}_0.distcp" for r in range(4))]
    for world in (2, 3):
        mp.start_processes(_worker, args=(world, str(tmp_path), "load"), nprocs=world, start_method="spawn")
    # a state of another shape cannot be resharded from it: refused before anything is read
    wider = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=8)
    model_sd, optim_sd = reference(wider)
    with pytest.raises(ReshardError, match=r"shared\.model\.transformer\.wte\.weight: checkpoint .* holds "
                                           r"\(256, 16\), this topology needs global shape \(256, 32\)"):
        load_resharded(path, {"model": model_sd, "optimizer": optim_sd})
