"""The DeepSpeed integration: what a configuration lets a rollback restore (fakes, unit tier), and a
real ``DeepSpeedEngine`` on 2 processes under torchrun on gloo (slow tier, one run of
tests/agent/integrations/deepspeed_worker.py for every case): the guard's skip leaves the weights
unchanged on every rank, a rollback restores them bit-for-bit from memory (ZeRO-2 and ZeRO-3) or
from the engine's own checkpoint (an offloaded optimizer), with the LR scale applied and acked, and
a configuration that cannot be rolled back in memory says so in ``run.started``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from cliffguard.agent.integrations.deepspeed_state import EngineCheckpoints, rollback_plan
from testing.torchrun_cases import run_cases

WORKER = Path(__file__).with_name("deepspeed_worker.py")
CASES = ("stage2", "stage3", "offload-disk", "elastic", "accum", "fp16")


def _engine(stage: int = 2, elastic: bool = False, offload: str | None = None, param: str | None = None):
    def device(d: str | None):
        return None if d is None else SimpleNamespace(device=SimpleNamespace(value=d))

    return SimpleNamespace(zero_optimization_stage=lambda: stage, zero_elastic_checkpoint=lambda: elastic,
                           zero_offload_optimizer=lambda: device(offload), zero_offload_param=lambda: device(param),
                           lr_scheduler=None)


def test_a_rigid_zero_state_rolls_back_from_memory_and_disk_when_a_save_dir_is_known():
    assert rollback_plan(_engine(3), None).mode == "memory"
    plan = rollback_plan(_engine(2), "/ckpt")
    assert (plan.memory, plan.disk, plan.mode, plan.reason) == (True, True, "memory and disk", "")


@pytest.mark.parametrize(("engine", "why"), [
    (_engine(2, elastic=True), "elastic_checkpoint"),
    (_engine(1, elastic=True), "elastic_checkpoint"),
    (_engine(2, offload="cpu"), "offload_optimizer to cpu"),
    (_engine(3, offload="nvme", param="nvme"), "offload_param to nvme"),
])
def test_an_elastic_or_offloaded_state_is_never_restored_from_memory(engine, why):
    plan = rollback_plan(engine, None)
    assert not plan.memory and plan.mode == "none" and why in plan.reason
    assert rollback_plan(engine, "/ckpt").mode == "disk only"


def test_offload_to_none_is_not_an_offload_and_zero3_ignores_the_stage2_elastic_flag():
    assert rollback_plan(_engine(2, offload="none", param="none"), None).memory
    assert rollback_plan(_engine(3, elastic=True), None).memory  # ZeRO-3 refuses elastic itself


def test_checkpoint_tags_are_targets_only_while_their_directory_exists(tmp_path):
    class Ring:
        def __init__(self) -> None:
            self.steps = [2, 4]

        def available_steps(self):
            return self.steps

        def restore(self, step, discard_newer=True):
            return {"step": step}, "memory"

        def discard_after(self, step):
            self.steps = [s for s in self.steps if s <= step]

    store = EngineCheckpoints(Ring(), _engine(), str(tmp_path))
    (tmp_path / "global_step6").mkdir()
    store.note_saved(6, str(tmp_path), "global_step6")
    store.note_saved(8, str(tmp_path), "global_step8")  # a save that left no directory
    assert store.available_steps() == [2, 4, 6]
    assert store.restore(4, discard_newer=False) == ({"step": 4}, "memory")
    state, source = store.restore(6)
    assert source == "disk (global_step6)" and state["disk"] == (str(tmp_path), "global_step6")
    store.discard_after(3)
    assert store.available_steps() == [2]
    with pytest.raises(KeyError):
        store.restore(6)


# ---------------------------------------------------------------------- 2 processes, real DeepSpeed
@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict[str, list[dict]]:
    """Every case's per-rank results from one torchrun of the worker (~25 s: DeepSpeed's import
    and six engines; no JIT build, tests/agent/integrations/deepspeed_cpu.py)."""
    out = tmp_path_factory.mktemp("deepspeed")
    return run_cases(WORKER, out, CASES, {"DS_ACCELERATOR": "cpu"})


@pytest.mark.slow
@pytest.mark.parametrize("case", ["stage2", "stage3", "offload-disk"])
def test_the_guard_skips_the_spike_on_every_rank_and_the_weights_do_not_move(ranks, case):
    for rank in ranks[case]:
        w = rank["weights"]
        assert w["spike_before"] == w["spike_after"]  # the bad update reached no rank's weights
        assert w["5"] != w["6"]  # the good ones did
    spike = next(s for s in ranks[case][0]["steps"] if s["step"] == 6)
    assert spike["skipped"] is True and spike["loss"] > 1e4
    clean = [s for s in ranks[case][0]["steps"] if not s["skipped"]]
    assert clean and all(s["grad_norm"] > 0 for s in clean)  # DeepSpeed's global norm, read after its step


@pytest.mark.slow
@pytest.mark.parametrize(("case", "source"), [("stage2", "memory"), ("stage3", "memory"),
                                              ("offload-disk", "disk (global_step4)")])
def test_a_rollback_restores_the_weights_bit_for_bit_and_applies_the_lr_scale(ranks, case, source):
    for rank in ranks[case]:
        assert rank["after_rollback"] == rank["weights"]["4"]  # every rank, every fp32 weight, exactly
        assert rank["steps_run"] == [*range(10), *range(4, 10)]
        assert rank["lrs"][-3:] == [0.025] * 3 and rank["lr_scale_applied"] == 0.5  # the update's own LR
        assert rank["global_steps"] == 10  # DeepSpeed's counter is the agent's step, restored with it
    ack = next(a for a in ranks[case][0]["acks"] if a["cmd_type"] == "rollback")
    assert ack["status"] == "applied" and f"restored step 4 from {source}" in ack["detail"]
    assert "lr_scale=0.5" in ack["detail"]
    after = [s for s in ranks[case][0]["steps"] if s["lr_scale"] == 0.5]
    assert after[0]["step"] == 4 and after[0]["lr"] == pytest.approx(0.025)  # reported as applied


@pytest.mark.slow
def test_run_started_declares_what_a_rollback_can_restore_under_each_configuration(ranks):
    started = {c: ranks[c][0]["started"] for c in CASES}
    assert all(s["config"]["integration"] == "deepspeed" for s in started.values())
    assert started["stage3"]["config"]["rollback"] == "memory" and started["stage3"]["config"]["zero_stage"] == 3
    assert "rollback" in started["stage2"]["capabilities"]
    disk = started["offload-disk"]
    assert disk["config"]["rollback"] == "disk only" and "offload_optimizer" in disk["config"]["rollback_limit"]
    assert "rollback" in disk["capabilities"]
    assert any(c["kind"] == "full" and c["path"].endswith("global_step4") for c in ranks["offload-disk"][0]["checkpoints"])
    none = started["elastic"]
    assert none["config"]["rollback"] == "none" and "elastic_checkpoint" in none["config"]["rollback_limit"]
    assert "rollback" not in none["capabilities"] and "pause" in none["capabilities"]  # pause-only, said at start
    assert all(rank["started"] is None for c in CASES for rank in ranks[c][1:])  # rank 0 alone reports


@pytest.mark.slow
def test_with_gradient_accumulation_the_guard_judges_each_optimizer_step_once(ranks):
    for rank in ranks["accum"]:
        assert rank["steps_run"] == [s for s in range(8) for _ in range(2)] and rank["global_steps"] == 8
        moved = [before != after for before, after in rank["weights"]["micro"]]
        # micro-batches 12-13 are step 6 (the spike): its update is skipped; every other step's lands
        assert moved == [i % 2 == 1 and i != 13 for i in range(16)]
    assert [(s["step"], s["skipped"]) for s in ranks["accum"][0]["steps"]] == [(s, s == 6) for s in range(8)]


@pytest.mark.slow
def test_validate_runs_on_the_val_batches_of_every_rank(ranks):
    val = ranks["stage2"][0]["validations"]
    assert len(val) == 1 and val[0]["batches"] == 4 and val[0]["cmd"]  # 2 batches on each of 2 ranks
    ack = next(a for a in ranks["stage2"][0]["acks"] if a["cmd_type"] == "validate")
    assert ack["status"] == "applied" and ack["detail"].startswith("val_loss=")


@pytest.mark.slow
def test_fp16_overflow_skips_and_the_loss_scale_reach_the_step_events(ranks):
    steps = ranks["fp16"][0]["steps"]
    overflowed = [s for s in steps if s["guard"] == "ok" and s["skipped"]]  # DeepSpeed's skips, not the guard's
    assert len(overflowed) >= 3 and steps[0] in overflowed  # 2^20 overflows the fp16 gradients at once
    scales = [s["loss_scale"] for s in overflowed]
    # halved on the overflows (the first is absorbed by DeepSpeed's hysteresis of 2), never raised
    assert scales == sorted(scales, reverse=True) and scales[0] == 2.0**20 and scales[-1] <= 2.0**16
    assert [s["overflow_skips"] for s in overflowed] == list(range(1, len(overflowed) + 1))
    applied = [s for s in steps if not s["skipped"]]
    assert applied and all(s["grad_norm"] > 0 for s in applied) and ranks["fp16"][0]["lrs"]
