"""overlap_copy: the snapshot's copy runs on the copier thread and the optimizer's step waits for
it, so a rollback target holds the state of its step even though training went on."""

from __future__ import annotations

import torch

from trainer.checkpoint import CheckpointConfig, CheckpointManager


def _model_and_opt():
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    return model, opt


def _train_step(model, opt):
    model(torch.randn(8, 64)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


def _state(model, opt):
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "lr_scale": 1.0}


def test_overlapped_snapshot_is_the_state_of_its_step(tmp_path):
    model, opt = _model_and_opt()
    mgr = CheckpointManager(CheckpointConfig(dir=str(tmp_path), overlap_copy=True, snapshot_every=1, ckpt_every=2,
                                             full_every=0))
    mgr.fence_before(opt)
    try:
        _train_step(model, opt)
        want = {k: v.clone() for k, v in model.state_dict().items()}
        mgr.on_step(2, lambda: _state(model, opt))  # memory + incremental, copy pending
        for _ in range(3):
            _train_step(model, opt)  # each step's optimizer first waits for the copy
        assert not torch.equal(model.weight, want["weight"])
        state, source = mgr.restore(2, discard_newer=False)
        assert source == "memory" and all(torch.equal(state["model"][k], v) for k, v in want.items())
        mgr.wait()
        mgr.ring.clear()
        state, source = mgr.restore(2, discard_newer=False)
        assert source == "disk" and all(torch.equal(state["model"][k], v) for k, v in want.items())
    finally:
        mgr.close()


def test_without_a_fenced_optimizer_the_copy_stays_on_the_training_thread(tmp_path):
    model, opt = _model_and_opt()
    mgr = CheckpointManager(CheckpointConfig(dir=str(tmp_path), overlap_copy=True, snapshot_every=1))
    try:
        mgr.snapshot(1, _state(model, opt))
        assert dict(mgr.ring.items())[1].pending is None and mgr._copier is None  # copied before snapshot returned
    finally:
        mgr.close()
