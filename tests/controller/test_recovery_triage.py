"""Triage verdicts in the recovery machine (controller/recovery_others.py ``on_triaged``): a step the
kit cured itself is an incident opened and closed ``cured`` at once, with an info alert; the ladder's
memory is kept; a class the kit does not cure, a re-read, or a verdict mid-incident moves nothing."""

from __future__ import annotations

from cliffguard.controller.recovery_types import (
    Alert,
    CloseIncident,
    OpenIncident,
    Phase,
    RecordTransition,
    SendCommand,
    StartedIn,
    TriagedIn,
)
from cliffguard.core.enums import CommandType
from tests.controller.test_recovery import Driver, healthy_run, recovering_after_a_rollback


def _triaged(d: Driver, step: int, cls: str = "data", *, ts: float = 5000.0, node: str = ""):
    return d.feed(TriagedIn(step=step, now=d.now, cls=cls, remedy="skip_batch" if cls == "data" else "retry_step",
                            rank=1, reason="rank 1's shard is bad on rank 0 too", reruns=2, rerun_s=0.05,
                            sample_ids=(41, 42) if cls == "data" else (), update_applied=cls == "transient", ts=ts,
                            node=node))


def test_a_cured_step_is_an_incident_closed_cured_at_once_with_an_info_alert():
    d = Driver()
    healthy_run(d, 30)
    acts = _triaged(d, 31)
    (opened,) = [a for a in acts if isinstance(a, OpenIncident)]
    assert (opened.rule, opened.level, opened.spike_step) == ("triage", "warn", 31)
    assert opened.evidence["cause"] == "data" and opened.evidence["sample_ids"] == [41, 42]
    rec = [a for a in acts if isinstance(a, RecordTransition)]
    assert [(r.from_state, r.to_state, r.trigger) for r in rec] == [(Phase.RUNNING, Phase.RUNNING, "triage_cured")]
    assert [(c.id, c.outcome) for c in acts if isinstance(c, CloseIncident)] == [(opened.id, "cured")]
    (alert,) = [a for a in acts if isinstance(a, Alert)]
    assert alert.level == "info" and "cured" in alert.title
    assert not any(isinstance(a, SendCommand) for a in acts)  # the trainer cured it: nothing to send
    assert d.s.phase is Phase.RUNNING and d.s.incident is None
    assert _triaged(d, 31) == []  # a re-read of the same report
    assert [a for a in _triaged(d, 35, "transient", ts=5010.0) if isinstance(a, CloseIncident)][0].outcome == "cured"


def test_a_cured_stretch_is_one_incident_and_a_later_or_other_cure_a_new_one():
    d = Driver()
    healthy_run(d, 30)
    first = [a for a in _triaged(d, 31, ts=5000.0) if isinstance(a, OpenIncident)][0]
    d.steps(31, 32)
    for step, ts in ((32, 5001.0), (33, 5002.0)):  # the corrupted stretch goes on: the same excursion
        acts = _triaged(d, step, ts=ts)
        assert not [a for a in acts if isinstance(a, (OpenIncident, Alert))]
        assert [(r.incident_id, r.trigger) for r in acts if isinstance(r, RecordTransition)] == [(first.id, "triage_cured")]
        assert [(c.id, c.outcome) for c in acts if isinstance(c, CloseIncident)] == [(first.id, "cured")]
    assert d.s.incident is None and d.s.cured_step == 33
    restored = type(d.s).from_state_dict(d.s.state_dict())  # the controller's restart keeps the stretch
    assert restored.cured == d.s.cured and restored.cured_step == 33
    other = [a for a in _triaged(d, 34, "transient", ts=5003.0) if isinstance(a, OpenIncident)]
    assert other and other[0].id != first.id  # another class: its own incident
    d.steps(33, 50)
    later = [a for a in _triaged(d, 50, ts=5010.0) if isinstance(a, OpenIncident)]
    assert later and later[0].id != first.id  # a data batch much later: a new excursion


def test_a_class_the_kit_does_not_cure_and_a_verdict_mid_incident_move_nothing():
    d = Driver()
    healthy_run(d, 30)
    for cls in ("optimizer", "unclear"):
        assert _triaged(d, 31, cls) == []
    d.spike(31)  # an incident of the machine's own: pausing
    assert d.s.phase is not Phase.RUNNING
    inc = d.s.incident
    assert _triaged(d, 32, ts=6000.0) == [] and d.s.incident == inc


def _torchrun(d: Driver, *, life: int = 0, nodes: int = 2, restarts_left: int = 3) -> None:
    d.feed(StartedIn(capabilities=tuple(CommandType), now=d.now, life=life, max_restarts=3, restarts_left=restarts_left,
                     nodes=nodes, min_nodes=1))


def test_a_bad_rank_is_evicted_by_a_restart_without_its_node_and_trains_again():
    d = Driver()
    _torchrun(d)
    healthy_run(d, 30)
    acts = _triaged(d, 31, "bad_rank", node="node-b")
    (opened,) = [a for a in acts if isinstance(a, OpenIncident)]
    assert opened.rule == "bad_rank" and opened.evidence["node"] == "node-b" and opened.evidence["rank"] == 1
    (cmd,) = [a for a in acts if isinstance(a, SendCommand)]
    assert (cmd.type, cmd.args["mode"], cmd.args["exclude_nodes"], cmd.args["ranks"]) == (
        "restart", "exclude", ["node-b"], [1])
    assert d.triggers() == ["evict"] and d.s.phase is Phase.RESTARTING
    assert not [a for a in d.actions if isinstance(a, SendCommand) and a.type in ("rollback", "pause")]  # no LR cut
    assert _triaged(d, 32, "bad_rank", ts=5001.0, node="node-b") == []  # its next bad step: the eviction answers it
    d.spike(32)  # the bad rank's loss, seen by the loss rule while the group restarts: no second remedy
    assert d.s.phase is Phase.RESTARTING
    _torchrun(d, life=1, nodes=1)
    d.steps(31, 31)
    assert d.s.phase is Phase.RUNNING
    assert [(c.id, c.outcome) for c in d.actions if isinstance(c, CloseIncident)] == [(opened.id, "restarted")]


def test_a_bad_rank_that_cannot_be_left_out_halts_with_the_job_left_running_and_says_so():
    for nodes, restarts, node, why in ((1, 3, "node-b", "cannot keep"), (2, 0, "node-b", "no restart left"),
                                       (2, 3, "", "unknown")):
        d = Driver()
        _torchrun(d, nodes=nodes, restarts_left=restarts)
        healthy_run(d, 30)
        acts = _triaged(d, 31, "bad_rank", node=node)
        assert d.s.phase is Phase.HALTED, why
        reason = [a for a in acts if isinstance(a, RecordTransition)][-1].reason
        assert why in reason and not [a for a in acts if isinstance(a, SendCommand) and a.args.get("mode") != "halt"]
        assert _triaged(d, 32, "bad_rank", ts=5001.0) == []  # the halt answers its next bad steps


def test_a_rank_whose_transients_reach_the_budget_is_evicted_like_a_bad_rank():
    d = Driver()  # transient_budget 3
    _torchrun(d)
    healthy_run(d, 40)

    def transient(step: int, n: int):
        return d.feed(TriagedIn(step=step, now=d.now, cls="transient", remedy="retry_step", rank=2,
                                reason="the same batch on the same ranks is normal again", reruns=1, rerun_s=0.01,
                                sample_ids=(), update_applied=True, ts=6000.0 + step, node="node-c",
                                transient_counts={"2": n}))

    for step, n in ((31, 1), (35, 2)):
        assert [c.outcome for c in transient(step, n) if isinstance(c, CloseIncident)] == ["cured"]
    acts = transient(39, 3)
    (opened,) = [a for a in acts if isinstance(a, OpenIncident)]
    assert opened.rule == "bad_rank" and opened.evidence["class"] == "transient" and opened.evidence["transient_count"] == 3
    (cmd,) = [a for a in acts if isinstance(a, SendCommand)]
    assert cmd.args["mode"] == "exclude" and cmd.args["exclude_nodes"] == ["node-c"] and cmd.args["ranks"] == [2]
    reason = [a for a in acts if isinstance(a, RecordTransition)][-1].reason
    assert "transient fault 3 in this life (budget 3)" in reason and d.s.phase is Phase.RESTARTING


def test_a_bad_rank_mid_incident_is_a_critical_alert():
    d = Driver()
    healthy_run(d, 30)
    d.spike(31)
    acts = _triaged(d, 31, "bad_rank", node="node-b")
    (alert,) = [a for a in acts if isinstance(a, Alert)]
    assert alert.level == "critical" and alert.rule == "bad_rank" and "rank 1 is bad" in alert.title
    assert not [a for a in acts if isinstance(a, RecordTransition)]


def take_every_triage_transition() -> None:
    """For the coverage test of every declared transition (tests/controller/test_recovery_held.py)."""
    test_a_cured_step_is_an_incident_closed_cured_at_once_with_an_info_alert()
    test_a_bad_rank_is_evicted_by_a_restart_without_its_node_and_trains_again()
    d = Driver()  # evicted while recovering from a rollback
    _torchrun(d)
    recovering_after_a_rollback(d)
    _triaged(d, 36, "bad_rank", node="node-b")
    assert d.triggers()[-1] == "evict"
