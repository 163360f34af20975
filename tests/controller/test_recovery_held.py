"""The recovery machine answers a held run, climbs its escalation ladder, and records what the
trainer (its own timeouts) or an operator decided without it (controller/recovery_others.py)."""

from __future__ import annotations

import pytest

from cliffguard.controller.recovery_state import RecoveryState
from cliffguard.controller.recovery_table import LADDER, TRANSITIONS, escalation_level, rung_of
from cliffguard.controller.recovery_types import (
    Alert,
    CheckpointIn,
    CloseIncident,
    MarkCommand,
    OpenIncident,
    Phase,
    RecordTransition,
    RecoveryConfig,
    SendCommand,
    TrainerTimeoutIn,
    VerdictIn,
)
from cliffguard.controller.rules.held import GUARD_HOLD
from cliffguard.controller.verdict import Action, Verdict
from cliffguard.core.enums import Level
from tests.controller import test_recovery as base
from tests.controller.test_recovery import ENDABLE, Driver, _drive_to_endable, healthy_run

CFG = RecoveryConfig(stable_window=5, recover_window=5, rollback_budget=10, command_timeout_s=10,
                     validate_timeout_s=20, max_attempts=2, escalate_within=20)


def hold(d: Driver, step: int, onset: int, skips: int = 3):
    v = Verdict(rule=GUARD_HOLD, level=Level.CRITICAL, step=step, onset_step=onset, action=Action.RECOVER,
                message=f"the trainer's guard holds for the controller: {skips} updates skipped",
                evidence={"guard": "hold", "skips": skips, "first_skip_step": onset, "held": True})
    return d.feed(VerdictIn(verdict=v, now=d.now))


def timeout(d: Driver, policy: str = "rollback", *, applied: bool = True, to_step: int | None = 20,
            at_step: int | None = None, lr_before: float | None = None, wait: str = "hold"):
    at = d.s.last_step if at_step is None else at_step
    before = d.s.lr_scale if lr_before is None else lr_before
    after = before * 0.5 if policy == "rollback" and applied else before
    return d.feed(TrainerTimeoutIn(step=to_step if policy == "rollback" and applied else at, now=d.now, wait=wait,
                                   policy=policy, applied=applied, waited_s=120.0, at_step=at,
                                   lr_scale_before=before, lr_scale=after, detail="restored step 20 from memory",
                                   first_bad_step=at - 4, to_step=to_step if policy == "rollback" else None,
                                   ts=d.now))


def _of(d: Driver, kind):
    return [a for a in d.actions if isinstance(a, kind)]


def stretch_resumed(d: Driver) -> None:
    """A corrupted stretch from 41: the loss rule's spike, pause at 43, validation normal, resume."""
    healthy_run(d, 40)
    d.spike(step=41, onset=41)
    d.steps(41, 42, level=Level.CRITICAL)
    d.ack()
    d.answer_validate(2.02)
    d.ack()
    assert d.s.phase is Phase.RUNNING and d.s.incident is None and d.s.previous.step == 42


def test_a_hold_soon_after_a_resume_is_answered_by_an_incident_a_rung_up():
    d = Driver(CFG)
    stretch_resumed(d)
    first = _of(d, OpenIncident)[0]
    d.steps(43, 45, level=Level.CRITICAL)  # the stretch goes on after the resume: the guard holds at 45
    acts = hold(d, step=45, onset=41, skips=5)
    assert d.s.phase is Phase.PAUSING and [a.type.value for a in acts if isinstance(a, SendCommand)] == ["pause"]
    second = _of(d, OpenIncident)[-1]
    assert second.rule == GUARD_HOLD and second.onset_step == 41
    assert second.evidence["escalation"]["level"] == 1 and second.evidence["escalation"]["follows"] == first.id
    assert d.s.incident.rung == 1 and d.s.incident.follows == first.id
    assert d.triggers()[-1] == "hold" and any(isinstance(a, Alert) and a.level == "critical" for a in acts)
    d.ack()
    d.answer_validate(2.01)  # validate again: the weights are fine (every bad update was skipped)
    d.ack()
    assert d.s.phase is Phase.RUNNING and d.s.lr_scale == 1.0
    assert [a.outcome for a in _of(d, CloseIncident)] == ["resumed", "resumed"]
    assert _of(d, CloseIncident)[-1].escalation == 1 and d.s.previous.rung == 1


def test_a_hold_while_the_machines_command_is_on_its_way_is_noted_not_answered_twice():
    for phase in (Phase.PAUSING, Phase.VALIDATING, Phase.ROLLING_BACK, Phase.RESUMING):
        d = _drive_to_endable(phase)
        inc, sent = d.s.incident, len(d.commands())
        acts = hold(d, step=33, onset=31)
        (rec,) = [a for a in acts if isinstance(a, RecordTransition)]
        assert (rec.from_state, rec.to_state, rec.trigger, rec.incident_id) == (phase, phase, "hold", inc.id)
        assert "answers it" in rec.reason and len(d.commands()) == sent and d.s.incident.id == inc.id


def test_an_excursion_long_after_the_previous_incident_starts_on_the_first_rung():
    d = Driver(CFG)
    stretch_resumed(d)
    d.steps(43, 80)
    hold(d, step=81, onset=79)
    assert d.s.incident.rung == 0 and "escalation" not in _of(d, OpenIncident)[-1].evidence
    assert escalation_level(CFG, d.s, 81 + CFG.escalate_within) == 0
    assert escalation_level(RecoveryConfig(escalate_within=0), d.s, 43) == 0  # 0: never


def _recover_from(d: Driver, spike_step: int, target: int) -> None:
    d.spike(step=spike_step, onset=spike_step)
    d.ack()
    d.answer_validate(3.0)
    assert d.commands()[-1][0] == "rollback" and d.commands()[-1][1]["to_step"] == target
    d.ack(detail="memory")
    d.steps(target + 1, target + CFG.recover_window)
    assert d.s.phase is Phase.RUNNING


def test_the_ladder_rolls_back_further_with_deeper_cuts_then_halts_for_a_human():
    d = Driver(CFG)
    d.steps(0, 9)
    for step in (10, 20, 30, 40):
        d.feed(CheckpointIn(step=step, kind="memory", verified=True, now=d.now))
        d.steps(step, step + 9)
    d.validate(2.0, step=49)
    d.steps(50, 60)
    _recover_from(d, 60, 40)  # rung 0: the newest stable checkpoint, LR x0.5
    _recover_from(d, 46, 30)  # soon after: rung 1, before the previous target (40), LR x0.25
    _recover_from(d, 36, 20)  # rung 2, LR x0.125
    rollbacks = [args["lr_scale"] for c, args in d.commands() if c == "rollback"]
    assert rollbacks == [0.5, 0.125, 0.015625]
    closes = _of(d, CloseIncident)
    assert [(c.escalation, c.lr_scales) for c in closes] == [(0, (0.5,)), (1, (0.125,)), (2, (0.015625,))]
    d.spike(step=26, onset=26)  # and again: the last rung
    assert d.s.incident.rung == 3 and rung_of(3).halt and rung_of(99) == LADDER[-1]
    d.ack()  # the pause applies: no validation, a human decides
    assert d.s.phase is Phase.HALTED and d.triggers()[-1] == "escalation_spent"
    assert d.commands()[-1][0] == "pause" and _of(d, CloseIncident)[-1].outcome == "halted"
    assert d.s.previous is None  # the human's decision starts the ladder afresh


def test_a_hold_while_recovering_means_the_rollback_did_not_cure_the_run():
    d = _drive_to_endable(Phase.RECOVERING)
    inc = d.s.incident
    hold(d, step=24, onset=22)
    assert d.s.phase is Phase.PAUSING and d.s.incident.id == inc.id and d.s.incident.rung == 1
    assert d.triggers()[-1] == "hold" and "rung 1" in _of(d, RecordTransition)[-1].reason


@pytest.mark.parametrize("phase", [Phase.RUNNING, *ENDABLE])
def test_a_trainer_timeout_rollback_is_an_incident_saying_who_cut_the_lr_and_why(phase):
    if phase is Phase.RUNNING:
        d = Driver(CFG)
        healthy_run(d, 40)
    else:
        d = _drive_to_endable(phase)
    inc, pend, lr = d.s.incident, d.s.pending, d.s.lr_scale
    acts = timeout(d, "rollback", to_step=20, at_step=44)
    assert d.s.phase is Phase.RECOVERING and d.s.lr_scale == lr * 0.5 and d.s.last_step == 20
    assert d.s.incident.rollback_to == 20 and d.s.incident.lr_scales[-1] == lr * 0.5
    (rec,) = [a for a in acts if isinstance(a, RecordTransition)]
    assert (rec.from_state, rec.trigger) == (phase, "trainer_rolled_back")
    assert "decided by the trainer-side timeout" in rec.reason and f"-> {lr * 0.5:g}" in rec.reason
    assert rec.evidence["decided_by"] == "trainer-side timeout" and rec.evidence["cause"] == "held"
    if inc is None:
        (opened,) = [a for a in acts if isinstance(a, OpenIncident)]
        assert opened.rule == "trainer_timeout" and opened.onset_step == 40 and opened.evidence["waited_s"] == 120
    else:
        assert d.s.incident.id == inc.id and not any(isinstance(a, OpenIncident) for a in acts)
    marks = [a for a in acts if isinstance(a, MarkCommand)]
    assert [(m.id, m.status) for m in marks] == ([(pend.id, "cancelled")] if pend else [])
    assert d.s.pending is None
    assert [a.level for a in acts if isinstance(a, Alert)] == ["critical"]
    again = TrainerTimeoutIn(step=20, now=d.now, wait="hold", policy="rollback", applied=True, waited_s=120.0,
                             at_step=44, lr_scale_before=lr, lr_scale=lr * 0.5, to_step=20, ts=d.now)
    assert d.feed(again) == [] and d.s.incident.rollbacks == (inc.rollbacks + 1 if inc else 1)  # a re-read
    d.steps(21, 21 + CFG.recover_window)  # then recovered like a rollback of the machine's own
    assert d.s.phase is Phase.RUNNING and _of(d, CloseIncident)[-1].outcome == "rolled_back"


@pytest.mark.parametrize("phase", [Phase.RUNNING, *ENDABLE])
@pytest.mark.parametrize(("policy", "applied", "to", "outcome"), [
    ("resume", True, Phase.RUNNING, "resumed"), ("stop", True, Phase.HALTED, "halted"),
    ("rollback", False, Phase.HALTED, "halted")])
def test_a_trainer_timeout_resume_or_stop_closes_the_incident(phase, policy, applied, to, outcome):
    if phase is Phase.RUNNING:
        d = Driver(CFG)
        healthy_run(d, 40)
    else:
        d = _drive_to_endable(phase)
    acts = timeout(d, policy, applied=applied, to_step=None)
    assert d.s.phase is to and d.s.pending is None
    (close,) = [a for a in acts if isinstance(a, CloseIncident)]
    assert close.outcome == ("halted" if phase is Phase.HALTED else outcome)
    rec = [a for a in acts if isinstance(a, RecordTransition)][-1]
    assert rec.trigger == ("trainer_resumed" if policy == "resume" else "trainer_stopped")
    assert (d.s.incident is None) == (to is Phase.RUNNING)


@pytest.mark.parametrize("phase", [Phase.RUNNING, *ENDABLE])
def test_an_operators_lr_scale_becomes_the_runs_with_a_record_of_who_set_it(phase):
    if phase is Phase.RUNNING:
        d = Driver(CFG)
        healthy_run(d, 40)
    else:
        d = _drive_to_endable(phase)
    before, phase_before = d.s.lr_scale, d.s.phase
    from cliffguard.controller.recovery_types import AckIn
    from cliffguard.core.enums import AckStatus

    acts = d.feed(AckIn(cmd_id="e" * 32, status=AckStatus.APPLIED, now=d.now, cmd_type="set_lr_scale",
                        detail="lr_scale=0.3 from step 44", args={"lr_scale": 0.3}))
    assert d.s.lr_scale == 0.3 and d.s.phase is phase_before
    (rec,) = [a for a in acts if isinstance(a, RecordTransition)]
    assert rec.trigger == "operator_lr_scale" and rec.evidence == {
        "cmd": "e" * 32, "cmd_type": "set_lr_scale", "detail": "lr_scale=0.3 from step 44", "decided_by": "operator",
        "lr_scale_before": before, "lr_scale": 0.3}
    # the same scale again changes nothing; a command the machine sent is not an operator's
    assert d.feed(AckIn(cmd_id="f" * 32, status=AckStatus.APPLIED, now=d.now, cmd_type="set_lr_scale",
                        args={"lr_scale": 0.3})) == []


def test_the_escalation_state_survives_a_reload():
    d = Driver(CFG)
    stretch_resumed(d)
    d.steps(43, 45, level=Level.CRITICAL)
    hold(d, step=45, onset=41)
    back = RecoveryState.from_state_dict(d.s.state_dict())
    assert back.state_dict() == d.s.state_dict()
    assert back.incident.rung == 1 and back.previous == d.s.previous


def test_zz_every_declared_transition_is_taken_somewhere():
    """Runs last: replays the scenarios of tests/controller/test_recovery.py and of this module and
    collects the edges they took."""
    taken: set[tuple[Phase, str]] = set()
    import cliffguard.controller.recovery_step as rec  # Step.move fires through it

    original = rec.fire

    def spy(phase, trigger):
        taken.add((phase, trigger))
        return original(phase, trigger)

    rec.fire = spy
    try:
        for fn in (base.test_spike_then_abnormal_validation_rolls_back_to_newest_stable_checkpoint_before_onset,
                   base.test_spike_then_normal_validation_resumes_and_stabilises_checkpoints,
                   base.test_repeated_spikes_exhaust_the_budget_and_halt, base.test_no_stable_checkpoint_halts,
                   base.test_failed_rollback_picks_an_older_stable_checkpoint_then_halts,
                   base.test_a_run_that_can_pause_but_not_roll_back_is_validated_then_halted_paused):
            fn()
        for phase in (Phase.PAUSING, Phase.VALIDATING, Phase.ROLLING_BACK, Phase.RESUMING):
            base.test_each_waiting_phase_retries_gives_up_and_halts_on_refusal(phase)
        for phase in ENDABLE:
            base.test_run_end_mid_incident_closes_it_and_cancels_the_unanswered_command(phase)
        _take_every_transition_of_this_module()
        from tests.controller.test_recovery_preempt import take_every_preemption_transition

        take_every_preemption_transition()
        from tests.controller.test_recovery_triage import take_every_triage_transition

        take_every_triage_transition()
        from tests.controller.test_recovery_sdc import take_every_sdc_transition

        take_every_sdc_transition()
        from tests.controller.test_recovery_suspect import take_every_suspect_transition

        take_every_suspect_transition()
        from tests.controller.test_recovery_evict_device import take_every_device_eviction_transition

        take_every_device_eviction_transition()
        from tests.controller.test_recovery_budgets import take_every_budget_transition

        take_every_budget_transition()
    finally:
        rec.fire = original
    assert taken - base.HANG_MOVES == set(TRANSITIONS) - base.HANG_MOVES  # the hang moves: test_recovery_hang.py


def _take_every_transition_of_this_module() -> None:
    test_a_hold_soon_after_a_resume_is_answered_by_an_incident_a_rung_up()
    test_a_hold_while_the_machines_command_is_on_its_way_is_noted_not_answered_twice()
    test_a_hold_while_recovering_means_the_rollback_did_not_cure_the_run()
    test_the_ladder_rolls_back_further_with_deeper_cuts_then_halts_for_a_human()
    for phase in (Phase.RUNNING, *ENDABLE):
        test_a_trainer_timeout_rollback_is_an_incident_saying_who_cut_the_lr_and_why(phase)
        test_a_trainer_timeout_resume_or_stop_closes_the_incident(phase, "resume", True, Phase.RUNNING, "resumed")
        test_a_trainer_timeout_resume_or_stop_closes_the_incident(phase, "stop", True, Phase.HALTED, "halted")
        test_an_operators_lr_scale_becomes_the_runs_with_a_record_of_who_set_it(phase)
