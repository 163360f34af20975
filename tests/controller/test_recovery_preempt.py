"""Preemptions in the recovery machine (controller/recovery_preempt.py): an incident of its own
kind, closed ``requeued`` when the run trains again, with the work lost and the time it was down."""

from __future__ import annotations

import pytest

from cliffguard.controller.recovery_types import (
    AckIn,
    Alert,
    CloseIncident,
    MarkCommand,
    OpenIncident,
    Phase,
    ProgressIn,
    RecordTransition,
    RunEndedIn,
    RunPreemptedIn,
    SendCommand,
)
from cliffguard.core.enums import AckStatus
from tests.controller.test_recovery import ENDABLE, Driver, _drive_to_endable, healthy_run


def _preempt(d: Driver, step: int, *, ts: float, save_s: float = 1.5, verified: bool = True):
    return d.feed(RunPreemptedIn(step=step, now=d.now, signal="SIGTERM", deadline_s=30.0, save_s=save_s,
                                 verified=verified, exit_code=75, ts=ts))


def test_a_preemption_opens_its_own_incident_and_the_first_step_after_the_restart_closes_it():
    d = Driver()
    healthy_run(d, 30)  # steps 0..30 seen: the trainer saved step 31 at the boundary
    acts = _preempt(d, 31, ts=5000.0)
    assert d.s.phase is Phase.PREEMPTED
    opened = [a for a in acts if isinstance(a, OpenIncident)]
    assert [(o.rule, o.level, o.spike_step) for o in opened] == [("preemption", "ok", 31)]
    ev = opened[0].evidence
    assert ev["cause"] == "preemption" and ev["signal"] == "SIGTERM" and ev["save_s"] == 1.5 and ev["verified"]
    assert not any(isinstance(a, (SendCommand, Alert)) for a in acts)  # not a failure: nothing to send or page
    assert d.feed(RunPreemptedIn(step=31, now=d.now, signal="SIGTERM", deadline_s=30.0, save_s=1.5, verified=True,
                                 exit_code=75, ts=5000.0))  # a second warning is noted, the incident stays
    assert d.s.phase is Phase.PREEMPTED and d.s.incident.id == opened[0].id
    acts = d.feed(ProgressIn(step=31, now=d.now, ts=5042.5))
    assert d.s.phase is Phase.RUNNING and d.s.incident is None
    rec = [a for a in acts if isinstance(a, RecordTransition)]
    assert [(r.from_state, r.to_state, r.trigger) for r in rec] == [(Phase.PREEMPTED, Phase.RUNNING, "training_again")]
    assert rec[0].evidence["steps_lost"] == 0 and rec[0].evidence["seconds_to_train"] == pytest.approx(42.5)
    closed = [a for a in acts if isinstance(a, CloseIncident)]
    assert [(c.id, c.outcome) for c in closed] == [(opened[0].id, "requeued")]
    assert d.s.previous is None  # not an excursion the next one escalates from


def test_a_restart_from_an_older_checkpoint_counts_the_steps_lost():
    d = Driver()
    healthy_run(d, 30)
    _preempt(d, 31, ts=5000.0, save_s=31.0, verified=False)  # the save missed the deadline
    acts = d.feed(ProgressIn(step=21, now=d.now, ts=5100.0))  # back from the checkpoint of step 20
    rec = [a for a in acts if isinstance(a, RecordTransition)]
    assert rec[0].evidence["steps_lost"] == 10
    assert d.s.last_step == 21  # the redone steps are the run's newest again
    d.steps(22, 25)
    assert d.s.phase is Phase.RUNNING and d.s.last_step == 25


@pytest.mark.parametrize("phase", ENDABLE)
def test_a_run_preempted_mid_incident_abandons_it_and_cancels_the_unanswered_command(phase):
    d = _drive_to_endable(phase)
    inc, pend = d.s.incident, d.s.pending
    acts = _preempt(d, d.s.last_step + 1, ts=6000.0)
    assert d.s.phase is Phase.PREEMPTED and d.s.pending is None and d.s.incident.rule == "preemption"
    outcome = "halted" if phase is Phase.HALTED else "abandoned"
    assert [(c.id, c.outcome) for c in acts if isinstance(c, CloseIncident)] == [(inc.id, outcome)]
    expect = [MarkCommand(id=pend.id, status="cancelled", detail="the run was preempted before answering")] \
        if pend is not None and not pend.acked else []
    assert [a for a in acts if isinstance(a, MarkCommand)] == expect


def test_a_run_that_ends_while_preempted_has_the_preemption_abandoned():
    d = Driver()
    healthy_run(d, 10)
    _preempt(d, 11, ts=5000.0)
    acts = d.feed(RunEndedIn(now=d.now, failed=False))
    assert d.s.phase is Phase.RUNNING
    assert [c.outcome for c in acts if isinstance(c, CloseIncident)] == ["abandoned"]


def test_an_operators_lr_scale_applied_just_before_the_preemption_is_adopted_while_preempted():
    d = Driver()
    healthy_run(d, 10)
    _preempt(d, 11, ts=5000.0)
    d.feed(AckIn(cmd_id="op-1", status=AckStatus.APPLIED, now=d.now, cmd_type="set_lr_scale",
                 args={"lr_scale": 0.25}))
    assert d.s.phase is Phase.PREEMPTED and d.s.lr_scale == 0.25 and d.s.incident.lr_scales == (0.25,)


def take_every_preemption_transition() -> None:
    """For the coverage test of every declared transition (tests/controller/test_recovery_held.py)."""
    test_a_preemption_opens_its_own_incident_and_the_first_step_after_the_restart_closes_it()
    test_a_restart_from_an_older_checkpoint_counts_the_steps_lost()
    test_a_run_that_ends_while_preempted_has_the_preemption_abandoned()
    test_an_operators_lr_scale_applied_just_before_the_preemption_is_adopted_while_preempted()
    for phase in ENDABLE:
        test_a_run_preempted_mid_incident_abandons_it_and_cancels_the_unanswered_command(phase)



def test_an_elastic_run_that_lost_only_the_warned_nodes_closes_the_preemption_shrunk():
    d = Driver()
    healthy_run(d, 30)
    acts = d.feed(RunPreemptedIn(step=31, now=d.now, signal="SIGTERM", deadline_s=20.0, save_s=0.3, verified=True,
                                 exit_code=75, ts=5000.0, scope="nodes", nodes=("group-a",), ranks_leaving=2, world=4))
    opened = [a for a in acts if isinstance(a, OpenIncident)]
    assert opened[0].evidence["scope"] == "nodes" and opened[0].evidence["nodes"] == ["group-a"]
    moved = [a for a in acts if isinstance(a, RecordTransition)]
    assert "group-a (2 of 4 ranks) leave" in moved[0].reason
    acts = d.feed(ProgressIn(step=31, now=d.now, ts=5012.0))  # the other nodes re-formed and train on
    assert [c.outcome for c in acts if isinstance(c, CloseIncident)] == ["shrunk"]
    rec = [a for a in acts if isinstance(a, RecordTransition)][0]
    assert rec.evidence["steps_lost"] == 0 and "without node(s) group-a" in rec.reason
