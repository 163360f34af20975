"""The recovery kit on a plain loop (world 1, CPU, in-memory sink and command source): the guard
enforced through the optimizer, the LR scale applied and reported, rollback from the memory ring
with the data position, validation on held-back batches, the hold and controller-silence timeouts."""

from __future__ import annotations

import logging
import time

import pytest
import torch

from cliffguard.agent.command_target import CommandTarget
from cliffguard.agent.config import AgentConfig
from cliffguard.agent.guard import GuardConfig
from cliffguard.agent.hooks import Agent
from cliffguard.agent.modes import TrainerMode
from cliffguard.agent.recovery import KitConfig, MemoryRing, RecoveryKit
from cliffguard.agent.sinks import InMemorySink
from cliffguard.core.enums import CommandType, EventType
from cliffguard.core.events import make_command
from cliffguard.core.spike import SpikeConfig


class Commands:
    def __init__(self) -> None:
        self.queue: list = []
        self.script: dict[int, list] = {}
        self.polls = 0

    def poll(self):
        self.polls += 1
        self.queue.extend(self.script.pop(self.polls, []))
        out, self.queue = self.queue, []
        return out

    def close(self) -> None:
        pass


class RecordingSGD(torch.optim.SGD):
    """SGD that records the LR each update ran with."""

    seen: list[float]

    def step(self, closure=None):
        self.seen = [*getattr(self, "seen", []), self.param_groups[0]["lr"]]
        return super().step(closure)


class Cursor:
    """A loader position: the index of the next batch."""

    def __init__(self) -> None:
        self.i = 0

    def get(self) -> int:
        return self.i

    def seek(self, position: int) -> None:
        self.i = position


def _setup(*, recovery: KitConfig | None = None, guard: GuardConfig | None = None, rewind: bool = True):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = RecordingSGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    cfg = AgentConfig(run="kit", hist_every=0, heartbeat_s=60, calibration_s=0.05, command_tick_s=0.01,
                      guard=guard or GuardConfig(spike=SpikeConfig(window=16, min_history=6)),
                      recovery=recovery or KitConfig(snapshot_every=2, ring_size=4, pause_timeout_s=0))
    sink, source = InMemorySink(), Commands()
    agent = Agent(None, model, opt, cfg, sink=sink, command_source=source)
    cursor = Cursor()
    kit = RecoveryKit(agent, model, opt, sched, data_position=cursor if rewind else None,
                      loss_fn=lambda b: torch.nn.functional.mse_loss(model(b[0]), b[1]))
    return model, opt, sched, agent, kit, sink, source, cursor


def _batch(i: int, spike: bool = False):
    g = torch.Generator().manual_seed(i)
    x = torch.randn(8, 4, generator=g)
    y = x.sum(dim=1, keepdim=True)
    return (x, y * 1000) if spike else (x, y)


def _run(model, opt, sched, agent, kit, cursor, until: int, spikes: set[int] | None = None):
    spikes = spikes if spikes is not None else set()
    applied = []
    while agent.step < until and kit.at_boundary():
        x, y = _batch(cursor.i, spike=cursor.i in spikes)
        spikes.discard(cursor.i)  # a bad batch once: replayed after a rollback it is clean
        cursor.i += 1
        kit.remember((x, y))
        loss = torch.nn.functional.mse_loss(model(x), y)
        agent.after_forward(loss)
        loss.backward()
        agent.after_backward()
        before = model.weight.detach().clone()
        kit.before_optimizer_step()
        opt.step()  # unconditionally, as the HF Trainer does: the kit's wrapper obeys the guard
        applied.append(not torch.equal(before, model.weight))
        opt.zero_grad()
        sched.step()
        agent.after_step()
    return applied


def _acks(sink):
    return {e.data["cmd"]: e.data for e in sink.events if e.type is EventType.COMMAND_ACK}


def test_the_kit_is_a_command_target_and_declares_what_it_can_apply():
    *_, agent, kit, _sink, _src, _cur = _setup()
    assert {n for n in vars(CommandTarget) if not n.startswith("_")} <= set(dir(kit))
    assert kit.capabilities == frozenset(CommandType)
    bare = RecoveryKit(agent, config=KitConfig(snapshot_every=0))
    assert CommandType.ROLLBACK not in bare.capabilities and CommandType.VALIDATE not in bare.capabilities


def test_a_spike_is_skipped_by_the_optimizer_itself_and_reported_skipped():
    model, opt, sched, agent, kit, sink, _src, cursor = _setup()
    applied = _run(model, opt, sched, agent, kit, cursor, until=12, spikes={9})
    steps = [e for e in sink.events if e.type is EventType.STEP]
    assert applied[9] is False and all(applied[i] for i in range(12) if i != 9)
    assert steps[9].data["skipped"] is True and steps[9].data["guard"] == "skip"
    assert len(kit.kept) == 4 and all(float(y.abs().max()) < 100 for _x, y in kit.kept)  # never the bad batch


def test_set_lr_scale_is_applied_inside_the_step_and_the_scheduler_lr_is_kept():
    model, opt, sched, agent, kit, sink, source, cursor = _setup()
    _run(model, opt, sched, agent, kit, cursor, until=3)
    source.queue.append(make_command(CommandType.SET_LR_SCALE, "kit", {"lr_scale": 0.25}))
    _run(model, opt, sched, agent, kit, cursor, until=6)
    # the command rode step 3's all-reduce, so steps 4 and 5 ran scaled; the group LR is put back
    assert opt.seen == [0.05] * 4 + [0.0125] * 2
    assert kit.lr_scale_applied == 0.25 and opt.param_groups[0]["lr"] == 0.05
    assert [e.data["lr_scale"] for e in sink.events if e.type is EventType.STEP][-1] == 0.25


def test_rollback_restores_the_ring_state_and_data_position_then_applies_the_lr_scale():
    model, opt, sched, agent, kit, sink, source, cursor = _setup()
    _run(model, opt, sched, agent, kit, cursor, until=4)
    w4 = model.weight.detach().clone()
    _run(model, opt, sched, agent, kit, cursor, until=7)
    assert kit.available_steps() == [0, 2, 4, 6]
    cmd = make_command(CommandType.ROLLBACK, "kit", {"to_step": 4, "lr_scale": 0.5})
    source.queue.append(cmd)
    _run(model, opt, sched, agent, kit, cursor, until=8)  # the command rides step 7's all-reduce
    boundary = kit.at_boundary()
    assert boundary and boundary.step == 4 and boundary.rolled_back and boundary.moved_from == 8
    ack = _acks(sink)[cmd.id]
    assert ack["status"] == "applied" and "restored step 4 from memory" in ack["detail"]
    assert agent.step == 4 and cursor.i == 4 and kit.available_steps() == [0, 2, 4]
    assert agent.lr_scale.value == 0.5
    _run(model, opt, sched, agent, kit, cursor, until=5)
    assert kit.lr_scale_applied == 0.5
    steps = [e.step for e in sink.events if e.type is EventType.STEP]
    assert steps[-2:] == [7, 4]
    assert not torch.equal(w4, model.weight)  # trained on from the restored weights


def test_validation_runs_on_held_back_batches_and_without_data_fails_without_crashing():
    model, opt, sched, agent, kit, sink, source, cursor = _setup()
    bare = RecoveryKit(agent, model, opt, loss_fn=lambda b: model(b[0]).sum())
    with pytest.raises(RuntimeError, match="no validation data"):
        bare.run_validation()
    _run(model, opt, sched, agent, kit, cursor, until=5)
    cmd = make_command(CommandType.VALIDATE, "kit", {"batches": 2})
    source.queue.append(cmd)
    _run(model, opt, sched, agent, kit, cursor, until=7)
    val = [e for e in sink.events if e.type is EventType.VALIDATION]
    assert val and val[-1].data["cmd"] == cmd.id and val[-1].data["batches"] == 2
    assert _acks(sink)[cmd.id]["status"] == "applied"


def test_a_validate_with_no_data_is_acked_failed_and_training_goes_on():
    model, opt, sched, agent, _kit, sink, source, cursor = _setup()
    kit = RecoveryKit(agent, model, opt, sched, data_position=cursor, loss_fn=lambda b: model(b[0]).sum(),
                      config=KitConfig(val_keep=2, snapshot_every=2))
    cmd = make_command(CommandType.VALIDATE, "kit")
    source.queue.append(cmd)
    _run(model, opt, sched, agent, kit, cursor, until=3)  # nothing remembered before step 1's boundary
    kit.kept.clear()
    source.queue.append(cmd2 := make_command(CommandType.VALIDATE, "kit"))
    agent.after_forward(torch.tensor(1.0))
    agent.before_optimizer_step()
    kit.kept.clear()
    boundary = kit.at_boundary()
    assert boundary and not boundary.rolled_back and boundary.step == agent.step
    assert _acks(sink)[cmd2.id]["status"] == "failed" and "no validation data" in _acks(sink)[cmd2.id]["detail"]
    assert agent.modes.mode is TrainerMode.RUNNING


def test_a_guard_hold_times_out_with_a_log_line_outside_the_bundled_trainer(caplog):
    guard = GuardConfig(spike=SpikeConfig(window=16, min_history=6), hold_after=2, hold_timeout_s=0.1,
                        on_timeout="rollback")
    model, opt, sched, agent, kit, sink, _src, cursor = _setup(guard=guard)
    with caplog.at_level(logging.ERROR, logger="cliffguard.agent.recovery.timeouts"):
        _run(model, opt, sched, agent, kit, cursor, until=12, spikes={9, 10})
    assert any("held by the guard" in r.getMessage() and "'rollback'" in r.getMessage() for r in caplog.records)
    assert agent.lr_scale.value == 0.5 and agent.modes.mode is TrainerMode.RUNNING
    steps = [e.step for e in sink.events if e.type is EventType.STEP]
    assert steps[:11] == list(range(11)) and steps[11] == 8  # rolled back to the snapshot before the spike
    # ... and said so: the controller records who changed the LR scale, and why
    (ev,) = [e for e in sink.events if e.type is EventType.TRAINER_TIMEOUT]
    assert ev.step == 8 and ev.data["at_step"] == 11 and ev.data["first_bad_step"] == 9
    assert (ev.data["wait"], ev.data["policy"], ev.data["applied"], ev.data["to_step"]) == ("hold", "rollback", True, 8)
    assert (ev.data["lr_scale_before"], ev.data["lr_scale"], ev.data["waited_s"]) == (1.0, 0.5, 0.1)
    assert "restored step 8" in ev.data["detail"]


def test_a_silent_controller_pause_times_out_to_its_policy(caplog):
    model, opt, sched, agent, kit, sink, source, cursor = _setup(
        recovery=KitConfig(snapshot_every=2, pause_timeout_s=0.15, on_pause_timeout="stop"))
    pause = make_command(CommandType.PAUSE, "kit")
    source.script[3] = [pause]
    t0 = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="cliffguard.agent.recovery.timeouts"):
        _run(model, opt, sched, agent, kit, cursor, until=20)
    assert time.monotonic() - t0 < 5
    assert any("fell silent" in r.getMessage() and "'stop'" in r.getMessage() for r in caplog.records)
    assert kit.stop_reason.startswith("failed: pause timed out") and agent.modes.mode is TrainerMode.STOPPING
    assert _acks(sink)[pause.id]["status"] == "applied" and agent.step == 3
    (ev,) = [e.data for e in sink.events if e.type is EventType.TRAINER_TIMEOUT]
    assert (ev["wait"], ev["policy"], ev["applied"], ev["lr_scale"]) == ("pause", "stop", True, 1.0)
    assert "to_step" not in ev and "stopping" in ev["detail"]


def test_a_command_restarts_the_silence_clock():
    model, opt, sched, agent, kit, sink, source, cursor = _setup(
        recovery=KitConfig(snapshot_every=2, pause_timeout_s=0.3, on_pause_timeout="stop"))
    source.script[2] = [make_command(CommandType.PAUSE, "kit")]
    for n in range(3, 9):  # one command every ~0.2 s (polls tick every 0.01 s) keeps the pause alive
        source.script[2 + 10 * (n - 2)] = [make_command(CommandType.PAUSE, "kit")]
    source.script[2 + 10 * 7] = [resume := make_command(CommandType.RESUME, "kit")]
    _run(model, opt, sched, agent, kit, cursor, until=4)
    assert _acks(sink)[resume.id]["status"] == "applied" and not kit.stop_reason and agent.step == 4


def test_memory_ring_evicts_the_oldest_and_hands_out_independent_copies():
    ring = MemoryRing(2)
    t = torch.zeros(3)
    for step in (0, 2, 4):
        t += 1
        ring.snapshot(step, {"w": t})
    assert ring.steps() == [2, 4]
    got = ring.get(4)
    got["w"] += 100
    assert ring.get(4)["w"].tolist() == [3.0, 3.0, 3.0]
    assert ring.restore(2)["w"].tolist() == [2.0, 2.0, 2.0] and ring.steps() == [2]
    with pytest.raises(KeyError):
        ring.restore(4)


def test_a_loop_with_its_own_counter_takes_the_step_from_the_boundary_through_a_rollback():
    """nanoGPT's shape: ``iter_num`` drives the LR and the end; after a rollback it must be the
    restored step, or the loop goes on at the old step with the restored weights."""
    model, opt, sched, agent, kit, sink, source, cursor = _setup()
    rollback = make_command(CommandType.ROLLBACK, "kit", {"to_step": 4, "lr_scale": 0.5})
    iter_num, seen, moves = 0, [], []
    while True:
        boundary = kit.at_boundary()
        if not boundary:
            break
        if boundary.rolled_back:
            moves.append((iter_num, boundary.step))
        iter_num = boundary.step
        if iter_num >= 10:
            break
        for group in opt.param_groups:
            group["lr"] = 0.01 * (iter_num + 1)  # the loop's own schedule, by its own counter
        x, y = _batch(iter_num)
        loss = torch.nn.functional.mse_loss(model(x), y)
        agent.after_forward(loss)
        loss.backward()
        agent.after_backward()
        kit.before_optimizer_step()
        opt.step()
        opt.zero_grad()
        seen.append((iter_num, agent.step, opt.seen[-1]))
        agent.after_step()
        iter_num += 1
        if iter_num == 7 and not moves:
            source.queue.append(rollback)  # applied at one of the next boundaries
    assert _acks(sink)[rollback.id]["status"] == "applied"
    assert len(moves) == 1 and moves[0][1] == 4 and moves[0][0] > 4  # rolled back from where it was, to 4
    assert all(own == kit_step for own, kit_step, _lr in seen)
    replay_at = max(i for i, (s, _, _) in enumerate(seen) if s == 4)
    after = seen[replay_at:]  # the replay from step 4
    assert [s for s, _, _ in after] == list(range(4, 10))
    assert all(lr == pytest.approx(0.01 * (s + 1) * 0.5) for s, _, lr in after)  # its schedule at the restored step, halved
    steps = [e.step for e in sink.events if e.type is EventType.STEP]
    assert steps[-6:] == list(range(4, 10))
