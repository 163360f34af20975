"""Checkpoint staging on each device (testing/cuda.py): a device state flattens into one host
buffer, pinned where the state is on a GPU and still pinned when recycled; DCP's async save stages
through ``FlatStager``; an overlapped snapshot of a model on the device is the state of its step."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp

from cliffguard.trainer.checkpoint import CheckpointConfig, CheckpointManager
from cliffguard.trainer.checkpoint_io import FlatStager, fill, flatten
from testing.cuda import DEVICES


def _state(device: str, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    cpu = {"model": {"w": torch.randn(64, 32, generator=gen), "b": torch.randn(32, generator=gen),
                     "half": torch.randn(40, generator=gen).half(), "empty": torch.zeros(0)},
           "optimizer": {"step": torch.tensor(float(seed)), "exp_avg": torch.randn(64, 32, generator=gen)}}
    return {part: {k: v.to(device) for k, v in d.items()} for part, d in cpu.items()}


def _assert_equal(got: dict, want: dict) -> None:
    for part, d in want.items():
        for k, v in d.items():
            t = got[part][k]
            assert t.device.type == "cpu" and t.dtype == v.dtype and torch.equal(t, v.cpu()), (part, k)


@pytest.mark.parametrize("device", DEVICES)
def test_a_device_state_stages_into_one_host_buffer_pinned_on_a_gpu_and_recycled(device):
    state = _state(device, 1)
    snap = flatten(state)
    assert snap.flat.device.type == "cpu" and snap.flat.is_pinned() == (device == "cuda")
    _assert_equal(snap.materialize(), state)
    newer = _state(device, 2)
    again = flatten(newer, snap)  # same layout: the same buffer, copied into again
    assert again.flat.data_ptr() == snap.flat.data_ptr() and again.flat.is_pinned() == (device == "cuda")
    _assert_equal(again.materialize(), newer)
    later = flatten(state, again, copy=False)  # walk and lay out now, copy later (the copier thread's part)
    fill(later)
    _assert_equal(later.materialize(), state)


@pytest.mark.parametrize("device", DEVICES)
def test_dcp_async_save_through_the_flat_stager_round_trips_a_device_state(device, tmp_path):
    stager = FlatStager()
    for seed in (1, 2):  # the second save stages into the first one's buffer
        state = _state(device, seed)
        path = tmp_path / f"ck{seed}"
        fut = dcp.async_save(state, storage_writer=dcp.FileSystemWriter(str(path)), async_stager=stager, no_dist=True)
        fut.result()
        if device == "cuda":
            assert stager._last is not None and stager._last.flat.is_pinned()
        back = {part: {k: torch.zeros_like(v, device="cpu") for k, v in d.items()} for part, d in state.items()}
        dcp.load(back, storage_reader=dcp.FileSystemReader(str(path)), no_dist=True)
        _assert_equal(back, state)
    stager.close()


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, device: str) -> None:
    model(torch.randn(8, 64, device=device)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("device", DEVICES)
def test_an_overlapped_snapshot_of_a_device_model_is_the_state_of_its_step(device, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    mgr = CheckpointManager(CheckpointConfig(dir=str(tmp_path), overlap_copy=True, snapshot_every=1, ckpt_every=2,
                                             full_every=0))
    mgr.fence_before(opt)
    try:
        _train_step(model, opt, device)
        want = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        mgr.on_step(2, lambda: {"model": model.state_dict(), "optimizer": opt.state_dict(), "lr_scale": 1.0})
        for _ in range(3):
            _train_step(model, opt, device)  # each optimizer step first waits for the copy
        assert not torch.equal(model.weight.detach().cpu(), want["weight"])
        for source in ("memory", "disk"):
            if source == "disk":
                mgr.wait()
                mgr.ring.clear()
            state, got = mgr.restore(2, discard_newer=False)
            assert got == source
            assert all(torch.equal(state["model"][k].cpu(), v) for k, v in want.items())
    finally:
        mgr.close()
