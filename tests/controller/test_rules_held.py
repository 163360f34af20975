"""The held rule: the guard's hold (and a long run of skips) is a verdict of its own."""

from __future__ import annotations

import pytest

from cliffguard.controller.detect import RulesConfig, RunDetector
from cliffguard.controller.rules.held import GUARD_HOLD, GuardHoldRule, HeldConfig
from cliffguard.controller.verdict import Action
from cliffguard.core.enums import GuardDecision, Level
from cliffguard.core.events import make_event
from testing.controller_stack import step_data

OK, SKIP, HOLD = GuardDecision.OK, GuardDecision.SKIP, GuardDecision.HOLD


def test_a_hold_asks_for_recovery_with_the_stretchs_first_step_as_onset():
    rule = GuardHoldRule()
    assert rule.observe(119, OK) == []
    assert rule.observe(120, SKIP) == [] and rule.observe(121, SKIP) == []
    # resumed at 122 (the controller's pause landed in the stretch); the guard holds at 124
    assert rule.observe(122, SKIP) == [] and rule.observe(123, SKIP) == []
    (v,) = rule.observe(124, HOLD)
    assert (v.rule, v.level, v.action, v.step, v.onset_step) == (GUARD_HOLD, Level.CRITICAL, Action.RECOVER, 124, 120)
    assert v.evidence == {"guard": "hold", "skips": 5, "first_skip_step": 120, "held": True}
    assert "holds for the controller" in v.message and "since step 120" in v.message
    assert rule.observe(125, OK) == [] and rule.state_dict() == {"first": None, "skips": 0, "unanswered": 0}


def test_a_run_that_keeps_skipping_without_a_hold_is_answered_every_skips_after():
    rule = GuardHoldRule(HeldConfig(skips_after=3))
    verdicts = [v for s in range(10, 17) for v in rule.observe(s, SKIP)]
    assert [(v.step, v.onset_step, v.evidence["skips"]) for v in verdicts] == [(12, 10, 3), (15, 10, 6)]
    assert all("keeps skipping" in v.message and v.evidence["held"] is False for v in verdicts)


def test_a_rewind_state_round_trip_and_off():
    rule = GuardHoldRule()
    rule.observe(5, SKIP)
    other = GuardHoldRule()
    other.load_state_dict(rule.state_dict())
    assert other.state_dict() == rule.state_dict() == {"first": 5, "skips": 1, "unanswered": 1}
    rule.rewind()
    assert rule.state_dict() == {"first": None, "skips": 0, "unanswered": 0}
    off = GuardHoldRule(HeldConfig(enabled=False))
    assert off.observe(1, HOLD) == []
    with pytest.raises(ValueError, match="skips_after"):
        HeldConfig(skips_after=0)


def test_the_detector_feeds_it_the_speaking_ranks_step_events():
    det = RunDetector(RulesConfig())
    out = []
    for step, guard in [(0, "ok"), (1, "skip"), (2, "skip"), (3, "hold")]:
        out += det.on_event(make_event("step", "r", step, {**step_data(2.0, step), "guard": guard}))
    assert [(v.rule, v.step, v.onset_step) for v in out if v.rule == GUARD_HOLD] == [(GUARD_HOLD, 3, 1)]
    assert "held" in det.state_dict()
