"""The suspect-node store in the recovery machine (controller/recovery_suspect.py; recovery_hang.py
``_decide`` through recovery_step.py ``record_suspects``): every eviction records its node; a suspect
node's beat is not admitted (the group restarts without it, or a human is called naming it); a node
with a record is evicted sooner; a passing node check clears a node an operator asked to re-admit."""

from __future__ import annotations

import json

from cliffguard.controller.recovery import new_state
from cliffguard.controller.recovery_hang_types import (
    ClearSuspect,
    NodeCheckIn,
    RecordSuspect,
    SuspectJoinedIn,
)
from cliffguard.controller.recovery_state import RecoveryState
from cliffguard.controller.recovery_types import (
    Alert,
    CloseIncident,
    OpenIncident,
    Phase,
    RecordTransition,
    RecoveryConfig,
    SendCommand,
    StartedIn,
    TriagedIn,
    VerdictIn,
)
from cliffguard.controller.verdict import Action, Verdict
from cliffguard.core.enums import CommandType, Level
from tests.controller.test_recovery import Driver, healthy_run

P = Phase
CFG = RecoveryConfig(restart_budget=3, restart_window_s=3600, repeat_window_s=600, restart_timeout_s=120)


# the hang moves' inputs, as tests/controller/test_recovery_hang.py feeds them (not imported from there:
# tests/controller/test_recovery_held.py walks this module's moves, and that module imports it)
def started(d: Driver, life: int = 0, *, max_restarts: int = 3, nodes: int = 1):
    return d.feed(StartedIn(capabilities=tuple(CommandType), now=d.now, life=life, max_restarts=max_restarts,
                            restarts_left=max(max_restarts - life, 0), nodes=nodes, min_nodes=1))


def hang(d: Driver, node: str = "b", life: int = 0, step: int = 27):
    v = Verdict(rule="hang", level=Level.CRITICAL, step=step, rank=3, onset_step=step, action=Action.RESTART,
                message="rank 3 never entered collective #60",
                evidence={"cause": "hang", "culprit": [3], "nodes": [node], "life": life, "table": []})
    return d.feed(VerdictIn(verdict=v, now=d.now))


def check(d: Driver, ok: bool, life: int = 1, nodes: tuple[str, ...] = ("b",)):
    return d.feed(NodeCheckIn(ok=ok, life=life, slow=() if ok else (3,), slow_nodes=() if ok else nodes,
                              detail="matmul rank 3 0.4s vs median 0.01s", now=d.now))


def restarts(acts) -> list[dict]:
    return [a.args for a in acts if isinstance(a, SendCommand) and a.type is CommandType.RESTART]


def running(nodes: int = 1, **kw) -> Driver:
    d = Driver(RecoveryConfig(**{**{f: getattr(CFG, f) for f in ("restart_budget", "restart_window_s",
                                                                   "repeat_window_s", "restart_timeout_s")}, **kw}))
    started(d, nodes=nodes)
    d.steps(0, 26)
    return d


def beat(d: Driver, node: str = "node-b", life: int | None = 0):
    return d.feed(SuspectJoinedIn(node=node, life=life, cause="bad_rank", why="rank 1 is bad whatever shard it gets",
                                  since=900.0, record_run="run-0", record_incident="i" * 32, now=d.now))


def transient(d: Driver, step: int, n: int, *, record: bool = False, node: str = "node-c"):
    return d.feed(TriagedIn(step=step, now=d.now, cls="transient", remedy="retry_step", rank=2, reason="normal again",
                            reruns=1, rerun_s=0.01, sample_ids=(), update_applied=True, ts=6000.0 + step, node=node,
                            transient_counts={"2": n}, node_record=record))


def bad_rank(d: Driver, step: int = 31, node: str = "node-b"):
    return d.feed(TriagedIn(step=step, now=d.now, cls="bad_rank", remedy="suspect_rank", rank=1, reason="rank 1 bad",
                            reruns=2, rerun_s=0.05, sample_ids=(), update_applied=False, ts=5000.0 + step, node=node))


def records(acts) -> list[tuple[str, str]]:
    return [(a.node, a.cause) for a in acts if isinstance(a, RecordSuspect)]


def moves(acts) -> list[tuple[Phase, Phase, str]]:
    return [(a.from_state, a.to_state, str(a.trigger)) for a in acts if isinstance(a, RecordTransition)]


def test_a_bad_rank_eviction_records_its_node_suspect_with_the_incident_and_why():
    d = running(nodes=2)
    acts = bad_rank(d)
    (opened,) = [a for a in acts if isinstance(a, OpenIncident)]
    (rec,) = [a for a in acts if isinstance(a, RecordSuspect)]
    assert (rec.node, rec.cause, rec.incident_id, rec.at) == ("node-b", "bad_rank", opened.id, d.now)
    assert "rank 1 is bad" in rec.reason and "restarting without node node-b" in rec.reason
    assert restarts(acts)[0]["exclude_nodes"] == ["node-b"]
    assert beat(d, life=0) == []  # its own beats in this life: the eviction under way answers them


def test_every_eviction_path_records_its_nodes_and_a_first_hang_does_not():
    d = running(nodes=4)
    assert records(hang(d, node="c")) == []  # restarted in place: one hang is no verdict on the node
    started(d, 1, nodes=4)
    d.steps(27, 30)
    d.now += 60
    assert records(hang(d, node="c", life=1, step=31)) == [("c", "hang_again")]
    d = running(nodes=4)
    hang(d)
    started(d, 1, nodes=4)
    assert records(check(d, ok=False, nodes=("b",))) == [("b", "node_check_failed")]
    d = running(nodes=2)
    for step, n in ((31, 1), (35, 2)):
        assert records(transient(d, step, n)) == []
    assert records(transient(d, 39, 3)) == [("node-c", "transient")]


def test_a_bad_rank_that_halts_is_recorded_suspect_too():
    d = Driver()
    started(d, nodes=2, max_restarts=0)  # torchrun has no restart to give
    healthy_run(d, 30)
    acts = bad_rank(d)
    assert d.s.phase is P.HALTED and records(acts) == [("node-b", "bad_rank")]


def test_a_node_with_a_record_is_evicted_at_its_first_transient():
    d = running(nodes=2)  # transient_budget 3, recorded_transient_budget 1
    assert [c.outcome for c in transient(d, 31, 1) if isinstance(c, CloseIncident)] == ["cured"]
    d = running(nodes=2)
    acts = transient(d, 31, 1, record=True)
    assert d.s.phase is P.RESTARTING and records(acts) == [("node-c", "transient")]
    assert "budget 1" in [a for a in acts if isinstance(a, RecordTransition)][-1].reason
    d = running(nodes=2, transient_budget=0)  # 0 still means never, record or not
    assert [c.outcome for c in transient(d, 31, 5, record=True) if isinstance(c, CloseIncident)] == ["cured"]


def test_a_suspect_nodes_beat_restarts_the_group_without_it_once_per_life():
    d = running(nodes=3)
    acts = beat(d)
    assert moves(acts) == [(P.RUNNING, P.RESTARTING, "suspect_node")]
    (opened,) = [a for a in acts if isinstance(a, OpenIncident)]
    assert opened.rule == "suspect_node" and opened.evidence["node"] == "node-b"
    assert opened.evidence["record"] == {"cause": "bad_rank", "why": "rank 1 is bad whatever shard it gets",
                                         "since": 900.0, "run": "run-0", "incident": "i" * 32}
    (cmd,) = restarts(acts)
    assert cmd["mode"] == "exclude" and cmd["exclude_nodes"] == ["node-b"] and "not admitted" in cmd["reason"]
    (alert,) = [a for a in acts if isinstance(a, Alert)]
    assert alert.level == "critical" and alert.rule == "suspect_node" and "a suspect node" in alert.title
    assert records(acts) == []  # recorded already: no second row for a refusal
    assert beat(d) == []  # the next beats of that life
    started(d, 1, nodes=2)
    d.steps(27, 28)
    assert d.s.phase is P.RUNNING
    assert [a for a in beat(d, life=0) if isinstance(a, RecordTransition)] == []  # a late beat of the old life


def test_a_suspect_node_that_rejoins_a_restarted_group_is_left_out_again():
    d = running(nodes=3)
    hang(d, node="a")
    started(d, 1, nodes=3)
    acts = beat(d, life=1)
    assert moves(acts) == [(P.REJOINING, P.RESTARTING, "suspect_node")]
    assert not [a for a in acts if isinstance(a, OpenIncident)]  # the restart's incident goes on
    assert restarts(acts)[0]["exclude_nodes"] == ["node-b"]


def test_a_suspect_node_while_recovering_closes_the_rollback_and_opens_its_own_incident():
    d = Driver(RecoveryConfig(stable_window=5, recover_window=50))
    started(d, nodes=3)
    healthy_run(d, 30)
    d.spike(31)
    d.ack()
    d.answer_validate(9.0)
    d.ack()
    assert d.s.phase is P.RECOVERING
    acts = beat(d)
    assert moves(acts) == [(P.RECOVERING, P.RESTARTING, "suspect_node")]
    assert [c.outcome for c in acts if isinstance(c, CloseIncident)] == ["rolled_back"]


def test_a_suspect_node_that_cannot_be_left_out_calls_a_human_naming_it():
    d = running(nodes=1)  # min_nodes 1: the only node
    acts = beat(d)
    assert moves(acts) == [(P.RUNNING, P.HALTED, "exclude_unavailable")]
    (alert,) = [a for a in acts if isinstance(a, Alert)]
    assert alert.level == "critical" and "node node-b should be left out" in alert.body
    d = Driver()
    started(d, nodes=2, max_restarts=0)
    healthy_run(d, 30)
    acts = beat(d)
    assert moves(acts) == [(P.RUNNING, P.HALTED, "restart_unavailable")]
    reason = [a for a in acts if isinstance(a, RecordTransition)][0].reason
    assert "evict node node-b by hand" in reason and "the suspect node trains with it" in reason
    assert not [a for a in acts if isinstance(a, SendCommand)]  # the job is left running
    d.steps(31, 33)
    assert d.s.phase is P.HALTED  # not taken for a stall that ended by itself


def test_a_suspect_node_mid_incident_is_one_critical_alert():
    d = Driver()
    started(d, nodes=2)
    healthy_run(d, 30)
    d.spike(31)
    acts = beat(d)
    (alert,) = acts
    assert isinstance(alert, Alert) and alert.level == "critical" and "suspect node node-b" in alert.title
    assert d.s.phase is P.PAUSING and beat(d) == []


def test_a_passing_node_check_clears_the_nodes_an_operator_asked_to_recheck():
    d = running(nodes=3)
    hang(d)
    started(d, 1, nodes=3)
    acts = d.feed(NodeCheckIn(ok=True, life=1, slow=(), slow_nodes=(), detail="every pair within x3", now=d.now,
                              nodes=("a", "b", "c"), rechecking=("b",)))
    (clear,) = [a for a in acts if isinstance(a, ClearSuspect)]
    assert clear.nodes == ("b",) and "passed" in clear.reason
    assert any(isinstance(a, Alert) and "admitted again" in a.title for a in acts)
    acts = d.feed(NodeCheckIn(ok=False, life=1, slow=(1,), slow_nodes=("b",), detail="slow", now=d.now,
                              nodes=("a", "b", "c"), rechecking=("b",)))
    assert not [a for a in acts if isinstance(a, ClearSuspect)]


def test_the_answered_suspects_survive_the_state_round_trip():
    d = running(nodes=3)
    beat(d)
    s = RecoveryState.from_state_dict(json.loads(json.dumps(d.s.state_dict())))
    assert s.hang.suspects == (("node-b", 0),) and new_state("r", "s").hang.suspects == ()


def take_every_suspect_transition() -> None:
    """For the coverage test of every declared transition (tests/controller/test_recovery_held.py)."""
    test_a_suspect_nodes_beat_restarts_the_group_without_it_once_per_life()
    test_a_suspect_node_that_rejoins_a_restarted_group_is_left_out_again()
    test_a_suspect_node_while_recovering_closes_the_rollback_and_opens_its_own_incident()

