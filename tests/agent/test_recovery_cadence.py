"""The kit's validations: the global RNGs untouched by them, the periodic cadence measured and
turned off when it costs more than ``val_max_share`` of training, the cost in ``run.finished``,
and a rollback's ack saying exactly what came back (world 1, CPU, in-memory sink)."""

from __future__ import annotations

import logging
import random
import time

import numpy as np
import pytest
import torch

from cliffguard.agent.config import AgentConfig
from cliffguard.agent.hooks import Agent
from cliffguard.agent.recovery import KitConfig, RecoveryKit
from cliffguard.agent.recovery.cadence import ValidationCadence, describe
from cliffguard.agent.recovery.restored import NO_DATA_POSITION, REPLAYED, describe_restored
from cliffguard.agent.sinks import InMemorySink
from cliffguard.core.enums import CommandType, EventType
from cliffguard.core.events import make_command


class Commands:
    def __init__(self) -> None:
        self.queue: list = []

    def poll(self):
        out, self.queue = self.queue, []
        return out

    def close(self) -> None:
        pass


class Cursor:
    def __init__(self) -> None:
        self.i = 0

    def get(self) -> int:
        return self.i

    def seek(self, position: int) -> None:
        self.i = position


def _kit(recovery: KitConfig, *, validate_fn=None, cursor: Cursor | None = None):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    cfg = AgentConfig(
        run="cadence",
        hist_every=0,
        heartbeat_s=60,
        calibration_s=0.05,
        command_tick_s=0.01,
        recovery=recovery,
    )
    sink, source = InMemorySink(), Commands()
    agent = Agent(None, model, opt, cfg, sink=sink, command_source=source)
    kit = RecoveryKit(
        agent,
        model,
        opt,
        sched,
        validate_fn=validate_fn,
        data_position=cursor,
        loss_fn=lambda b: torch.nn.functional.mse_loss(model(b[0]), b[1]),
    )
    return model, opt, sched, agent, kit, sink, source


def _train(model, opt, sched, agent, kit, until: int, step_s: float = 0.0) -> None:
    while agent.step < until and kit.at_boundary():
        g = torch.Generator().manual_seed(agent.step)
        x = torch.randn(8, 4, generator=g)
        kit.remember((x, x.sum(dim=1, keepdim=True)))
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        agent.after_forward(loss)
        loss.backward()
        agent.after_backward()
        kit.before_optimizer_step()
        opt.step()
        opt.zero_grad()
        sched.step()
        if step_s:
            time.sleep(step_s)  # what a real step costs (the cadence's yardstick), not a synchronisation
        agent.after_step()


def _rng_now() -> tuple:
    return torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()


def _same_rng(a: tuple, b: tuple) -> bool:
    return torch.equal(a[0], b[0]) and a[1] == b[1] and np.array_equal(a[2], b[2])


def test_a_validation_leaves_every_global_rng_as_it_found_it():
    def greedy(batches):  # a validation that draws from every stream, as a DataLoader and dropout do
        torch.rand(3), random.random(), np.random.rand()
        return 1.0, 1

    *_, kit, _sink, _src = _kit(KitConfig(val_every=0), validate_fn=greedy)
    before = _rng_now()
    assert kit.run_validation() == 1.0
    assert _same_rng(before, _rng_now())


def test_the_mfu_calibration_draws_from_a_generator_of_its_own():
    from cliffguard.agent.collectors.mfu import calibrate_peak

    torch.manual_seed(3)
    before = torch.get_rng_state()
    assert calibrate_peak(torch.device("cpu"), size=32, seconds=0.01) > 0
    assert torch.equal(before, torch.get_rng_state())


def test_a_cheap_periodic_validation_keeps_its_cadence_and_its_cost_reaches_run_finished():
    model, opt, sched, agent, kit, sink, _src = _kit(
        KitConfig(val_every=5, val_max_share=0.5, snapshot_every=0)
    )
    _train(model, opt, sched, agent, kit, until=16, step_s=0.02)
    agent.close(final_loss=1.0)
    periodic = [e for e in sink.events if e.type is EventType.VALIDATION]
    assert [e.step for e in periodic] == [5, 10, 15] and not kit.cadence.off
    (finished,) = [e for e in sink.events if e.type is EventType.RUN_FINISHED]
    v = finished.data["validation"]
    assert (v["every"], v["periodic"], v["on_command"], v["off"]) == (5, 3, 0, "")
    assert v["train_s"] >= 15 * 0.02 and 0 <= v["share"] < 0.5 and v["periodic_s"] >= 0
    assert describe(v).startswith("validation every 5 steps; 3 periodic")


def test_a_validation_over_its_share_of_training_turns_the_cadence_off_loudly(caplog):
    def slow(batches):
        time.sleep(0.3)  # a whole evaluate() on a large eval set, against ~ms steps
        return 1.0, 1

    model, opt, sched, agent, kit, sink, source = _kit(
        KitConfig(val_every=5, val_max_share=0.1, snapshot_every=0), validate_fn=slow
    )
    with caplog.at_level(logging.WARNING, logger="cliffguard.agent.recovery.kit"):
        _train(model, opt, sched, agent, kit, until=12)
    assert [e.step for e in sink.events if e.type is EventType.VALIDATION] == [5]  # the measurement only
    (warning,) = [r.getMessage() for r in caplog.records if "periodic validation is off" in r.getMessage()]
    assert (
        "from step 5" in warning and "val_max_share = 0.1" in warning and "validations on command" in warning
    )
    source.queue.append(cmd := make_command(CommandType.VALIDATE, "cadence"))
    _train(model, opt, sched, agent, kit, until=14)  # a command still validates
    assert kit.at_boundary()  # a truthy Boundary: training goes on
    val = [e for e in sink.events if e.type is EventType.VALIDATION]
    assert val[-1].data["cmd"] == cmd.id
    summary = kit.cadence.summary()
    assert summary["periodic"] == 1 and summary["on_command"] == 1 and "val_max_share" in summary["off"]
    assert describe(summary).startswith("validation turned off: a validation took")


def test_no_limit_keeps_even_a_costly_cadence():
    cadence = ValidationCadence(every=10, max_share=0.0)
    cadence.leave(0.0)
    cadence.enter(1.0)
    assert cadence.due(10) and cadence.over_budget(10, seconds=5.0) == ""
    assert not ValidationCadence(every=0, max_share=0.1).due(10)


def test_the_share_is_measured_against_the_loops_own_time_since_the_last_periodic_validation():
    cadence = ValidationCadence(every=10, max_share=0.2)
    cadence.leave(0.0)
    cadence.enter(10.0)  # 10 s of training
    cadence.leave(10.5)  # 0.5 s at a boundary (a pause, a snapshot): not training
    cadence.enter(20.5)
    assert cadence.train_s == pytest.approx(20.0)
    assert cadence.over_budget(10, seconds=3.0) == ""  # 15 %
    cadence.leave(24.0)
    cadence.enter(34.0)  # 10 s more
    assert "30%" in cadence.over_budget(20, seconds=3.0)  # against those 10 s, not the 30 s in all


def test_the_rollback_ack_names_what_came_back():
    cursor = Cursor()
    model, opt, sched, agent, kit, sink, source = _kit(
        KitConfig(val_every=0, snapshot_every=2), cursor=cursor
    )
    _train(model, opt, sched, agent, kit, until=5)
    source.queue.append(cmd := make_command(CommandType.ROLLBACK, "cadence", {"to_step": 2, "lr_scale": 0.5}))
    _train(model, opt, sched, agent, kit, until=6)  # the command rides step 5's all-reduce
    assert kit.at_boundary()  # a truthy Boundary: training goes on
    (ack,) = [e.data for e in sink.events if e.type is EventType.COMMAND_ACK and e.data["cmd"] == cmd.id]
    assert ack["detail"].startswith(
        "restored step 2 from memory: weights, optimizer, scheduler, guard window, "
        "RNG (torch, python, numpy), data position; lr_scale=0.5"
    )


def test_without_a_data_position_the_ack_says_the_rng_came_back_and_the_position_did_not():
    state = {
        "step": 4,
        "model": {},
        "optimizer": {},
        "rng": {"torch": 0, "python": 0},
        "agent": {},
        "extra": {},
    }
    text = describe_restored(state)
    assert text == f"weights, optimizer, guard window, RNG (torch, python); {NO_DATA_POSITION}{REPLAYED}"
    assert "replays the same ones" in text
    # the bundled trainer's state: the sampler is its data position; a scaler that is None is absent
    bundled = {
        "model": {},
        "optimizer": {},
        "scheduler": {},
        "sampler": {},
        "rng": {"torch": 0},
        "agent": {},
        "loss_scaler": None,
        "elastic": {},
        "config": {},
    }
    assert describe_restored(bundled) == (
        "weights, optimizer, scheduler, guard window, RNG (torch), "
        "data position (sampler), elastic batch plan"
    )
    # a Hugging Face checkpoint-N without its rng file: the RNG is not claimed
    assert describe_restored({"model": {}, "optimizer": {}, "scheduler": {}}) == (
        f"weights, optimizer, scheduler; {NO_DATA_POSITION}"
    )
