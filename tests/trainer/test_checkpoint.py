import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from cliffguard.trainer.checkpoint import CheckpointConfig, CheckpointManager
from cliffguard.trainer.model import GPT, GPTConfig

REPO = Path(__file__).resolve().parents[2]


def training_state(seed: int = 0) -> tuple[GPT, torch.optim.Optimizer, dict]:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, 256, (2, 8))
    _, loss = model(x, x)
    loss.backward()
    opt.step()
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "lr_scale": 0.5,
        "sampler": {"skips": [[8, 16]], "weights": {3: 0.1}},
        "rng": {"torch": torch.get_rng_state()},
    }
    return model, opt, state


def assert_state_equal(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_state_equal(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_state_equal(x, y)
    else:
        assert a == b


def manager(tmp_path, events, writer="thread", **kw):
    cfg = CheckpointConfig(dir=str(tmp_path), writer=writer, **kw)
    return CheckpointManager(cfg, rank=0, world=1, on_event=events.append)


def test_disk_round_trip_is_exact_and_verified(tmp_path):
    events: list[dict] = []
    m = manager(tmp_path, events)
    _, _, state = training_state()
    m.save(100, state, "full")
    m.wait()
    ev = [e for e in events if e["kind"] == "full"]
    assert ev and ev[0]["verified"] and ev[0]["step"] == 100 and len(ev[0]["sha256"]) == 64
    files = [f for f in Path(ev[0]["path"]).iterdir()]  # a DCP directory: shard(s) + .metadata
    assert {f.name for f in files} >= {".metadata", "__0_0.distcp"}
    assert sum(f.stat().st_size for f in files) == ev[0]["bytes"]
    m.close()
    fresh = manager(tmp_path, [])  # a new process: only the disk is left
    restored, source = fresh.restore(100)
    assert source == "disk"
    assert_state_equal(state, restored)
    fresh.close()


def test_memory_snapshot_is_a_copy_and_restore_loads_into_model(tmp_path):
    m = manager(tmp_path, [])
    model, opt, state = training_state()
    m.snapshot(10, state)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # training goes on; the snapshot must not move with it
    restored, source = m.restore(10)
    assert source == "memory"
    model.load_state_dict(restored["model"])
    opt.load_state_dict(restored["optimizer"])
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    m.close()


def test_schedule_ring_and_retention(tmp_path):
    events: list[dict] = []
    m = manager(tmp_path, events, memory_ring=3, snapshot_every=10, ckpt_every=20, full_every=60, keep_full=2,
                keep_incremental=2)
    _, _, state = training_state()
    for step in range(0, 190, 10):
        m.on_step(step, lambda: state)
    m.wait()
    assert list(m.ring) == [160, 170, 180]
    assert m.kinds_due(120) == ["memory", "full"] and m.kinds_due(140) == ["memory", "incremental"]
    assert m.disk_steps() == [120, 140, 160, 180]  # newest 2 full (120, 180) + 2 incremental (140, 160)
    assert m.available_steps() == [120, 140, 160, 170, 180]
    assert all(e["verified"] for e in events)
    with pytest.raises(KeyError):
        m.restore(130)
    m.close()


def test_restore_discards_the_abandoned_timeline(tmp_path):
    m = manager(tmp_path, [], snapshot_every=10, ckpt_every=20, full_every=0)
    _, _, state = training_state()
    for step in (20, 30, 40):
        m.on_step(step, lambda: state)
    m.restore(20)
    assert m.available_steps() == [20]
    m.close()


def test_corrupt_newest_checkpoint_falls_back_to_previous(tmp_path):
    events: list[dict] = []
    m = manager(tmp_path, events)
    _, _, old = training_state(seed=1)
    _, _, new = training_state(seed=2)
    m.save(100, old, "full")
    m.save(200, new, "full")
    m.close()
    newest = tmp_path / "full-000000200" / "__0_0.distcp"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))

    events.clear()
    fresh = manager(tmp_path, events)
    assert fresh.latest_verified() == 100
    step, state, source, detail = fresh.restore_latest()
    assert (step, source) == (100, "disk")
    assert "200" in detail and "corrupt" in detail
    assert_state_equal(old, state)
    bad = [e for e in events if not e["verified"]]
    assert bad and bad[0]["step"] == 200 and "sha256" in bad[0]["detail"]
    with pytest.raises(KeyError, match="corrupt"):
        fresh.restore(200, discard_newer=False)
    fresh.close()


WRITER = textwrap.dedent(
    """
    import sys, time
    import torch
    import cliffguard.trainer.checkpoint as ck
    import cliffguard.trainer.checkpoint_io as ckio
    cfg = ck.CheckpointConfig(dir=sys.argv[1], writer="thread")
    m = ck.CheckpointManager(cfg)
    m.save(100, {"w": torch.ones(1000)}, "full")
    m.wait()
    def stalled(files):  # the shards are written, nothing is committed yet
        print("WRITING", flush=True)
        time.sleep(60)
    ckio.manifest_sha256 = stalled
    m.save(200, {"w": torch.full((100000,), 2.0)}, "full")
    time.sleep(60)
    """
)


def test_writer_killed_mid_checkpoint_leaves_previous_intact(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout.readline().strip() == "WRITING"
        assert (tmp_path / "full-000000200.tmp" / ".metadata").exists()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    events: list[dict] = []
    m = manager(tmp_path, events)
    assert not list(tmp_path.glob("*.tmp"))
    assert m.available_steps() == [100]
    state, source = m.restore(100)
    assert source == "disk" and torch.equal(state["w"], torch.ones(1000))
    m.close()


def test_failing_observer_does_not_stop_the_writer(tmp_path):
    def boom(_payload):
        raise RuntimeError("observer down")

    m = CheckpointManager(CheckpointConfig(dir=str(tmp_path), writer="thread"), on_event=boom)
    m.save(5, {"w": torch.zeros(3)}, "incremental")
    m.wait()
    assert m.disk_steps() == [5]
    m.close()


@pytest.mark.parametrize("kw, field", [({"memory_ring": 0}, "memory_ring"), ({"keep_full": 0}, "keep_full"),
                                       ({"ckpt_every": -1}, "ckpt_every")])
def test_config_validation(tmp_path, kw, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        CheckpointConfig(dir=str(tmp_path), **kw)


def test_recycled_snapshot_buffers_never_clobber_live_states(tmp_path):
    m = manager(tmp_path, [], memory_ring=2, snapshot_every=1, ckpt_every=3, full_every=0, keep_incremental=10)
    w = torch.zeros(50_000)
    for step in range(1, 13):
        w.fill_(float(step))
        m.on_step(step, lambda s=step: {"w": w, "meta": {"step": s}})
    m.wait()
    assert m.ring._spare, "evicted snapshots are recycled"
    assert {s: float(snap.materialize()["w"][0]) for s, snap in m.ring.items()} == {11: 11.0, 12: 12.0}
    for step in (3, 6, 9, 12):
        state, _ = m.restore(step, discard_newer=False)
        assert torch.equal(state["w"], torch.full((50_000,), float(step))) and state["meta"] == {"step": step}
    m.close()


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")

    def __deepcopy__(self, memo):
        return self


def test_a_failed_write_is_reported_and_the_next_one_works(tmp_path):
    events: list[dict] = []
    m = manager(tmp_path, events)
    m.save(1, {"w": torch.ones(10)}, "full")
    m.save(2, {"w": torch.full((10,), 2.0), "obj": Unpicklable()}, "full")
    m.wait()
    failed = [e for e in events if e["step"] == 2]
    assert failed and not failed[0]["verified"] and "write failed" in failed[0]["detail"]
    assert m.available_steps() == [1]
    m.save(3, {"w": torch.full((10,), 3.0)}, "full")  # the writer thread goes on
    m.wait()
    assert m.disk_steps() == [1, 3]
    state, _ = m.restore(3)
    assert torch.equal(state["w"], torch.full((10,), 3.0))
    m.close()


def test_the_writer_is_a_thread_and_world_above_one_needs_a_process_group(tmp_path):
    with pytest.raises(ValueError, match="^writer:"):
        CheckpointConfig(dir=str(tmp_path), writer="process")
    with pytest.raises(ValueError, match="^world: > 1 needs an initialized process group"):
        CheckpointManager(CheckpointConfig(dir=str(tmp_path)), rank=1, world=2)


def test_flat_snapshot_keeps_dtypes_shapes_and_plain_values():
    from cliffguard.trainer.checkpoint_io import clone_tensors, flatten

    state = {"a": torch.arange(6, dtype=torch.int64).view(2, 3), "b": torch.tensor(True), "c": torch.zeros(0),
             "d": [torch.rand(3, dtype=torch.float16), 1.5, "x"], "e": (torch.get_rng_state(), None)}
    snap = flatten(state)
    again = flatten(state, spare=snap)
    assert again.flat is snap.flat  # same layout: the buffer is reused
    assert_state_equal(state, clone_tensors(again.materialize()))


def test_per_rank_state_is_kept_per_rank_and_shared_state_once(tmp_path):
    from cliffguard.trainer.checkpoint_io import from_dcp_state, to_dcp_state

    saved = to_dcp_state({"model": {"w": torch.ones(2)}, "rng": {"torch": torch.zeros(3)}}, rank=2)
    assert set(saved) == {"shared", "ranks"} and set(saved["ranks"]) == {"2"}
    assert torch.equal(from_dcp_state(saved, 2)["rng"]["torch"], torch.zeros(3))
    assert "rng" not in from_dcp_state(saved, 3)  # a rank the saving world did not have: seeded by the caller


def plant_malformed_sidecars(root: Path) -> list[Path]:
    """An empty object, a truncated file and wrong types, at steps above the real checkpoints."""
    bad = {
        "full-000000900.json": "{}",
        "incremental-000000950.json": '{"step": 950, "kind": "incr',
        "full-000000990.json": '{"step": "990", "kind": "full", "sha256": 7, "bytes": true}',
        "incremental-000000999.json": "[1, 2]",
    }
    for name, text in bad.items():
        (root / name).write_text(text)
    return [root / name for name in bad]


def test_malformed_sidecars_are_skipped_reported_once_and_break_nothing(tmp_path):
    events: list[dict] = []
    m = manager(tmp_path, events, keep_full=2)
    bad = plant_malformed_sidecars(m.root)
    _, _, state = training_state()
    try:
        for step in (100, 200, 300):
            m.save(step, state, "full")
        m.wait()
        saved = [e for e in events if e["kind"] == "full" and not e["path"].endswith(".json")]
        assert [e["verified"] for e in saved] == [True, True, True], saved
        assert m.disk_steps() == [200, 300]  # pruning still ran, past the bad sidecars
        m.snapshot(350, state)
        assert m.available_steps() == [200, 300, 350]
        restored, source = m.restore(350, discard_newer=False)  # a memory rollback
        assert source == "memory"
        assert_state_equal(restored, state)
        restored, source = m.restore(200)  # a disk rollback, discarding newer
        assert source == "disk"
        assert_state_equal(restored, state)
        assert m.restore_latest()[0] == 200
        m.save(400, state, "full")
        m.wait()
        assert m.disk_steps() == [200, 400]
    finally:
        m.close()
    assert sorted(m.malformed_sidecars) == sorted(str(p) for p in bad)
    assert all(p.exists() for p in bad)  # reported, not silently deleted
    reports = [e for e in events if e["detail"].startswith("malformed sidecar")]
    assert sorted((e["kind"], e["step"]) for e in reports) == [
        ("full", 900), ("full", 990), ("incremental", 950), ("incremental", 999)]  # once each
    assert all(e["verified"] is False for e in reports)


def test_a_reused_directory_prunes_and_restores_only_the_runs_own_checkpoints(tmp_path):
    _, _, state = training_state(0)
    _, _, other_state = training_state(1)
    old = CheckpointManager(CheckpointConfig(dir=str(tmp_path), writer="thread", keep_full=4), run_id="old-run")
    try:
        for step in (100, 500, 600, 700):  # higher steps than the new run reaches, and one shared step
            old.save(step, other_state, "full")
        old.wait()
    finally:
        old.close()
    others = sorted(p.name for p in tmp_path.iterdir())
    assert len(others) == 8  # 4 kept, each with its sidecar
    events: list[dict] = []
    cfg = CheckpointConfig(dir=str(tmp_path), keep_full=2)
    m = CheckpointManager(cfg, on_event=events.append, run_id="new-run")
    try:
        assert m.disk_steps() == [] and m.available_steps() == []  # another run's are not ours
        with pytest.raises(KeyError):
            m.restore_latest()
        for step in (100, 200, 300, 400):
            m.save(step, state, "full")
        m.wait()
        assert [e["verified"] for e in events if e["kind"] == "full"] == [True] * 4
        assert m.disk_steps() == [300, 400]  # its newest two survive the other run's higher steps
        step, restored, _, _ = m.restore_latest()
        assert step == 400
        assert_state_equal(restored, state)
        m.discard_after(300)
        assert m.disk_steps() == [300]
    finally:
        m.close()
    left = {p.name for p in tmp_path.iterdir()}
    assert set(others) <= left  # every file of the other run is still there
    again = CheckpointManager(CheckpointConfig(dir=str(tmp_path), writer="thread"), run_id="old-run")
    try:
        assert again.disk_steps() == [100, 500, 600, 700]
        assert_state_equal(again.restore(700, discard_newer=False)[0], other_state)
    finally:
        again.close()
    reader = CheckpointManager(CheckpointConfig(dir=str(tmp_path), writer="thread"), run_id=None)
    try:  # run_id=None is the explicit ask for every run's checkpoints
        assert reader.disk_steps() == [100, 300, 500, 600, 700]
    finally:
        reader.close()


def test_a_failing_restore_changes_nothing_newer_checkpoints_stay(tmp_path):
    events: list[dict] = []
    m = manager(tmp_path, events, keep_full=3)
    _, _, state = training_state()
    try:
        for step in (100, 200, 300):
            m.save(step, state, "full")
        m.snapshot(350, state)
        m.wait()
        target = tmp_path / "full-000000100" / "__0_0.distcp"
        target.write_bytes(target.read_bytes()[:-64])  # truncated: fails its sha256 check
        before = sorted(p.name for p in tmp_path.iterdir())
        with pytest.raises(KeyError, match="corrupt"):
            m.restore(100)
        with pytest.raises(KeyError, match="no checkpoint"):
            m.restore(150)
        assert m.available_steps() == [100, 200, 300, 350]  # the ring and disk keep the newer states
        assert sorted(p.name for p in tmp_path.iterdir()) == before
        assert m.restore(200)[1] == "disk"  # a restore that succeeds discards only then
        assert m.available_steps() == [100, 200]
    finally:
        m.close()
