"""overlap_copy: the snapshot's copy runs on the copier thread and the optimizer's step waits for
it, so a rollback target holds the state of its step even though training went on."""

from __future__ import annotations

import torch

from cliffguard.trainer.checkpoint import CheckpointConfig, CheckpointManager


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


# -- the bundled loop: the copy overlaps the next step, the optimizer's fence keeps it exact -----------
def _gated_copy(monkeypatch, check):
    """Hold the copier thread until ``check()`` (run on it) returns, then copy as usual."""
    import cliffguard.trainer.checkpoint as ckpt_mod

    real_fill = ckpt_mod.fill
    seen: list = []

    def fill(snap):
        seen.append(check())
        real_fill(snap)

    monkeypatch.setattr(ckpt_mod, "fill", fill)
    return seen


def _tensors(state):
    """Every tensor of a checkpointed model/optimizer state by path, as independent copies."""
    out = {}

    def walk(obj, path):
        if isinstance(obj, torch.Tensor):
            out[path] = obj.detach().clone()
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{path}/{k}")
        elif isinstance(obj, list | tuple):
            for i, v in enumerate(obj):
                walk(v, f"{path}[{i}]")

    walk({"model": state["model"], "optimizer": state["optimizer"]}, "")
    return out


def _save_then_step(tmp_path, monkeypatch, *, fenced: bool):
    """Two steps, a full checkpoint at step 2, then step 2 runs while the copy is held back; returns
    (the state at the save as a deep copy, the checkpoint restored from disk, the model after step 2,
    what the copier saw, the seconds step 2 waited in the fence)."""
    import copy
    import threading

    from testing.trainer import make_trainer, small_config

    tr, _sink, _source = make_trainer(small_config(tmp_path, steps=4))
    stepped = threading.Event()
    try:
        assert tr.cfg.checkpoint.overlap_copy and tr.ckpt.fence_hooks  # the default, wired by the loop
        for _ in range(2):
            tr.train_step()
        if not fenced:
            for handle in tr.ckpt.fence_hooks:
                handle.remove()
        want = copy.deepcopy(tr.capture_state())
        before = _tensors(want)
        # Fenced: the copier is let go only after step 2's optimizer has been waiting in the fence for a
        # while. Unfenced: only after step 2 has finished (what an unfenced step lets happen).
        seen = _gated_copy(monkeypatch, lambda: (
            stepped.wait(5) if not fenced else _wait_for(_training_thread_in_fence),
            {k: torch.equal(v, _tensors(tr.capture_state())[k]) for k, v in before.items()}))
        wait0 = tr.ckpt.fence_wait_s
        tr.checkpoint("full")
        tr.train_step()
        waited = tr.ckpt.fence_wait_s - wait0  # in step 2 (its optimizer's fence)
        stepped.set()
        tr.ckpt.wait()
        state, source = tr.ckpt.restore(2, discard_newer=False)
        assert source == "disk"
        return before, _tensors(state), _tensors(tr.capture_state()), seen, waited
    finally:
        stepped.set()
        tr.ckpt.close()
        tr.agent.close(None)


def _training_thread_in_fence() -> bool:
    """The training (main) thread is blocked in ``CheckpointManager.fence`` right now."""
    import sys
    import threading

    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None:
        if frame.f_code.co_name == "fence" and "checkpoint" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def _wait_for(cond, timeout: float = 10.0) -> bool:
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.005)
    return False


def test_loop_checkpoint_is_the_state_at_its_step_though_training_went_on(tmp_path, monkeypatch):
    before, saved, after, seen, waited = _save_then_step(tmp_path, monkeypatch, fenced=True)
    (reached_fence, unchanged_at_copy), = seen
    assert reached_fence and waited > 0  # step 2's optimizer waited in the fence for the copy
    assert all(unchanged_at_copy.values())  # nothing had changed the state when the copier copied it
    assert set(saved) == set(before) and any(k.startswith("/optimizer/state") for k in saved)
    assert all(torch.equal(saved[k], v) for k, v in before.items())  # parameters and optimizer moments
    assert not torch.equal(after["/model/lm_head.weight"], before["/model/lm_head.weight"])  # step 2 did update


def test_without_the_fence_the_overlapped_copy_would_save_the_next_steps_state(tmp_path, monkeypatch):
    # The control for the test above: the same save and step with the optimizer's fence removed is
    # caught by the same comparison, so the fence is what makes the overlapped checkpoint exact.
    before, saved, after, seen, waited = _save_then_step(tmp_path, monkeypatch, fenced=False)
    (_stepped, unchanged_at_copy), = seen
    assert waited == 0 and not all(unchanged_at_copy.values())
    assert not all(torch.equal(saved[k], v) for k, v in before.items())
    assert all(torch.equal(saved[k], after[k]) for k in before if k.startswith("/model"))  # step 2's state


def test_a_failed_background_copy_is_never_written_or_restored(tmp_path, monkeypatch):
    import pytest

    import cliffguard.trainer.checkpoint as ckpt_mod

    def broken(snap):
        raise RuntimeError("no memory")

    monkeypatch.setattr(ckpt_mod, "fill", broken)
    model, opt = _model_and_opt()
    events = []
    mgr = CheckpointManager(CheckpointConfig(dir=str(tmp_path), overlap_copy=True, snapshot_every=1, ckpt_every=1,
                                             full_every=0, emit_memory_events=False), on_event=events.append)
    mgr.fence_before(opt)
    try:
        mgr.on_step(1, lambda: _state(model, opt))
        mgr.wait()
        assert [(e["verified"], e["detail"].startswith("write failed: snapshot copy failed")) for e in events] == [(False, True)]
        with pytest.raises(KeyError):
            mgr.restore(1, discard_newer=False)
    finally:
        mgr.close()


def test_fence_before_refuses_a_wrapper_without_step_hooks(tmp_path):
    import pytest
    from accelerate import Accelerator

    model, opt = _model_and_opt()
    _model, wrapped = Accelerator(cpu=True).prepare(model, opt)
    mgr = CheckpointManager(CheckpointConfig(dir=str(tmp_path)))
    try:
        with pytest.raises(ValueError, match="optimizer: AcceleratedOptimizer"):
            mgr.fence_before(wrapped)
    finally:
        mgr.close()


def test_the_copier_and_writer_threads_run_at_a_lower_priority(tmp_path):
    import os
    import sys
    import threading

    import pytest

    if not sys.platform.startswith("linux"):
        pytest.skip("per-thread niceness is Linux's")
    model, opt = _model_and_opt()
    mgr = CheckpointManager(CheckpointConfig(dir=str(tmp_path), background_nice=5, snapshot_every=1))
    mgr.fence_before(opt)
    try:
        mgr.save(1, _state(model, opt), "full")  # both threads have run a job
        mgr.wait()
        mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        for thread in (mgr._feeder, mgr._copier):
            assert os.getpriority(os.PRIO_PROCESS, thread.native_id) == min(mine + 5, 19)
    finally:
        mgr.close()
