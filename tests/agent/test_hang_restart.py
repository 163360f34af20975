"""The restart command (agent/hang/part.py, agent/hang/restart.py): on rank 0's listener thread
while the training thread is stalled, at the boundary on every rank otherwise; a halted job's
workers refuse to train."""

from __future__ import annotations

import threading

import pytest
import torch

from cliffguard.agent.config import AgentConfig
from cliffguard.agent.hang.config import HangConfig
from cliffguard.agent.hang.part import HangPart, NotThisLife, RestartRequested
from cliffguard.agent.hang.watchdog import Watchdog
from cliffguard.agent.hooks import Agent
from cliffguard.agent.modes import ModeMachine
from cliffguard.agent.ranks import Ranks
from cliffguard.agent.recovery import KitConfig, RecoveryKit
from cliffguard.agent.sinks import InMemorySink
from cliffguard.core.enums import AckStatus, CommandType, EventType
from cliffguard.core.events import make_command
from cliffguard.core.restart_plan import RESTART_EXIT_CODE, RestartPlan, WorkerLife, read_plan, write_plan
from testing.controller_service import wait_for
from tests.agent.test_recovery_kit import Commands


def restart(mode: str = "in_place", life: int = 1, **args):
    return make_command(CommandType.RESTART, "kit", {"mode": mode, "life": life, "ranks": [3], "reason": "rank 3 hung",
                                                    "incident": "inc-1", **args}, ttl_s=60)


class Part:
    """A rank-0 HangPart whose leaving is recorded instead of exiting the test process."""

    def __init__(self, tmp_path, life: int = 1) -> None:
        self.acks: list = []
        self.left = threading.Event()
        self.exit_code: int | None = None
        self.flushed = False
        ranks = Ranks(0, 4, torch.device("cpu"), False)
        self.part = HangPart(HangConfig(plan_grace_s=0), "kit", ranks, emitter=None, modes=ModeMachine(),  # type: ignore[arg-type]
                             step=lambda: 27, base_dir=tmp_path,
                             life=WorkerLife(job="job-1", life=life, max_restarts=3, node="a", nodes=1, min_nodes=1),
                             exit=self._exit)
        self.part.ack = lambda cmd, status, detail: self.acks.append((cmd.id, status, detail))
        self.part.flush = self._flush

    def _exit(self, code: int) -> None:
        self.exit_code = code
        self.left.set()

    def _flush(self) -> None:
        self.flushed = True

    def stall(self) -> None:
        dog = Watchdog(HangConfig(), step=lambda: 27, mode=lambda: self.part.modes.mode, collective=lambda: "",
                       report=lambda ev: None, node="a", life=1)
        dog.reported = True
        self.part.watchdog = dog


def test_a_restart_while_stalled_is_applied_on_the_listeners_thread_and_rank_0_leaves(tmp_path):
    p = Part(tmp_path)
    cmd = restart()
    assert not p.part.urgent(cmd)  # not stalled: the boundary applies it with every rank
    p.stall()
    assert not p.part.urgent(make_command(CommandType.PAUSE, "kit", {}, ttl_s=60))
    assert p.part.urgent(cmd)
    assert p.left.wait(10) and p.exit_code == RESTART_EXIT_CODE and p.flushed
    plan = read_plan(tmp_path)
    assert (plan.mode, plan.life, plan.job, plan.ranks, plan.incident, plan.cmd) == ("in_place", 1, "job-1", (3,),
                                                                                     "inc-1", cmd.id)
    ((cid, status, detail),) = p.acks
    assert cid == cmd.id and status is AckStatus.APPLIED and "rank 0 leaves" in detail


def test_an_earlier_lifes_restart_is_acked_and_nothing_happens(tmp_path):
    p = Part(tmp_path, life=2)
    p.stall()
    assert p.part.urgent(restart(life=1))
    wait_for(lambda: p.acks)
    assert p.acks and p.acks[0][1] is AckStatus.APPLIED and "restarted already" in p.acks[0][2]
    assert p.exit_code is None and read_plan(tmp_path) is None


def test_plan_for_checks_the_arguments_against_this_life(tmp_path):
    part = Part(tmp_path, life=1).part
    with pytest.raises(NotThisLife):
        part.plan_for(restart(life=0))
    with pytest.raises(ValueError, match="ahead"):
        part.plan_for(restart(life=2))
    with pytest.raises(ValueError, match="mode"):
        part.plan_for(make_command(CommandType.RESTART, "kit", {"mode": "reboot", "life": 1}, ttl_s=60))
    with pytest.raises(ValueError, match="exclude_nodes"):
        part.plan_for(make_command(CommandType.RESTART, "kit", {"mode": "exclude", "life": 1}, ttl_s=60))
    assert part.plan_for(restart("exclude", exclude_nodes=["b"])).exclude_nodes == ("b",)


def test_a_halt_plan_of_this_job_is_found_and_another_jobs_is_not(tmp_path):
    part = Part(tmp_path).part
    assert part.halted() is None
    write_plan(tmp_path, RestartPlan(mode="halt", life=0, job="job-1", reason="budget spent"))
    assert part.halted().reason == "budget spent"
    write_plan(tmp_path, RestartPlan(mode="halt", life=0, job="job-0"))
    assert part.halted() is None  # an earlier launch's
    write_plan(tmp_path, RestartPlan(mode="in_place", life=0, job="job-1"))
    assert part.halted() is None


def _kit(tmp_path):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    cfg = AgentConfig(run="kit", hist_every=0, heartbeat_s=60, calibration_s=0.05, command_tick_s=0.01,
                      hang=HangConfig(plan_dir=str(tmp_path)), recovery=KitConfig(snapshot_every=0, pause_timeout_s=0))
    sink, source = InMemorySink(), Commands()
    agent = Agent(None, model, opt, cfg, sink=sink, command_source=source)
    kit = RecoveryKit(agent, model, opt, loss_fn=lambda b: torch.nn.functional.mse_loss(model(b[0]), b[1]))
    return model, agent, kit, sink, source


def _step(model, agent, kit) -> None:
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    loss = torch.nn.functional.mse_loss(model(x), y)
    agent.after_forward(loss, tokens=8)
    loss.backward()
    agent.after_backward()
    if kit.before_optimizer_step():
        kit.optimizer.step()
    kit.optimizer.zero_grad()
    agent.after_step()


def test_a_restart_at_the_boundary_is_acked_then_every_rank_leaves_for_torchrun(tmp_path):
    model, agent, kit, sink, source = _kit(tmp_path)
    kit.start()
    assert CommandType.RESTART in kit.capabilities
    _step(model, agent, kit)
    cmd = restart(life=0)
    source.queue.append(cmd)
    _step(model, agent, kit)  # the flag rides on this step's all-reduce
    with pytest.raises(RestartRequested) as exc:
        kit.at_boundary()
    assert exc.value.code == RESTART_EXIT_CODE and exc.value.plan.mode == "in_place"
    assert read_plan(tmp_path).cmd == cmd.id
    acks = [e for e in sink.events if e.type is EventType.COMMAND_ACK]
    assert [(a.data["cmd"], a.data["status"]) for a in acks] == [(cmd.id, "applied")]
    failed = [e for e in sink.events if e.type is EventType.RUN_FAILED]
    assert len(failed) == 1 and "restart in_place of life 0" in failed[0].data["error"] and agent.closed


def test_an_earlier_lifes_restart_at_the_boundary_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    model, agent, kit, sink, source = _kit(tmp_path)
    kit.start()
    _step(model, agent, kit)
    source.queue.append(restart(life=0))
    _step(model, agent, kit)
    assert kit.at_boundary().go_on
    (ack,) = [e for e in sink.events if e.type is EventType.COMMAND_ACK]
    assert ack.data["status"] == "applied" and "restarted already" in ack.data["detail"]
    assert read_plan(tmp_path) is None and not agent.closed
    agent.close()


def test_a_worker_of_a_halted_job_does_not_start(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-9")
    write_plan(tmp_path, RestartPlan(mode="halt", life=2, job="job-9", incident="inc-7", reason="hung 3 times"))
    model, agent, kit, sink, source = _kit(tmp_path)
    with pytest.raises(SystemExit, match="halted for a human by incident inc-7"):
        kit.start()
    assert not [e for e in sink.events if e.type is EventType.RUN_STARTED]
    agent.close()


def test_a_stop_signal_to_a_rank_whose_stall_was_reported_flushes_then_leaves_with_the_signals_code(tmp_path):
    """torchrun's SIGTERM to a hung group: the rank that reported its stall leaves now (not at the
    SIGKILL 30 s later), its events out first (before, a rank that left unflushed lost its evidence
    and its peers named it dead); the preemption watch routes the signal there only once reported."""
    import signal

    from cliffguard.agent.recovery.preemption import PreemptionConfig, PreemptionWatch

    p = Part(tmp_path)
    watch = PreemptionWatch(PreemptionConfig(), stalled=lambda: p.part.stall_reported,
                            on_stalled=p.part.leave_on_signal)
    watch._on_signal(signal.SIGTERM, None)  # training, not stalled: a preemption request, nobody leaves
    assert watch.requested and not p.left.is_set()
    p.stall()
    watch = PreemptionWatch(PreemptionConfig(), stalled=lambda: p.part.stall_reported,
                            on_stalled=p.part.leave_on_signal)
    watch._on_signal(signal.SIGTERM, None)
    assert p.left.wait(10) and p.flushed and p.exit_code == 128 + signal.SIGTERM
    assert not watch.requested  # no save is pretended
