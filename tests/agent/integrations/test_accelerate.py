"""Accelerate: the tracker is report-only (and says so in run.started); ``accelerate_kit`` acts.
Through the real broker and controller: a tracker run with a spike gets alerts and no command."""

from __future__ import annotations

import time

import pytest
import torch
from accelerate import Accelerator
from sqlalchemy import select

from cliffguard.agent.hooks import Agent, AgentConfig
from cliffguard.agent.integrations import AgentTracker, accelerate_kit
from cliffguard.agent.sinks import InMemorySink
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import AlertRow, CommandRow, RunRow
from cliffguard.core.enums import CommandType, EventType
from testing.controller_service import SECRET, FakeTrainer, Running, healthy_loss, store_engine, wait_for


def _model():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1)


def test_the_tracker_declares_no_command_and_takes_a_factory_for_the_agent_it_needs_the_accelerator_for():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sink = InMemorySink()
    built: list = []

    def make_agent() -> Agent:  # runs at init_trackers, when `accelerator` below exists
        built.append(accelerator.device)
        return Agent(accelerator, model, opt, AgentConfig(run="trk", heartbeat_s=60, calibration_s=0.05), sink=sink)

    accelerator = Accelerator(cpu=True, log_with=[AgentTracker(make_agent)])
    assert built == []
    accelerator.init_trackers("proj", config={"lr": 0.1})
    accelerator.log({"loss": 2.0}, step=0)
    accelerator.end_training()
    started = sink.events[0]
    assert started.type is EventType.RUN_STARTED and started.data["capabilities"] == []
    assert built == [torch.device("cpu")] and [e.type for e in sink.events].count(EventType.STEP) == 1


@pytest.mark.broker
def test_accelerate_kit_is_one_line_and_declares_what_the_kit_applies(kafka_cfg):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    accelerator = Accelerator(cpu=True)
    model, opt = accelerator.prepare(model, opt)
    kit = accelerate_kit(accelerator, model, opt, run="acc-kit", loss_fn=lambda b: model(b[0]).pow(2).mean(),
                         kafka=kafka_cfg, secret=SECRET)
    try:
        assert CommandType.ROLLBACK in kit.capabilities and CommandType.VALIDATE in kit.capabilities
        assert kit.agent.rank == accelerator.process_index and kit.agent.commands is not None
    finally:
        kit.agent.close()
    with pytest.raises(ValueError, match="run: name the run"):
        accelerate_kit(accelerator, model, opt, kafka=kafka_cfg)


@pytest.mark.broker
def test_a_tracker_run_with_a_spike_gets_alerts_and_no_command(kafka_cfg, tmp_path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with store_engine("sqlite", tmp_path) as (engine, _):
        with Running(kafka_cfg, engine, group="ctl-tracker"):
            agent = Agent(None, model, opt, AgentConfig(run="tracked", heartbeat_s=60, calibration_s=0.05),
                          kafka=kafka_cfg, secret=SECRET)
            accelerator = Accelerator(cpu=True, log_with=[AgentTracker(agent)])
            accelerator.init_trackers("proj")
            for step in range(60):
                accelerator.log({"loss": 20.0 if 45 <= step < 48 else healthy_loss(step)}, step=step)
                time.sleep(0.002)

            def alerted() -> bool:
                with session_scope(engine) as s:
                    return bool(s.scalars(select(AlertRow).where(AlertRow.run_id == "tracked",
                                                              AlertRow.level == "critical")).all())

            wait_for(alerted)
            time.sleep(1.0)  # a pause would be on its way by now
            accelerator.end_training()
            probe = FakeTrainer(kafka_cfg)
            try:
                probe.quiet(1.0)
                assert probe.types("tracked") == []  # nothing on the commands topic for this run
            finally:
                probe.close()
        with session_scope(engine) as s:
            assert s.scalars(select(CommandRow).where(CommandRow.run_id == "tracked")).all() == []
            run = s.get(RunRow, "tracked")
            assert run.capabilities == [] and run.recovery_state == "running"
