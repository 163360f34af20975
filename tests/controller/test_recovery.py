"""The recovery state machine: every declared transition, every guard, illegal moves raise."""

from __future__ import annotations

import json
import math

import pytest

from cliffguard.controller.recovery import new_state, transition
from cliffguard.controller.recovery_state import RecoveryState
from cliffguard.controller.recovery_table import GUARDS, TRANSITIONS, TransitionNotAllowed, fire, is_recovered
from cliffguard.controller.recovery_types import (
    AckIn,
    Alert,
    CheckpointIn,
    CloseIncident,
    FlagSamples,
    MarkCommand,
    MarkStable,
    OpenIncident,
    Phase,
    ProgressIn,
    RecordTransition,
    RecoveryConfig,
    RunEndedIn,
    SendCommand,
    StartedIn,
    TickIn,
    Trigger,
    ValidationIn,
    VerdictIn,
)
from cliffguard.controller.verdict import Action, Verdict
from cliffguard.core.deployment import PolicyConfig
from cliffguard.core.enums import AckStatus, CommandType, Level

HANG_TRIGGERS = {Trigger.HANG, Trigger.HANG_AGAIN, Trigger.NODE_CHECK_FAILED, Trigger.RESTART_UNAVAILABLE,
                 Trigger.RESTART_BUDGET_SPENT, Trigger.EXCLUDE_UNAVAILABLE, Trigger.WORKERS_STARTED,
                 Trigger.NODE_CHECK_PASSED, Trigger.TRAINING_AGAIN, Trigger.RESTART_TIMED_OUT}
HANG_MOVES = {(p, t) for p, t in TRANSITIONS
              if (t in HANG_TRIGGERS or p in (Phase.RESTARTING, Phase.REJOINING))
              and p is not Phase.PREEMPTED  # its first step again is a preemption's move: test_recovery_preempt
              and t is not Trigger.SUSPECT_NODE  # a suspect node's: tests/controller/test_recovery_suspect.py
              and t is not Trigger.EVICT_BUDGET_SPENT}  # the evict budget's: tests/controller/test_recovery_budgets.py
"""The hang moves (controller/recovery_hang.py), walked by tests/controller/test_recovery_hang.py."""
CFG = RecoveryConfig(stable_window=5, recover_window=5, rollback_budget=2, command_timeout_s=10,
                     validate_timeout_s=20, max_attempts=2, skip_data=True)


class Driver:
    """Feeds inputs through ``transition`` and keeps every action, like the service does."""

    def __init__(self, cfg: RecoveryConfig = CFG) -> None:
        self.cfg = cfg
        self.s = new_state("run-1", "salt")
        self.actions: list = []
        self.now = 1000.0

    def feed(self, inp):
        before = self.s.state_dict()
        self.s, acts = transition(self.cfg, self.s, inp)
        assert json.loads(json.dumps(before)) == before  # the input state was not touched
        self.actions += acts
        return acts

    def steps(self, first: int, last: int, per_step_samples: int = 8, level: Level | None = None):
        for step in range(first, last + 1):
            self.feed(ProgressIn(step=step, now=self.now, sample_start=step * per_step_samples,
                                 sample_end=(step + 1) * per_step_samples, loss_level=level))

    def spike(self, step: int, onset: int | None = None, rule: str = "loss_spike"):
        v = Verdict(rule=rule, level=Level.CRITICAL, step=step, message="7.1σ above median",
                    action=Action.RECOVER, onset_step=onset, evidence={"median": 2.0, "sigma": 0.1})
        return self.feed(VerdictIn(verdict=v, now=self.now))

    def ack(self, status=AckStatus.APPLIED, detail="", cmd_id=None, cmd_type=None):
        cmd = cmd_id or self.s.pending.id
        return self.feed(AckIn(cmd_id=cmd, status=status, now=self.now, cmd_type=cmd_type, detail=detail))

    def validate(self, val_loss: float, cmd: str | None = None, step: int | None = None):
        return self.feed(ValidationIn(step=self.s.last_step if step is None else step, val_loss=val_loss,
                                      batches=4, now=self.now, cmd=cmd))

    def answer_validate(self, val_loss: float):
        pend = self.s.pending
        assert pend.type is CommandType.VALIDATE
        self.ack()
        return self.validate(val_loss, cmd=pend.id)

    def commands(self):
        return [(a.type.value, a.args) for a in self.actions if isinstance(a, SendCommand)]

    def triggers(self):
        return [a.trigger for a in self.actions if isinstance(a, RecordTransition)]


def healthy_run(d: Driver, upto: int = 30) -> None:
    """Steps 0..upto with a checkpoint at 10 and 20 and a periodic validation baseline."""
    d.steps(0, 10)
    d.feed(CheckpointIn(step=10, kind="memory", verified=False, now=d.now))
    d.steps(11, 20)
    d.feed(CheckpointIn(step=20, kind="full", verified=True, now=d.now))
    d.validate(2.0, step=20)
    d.steps(21, upto)


def recovering_after_a_rollback(d: Driver) -> None:
    """A healthy run to 40, a spike at 41 (onset 39), abnormal validation, the rollback acked: the
    run is RECOVERING (what a fault found while recovering meets)."""
    healthy_run(d, 40)
    d.spike(41, onset=39)
    d.ack()
    d.answer_validate(9.0)
    d.ack()
    assert d.s.phase is Phase.RECOVERING


def test_table_declares_the_documented_machine():
    assert fire(Phase.RUNNING, "spike") is Phase.PAUSING
    assert fire(Phase.VALIDATING, "validation_abnormal") is Phase.ROLLING_BACK
    assert fire(Phase.VALIDATING, "validation_normal") is Phase.RESUMING
    assert fire(Phase.ROLLING_BACK, "rollback_applied") is Phase.RECOVERING
    assert fire(Phase.RECOVERING, "recovered") is Phase.RUNNING
    assert fire(Phase.RESUMING, "resume_applied") is Phase.RUNNING
    reachable = {to for to in TRANSITIONS.values()}
    assert reachable == set(Phase)  # every phase is entered by some transition


@pytest.mark.parametrize("phase", list(Phase))
def test_every_undeclared_move_raises(phase):
    triggers = {t for _, t in TRANSITIONS}
    for trig in triggers:
        if (phase, trig) in TRANSITIONS:
            continue
        with pytest.raises(TransitionNotAllowed) as exc:
            fire(phase, trig)
        assert exc.value.phase is phase and trig in str(exc.value)
    with pytest.raises(TransitionNotAllowed):
        fire(phase, "no_such_trigger")


def test_non_input_raises_type_error():
    with pytest.raises(TypeError):
        transition(CFG, new_state("r", "s"), object())  # type: ignore[arg-type]


def test_the_deployments_policy_sets_the_lr_cut_and_the_command_lifetime():
    import dataclasses

    d = Driver(dataclasses.replace(CFG, policy=PolicyConfig(lr_factor=0.25, command_ttl_s=12.0)))
    healthy_run(d, 40)
    d.spike(step=41, onset=39)
    d.ack()
    d.answer_validate(2.5)
    sent = [a for a in d.actions if isinstance(a, SendCommand)]
    assert sent[-1].args["lr_scale"] == 0.25
    assert {a.ttl_s for a in sent} == {12.0}


def test_spike_then_abnormal_validation_rolls_back_to_newest_stable_checkpoint_before_onset():
    d = Driver()
    healthy_run(d, 40)
    assert [c.stable for c in d.s.checkpoints] == [True, True]
    d.feed(CheckpointIn(step=38, kind="memory", verified=True, now=d.now))  # too recent to be stable
    acts = d.spike(step=41, onset=39)
    assert d.s.phase is Phase.PAUSING
    assert any(isinstance(a, OpenIncident) and a.onset_step == 39 and a.spike_step == 41 for a in acts)
    assert any(isinstance(a, Alert) and a.level == "critical" for a in acts)
    d.ack()
    assert d.s.phase is Phase.VALIDATING
    d.answer_validate(2.5)
    assert d.s.phase is Phase.ROLLING_BACK
    d.ack(detail="memory")
    assert d.s.phase is Phase.RECOVERING
    assert d.commands() == [
        ("pause", {"reason": d.commands()[0][1]["reason"]}),
        ("validate", {}),
        ("rollback", {"to_step": 20, "lr_scale": 0.5, "skip_data": [168, 328]}),
    ]
    rec = [a for a in d.actions if isinstance(a, RecordTransition)]
    abnormal = next(r for r in rec if r.trigger == "validation_abnormal")
    assert abnormal.evidence["val_loss"] == 2.5 and abnormal.evidence["baseline"] == 2.0
    assert abnormal.evidence["target"] == {"step": 20, "kind": "full"}
    assert "loss_spike" in rec[0].reason and rec[0].evidence["window"] == {"median": 2.0, "sigma": 0.1}
    assert rec[0].step == 41 and rec[1].step == 40  # the spike's own step, then the last step seen
    # checkpoints after the target belong to the abandoned branch
    assert [c.step for c in d.s.checkpoints] == [10, 20]
    d.steps(21, 24)
    assert d.s.phase is Phase.RECOVERING and not is_recovered(d.cfg, d.s)
    d.steps(25, 25)
    assert d.s.phase is Phase.RUNNING and d.s.incident is None
    close = [a for a in d.actions if isinstance(a, CloseIncident)]
    assert close[-1].outcome == "rolled_back" and close[-1].rollback_to == 20 and close[-1].lr_scale == 0.5
    assert d.triggers() == ["spike", "pause_applied", "validation_abnormal", "rollback_applied", "recovered"]


def test_spike_then_normal_validation_resumes_and_stabilises_checkpoints():
    d = Driver()
    healthy_run(d, 25)
    d.feed(CheckpointIn(step=24, kind="memory", verified=True, now=d.now))
    warn = Verdict(rule="loss_spike", level=Level.WARN, step=26, message="6σ (patience)", action=Action.ALERT)
    d.feed(VerdictIn(verdict=warn, now=d.now))
    d.steps(26, 26)
    d.spike(step=27, onset=26)
    d.steps(27, 27)
    d.ack()
    d.answer_validate(2.05)  # within 5% of the baseline
    assert d.s.phase is Phase.RESUMING
    flags = [a for a in d.actions if isinstance(a, FlagSamples)]
    assert [(f.step, f.ranges) for f in flags] == [(27, ((208, 216), (216, 224)))]
    assert flags[0].score == pytest.approx(2.05 / 2.0)
    assert any(isinstance(a, MarkStable) and a.step == 24 and "validation" in a.reason for a in d.actions)
    d.ack()
    assert d.s.phase is Phase.RUNNING and d.s.incident is None and d.s.lr_scale == 1.0
    assert [c for c, _ in d.commands()] == ["pause", "validate", "resume"]
    assert [a.outcome for a in d.actions if isinstance(a, CloseIncident)] == ["resumed"]
    assert any(isinstance(a, Alert) and a.action == "resolve" for a in d.actions)


def test_a_normal_validation_flags_the_bad_steps_run_while_the_pause_was_on_its_way():
    d = Driver()
    healthy_run(d, 25)
    d.spike(step=26, onset=26)  # an extreme spike: critical at its first step
    d.steps(26, 26, level=Level.CRITICAL)
    d.steps(27, 28, level=Level.WARN)  # the rest of the bad stretch ran before the pause landed
    d.steps(29, 30, level=Level.OK)  # healthy again before the pause landed: not flagged
    d.ack()
    d.answer_validate(2.05)
    flags = [a for a in d.actions if isinstance(a, FlagSamples)]
    assert [(f.step, f.ranges) for f in flags] == [(26, ((208, 216), (216, 224), (224, 232)))]


def test_a_resumed_excursion_that_goes_on_is_flagged_step_by_step_until_healthy():
    d = Driver()
    healthy_run(d, 25)
    d.spike(step=26, onset=26)
    d.steps(26, 26, level=Level.CRITICAL)
    d.ack()
    d.answer_validate(2.05)
    assert d.s.flagging == (26, pytest.approx(2.05 / 2.0), "loss_spike at step 26 was transient (validation normal)")
    restored = RecoveryState.from_state_dict(json.loads(json.dumps(d.s.state_dict())))
    assert restored.flagging == d.s.flagging
    d.ack()  # resumed: the rest of the bad stretch runs now
    assert d.s.phase is Phase.RUNNING
    d.steps(27, 27, level=Level.CRITICAL)
    d.steps(28, 28, level=Level.WARN)
    d.steps(29, 29, level=Level.OK)  # the excursion is over
    d.steps(30, 30, level=Level.WARN)  # a later warn is not this excursion's
    flags = [(f.step, f.ranges) for f in d.actions if isinstance(f, FlagSamples)]
    assert flags == [(26, ((208, 216),)), (27, ((216, 224),)), (28, ((224, 232),))]
    assert d.s.flagging is None


def test_a_new_incident_ends_the_flagging_of_a_resumed_excursion():
    d = Driver()
    healthy_run(d, 25)
    d.spike(step=26, onset=26)
    d.steps(26, 26, level=Level.CRITICAL)
    d.ack()
    d.answer_validate(2.05)
    d.ack()
    d.spike(step=27, onset=27)
    assert d.s.flagging is None and d.s.phase is Phase.PAUSING
    d.steps(27, 27, level=Level.CRITICAL)
    assert [f.step for f in d.actions if isinstance(f, FlagSamples)] == [26]


def test_repeated_spikes_exhaust_the_budget_and_halt():
    d = Driver()
    healthy_run(d, 40)
    for spike_step, target in ((41, 20), (24, 10)):
        d.spike(step=spike_step)
        d.ack()
        d.answer_validate(3.0)
        d.ack()
        assert d.s.phase is Phase.RECOVERING and d.s.incident.rollback_to == target
        d.steps(target + 1, target + 3)
    # the second spike came while recovering: the rollback did not cure the run, so the incident
    # climbed a rung of the escalation ladder: a longer rollback (to 10, before the first one's 20)
    # with the LR cut twice (0.5 -> 0.125)
    assert d.s.lr_scale == 0.125 and d.s.incident.lr_scales == (0.5, 0.125) and d.s.incident.rung == 1
    d.spike(step=13)  # a spike while recovering continues the same incident
    opened = [a for a in d.actions if isinstance(a, OpenIncident)]
    assert len(opened) == 1
    d.ack()
    d.answer_validate(3.0)
    assert d.s.phase is Phase.HALTED and d.s.pending is None
    assert [c for c, _ in d.commands()] == ["pause", "validate", "rollback"] * 2 + ["pause", "validate"]
    halt = [a for a in d.actions if isinstance(a, RecordTransition)][-1]
    assert halt.trigger == "budget_exhausted" and halt.evidence["rollbacks_in_window"] == 2
    assert any(isinstance(a, Alert) and a.level == "critical" and "halted" in a.title for a in d.actions)
    assert [a.outcome for a in d.actions if isinstance(a, CloseIncident)] == ["halted"]
    # halted ignores further spikes; an operator's applied resume brings it back
    assert d.spike(step=14) == [a for a in d.actions[-1:] if False]
    d.ack(cmd_id="f" * 32, cmd_type="resume", detail="by alice")
    assert d.s.phase is Phase.RUNNING and d.s.incident is None
    assert d.triggers()[-1] == "operator_resumed"


def test_budget_window_forgets_old_rollbacks():
    d = Driver(RecoveryConfig(stable_window=5, recover_window=5, rollback_budget=1, rollback_window_s=100))
    healthy_run(d, 40)
    d.spike(step=41)
    d.ack()
    d.answer_validate(3.0)
    d.ack()
    d.steps(21, 26)
    assert d.s.phase is Phase.RUNNING
    d.now += 101  # the first rollback is out of the window
    d.spike(step=27)
    d.ack()
    d.answer_validate(3.0)
    assert d.s.phase is Phase.ROLLING_BACK


def test_no_stable_checkpoint_halts():
    d = Driver()
    d.steps(0, 3)
    d.feed(CheckpointIn(step=2, kind="memory", verified=True, now=d.now))
    d.validate(2.0, step=3)  # passes: checkpoint 2 becomes stable...
    d.spike(step=4, onset=1)  # ...but the onset is before it
    d.ack()
    d.answer_validate(9.0)
    assert d.s.phase is Phase.HALTED
    assert d.triggers()[-1] == "no_target"


def test_validation_without_baseline_counts_as_abnormal_and_nonfinite_too():
    d = Driver()
    d.steps(0, 12)
    d.feed(CheckpointIn(step=5, kind="memory", verified=True, now=d.now))
    d.steps(13, 13)
    d.spike(step=14)
    d.ack()
    d.answer_validate(1.0)
    rec = [a for a in d.actions if isinstance(a, RecordTransition)][-1]
    assert rec.trigger == "validation_abnormal" and "no healthy validation baseline" in rec.reason
    d2 = Driver()
    healthy_run(d2, 30)
    d2.spike(step=31)
    d2.ack()
    d2.answer_validate(math.nan)
    assert d2.s.phase is Phase.ROLLING_BACK


def test_failed_rollback_picks_an_older_stable_checkpoint_then_halts():
    d = Driver()
    healthy_run(d, 30)
    d.spike(step=31)
    d.ack()
    d.answer_validate(3.0)
    d.ack(status=AckStatus.FAILED, detail="step 20 not available")
    assert d.s.phase is Phase.ROLLING_BACK
    assert d.commands()[-1] == ("rollback", {"to_step": 10, "lr_scale": 0.5, "skip_data": [88, 248]})
    d.ack(status=AckStatus.FAILED, detail="step 10 not available")
    assert d.s.phase is Phase.HALTED and d.triggers()[-2:] == ["rollback_failed", "no_target"]


def test_timeouts_retry_then_give_up_with_a_critical_alert():
    d = Driver()
    healthy_run(d, 30)
    d.spike(step=31)
    first = d.s.pending.id
    d.now += 5
    assert d.feed(TickIn(now=d.now)) == []  # not yet
    d.now += 6
    acts = d.feed(TickIn(now=d.now))
    assert any(isinstance(a, MarkCommand) and a.id == first and a.status == "timeout" for a in acts)
    assert d.s.pending.attempt == 2 and d.s.pending.id != first and d.s.phase is Phase.PAUSING
    d.ack(cmd_id=first)  # a late ack of the first copy is not ours any more: ignored
    assert d.s.phase is Phase.PAUSING
    d.now += 11
    d.feed(TickIn(now=d.now))
    assert d.s.phase is Phase.HALTED and d.triggers()[-2:] == ["command_retry", "command_gave_up"]
    assert d.commands() == [("pause", d.commands()[0][1])] * 2
    assert d.feed(TickIn(now=d.now + 100)) == []  # nothing pending once halted


def test_validate_waits_longer_and_an_expired_ack_retries():
    d = Driver()
    healthy_run(d, 30)
    d.spike(step=31)
    d.ack()
    d.ack()  # validate applied; the validation event is still due
    assert d.s.pending.acked and d.s.phase is Phase.VALIDATING
    d.now += 15
    assert d.feed(TickIn(now=d.now)) == []  # validate_timeout_s = 20
    d.ack(status=AckStatus.EXPIRED)
    assert d.s.phase is Phase.VALIDATING and d.s.pending.attempt == 2
    d.ack(status=AckStatus.DUPLICATE)
    assert d.s.phase is Phase.VALIDATING and d.s.pending.attempt == 2


@pytest.mark.parametrize("status", [AckStatus.REJECTED, AckStatus.FAILED])
def test_refused_command_halts(status):
    d = Driver()
    healthy_run(d, 30)
    d.spike(step=31)
    d.ack(status=status, detail="bad_signature")
    assert d.s.phase is Phase.HALTED and d.triggers()[-1] == "command_refused"


def test_stale_validation_and_acks_change_nothing():
    d = Driver()
    healthy_run(d, 30)
    s0 = d.s.state_dict()
    assert d.validate(9.0, cmd="a" * 32) == []
    assert d.ack(cmd_id="b" * 32, cmd_type="resume") == []  # operator ack while running
    assert d.s.state_dict() == s0


def test_alert_verdicts_alert_and_mark_steps_unhealthy():
    d = Driver()
    d.steps(0, 10)
    d.feed(CheckpointIn(step=10, kind="memory", verified=True, now=d.now))
    warn = Verdict(rule="loss_spike", level=Level.WARN, step=12, message="3.4σ", action=Action.ALERT)
    acts = d.feed(VerdictIn(verdict=warn, now=d.now))
    assert [a.level for a in acts if isinstance(a, Alert)] == ["warn"]
    ok = Verdict(rule="mfu_low", level=Level.OK, step=12, message="", action=Action.ALERT)
    assert d.feed(VerdictIn(verdict=ok, now=d.now)) == []
    d.steps(11, 30)
    assert not d.s.checkpoints[0].stable  # step 12 was unhealthy within 5 steps of it
    d.spike(step=31)
    assert d.spike(step=32) == []  # already pausing: no second incident


def test_a_checkpoint_whose_own_step_was_unhealthy_never_becomes_stable_by_window():
    d = Driver()
    d.steps(0, 10)
    d.feed(CheckpointIn(step=10, kind="memory", verified=True, now=d.now))
    warn = Verdict(rule="divergence", level=Level.WARN, step=10, message="rising", action=Action.ALERT)
    d.feed(VerdictIn(verdict=warn, now=d.now))  # the checkpoint holds the state *before* step 10 ran
    d.feed(CheckpointIn(step=11, kind="memory", verified=True, now=d.now))
    d.steps(11, 30)
    assert [(c.step, c.stable) for c in d.s.checkpoints] == [(10, False), (11, True)]


def test_periodic_validation_above_baseline_alerts_and_is_kept_out_of_the_baseline():
    d = Driver()
    d.validate(2.0, step=1)
    acts = d.validate(2.5, step=2)
    assert [a.rule for a in acts if isinstance(a, Alert)] == ["validation"]
    assert d.s.val_baseline == (2.0,)
    d.validate(math.inf, step=3)
    d2 = Driver()
    d2.validate(math.nan, step=1)  # no baseline and non-finite: nothing learned
    assert d2.s.val_baseline == () and d2.s.baseline() is None
    d2.validate(1.0)
    d2.validate(1.04)
    assert d2.s.baseline() == pytest.approx(1.02)


def test_checkpoints_unverified_duplicates_and_the_memory_bound():
    d = Driver(RecoveryConfig(max_checkpoints=3, stable_window=2))
    d.feed(CheckpointIn(step=1, kind="full", verified=False, now=d.now))
    assert d.s.checkpoints == ()
    for step in range(0, 8):
        d.steps(step, step)
        d.feed(CheckpointIn(step=step, kind="memory", verified=True, now=d.now))
        d.feed(CheckpointIn(step=step, kind="full", verified=True, now=d.now))  # same step: kept once
    assert [c.step for c in d.s.checkpoints] == [5, 6, 7]
    d.validate(1.0)
    d.feed(CheckpointIn(step=8, kind="memory", verified=True, now=d.now))
    assert [c.step for c in d.s.checkpoints] == [6, 7, 8]  # all stable: the oldest goes
    d.feed(ProgressIn(step=9, now=d.now))  # a trainer that does not report sample ranges
    assert d.s.last_step == 9 and d.s.last_sample_end == 64
    recent = d.s.unhealthy_samples
    d.feed(ProgressIn(step=10, now=d.now, sample_end=88))  # an end without a start: no range to keep
    assert d.s.last_sample_end == 88 and d.s.unhealthy_samples == recent
    d3 = Driver(RecoveryConfig(max_checkpoints=3, stable_window=100))
    d3.steps(0, 0)
    d3.feed(CheckpointIn(step=0, kind="full", verified=True, now=d3.now))
    d3.validate(1.0)
    for step in (1, 2, 3):
        d3.feed(CheckpointIn(step=step, kind="memory", verified=True, now=d3.now))
    assert [c.step for c in d3.s.checkpoints] == [0, 2, 3]  # the newest stable one is never forgotten


def test_state_dict_round_trips_mid_incident():
    d = Driver()
    healthy_run(d, 30)
    d.spike(step=31, onset=29)
    d.ack()
    blob = json.dumps(d.s.state_dict())
    restored = RecoveryState.from_state_dict(json.loads(blob))
    assert restored.state_dict() == d.s.state_dict()
    other = new_state("x", "y")
    other.load_state_dict(json.loads(blob))
    assert other == d.s
    d.s = other
    d.answer_validate(2.0)
    assert d.s.phase is Phase.RESUMING


def test_ids_are_deterministic_per_salt_and_unique():
    a, b, c = Driver(), Driver(), Driver()
    c.s = new_state("run-1", "other-salt")
    for d in (a, b, c):
        healthy_run(d, 30)
        d.spike(step=31)
    assert a.s.pending.id == b.s.pending.id != c.s.pending.id
    assert len({a.s.incident.id, a.s.pending.id}) == 2


def test_every_guard_is_exercised_by_name():
    assert set(GUARDS) == {"starts_incident", "is_abnormal", "within_budget", "rollback_target", "can_retry",
                           "timed_out", "is_recovered", "is_stable", "is_ours", "escalation_spent",
                           # the hang moves' (tests/controller/test_recovery_hang.py)
                           "starts_restart", "can_restart", "within_restart_budget", "wants_exclusion", "can_exclude",
                           "restart_timed_out", "trains_on",
                           "device_only",  # a device-level eviction's (tests/controller/test_recovery_evict_device.py)
                           "starts_sdc", "sdc_repeats",  # a diverged replica's (tests/controller/test_recovery_sdc.py)
                           # the budgets' (tests/controller/test_recovery_budgets.py)
                           "within_evict_budget", "within_retry_budget", "within_rerun_budget"}
    s = new_state("r", "s")
    assert GUARDS["timed_out"](CFG, s, 1e9) is False  # nothing pending
    assert GUARDS["can_retry"](CFG, s) is False


@pytest.mark.parametrize("field,value", [
    ("stable_window", 0), ("recover_window", 0), ("rollback_budget", -1),
    ("rollback_window_s", 0), ("val_margin_rel", -1), ("baseline_window", 0), ("command_timeout_s", 0),
    ("max_attempts", 0), ("max_checkpoints", 0),
])
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError) as exc:
        RecoveryConfig(**{field: value})
    assert str(exc.value).split(":")[0] in (field, "val_margin_rel", "command_timeout_s")


def _drive_to(phase: Phase) -> Driver:
    d = Driver()
    healthy_run(d, 30)
    d.spike(step=31)
    if phase is Phase.PAUSING:
        return d
    d.ack()
    if phase is Phase.VALIDATING:
        return d
    d.answer_validate(3.0 if phase is Phase.ROLLING_BACK else 2.0)
    assert d.s.phase is phase
    return d


@pytest.mark.parametrize("phase", [Phase.PAUSING, Phase.VALIDATING, Phase.ROLLING_BACK, Phase.RESUMING])
def test_each_waiting_phase_retries_gives_up_and_halts_on_refusal(phase):
    d = _drive_to(phase)
    cmd_type = d.s.pending.type
    d.now += 1000
    d.feed(TickIn(now=d.now))
    assert d.s.phase is phase and d.s.pending.attempt == 2 and d.commands()[-1][0] == cmd_type.value
    d.now += 1000
    d.feed(TickIn(now=d.now))
    assert d.s.phase is Phase.HALTED
    d2 = _drive_to(phase)
    d2.ack(status=AckStatus.REJECTED, detail="bad_signature")
    assert d2.s.phase is Phase.HALTED


ENDABLE = [Phase.PAUSING, Phase.VALIDATING, Phase.ROLLING_BACK, Phase.RECOVERING, Phase.RESUMING, Phase.HALTED]


def _drive_to_endable(phase: Phase) -> Driver:
    if phase is Phase.RECOVERING:
        d = _drive_to(Phase.ROLLING_BACK)
        d.ack(detail="memory")
    elif phase is Phase.HALTED:
        d = _drive_to(Phase.PAUSING)
        d.ack(status=AckStatus.REJECTED, detail="bad_signature")
    else:
        d = _drive_to(phase)
    assert d.s.phase is phase and d.s.incident is not None
    return d


@pytest.mark.parametrize("phase", ENDABLE)
def test_run_end_mid_incident_closes_it_and_cancels_the_unanswered_command(phase):
    d = _drive_to_endable(phase)
    inc, pend, lr = d.s.incident, d.s.pending, d.s.lr_scale
    d.now += 5
    acts = d.feed(RunEndedIn(now=d.now, failed=True, detail="CUDA error"))
    assert d.s.phase is Phase.RUNNING and d.s.incident is None and d.s.pending is None
    rec = [a for a in acts if isinstance(a, RecordTransition)]
    assert [(r.from_state, r.to_state, r.trigger) for r in rec] == [(phase, Phase.RUNNING, "run_ended")]
    assert rec[0].incident_id == inc.id and "failed" in rec[0].reason and "CUDA error" in rec[0].reason
    assert rec[0].evidence["phase"] == phase and rec[0].evidence["cmd"] == (pend.id if pend else None)
    # halted already asked a human and says so; every other phase was cut short by the run's end
    outcome = "halted" if phase is Phase.HALTED else "abandoned"
    assert [a for a in acts if isinstance(a, CloseIncident)] == [
        CloseIncident(id=inc.id, outcome=outcome, closed_at=d.now, rollback_to=inc.rollback_to, lr_scale=lr,
                      lr_scales=inc.lr_scales, escalation=inc.rung)]
    expect_marks = [MarkCommand(id=pend.id, status="cancelled", detail="the run failed before answering")] if pend else []
    assert [a for a in acts if isinstance(a, MarkCommand)] == expect_marks
    assert [(a.level, a.action, a.incident_id) for a in acts if isinstance(a, Alert)] == [("warn", "resolve", inc.id)]
    assert not any(isinstance(a, SendCommand) for a in acts)
    # later events are harmless: a second end, a late ack of the cancelled command
    assert d.feed(RunEndedIn(now=d.now + 1, failed=False)) == []
    if pend is not None:
        assert d.ack(cmd_id=pend.id) == [] and d.s.phase is Phase.RUNNING


def test_run_end_without_incident_is_a_no_op_and_an_applied_validate_is_not_cancelled():
    d = Driver()
    healthy_run(d, 30)
    before = d.s.state_dict()
    assert d.feed(RunEndedIn(now=d.now, failed=False)) == [] and d.s.state_dict() == before
    with pytest.raises(TransitionNotAllowed):
        fire(Phase.RUNNING, "run_ended")
    d.spike(step=31)
    d.ack()  # pause applied
    d.ack()  # validate applied; its result never comes
    acts = d.feed(RunEndedIn(now=d.now, failed=False))
    assert d.s.phase is Phase.RUNNING and not any(isinstance(a, MarkCommand) for a in acts)
    rec = next(a for a in acts if isinstance(a, RecordTransition))
    assert rec.reason == "the run finished while validating; incident abandoned"
    assert [a.outcome for a in acts if isinstance(a, CloseIncident)] == ["abandoned"]
    d.spike(step=40)  # a restarted run under the same id is watched again
    assert d.s.phase is Phase.PAUSING and d.s.incident is not None


def test_a_failed_rollback_to_a_memory_snapshot_forgets_the_older_memory_snapshots_not_the_disk_ones():
    d = Driver()
    d.steps(0, 4)
    d.feed(CheckpointIn(step=5, kind="full", verified=True, now=d.now))
    for step in (10, 20, 30):
        d.steps(step - 5 if step > 10 else 5, step)
        d.feed(CheckpointIn(step=step, kind="memory", verified=True, now=d.now))
    d.validate(2.0, step=30)  # every checkpoint so far is stable
    d.steps(31, 40)
    d.spike(step=41, onset=39)
    d.ack()
    d.answer_validate(5.0)
    assert d.commands()[-1][1]["to_step"] == 30
    d.ack(status=AckStatus.FAILED, detail="step 30 is not available")
    # 20 and 10 were in the same ring, older: gone too; the disk checkpoint at 5 is the next target
    assert d.commands()[-1][1]["to_step"] == 5 and d.commands()[-1][1]["lr_scale"] == 0.5
    assert [c.step for c in d.s.checkpoints] == [5]


def test_a_failed_rollback_that_says_what_the_trainer_holds_goes_straight_to_one_of_those():
    d = Driver()
    d.steps(0, 4)
    d.feed(CheckpointIn(step=5, kind="full", verified=True, now=d.now))
    for step in (10, 20, 30):
        d.steps(step - 5 if step > 10 else 5, step)
        d.feed(CheckpointIn(step=step, kind="incremental", verified=True, now=d.now))
    d.validate(2.0, step=30)
    d.steps(31, 40)
    d.spike(step=41, onset=39)
    d.ack()
    d.answer_validate(5.0)
    assert d.commands()[-1][1]["to_step"] == 30
    # the trainer's retention pruned 10..30 (a newer full checkpoint replaced them): no blind retry of 20, 10
    d.feed(AckIn(cmd_id=d.s.pending.id, status=AckStatus.FAILED, now=d.now, detail="step 30 is not available",
                 available=(5, 38)))
    assert d.commands()[-1][1]["to_step"] == 5
    assert [c.step for c in d.s.checkpoints] == [5]


def test_a_disk_checkpoint_after_the_memory_snapshot_of_its_step_outlives_the_ring():
    d = Driver()
    d.steps(0, 9)
    d.feed(CheckpointIn(step=10, kind="memory", verified=True, now=d.now))
    d.feed(CheckpointIn(step=10, kind="incremental", verified=True, now=d.now))  # same step, on disk too
    assert [(c.step, c.kind) for c in d.s.checkpoints] == [(10, "incremental")]


def _with_capabilities(*caps: CommandType) -> Driver:
    d = Driver()
    d.feed(StartedIn(capabilities=caps, now=d.now))
    return d


def test_an_alert_only_run_gets_a_critical_alert_for_a_spike_and_no_incident_or_command():
    d = _with_capabilities()
    healthy_run(d, 30)
    acts = d.spike(step=31)
    assert d.s.phase is Phase.RUNNING and d.s.incident is None and d.s.pending is None
    assert not any(isinstance(a, (SendCommand, OpenIncident, RecordTransition)) for a in acts)
    alerts = [a for a in acts if isinstance(a, Alert)]
    assert [(a.level, a.rule) for a in alerts] == [("critical", "loss_spike")]
    assert "cannot pause, validate, resume" in alerts[0].title and alerts[0].evidence["capabilities"] == []
    d.now += 1000
    assert d.feed(TickIn(now=d.now)) == []  # nothing pending, nothing to time out


def test_pause_without_validate_or_resume_is_no_pause_cycle():
    d = _with_capabilities(CommandType.PAUSE, CommandType.ROLLBACK)
    healthy_run(d, 30)
    acts = d.spike(step=31)
    assert d.commands() == [] and d.s.phase is Phase.RUNNING
    assert "cannot validate, resume" in next(a for a in acts if isinstance(a, Alert)).title


def test_a_run_that_can_pause_but_not_roll_back_is_validated_then_halted_paused():
    d = _with_capabilities(CommandType.PAUSE, CommandType.VALIDATE, CommandType.RESUME)
    healthy_run(d, 30)
    d.spike(step=31, onset=29)
    d.ack()
    acts = d.answer_validate(5.0)
    assert d.s.phase is Phase.HALTED and d.s.pending is None and d.s.lr_scale == 1.0
    assert [c for c, _ in d.commands()] == ["pause", "validate"]  # no rollback, no resume: it stays paused
    rec = next(a for a in acts if isinstance(a, RecordTransition))
    assert rec.trigger == "rollback_unsupported" and rec.evidence["capabilities"] == ["pause", "resume", "validate"]
    assert [(a.level, "human needed" in a.title) for a in acts if isinstance(a, Alert)] == [("critical", True)]
    assert [a.outcome for a in acts if isinstance(a, CloseIncident)] == ["halted"]


def test_the_same_run_with_rollback_rolls_back_and_a_normal_validation_resumes_either_way():
    d = _with_capabilities(CommandType.PAUSE, CommandType.VALIDATE, CommandType.RESUME, CommandType.ROLLBACK)
    healthy_run(d, 30)
    d.spike(step=31, onset=29)
    d.ack()
    d.answer_validate(5.0)
    assert d.s.phase is Phase.ROLLING_BACK
    n = _with_capabilities(CommandType.PAUSE, CommandType.VALIDATE, CommandType.RESUME)
    healthy_run(n, 30)
    n.spike(step=31)
    n.ack()
    n.answer_validate(2.0)
    assert n.s.phase is Phase.RESUMING and [c for c, _ in n.commands()] == ["pause", "validate", "resume"]


def test_capabilities_default_to_every_command_and_survive_the_state_dict():
    assert new_state("r", "s").capabilities == tuple(CommandType)
    d = _with_capabilities(CommandType.VALIDATE, CommandType.PAUSE)
    assert d.s.capabilities == (CommandType.PAUSE, CommandType.VALIDATE)  # the enum's order, each once
    restored = RecoveryState.from_state_dict(json.loads(json.dumps(d.s.state_dict())))
    assert restored.capabilities == (CommandType.PAUSE, CommandType.VALIDATE)
    old = d.s.state_dict()
    del old["capabilities"]  # saved by a controller from before capabilities
    assert RecoveryState.from_state_dict(old).capabilities == tuple(CommandType)
    # a restart that declares more (a newer agent under the same run id) is believed
    d.feed(StartedIn(capabilities=tuple(CommandType), now=d.now))
    healthy_run(d, 30)
    d.spike(step=31)
    assert d.s.phase is Phase.PAUSING


def test_a_straggler_alert_also_asks_for_per_rank_detail_without_taking_the_command_slot():
    from cliffguard.controller.recovery import transition as step_machine
    from cliffguard.controller.recovery_types import RecoveryConfig, SendCommand, VerdictIn
    from cliffguard.controller.verdict import Verdict
    from cliffguard.core.enums import CommandType, Level

    cfg = RecoveryConfig(detail_steps=30)
    state = new_state("r", "salt")
    v = Verdict(rule="straggler", level=Level.WARN, step=50, message="rank 3 slow", rank=3)
    after, acts = step_machine(cfg, state, VerdictIn(verdict=v, now=1.0))
    sends = [a for a in acts if isinstance(a, SendCommand)]
    assert [(a.type, a.args) for a in sends] == [(CommandType.DETAIL, {"steps": 30})]
    assert after.pending is None
    other = Verdict(rule="mfu_low", level=Level.WARN, step=50, message="low")
    assert not [a for a in step_machine(cfg, state, VerdictIn(verdict=other, now=1.0))[1] if isinstance(a, SendCommand)]


def test_an_unverified_checkpoint_raises_an_alert_with_the_trainers_reason():
    d = Driver()
    d.steps(0, 5)
    _, acts = transition(d.cfg, d.s, CheckpointIn(step=5, kind="full", verified=False, now=d.now,
                                                  detail="write failed: No space left on device"))
    (alert,) = [a for a in acts if isinstance(a, Alert)]
    assert (alert.rule, alert.level) == ("checkpoint_unverified", "warn")
    assert "step 5" in alert.title and "No space left" in alert.body
    assert alert.evidence == {"step": 5, "kind": "full", "detail": "write failed: No space left on device"}
    _, acts = transition(d.cfg, d.s, CheckpointIn(step=5, kind="full", verified=True, now=d.now))
    assert not [a for a in acts if isinstance(a, Alert)]


def test_clone_copies_every_field_and_is_independent():
    import dataclasses

    from cliffguard.controller.recovery_state import RecoveryState

    s = new_state("r", "salt")
    s.seq, s.lr_scale, s.unhealthy_steps = 7, 0.5, (3, 4)
    c = s.clone()
    assert c == s and c is not s
    assert [f.name for f in dataclasses.fields(RecoveryState)] == list(RecoveryState.__slots__)
    c.seq, c.unhealthy_steps = 8, (5,)
    assert (s.seq, s.unhealthy_steps) == (7, (3, 4))


@pytest.mark.parametrize("phase", [p for p in Phase if p is not Phase.REJOINING])  # its step ends a restart
def test_the_quiet_step_fast_path_gives_what_the_full_progress_path_gives(phase, monkeypatch):
    """``transition`` skips its action-collecting path for a step with nothing to stabilise,
    recover or flag; for every phase, level, sample range, flagging and checkpoint mix the state
    and actions must be those of ``_on_progress`` run in full."""
    import itertools

    from cliffguard.controller import recovery
    from cliffguard.controller.recovery_state import Checkpoint, Incident
    from cliffguard.controller.recovery_types import ProgressIn

    full_step = recovery.Step
    slow: list[int] = []

    class CountedStep(full_step):  # type: ignore[misc, valid-type]
        def __init__(self, *args):
            slow.append(1)
            super().__init__(*args)

    monkeypatch.setattr(recovery, "Step", CountedStep)
    cfg = RecoveryConfig()
    checkpoint_mixes = [(), (Checkpoint(step=2, kind="full", stable=True),),
                        (Checkpoint(step=2, kind="full", stable=True), Checkpoint(step=90, kind="full"))]
    for level, rng, flagging, cps in itertools.product(
            [None, Level.OK, Level.WARN, Level.CRITICAL], [None, (80, 88)], [None, (40, 3.0, "transient")],
            checkpoint_mixes):
        state = new_state("r", "salt")
        state.phase, state.flagging, state.checkpoints, state.last_step = phase, flagging, cps, 120
        state.unhealthy_samples = ((9, 0, 8),)
        if phase is Phase.RECOVERING:
            state.incident = Incident(id="i", rule="loss_spike", level="critical", spike_step=100, onset_step=99,
                                      opened_at=900.0, rollback_to=60)
        if phase is Phase.PREEMPTED:
            state.incident = Incident(id="i", rule="preemption", level="ok", spike_step=118, onset_step=118,
                                      opened_at=900.0, evidence={"last_step": 120, "preempted_at": 900.0})
        inp = ProgressIn(step=121, now=1000.0, sample_end=rng[1] if rng else None,
                         sample_start=rng[0] if rng else None, loss_level=level)
        full = full_step(cfg, state)
        recovery._on_progress(full, inp)
        slow.clear()
        got, actions = transition(cfg, state, inp)
        assert (got, actions) == (full.s, full.actions), (level, rng, flagging, cps)
        # halted: a step may end a stall that a halt left running (controller/recovery_hang.py)
        quiet = flagging is None and all(c.stable for c in cps) and phase not in (
            Phase.RECOVERING, Phase.PREEMPTED, Phase.HALTED)
        assert not slow if quiet else slow  # the fast path is taken exactly where it applies
