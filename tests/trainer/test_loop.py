"""The training loop in one process (world 1): schedule and lr_scale, config, the guard's hold
with its local timeout policy, and commands applied at step boundaries.

The 2-process behaviour over the real broker is in test_train_e2e.py.
"""

from __future__ import annotations

import math

import pytest

from cliffguard.agent.guard import GuardConfig
from cliffguard.agent.lr_scale import LRScale
from cliffguard.agent.sinks import InMemorySink
from cliffguard.core.deployment import PolicyConfig
from cliffguard.core.enums import CommandType, EventType
from cliffguard.core.events import make_command
from cliffguard.core.spike import SpikeConfig
from cliffguard.trainer.config import TrainConfig
from cliffguard.trainer.data import DataConfig
from cliffguard.trainer.schedule import WarmupCosine
from testing.trainer import FakeCommands, make_trainer, small_config, step_events


def test_warmup_cosine_and_lr_scale():
    s = WarmupCosine(lr=1.0, min_lr=0.1, warmup_steps=4, total_steps=104)
    assert [s.lr_at(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert s.lr_at(54) == pytest.approx(0.55) and s.lr_at(104) == pytest.approx(0.1) and s.lr_at(500) == pytest.approx(0.1)
    assert "scale" not in str(s.state_dict())  # the schedule's state can never carry the LR scale
    scale = LRScale(0.5)
    other = LRScale()
    other.load_state_dict(scale.state_dict())
    assert other.value == 0.5
    with pytest.raises(ValueError, match="lr_scale"):
        scale.set(math.nan)


def test_config_round_trip_and_validation(tmp_path):
    cfg = small_config(tmp_path, faults=["nan@3"])
    cfg.save(tmp_path / "c.json")
    again = TrainConfig.load(tmp_path / "c.json")
    assert again == cfg and again.agent.run == "loop" and again.checkpoint.snapshot_every == 2
    assert cfg.micro_batch(2) == 1
    with pytest.raises(ValueError, match="global_batch"):
        cfg.micro_batch(3)
    with pytest.raises(ValueError, match="faults"):
        small_config(tmp_path, faults=["meteor@3"])
    with pytest.raises(ValueError, match="seq_len"):
        small_config(tmp_path, data=DataConfig(seq_len=64))
    with pytest.raises(ValueError, match="unknown field"):
        TrainConfig.from_dict({"stepz": 3})


@pytest.mark.parametrize("lr_factor", [0.5, 0.25])
def test_guard_hold_times_out_into_a_local_rollback_with_the_policys_lr_cut(tmp_path, lr_factor):
    guard = GuardConfig(spike=SpikeConfig(window=16, min_history=8), hold_after=3, hold_timeout_s=0.3,
                        on_timeout="rollback", policy=PolicyConfig(lr_factor=lr_factor))
    cfg = small_config(tmp_path, guard=guard, faults=["nan@6", "nan@7", "nan@8"])
    tr, sink, _ = make_trainer(cfg)
    assert tr.run() == 0
    steps = step_events(sink)
    by = [(e.step, e.data["guard"], e.data["lr_scale"]) for e in steps]
    assert (6, "skip", 1.0) in by and (7, "skip", 1.0) in by and (8, "hold", 1.0) in by
    held = [e for e in sink.events if e.type is EventType.HEARTBEAT and e.data["state"] == "held"]
    assert held  # heartbeats went on while held
    # Rolled back to the newest snapshot at or before the first skipped step (6), lr x[policy] lr_factor,
    # and trained on: the one-shot NaNs do not recur on the replay.
    replay = [e for e in steps if e.step == 6 and e.data["lr_scale"] == lr_factor]
    assert replay and replay[0].data["guard"] == "ok"
    assert steps[-1].step == cfg.steps - 1 and steps[-1].data["lr_scale"] == lr_factor
    assert any(e.type is EventType.RUN_FINISHED for e in sink.events)


def test_commands_pause_resume_set_lr_scale_checkpoint_and_stop(tmp_path):
    cfg = small_config(tmp_path, steps=50)
    tr, sink, source = make_trainer(cfg)
    pause = make_command(CommandType.PAUSE, "loop")
    scale = make_command(CommandType.SET_LR_SCALE, "loop", {"lr_scale": 0.25})
    ckpt = make_command(CommandType.CHECKPOINT_NOW, "loop", {"kind": "full"})
    resume, stop = make_command(CommandType.RESUME, "loop"), make_command(CommandType.STOP, "loop")
    script = {3: [pause], 8: [scale, ckpt], 12: [resume], 20: [stop]}

    def feed(src: FakeCommands) -> None:
        src.queue += script.pop(src.polls, [])

    source.on_poll = feed
    assert tr.run() == 0
    acks = {e.data["cmd"]: (e.data["status"], e.step) for e in sink.events if e.type is EventType.COMMAND_ACK}
    assert all(acks[c.id][0] == "applied" for c in (pause, scale, ckpt, resume, stop)), acks
    paused_at = acks[pause.id][1]
    assert acks[scale.id][1] == acks[resume.id][1] == paused_at  # applied while paused: no step ran
    assert any(e.type is EventType.HEARTBEAT and e.data["state"] == "paused" for e in sink.events)
    after = [e for e in step_events(sink) if e.step >= paused_at]
    assert after and all(e.data["lr_scale"] == 0.25 for e in after)
    full = [e for e in sink.events if e.type is EventType.CHECKPOINT and e.data["kind"] == "full"]
    assert full and full[0].step == paused_at and full[0].data["verified"] is True
    assert step_events(sink)[-1].step < cfg.steps - 1  # stopped early


def test_bf16_loss_scaling_and_per_layer_clipping_run_and_report(tmp_path):
    cfg = small_config(tmp_path, steps=4, bf16=True, loss_scaling=True, clip_layer_norm=0.05)
    tr, sink, _ = make_trainer(cfg)
    assert tr.run() == 0
    steps = step_events(sink)
    assert [e.step for e in steps] == [0, 1, 2, 3]
    assert all(math.isfinite(e.data["loss"]) and e.data["skipped"] is False for e in steps)
    assert all(e.data["loss_scale"] > 1 for e in steps)  # the scaler ran and reported its scale
    assert max(e.data["clipped_layers"] for e in steps) > 0  # a tiny threshold clips some layers
    # The scaler's state is part of what a rollback restores.
    assert tr.capture_state()["loss_scaler"]["scale"] == steps[-1].data["loss_scale"]


def test_broker_outage_fault_switches_the_publishers_producers_off_for_its_window(tmp_path):
    from accelerate import Accelerator

    from cliffguard.trainer.loop import Trainer

    tr = Trainer(small_config(tmp_path, steps=8, faults=["broker_outage@3:2"]), Accelerator(cpu=True),
                 sink=InMemorySink(), command_source=FakeCommands())
    tr.agent.start()
    down = []
    for _ in range(8):
        tr.kit.at_boundary()
        tr.train_step()
        down.append(tr.faults.switch.down)  # what the publisher's producers saw during the step
    assert down == [False, False, False, True, True, False, False, False]
    tr.ckpt.close()
    tr.agent.close(None)


def test_workers_get_the_kafka_password_from_the_environment_not_the_saved_config(tmp_path, monkeypatch):
    from cliffguard.core.kafka_config import KafkaConfig
    from cliffguard.trainer.run import with_env_secrets

    cfg = small_config(tmp_path, kafka=KafkaConfig(security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                                           sasl_plain_username="u", sasl_plain_password="hunter2-secret"))
    cfg.save(tmp_path / "config.json")
    assert "hunter2-secret" not in (tmp_path / "config.json").read_text()
    loaded = TrainConfig.load(tmp_path / "config.json")
    monkeypatch.setenv("CLIFFGUARD_KAFKA__SASL_PLAIN_PASSWORD", "hunter2-secret")
    assert with_env_secrets(loaded).kafka.sasl_plain_password == "hunter2-secret"
