"""The recovery machine's hang moves (controller/recovery_hang.py): every one of the table's hang
transitions taken, with its guard terms and actions."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from cliffguard.controller.recovery_hang_types import NodeCheckIn
from cliffguard.controller.recovery_state import RecoveryState
from cliffguard.controller.recovery_table import GUARDS, TRANSITIONS
from cliffguard.controller.recovery_types import (
    Alert,
    CheckpointIn,
    CloseIncident,
    OpenIncident,
    Phase,
    ProgressIn,
    RecordTransition,
    RecoveryConfig,
    RunEndedIn,
    SendCommand,
    StartedIn,
    TickIn,
    VerdictIn,
)
from cliffguard.controller.verdict import Action, Verdict
from cliffguard.core.enums import CommandType, Level
from tests.controller.test_recovery import HANG_MOVES, Driver, _drive_to_endable

CFG = RecoveryConfig(restart_budget=3, restart_window_s=3600, repeat_window_s=600, restart_timeout_s=120)
P = Phase


def started(d: Driver, life: int = 0, *, max_restarts: int = 3, nodes: int = 1, min_nodes: int = 1,
            caps: tuple[CommandType, ...] = tuple(CommandType)):
    return d.feed(StartedIn(capabilities=caps, now=d.now, life=life, max_restarts=max_restarts,
                            restarts_left=max(max_restarts - life, 0), nodes=nodes, min_nodes=min_nodes))


def hang(d: Driver, culprit: int = 3, node: str = "b", life: int = 0, step: int = 27):
    v = Verdict(rule="hang", level=Level.CRITICAL, step=step, rank=culprit, onset_step=step, action=Action.RESTART,
                message=f"rank {culprit} never entered collective #60",
                evidence={"cause": "hang", "culprit": [culprit], "nodes": [node], "life": life, "kind": "outside_collective",
                          "frame": "faults.py:1 in hang", "table": [], "first_report_ts": d.now - 1})
    return d.feed(VerdictIn(verdict=v, now=d.now))


def check(d: Driver, ok: bool, life: int = 1, slow: tuple[int, ...] = (3,), nodes: tuple[str, ...] = ("b",)):
    return d.feed(NodeCheckIn(ok=ok, life=life, slow=() if ok else slow, slow_nodes=() if ok else nodes,
                              detail="matmul rank 3 0.4s vs median 0.01s", now=d.now))


def moves(acts) -> list[tuple[Phase, Phase, str]]:
    return [(a.from_state, a.to_state, str(a.trigger)) for a in acts if isinstance(a, RecordTransition)]


def restarts(acts) -> list[dict]:
    return [a.args for a in acts if isinstance(a, SendCommand) and a.type is CommandType.RESTART]


def running(nodes: int = 1, min_nodes: int = 1, **kw) -> Driver:
    d = Driver(RecoveryConfig(**{**{f: getattr(CFG, f) for f in ("restart_budget", "restart_window_s",
                                                                   "repeat_window_s", "restart_timeout_s")}, **kw}))
    started(d, nodes=nodes, min_nodes=min_nodes)
    d.steps(0, 26)
    return d


def test_a_hang_restarts_in_place_then_the_next_life_rejoins_checks_and_trains_again():
    d = running()
    acts = hang(d)
    assert moves(acts) == [(P.RUNNING, P.RESTARTING, "hang")]
    (opened,) = [a for a in acts if isinstance(a, OpenIncident)]
    assert opened.rule == "hang" and opened.evidence["cause"] == "hang" and opened.evidence["culprit"] == [3]
    assert restarts(acts) == [{"mode": "in_place", "life": 0, "ranks": [3], "reason": restarts(acts)[0]["reason"],
                               "incident": opened.id}]
    assert "restarting the worker group in place" in restarts(acts)[0]["reason"]
    assert d.s.pending is None  # a side request: the next life's run.started answers it
    assert [a.level for a in acts if isinstance(a, Alert)] == ["critical"]
    assert moves(d.feed(RunEndedIn(now=d.now, failed=True, detail="restart requested"))) == [
        (P.RESTARTING, P.RESTARTING, "run_ended")]
    d.now += 20
    assert moves(started(d, life=1)) == [(P.RESTARTING, P.REJOINING, "workers_started")]
    assert d.s.hang.restart.started_at == d.now
    assert moves(check(d, ok=True)) == [(P.REJOINING, P.REJOINING, "node_check_passed")]
    d.now += 5
    acts = d.feed(ProgressIn(step=25, now=d.now))
    assert moves(acts) == [(P.REJOINING, P.RUNNING, "training_again")]
    (closed,) = [a for a in acts if isinstance(a, CloseIncident)]
    assert closed.outcome == "restarted" and closed.id == opened.id
    assert d.s.incident is None and d.s.last_step == 25 and d.s.hang.restart is None
    ev = next(a for a in acts if isinstance(a, RecordTransition)).evidence
    assert ev["restart_s"] == 25.0 and ev["mode"] == "in_place"


def test_the_old_lifes_memory_snapshots_are_forgotten_when_the_next_life_starts():
    d = running()
    d.feed(CheckpointIn(step=20, kind="full", verified=True, now=d.now))
    d.feed(CheckpointIn(step=25, kind="memory", verified=True, now=d.now))
    hang(d)
    started(d, life=1)
    assert [(c.step, c.kind) for c in d.s.checkpoints] == [(20, "full")]


def test_a_life_torchrun_restarted_already_gets_no_command():
    d = running()
    started(d, life=1)  # a rank died: torchrun restarted before the evidence was decided
    acts = hang(d, life=0)
    assert moves(acts) == [(P.RUNNING, P.RESTARTING, "hang"), (P.RESTARTING, P.REJOINING, "workers_started")]
    assert restarts(acts) == []


def test_from_recovering_the_rollbacks_incident_closes_and_the_hang_opens_its_own():
    d = _drive_to_endable(P.RECOVERING)
    started(d)
    rollback = d.s.incident
    acts = hang(d)
    assert moves(acts) == [(P.RECOVERING, P.RESTARTING, "hang")]
    assert [(a.id, a.outcome) for a in acts if isinstance(a, CloseIncident)] == [(rollback.id, "rolled_back")]
    assert d.s.incident.id != rollback.id and d.s.incident.rule == "hang"


def _hang_again(d: Driver) -> list:
    hang(d, node="b")
    started(d, life=1, nodes=d.s.hang.nodes, min_nodes=d.s.hang.min_nodes)
    d.feed(ProgressIn(step=25, now=d.now))
    d.now += 60
    return hang(d, node="b", life=1)


def test_a_node_that_hangs_again_within_the_window_is_left_out():
    d = running(nodes=2)
    acts = _hang_again(d)
    assert moves(acts) == [(P.RUNNING, P.RESTARTING, "hang_again")]
    (args,) = restarts(acts)
    assert args["mode"] == "exclude" and args["exclude_nodes"] == ["b"] and args["life"] == 1
    assert "without node b" in args["reason"]


def test_a_node_that_hung_before_hangs_again_while_recovering_from_a_rollback():
    d = _drive_to_endable(P.RECOVERING)
    started(d, nodes=2)
    d.s.hang = replace(d.s.hang, hangs=(("b", d.now - 60),))  # its earlier hang, restarted in place
    acts = hang(d, node="b")
    assert moves(acts) == [(P.RECOVERING, P.RESTARTING, "hang_again")]
    assert restarts(acts)[0]["exclude_nodes"] == ["b"]


def test_a_hang_after_the_repeat_window_is_restarted_in_place_again():
    d = running(nodes=2)
    hang(d, node="b")
    started(d, life=1, nodes=2)
    d.feed(ProgressIn(step=25, now=d.now))
    d.now += 601
    assert restarts(hang(d, node="b", life=1))[0]["mode"] == "in_place"


def test_one_node_that_hangs_again_halts_for_a_human():
    d = running(nodes=1)
    acts = _hang_again(d)
    assert moves(acts) == [(P.RUNNING, P.HALTED, "exclude_unavailable")]
    assert restarts(acts)[0]["mode"] == "halt"
    assert [a.outcome for a in acts if isinstance(a, CloseIncident)] == ["halted"]
    assert any(a.level == "critical" and "human needed" in a.title for a in acts if isinstance(a, Alert))


def test_no_restart_left_halts_and_a_run_that_cannot_restart_gets_no_command():
    d = Driver(CFG)
    started(d, max_restarts=0)
    d.steps(0, 26)
    acts = hang(d)
    assert moves(acts) == [(P.RUNNING, P.HALTED, "restart_unavailable")]
    # no restart to give it: a human is told, the job is not halted (a stall may end by itself)
    halt = [a for a in acts if isinstance(a, RecordTransition)][0]
    assert restarts(acts) == [] and "no restart left" in halt.reason and "the job is left running" in halt.reason
    d2 = Driver(CFG)
    started(d2, caps=tuple(c for c in CommandType if c is not CommandType.RESTART))
    acts = hang(d2)
    assert moves(acts) == [(P.RUNNING, P.HALTED, "restart_unavailable")] and restarts(acts) == []


def test_the_restart_budget_spent_halts():
    d = running(restart_budget=1)
    hang(d, node="a")
    started(d, life=1)
    d.feed(ProgressIn(step=25, now=d.now))
    acts = hang(d, node="b", life=1)
    assert moves(acts) == [(P.RUNNING, P.HALTED, "restart_budget_spent")]
    assert "restart budget (1 per 3600 s) is spent" in restarts(acts)[0]["reason"]


def test_a_failed_node_check_while_rejoining_restarts_without_the_slow_node():
    d = running(nodes=2)
    hang(d, node="a")
    started(d, life=1, nodes=2)
    acts = check(d, ok=False)
    assert moves(acts) == [(P.REJOINING, P.RESTARTING, "node_check_failed")]
    assert restarts(acts)[0]["mode"] == "exclude" and restarts(acts)[0]["exclude_nodes"] == ["b"]
    assert not any(isinstance(a, OpenIncident) for a in acts)  # the hang's incident goes on


@pytest.mark.parametrize("source", [P.RUNNING, P.RECOVERING])
def test_a_failed_node_check_the_controller_did_not_ask_for_opens_an_incident(source):
    d = running(nodes=2) if source is P.RUNNING else _drive_to_endable(P.RECOVERING)
    started(d, life=1, nodes=2)
    acts = check(d, ok=False)
    assert moves(acts) == [(source, P.RESTARTING, "node_check_failed")]
    assert [a.rule for a in acts if isinstance(a, OpenIncident)] == ["hang"]


def _at(source: Phase, nodes: int, **kw) -> Driver:
    if source is P.RECOVERING:
        d = _drive_to_endable(P.RECOVERING)
        d.cfg = RecoveryConfig(**{**{f: getattr(CFG, f) for f in ("restart_window_s", "repeat_window_s")}, **kw})
        started(d, nodes=nodes, max_restarts=kw.pop("_max", 3))
        return d
    return running(nodes=nodes, **kw)


@pytest.mark.parametrize("source", [P.RUNNING, P.RECOVERING, P.REJOINING])
@pytest.mark.parametrize("trigger", ["restart_unavailable", "restart_budget_spent", "exclude_unavailable"])
def test_each_halt_from_each_phase(source, trigger):
    budget = 0 if trigger == "restart_budget_spent" else 3
    d = _at(source, nodes=1, restart_budget=budget) if source is not P.REJOINING else running(nodes=1)
    if source is P.REJOINING:
        hang(d)
        d.cfg = RecoveryConfig(restart_budget=1 if trigger == "restart_budget_spent" else 3)
        started(d, life=3 if trigger == "restart_unavailable" else 1, nodes=1)
        acts = check(d, ok=False)
    elif trigger == "restart_unavailable":
        started(d, max_restarts=0)
        acts = hang(d)
    elif trigger == "exclude_unavailable":
        acts = check(d, ok=False)
    else:
        acts = hang(d)
    assert moves(acts)[-1] == (source, P.HALTED, trigger)
    if trigger == "restart_unavailable" and source is not P.REJOINING:
        assert d.s.phase is P.HALTED and restarts(acts) == []  # the job is left running
    else:
        assert d.s.phase is P.HALTED and restarts(acts)[-1]["mode"] == "halt"


@pytest.mark.parametrize("phase", [P.RESTARTING, P.REJOINING])
def test_no_life_training_within_the_restart_timeout_halts(phase):
    d = running()
    hang(d)
    if phase is P.REJOINING:
        started(d, life=1)
    d.now += 119
    assert d.feed(TickIn(now=d.now)) == []
    d.now += 1
    acts = d.feed(TickIn(now=d.now))
    assert moves(acts) == [(phase, P.HALTED, "restart_timed_out")]
    assert restarts(acts)[0]["mode"] == "halt"


def test_a_new_life_that_ends_before_its_first_step_waits_for_the_next():
    d = running()
    hang(d)
    started(d, life=1)
    assert moves(d.feed(RunEndedIn(now=d.now, failed=True, detail="halted"))) == [(P.REJOINING, P.RESTARTING, "run_ended")]
    assert moves(started(d, life=2)) == [(P.RESTARTING, P.REJOINING, "workers_started")]


def test_a_new_life_after_a_halt_closes_the_halted_incident():
    d = running()
    started(d, max_restarts=0)
    hang(d)
    inc = d.s.incident
    d.now += 3600
    acts = started(d, life=0, max_restarts=3)  # someone launched the job again
    assert moves(acts) == [(P.HALTED, P.RUNNING, "workers_started")]
    assert [(a.id, a.outcome, a.closed_at) for a in acts if isinstance(a, CloseIncident)] == [(inc.id, "halted", d.now)]


def test_a_stall_a_halt_left_running_that_ends_by_itself_runs_again_and_the_next_fault_gets_its_own_incident():
    """The soak's seed 102: a rank stopped 9 s on a run with no restart left was halted with the job
    left running; it trained on, and an LR blow-up later was absorbed by the standing halt."""
    d = Driver(CFG)
    started(d, max_restarts=0)
    d.steps(0, 26)
    hang(d)
    inc = d.s.incident
    assert d.s.phase is P.HALTED and d.s.hang.left_running == inc.id
    assert moves(d.feed(ProgressIn(step=27, now=d.now))) == []  # the hung step itself, reported late
    d.now += 9
    acts = d.feed(ProgressIn(step=28, now=d.now))
    assert moves(acts) == [(P.HALTED, P.RUNNING, "training_again")]
    assert [(a.id, a.outcome) for a in acts if isinstance(a, CloseIncident)] == [(inc.id, "resumed")]
    assert [(a.level, a.action) for a in acts if isinstance(a, Alert)] == [("info", "resolve")]
    assert d.s.incident is None and d.s.hang.left_running is None and d.s.previous is None
    d.steps(29, 60)
    acts = d.spike(61)
    assert moves(acts) == [(P.RUNNING, P.PAUSING, "spike")]
    assert [a.rule for a in acts if isinstance(a, OpenIncident)] == ["loss_spike"]


def test_a_halted_job_does_not_run_again_on_a_late_step():
    """A halt that sent ``restart halt`` (the budget spent) is a human's to lift: steps still in
    flight from the halted job do not end it."""
    d = running(restart_budget=0)
    hang(d)
    assert d.s.phase is P.HALTED and d.s.hang.left_running is None
    acts = d.feed(ProgressIn(step=28, now=d.now))
    assert moves(acts) == [] and d.s.phase is P.HALTED


def test_a_hang_mid_pause_is_alerted_not_acted_on_and_mid_restart_is_quiet():
    d = _drive_to_endable(P.PAUSING)
    acts = hang(d)
    assert moves(acts) == [] and [a.level for a in acts if isinstance(a, Alert)] == ["critical"]
    d2 = running()
    hang(d2)
    assert hang(d2) == []


@pytest.mark.parametrize("phase", [P.RESTARTING, P.REJOINING])
@pytest.mark.parametrize(("policy", "to", "trigger"), [("rollback", P.RECOVERING, "trainer_rolled_back"),
                                                       ("resume", P.RUNNING, "trainer_resumed"),
                                                       ("stop", P.HALTED, "trainer_stopped")])
def test_a_trainer_side_timeout_mid_restart_is_the_trainers_decision(phase, policy, to, trigger):
    from tests.controller.test_recovery_held import timeout

    d = running()
    hang(d)
    if phase is P.REJOINING:
        started(d, life=1)  # e.g. its node check failed: paused, and the controller fell silent
    acts = timeout(d, policy, to_step=20 if policy == "rollback" else None, wait="pause")
    assert moves(acts)[-1] == (phase, to, trigger)


@pytest.mark.parametrize("phase", [P.RESTARTING, P.REJOINING])
def test_an_operators_lr_scale_mid_restart_is_adopted(phase):
    from cliffguard.controller.recovery_types import AckIn
    from cliffguard.core.enums import AckStatus

    d = running()
    hang(d)
    if phase is P.REJOINING:
        started(d, life=1)
    acts = d.feed(AckIn(cmd_id="e" * 32, status=AckStatus.APPLIED, now=d.now, cmd_type="set_lr_scale",
                        detail="lr_scale=0.3", args={"lr_scale": 0.3}))
    assert moves(acts) == [(phase, phase, "operator_lr_scale")] and d.s.lr_scale == 0.3


@pytest.mark.parametrize("phase", [P.RESTARTING, P.REJOINING])
def test_a_preemption_mid_restart_abandons_the_hang_and_opens_its_own(phase):
    """The scheduler takes the nodes back while a hung group restarts: the hang's incident is
    abandoned and the preemption's opens (the requeued run resumes from the saved step)."""
    from cliffguard.controller.recovery_types import CloseIncident, OpenIncident, RunPreemptedIn

    d = running()
    hang(d)
    if phase is P.REJOINING:
        started(d, life=1)
    hang_incident = d.s.incident
    acts = d.feed(RunPreemptedIn(step=d.s.last_step + 1, now=d.now, signal="SIGTERM", deadline_s=30.0, save_s=1.0,
                                 verified=True, exit_code=75, ts=d.now))
    assert moves(acts)[-1] == (phase, P.PREEMPTED, "preempted")
    assert [(c.id, c.outcome) for c in acts if isinstance(c, CloseIncident)] == [(hang_incident.id, "abandoned")]
    assert [o.rule for o in acts if isinstance(o, OpenIncident)] == ["preemption"]


def test_hang_state_round_trips():
    d = running(nodes=2)
    hang(d)
    blob = json.loads(json.dumps(d.s.state_dict()))
    back = RecoveryState.from_state_dict(blob)
    assert back == d.s and back.hang.restart.mode == "in_place" and back.hang.hangs == (("b", d.now),)
    assert RecoveryState.from_state_dict({k: v for k, v in blob.items() if k != "hang"}).hang.life == 0


def test_the_guards_by_name():
    d = running(nodes=3, min_nodes=2)
    s = d.s
    assert GUARDS["can_exclude"](CFG, s, ("b",)) and not GUARDS["can_exclude"](CFG, s, ("a", "b"))
    assert not GUARDS["can_exclude"](CFG, s, ()) and not GUARDS["can_exclude"](CFG, s, ("",))
    assert GUARDS["can_restart"](CFG, s) and GUARDS["within_restart_budget"](CFG, s, d.now)
    assert not GUARDS["wants_exclusion"](CFG, s, None, ("b",), d.now)
    assert not GUARDS["restart_timed_out"](CFG, s, 1e12)  # no restart under way


def test_zz_every_hang_move_is_taken_somewhere():
    import sys

    import cliffguard.controller.recovery_step as rec

    taken: set = set()
    original = rec.fire

    def spy(phase, trigger):
        taken.add((phase, trigger))
        return original(phase, trigger)

    rec.fire = spy
    try:
        module = sys.modules[__name__]
        for name in dir(module):
            fn = getattr(module, name)
            if name.startswith("test_") and name != "test_zz_every_hang_move_is_taken_somewhere" and callable(fn):
                marks = getattr(fn, "pytestmark", [])
                params = [m for m in marks if m.name == "parametrize"]
                if not params:
                    fn()
                    continue
                import itertools

                def cases(mark) -> list[dict]:
                    names = mark.args[0]
                    names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
                    return [dict(zip(names, v if len(names) > 1 else (v,), strict=True)) for v in mark.args[1]]

                for combo in itertools.product(*(cases(m) for m in params)):
                    fn(**{k: v for c in combo for k, v in c.items()})
    finally:
        rec.fire = original
    assert taken >= HANG_MOVES, sorted(HANG_MOVES - taken)
    assert HANG_MOVES and set(TRANSITIONS) >= HANG_MOVES
