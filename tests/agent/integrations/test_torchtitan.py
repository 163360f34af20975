"""The torchtitan integration: a config it cannot guard is refused when it is made (unit tier), and a real
torchtitan ``Trainer`` (its debug Llama, 2 layers, FSDP over 2 gloo processes under torchrun; slow tier,
one run of tests/agent/integrations/torchtitan_worker.py for every case): the guard's skip leaves the
weights unchanged on every rank (with gradient accumulation too), a rollback restores them bit-for-bit
from the memory ring or from torchtitan's own checkpoint with the LR scale applied and acked,
validation runs on held-back batches or torchtitan's validator, the checkpointer's saves are
checkpoint events, a checkpoint saved without cliffguard resumes, and ``run.started`` says what a
rollback can restore."""

from __future__ import annotations

from pathlib import Path

import pytest
from torchtitan.models.llama3.config_registry import llama3_debugmodel

from cliffguard.agent.integrations.torchtitan import CliffguardTrainer, guarded
from testing.torchrun_cases import run_cases

WORKER = Path(__file__).with_name("torchtitan_worker.py")
CASES = ("memory", "disk", "resume", "accum")


def test_a_run_with_pipeline_parallelism_is_refused_when_its_config_is_made():
    cfg = llama3_debugmodel()
    cfg.training.disable_cuda_graphs = True  # torchtitan's own refusal of PP with CUDA graphs comes first
    cfg.parallelism.pipeline_parallel_degree = 2
    with pytest.raises(ValueError, match="cannot guard a torchtitan run with pipeline parallelism"):
        guarded(cfg, run="pp")


def test_guarded_makes_a_config_that_builds_the_guarded_trainer_and_wants_a_run_name():
    config = guarded(llama3_debugmodel(), run="r1", config_path="/etc/cliffguard.toml")
    assert isinstance(config, CliffguardTrainer.Config) and config._owner is CliffguardTrainer
    assert (config.cliffguard.run, config.cliffguard.config_path) == ("r1", "/etc/cliffguard.toml")
    assert config.training.steps == llama3_debugmodel().training.steps  # torchtitan's settings kept
    with pytest.raises(ValueError, match="cliffguard.run"):
        guarded(llama3_debugmodel(), run="")
    with pytest.raises(ValueError, match="takes a torchtitan Trainer.Config"):
        guarded(config, run="again")


CONFIG_MODULE = """
from torchtitan.models.llama3.config_registry import llama3_debugmodel

from cliffguard.agent.integrations.torchtitan import guarded


def llama3_guarded():
    return guarded(llama3_debugmodel(), run="llama3-debug")
"""


def test_torchtitans_own_cli_builds_the_guarded_config_from_a_config_module_and_refuses_pp(tmp_path, monkeypatch,
                                                                                           capsys):
    from torchtitan.config import ConfigManager

    (tmp_path / "my_guarded_configs.py").write_text(CONFIG_MODULE)  # the docs' few lines, as a user's module
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["--module", "my_guarded_configs", "--config", "llama3_guarded"]
    config = ConfigManager().parse_args([*argv, "--cliffguard.run", "from-cli", "--training.steps", "7"])
    assert type(config) is CliffguardTrainer.Config and config._owner is CliffguardTrainer
    assert (config.cliffguard.run, config.training.steps) == ("from-cli", 7)
    with pytest.raises(SystemExit):  # tyro reports the config's ValueError and exits
        ConfigManager().parse_args([*argv, "--parallelism.pipeline_parallel_degree", "2",
                                    "--training.disable_cuda_graphs"])
    said = " ".join(capsys.readouterr().err.replace("│", " ").split())  # tyro's box, wrapped to the terminal
    assert "cannot guard a torchtitan run with pipeline parallelism" in said


# ---------------------------------------------------------------------- 2 processes, real torchtitan
@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict[str, list[dict]]:
    """Every case's per-rank results from one torchrun of the worker (~45 s on 2 idle cores)."""
    out = tmp_path_factory.mktemp("torchtitan")
    return run_cases(WORKER, out, CASES)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["memory", "disk", "accum"])
def test_the_guard_skips_the_spike_on_every_rank_and_the_weights_do_not_move(ranks, case):
    for rank in ranks[case]:
        before, after = rank["spike"]
        assert before == after  # the bad update reached no rank's shard
        assert rank["weights"]["5"] != rank["weights"]["6"]  # the good ones did
    steps = ranks[case][0]["steps"]
    spike = next(s for s in steps if s["step"] == 6)
    assert spike["skipped"] is True and spike["guard"] == "skip" and spike["loss"] > 10 * steps[5]["loss"]
    assert all(s["grad_norm"] > 0 for s in steps)  # torchtitan's global norm, from its clip_grad_norm_


@pytest.mark.slow
@pytest.mark.parametrize(("case", "source"), [("memory", "memory"), ("disk", "disk (step-4)")])
def test_a_rollback_restores_the_weights_bit_for_bit_and_applies_the_lr_scale(ranks, case, source):
    for rank in ranks[case]:
        assert rank["after_rollback"] == rank["weights"]["4"]  # every rank's gathered weights, every bit
        assert rank["steps_run"] == [*range(10), *range(4, 12)] and rank["final_step"] == 12
        assert rank["lr_scale_applied"] == 0.5
    rank0 = ranks[case][0]
    ack = next(a for a in rank0["acks"] if a["cmd_type"] == "rollback")
    assert ack["status"] == "applied" and f"restored step 4 from {source}" in ack["detail"]
    assert "lr_scale=0.5" in ack["detail"]
    after = [s for s in rank0["steps"] if s["lr_scale"] == 0.5]
    before = next(s for s in rank0["steps"] if s["step"] == 4)
    assert after[0]["step"] == 4 and after[0]["lr"] == pytest.approx(before["lr"] * 0.5)  # reported as applied
    # the LR each applied update ran with (the optimizer's own): steps 0-5, 7-9 (6 skipped), then 4 again
    assert len(rank0["lrs"]) == 17 and rank0["lrs"][9] == pytest.approx(rank0["lrs"][4] * 0.5)


@pytest.mark.slow
def test_validate_runs_on_held_back_batches_or_torchtitans_validator(ranks):
    for case, batches in (("memory", 4), ("disk", 2)):  # 2 kept batches on each of 2 ranks; the validator's 2 steps
        val, = ranks[case][0]["validations"]
        assert val["batches"] == batches and val["cmd"] and val["val_loss"] > 0
        ack = next(a for a in ranks[case][0]["acks"] if a["cmd_type"] == "validate")
        assert ack["status"] == "applied" and ack["detail"].startswith("val_loss=")
    assert ranks["memory"][0]["started"]["config"]["validation"] == "held-back training batches"
    assert ranks["disk"][0]["started"]["config"]["validation"] == "torchtitan validator"


@pytest.mark.slow
def test_the_checkpointers_saves_are_checkpoint_events_and_a_model_only_one_is_no_target(ranks):
    full = [c for c in ranks["disk"][0]["checkpoints"] if c["kind"] == "full"]
    assert [c["step"] for c in full] == [4, 8, 8, 12]  # step 8 again after the rollback
    assert all(c["path"].endswith(f"checkpoint/step-{c['step']}") and c["bytes"] > 0 for c in full)
    assert [c["verified"] for c in full] == [True, True, True, False]  # the last save is model-only
    assert not [c for c in ranks["disk"][0]["checkpoints"] if c["kind"] == "memory"]  # no ring: disk only
    assert any(c["kind"] == "memory" for c in ranks["memory"][0]["checkpoints"])


@pytest.mark.slow
def test_run_started_declares_the_integration_and_what_a_rollback_can_restore(ranks):
    started = {c: ranks[c][0]["started"] for c in ("memory", "disk")}
    for s in started.values():
        assert s["config"]["integration"] == "torchtitan" and s["config"]["parallelism"]["dp_shard"] == 2
        assert {"rollback", "validate", "pause", "set_lr_scale"} <= set(s["capabilities"])
    assert started["memory"]["config"]["rollback"] == "memory and disk"
    assert started["disk"]["config"]["rollback"] == "disk only"
    assert all(rank["started"] is None for c in CASES for rank in ranks[c][1:])  # rank 0 alone reports
    assert ranks["memory"][0]["finished"]["final_loss"] == pytest.approx(ranks["memory"][0]["steps"][-1]["loss"])


@pytest.mark.slow
def test_a_guarded_run_resumes_from_the_checkpoint_of_a_run_without_cliffguard(ranks):
    for rank in ranks["resume"]:
        assert rank["steps_run"] == [4, 5] and rank["final_step"] == 6
    r0 = ranks["resume"][0]
    # run.started at the step resumed from, and the unguarded run's trained weights loaded (fresh: ~8)
    assert r0["started_step"] == 4 and r0["steps"][0]["step"] == 4 and r0["steps"][0]["loss"] < 1.0
    assert r0["finished"]["steps"] == 6


@pytest.mark.slow
def test_with_gradient_accumulation_the_guard_judges_each_optimizer_step_once(ranks):
    for rank in ranks["accum"]:
        assert rank["steps_run"] == list(range(8)) and rank["final_step"] == 8
    r0 = ranks["accum"][0]
    assert r0["started"]["config"]["gradient_accumulation_steps"] == 2
    assert [(s["step"], s["skipped"]) for s in r0["steps"]] == [(s, s == 6) for s in range(8)]
    spike, before = r0["steps"][6], r0["steps"][5]
    # the step's loss is its two micro-batches' mean: the random one's (~8) and a learnt one's
    assert 10 * before["loss"] < spike["loss"] < 0.75 * r0["steps"][0]["loss"]
