"""Triage on the bundled trainer (trainer/rerun.py, issue 22 part 1): a critical step is re-run from
its pre-step state and classified. A corrupted batch (``corrupt@S``) is ``data``: the update stays
skipped and its sample ids join the bad-batch list and are never drawn again; an LR blow-up is
``optimizer`` (the guard's decision stands: today's rollback path). World 1 in process; world 2 as
two spawned gloo processes, where a corruption of one rank's shard follows that shard to the other
rank when the shards are rotated."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from cliffguard.agent.config import AgentConfig
from cliffguard.agent.guard import GuardConfig
from cliffguard.agent.recovery import KitConfig
from cliffguard.core.enums import EventType
from cliffguard.core.spike import SpikeConfig
from cliffguard.trainer.config import TrainConfig
from cliffguard.trainer.record import SAMPLES_NAME
from testing.trainer import make_trainer, small_config, step_events

CORRUPT_AT, BLOWUP_AT = 20, 26
BLOWUP = f"lr_blowup@{BLOWUP_AT}x1000:3"
"""LR x1000 at step 26: its update wrecks the tiny GPT, so steps 27 and 28 spike (x100 does not)."""
STEPS = BLOWUP_AT + 3
"""The run ends before the third skip would hold it (hold_after 3): no hold to wait out."""


def _config(tmp_path: Path, faults: list[str], **kw) -> TrainConfig:
    guard = GuardConfig(spike=SpikeConfig(window=16, min_history=8), hold_timeout_s=0.5, on_timeout="resume")
    agent = AgentConfig(run="triage", hist_every=0, heartbeat_s=0.05, calibration_s=0.05, command_tick_s=0.02,
                        guard=guard, **kw)
    return small_config(tmp_path, run="triage", steps=STEPS, faults=faults, sample_log=True, agent=agent)


def _fed(cfg: TrainConfig, step: int) -> list[list[int]]:
    """Every rank's sample ids as fed at ``step`` (rank 0's sample log)."""
    rows = [json.loads(line) for line in (cfg.run_dir / SAMPLES_NAME).read_text().splitlines()]
    return next(r for r in rows if r.get("step") == step and "ids" in r)["ids"]


def _triaged(events) -> dict[int, dict]:
    return {e.step: e.data for e in events if e.type is EventType.STEP_TRIAGED}


def test_a_corrupted_batch_is_data_listed_and_never_drawn_again_and_a_blowup_is_the_optimizers(tmp_path):
    cfg = _config(tmp_path, [f"corrupt@{CORRUPT_AT}", BLOWUP])
    tr, sink, _ = make_trainer(cfg)
    assert tr.run() == 0
    steps = {e.step: e.data for e in step_events(sink)}
    triaged = _triaged(sink.events)
    data = triaged[CORRUPT_AT]
    assert (data["class"], data["remedy"], data["update_applied"]) == ("data", "skip_batch", False)
    assert steps[CORRUPT_AT]["skipped"] and steps[CORRUPT_AT]["triaged"] == "data"
    # the re-run of the same shard is the step itself: the pre-step RNG and the batch rebuilt as fed
    assert data["evidence"]["same"]["loss"] == [steps[CORRUPT_AT]["loss"]]
    assert data["evidence"]["control"]["loss"][0] < data["evidence"]["median"] + 6 * data["evidence"]["sigma"]
    fed = _fed(cfg, CORRUPT_AT)[0]
    assert data["sample_ids"] == fed and data["reruns"] == 2 and data["rerun_s"] > 0
    assert [b.sample_ids for b in tr.kit.triage.bad.entries] == [tuple(fed)]
    assert all(tr.sampler.weights[i] == 0.0 for i in fed)  # the sampler never draws them again
    later = [i for s in range(CORRUPT_AT + 1, STEPS) for i in _fed(cfg, s)[0]]
    assert not set(fed) & set(later)
    # the blow-up's update damaged the weights: the next steps are bad on a known-good batch too
    spiked = [s for s in range(BLOWUP_AT + 1, STEPS) if s in triaged]
    assert spiked and all(triaged[s]["class"] == "optimizer" and not triaged[s]["update_applied"] for s in spiked)
    assert all(steps[s]["skipped"] for s in spiked)
    summary = next(e for e in sink.events if e.type is EventType.RUN_FINISHED).data["triage"]
    assert summary["verdicts"] == {"data": 1, "optimizer": len(spiked)} and summary["bad_batches"] == 1


def test_triage_is_declared_and_off_at_zero_steps(tmp_path):
    off = _config(tmp_path, [f"corrupt@{CORRUPT_AT}"], recovery=KitConfig(triage_max_steps=0))
    tr, sink, _ = make_trainer(off)
    assert tr.kit.triage is None
    assert tr.run() == 0
    assert not _triaged(sink.events) and step_events(sink)[CORRUPT_AT].data["skipped"]  # the guard alone
    assert KitConfig().triage_max_steps > 0 and KitConfig().triage.k == 6.0  # on by default, bounded
    with pytest.raises(ValueError, match="triage_max_steps"):
        KitConfig(triage_max_steps=-1)


def test_the_budget_of_triaged_steps_bounds_the_reruns(tmp_path):
    later = CORRUPT_AT + 3
    cfg = _config(tmp_path, [f"corrupt@{CORRUPT_AT}", f"corrupt@{later}"], recovery=KitConfig(triage_max_steps=1))
    tr, sink, _ = make_trainer(cfg)
    assert tr.run() == 0
    assert list(_triaged(sink.events)) == [CORRUPT_AT]  # the second bad batch: the guard's skip alone
    steps = {e.step: e.data for e in step_events(sink)}
    assert steps[later]["skipped"] and "triaged" not in steps[later]
    assert tr.kit.triage.summary()["budget_spent"] and tr.kit.triage.reruns == 2


# -- world 2 ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, root: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    import torch

    torch.set_num_threads(1)
    from accelerate import Accelerator

    from cliffguard.agent.sinks import InMemorySink
    from cliffguard.trainer.loop import Trainer
    from testing.trainer import FakeCommands

    cfg = TrainConfig.load(Path(root) / "config.json")
    sink = InMemorySink()
    try:
        tr = Trainer(cfg, Accelerator(cpu=True), sink=sink, command_source=FakeCommands())
        rc = tr.run()
        out = {"rc": rc, "triaged": {str(s): d for s, d in _triaged(sink.events).items()},
               "steps": {str(e.step): e.data for e in step_events(sink) if e.rank == rank},
               "excluded": sorted(i for i, w in tr.sampler.weights.items() if w == 0.0)}
        Path(root, f"{rank}.json").write_text(json.dumps(out, default=str))
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _two_ranks(tmp_path: Path, faults: list[str]) -> tuple[TrainConfig, dict, dict]:
    cfg = _config(tmp_path, faults)
    cfg.save(tmp_path / "config.json")
    mp.start_processes(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    r0, r1 = (json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1))
    assert r0["rc"] == r1["rc"] == 0
    return cfg, r0, r1


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_ranks_a_corrupted_batch_is_data_and_a_blowup_is_the_optimizers(tmp_path):
    cfg, r0, r1 = _two_ranks(tmp_path, [f"corrupt@{CORRUPT_AT}", BLOWUP])
    data = r0["triaged"][str(CORRUPT_AT)]
    assert (data["class"], data["update_applied"]) == ("data", False) and "rank" not in data  # every shard
    same = data["evidence"]["same"]["loss"]
    assert sum(same) / 2 == r0["steps"][str(CORRUPT_AT)]["loss"]  # the re-run is the step itself
    fed = _fed(cfg, CORRUPT_AT)
    assert data["sample_ids"] == fed[0] + fed[1]
    assert r0["excluded"] == r1["excluded"] == sorted(fed[0] + fed[1])  # every rank's sampler skips them
    spiked = [s for s in range(BLOWUP_AT + 1, STEPS) if str(s) in r0["triaged"]]
    assert spiked and all(r0["triaged"][str(s)]["class"] == "optimizer" for s in spiked)
    assert all(r0["steps"][str(s)]["skipped"] for s in spiked)  # one step event per step: rank 0's


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_ranks_one_ranks_corrupted_shard_follows_its_shard_to_the_other_rank(tmp_path):
    """Three bad shards of rank 1 in a row: half the batch bad only warns at first (those updates go
    through: triage runs on criticals only); the third is critical."""
    bad = [CORRUPT_AT, CORRUPT_AT + 1, CORRUPT_AT + 2]
    cfg, r0, r1 = _two_ranks(tmp_path, [f"corrupt@{s}:1" for s in bad])
    (step, data), = r0["triaged"].items()
    assert int(step) in bad and (data["class"], data["rank"], data["update_applied"]) == ("data", 1, False)
    same, swapped = data["evidence"]["same"]["loss"], data["evidence"]["swapped"]["loss"]
    assert same[1] > same[0] and swapped[0] > swapped[1]  # rank 1's shard is bad on rank 0 too
    fed = _fed(cfg, int(step))
    assert data["sample_ids"] == fed[1]  # only the bad shard is listed
    assert r0["excluded"] == r1["excluded"] == sorted(fed[1])
