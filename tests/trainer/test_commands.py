"""The bundled trainer as a CommandTarget (trainer/commands.py): commands through the dispatch table
on a real world-1 trainer, the one lr_scale owner, and the mode table holding in the loop."""

from __future__ import annotations

from cliffguard.agent.dispatch import dispatch
from cliffguard.agent.lr_scale import LRScale
from cliffguard.core.enums import AckStatus, CommandType, EventType, TrainerMode
from cliffguard.core.events import make_command
from testing.trainer import make_trainer, small_config, step_events


def _train(tr, steps: int) -> None:
    for _ in range(steps):
        tr.kit.at_boundary()
        tr.train_step()


def _send(tr, ctype, args=None):
    cmd = make_command(ctype, "loop", args or {})
    return dispatch(cmd, tr.kit, tr.agent.modes, tr.agent.ack)


def test_the_trainer_implements_every_command_target_method():
    from cliffguard.agent.command_target import CommandTarget
    from cliffguard.trainer.commands import TrainerCommands

    wanted = {n for n in vars(CommandTarget) if not n.startswith("_")}
    assert wanted == {"pause", "resume", "validate", "rollback", "set_lr_scale", "checkpoint_now", "stop", "restart"}
    assert all(callable(getattr(TrainerCommands, n, None)) for n in wanted)


def test_a_rollback_with_a_bad_lr_scale_is_rejected_and_nothing_is_restored(tmp_path):
    tr, sink, _ = make_trainer(small_config(tmp_path, steps=8))
    _train(tr, 5)
    digest, step = tr.param_digest(), tr.step
    out = _send(tr, CommandType.ROLLBACK, {"to_step": 2, "lr_scale": 0.0})
    assert out.status is AckStatus.REJECTED and "lr_scale" in out.detail
    assert (tr.param_digest(), tr.step, tr.agent.lr_scale.value) == (digest, step, 1.0)
    assert tr.agent.modes.mode is TrainerMode.RUNNING
    # the same rollback with a usable scale restores, sets the scale after the restore, and trains on
    out = _send(tr, CommandType.ROLLBACK, {"to_step": 2, "lr_scale": 0.5})
    assert out.status is AckStatus.APPLIED and "restored step 2 from memory" in out.detail
    assert tr.step == 2 and tr.agent.lr_scale.value == 0.5 and tr.agent.modes.mode is TrainerMode.RUNNING
    _train(tr, 1)
    replay = step_events(sink)[-1]
    assert replay.step == 2 and replay.data["lr_scale"] == 0.5  # the step event reads the one owner
    assert replay.data["lr"] == tr.schedule.lr_at(2) * 0.5
    acks = [e.data["status"] for e in sink.events if e.type is EventType.COMMAND_ACK]
    assert acks == ["rejected", "applied"]
    tr.ckpt.close()


def test_a_missing_step_fails_the_rollback_and_pauses(tmp_path):
    tr, _, _ = make_trainer(small_config(tmp_path, steps=8))
    _train(tr, 3)
    out = _send(tr, CommandType.ROLLBACK, {"to_step": 1, "lr_scale": 0.5})
    assert out.status is AckStatus.FAILED and "not available" in out.detail
    assert tr.agent.modes.mode is TrainerMode.PAUSED and tr.agent.lr_scale.value == 1.0 and tr.step == 3
    tr.ckpt.close()


def test_lr_scale_has_one_owner_and_round_trips_through_the_checkpointed_state(tmp_path):
    tr, _, _ = make_trainer(small_config(tmp_path, steps=8))
    assert _send(tr, CommandType.SET_LR_SCALE, {"lr_scale": 0.25}).status is AckStatus.APPLIED
    state = tr.capture_state()
    assert state["agent"]["lr_scale"] == {"value": 0.25} and "lr_scale" not in state  # saved once
    tr.agent.lr_scale.set(0.125)
    tr.load_state(state)
    assert tr.agent.lr_scale.value == 0.25
    other = LRScale()
    other.load_state_dict(tr.agent.state_dict()["lr_scale"])
    assert other.value == 0.25
    tr.ckpt.close()


def test_commands_after_a_stop_in_the_same_batch_are_rejected_and_the_run_ends(tmp_path):
    tr, sink, source = make_trainer(small_config(tmp_path, steps=40))
    stop = make_command(CommandType.STOP, "loop")
    rollback = make_command(CommandType.ROLLBACK, "loop", {"to_step": 2, "lr_scale": 0.5})
    resume = make_command(CommandType.RESUME, "loop")
    script = {4: [stop, rollback, resume]}
    source.on_poll = lambda src: src.queue.extend(script.pop(src.polls, []))
    assert tr.run() == 0
    acks = {e.data["cmd"]: e.data for e in sink.events if e.type is EventType.COMMAND_ACK}
    assert acks[stop.id]["status"] == "applied"
    assert acks[rollback.id]["status"] == acks[resume.id]["status"] == "rejected"
    assert "not allowed while stopping" in acks[rollback.id]["detail"]
    assert step_events(sink)[-1].step < 10 and tr.agent.lr_scale.value == 1.0
    assert any(e.type is EventType.RUN_FINISHED for e in sink.events)


def test_heartbeats_report_the_machines_mode(tmp_path):
    tr, sink, _ = make_trainer(small_config(tmp_path, steps=2))
    tr.agent.modes.move(TrainerMode.PAUSED)
    tr.agent.lifecycle.beat()
    tr.agent.modes.move(TrainerMode.RUNNING)
    with tr.agent.modes.validating():
        tr.agent.lifecycle.beat()
    states = [e.data["state"] for e in sink.events if e.type is EventType.HEARTBEAT]
    assert states == ["paused", "validating"]
    tr.ckpt.close()


def test_the_bundled_trainer_declares_every_command_in_run_started(tmp_path):
    trainer, sink, _ = make_trainer(small_config(tmp_path, steps=1))
    assert trainer.kit.capabilities == frozenset(CommandType)
    trainer.run()
    started = next(e for e in sink.events if e.type is EventType.RUN_STARTED)
    assert set(started.data["capabilities"]) == set(CommandType)
