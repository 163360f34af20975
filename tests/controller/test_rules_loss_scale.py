"""Loss-scale collapse (controller/rules/loss_scale.py): branches, persistence, suite figures."""

from __future__ import annotations

import json
import math

import pytest

from cliffguard.controller.rules.loss_scale import LossScaleConfig, LossScaleRule
from cliffguard.core.enums import Level
from tests.controller.synthetic import score
from tests.controller.synthetic_metrics import loss_scale_suite


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"window": 1}, "window"),
        ({"warn_halvings": 0}, "warn_halvings"),
        ({"warn_halvings": 13}, "warn_halvings"),
        ({"min_scale": -1}, "min_scale"),
        ({"grace_steps": -1}, "grace_steps"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        LossScaleConfig(**kwargs)


def halvings(rule: LossScaleRule, start_step: int, start: float, n: int) -> list:
    return [v for i in range(n) for v in rule.observe(start_step + i, start / 2**i)]


def test_warn_then_critical_once_with_the_onset_at_the_window_peak():
    rule = LossScaleRule(LossScaleConfig(grace_steps=0))
    for s in range(10):
        assert rule.observe(s, 2.0**14) == []
    out = halvings(rule, 10, 2.0**14, 14)
    assert [(v.level, v.step) for v in out] == [(Level.WARN, 16), (Level.CRITICAL, 22)]
    assert all(v.onset_step == 10 for v in out)  # the last step at the peak, just before the fall
    assert out[0].evidence["halvings"] == 6 and "halvings below" in out[0].message
    assert rule.observe(24, 2.0**-1) == []  # already critical


def test_recovery_re_arms_and_a_constant_scale_never_alarms():
    rule = LossScaleRule(LossScaleConfig(grace_steps=0, window=20))
    halvings(rule, 0, 2.0**14, 8)
    assert rule.observe(30, 2.0**14) == []  # the old peak left the window: re-armed
    assert [v.level for v in halvings(rule, 31, 2.0**14, 8)] == [Level.WARN]
    fp32 = LossScaleRule()
    assert [v for s in range(500) for v in fp32.observe(s, 1.0)] == []


def test_grace_period_min_scale_and_nonfinite():
    rule = LossScaleRule(LossScaleConfig(grace_steps=10, min_scale=1.0))
    assert halvings(rule, 0, 2.0**16, 10) == []  # start-up calibration is ignored
    (v,) = rule.observe(10, 0.5)
    assert v.level is Level.CRITICAL
    bad = LossScaleRule()
    (v,) = bad.observe(3, math.nan)  # non-finite even inside the grace period
    assert v.level is Level.CRITICAL and "non-finite" in v.evidence["reason"]
    assert LossScaleRule(LossScaleConfig(enabled=False)).observe(100, 0.0) == []


def test_state_dict_round_trips_through_json():
    rule = LossScaleRule(LossScaleConfig(grace_steps=0))
    halvings(rule, 0, 2.0**14, 7)
    twin = LossScaleRule(rule.config)
    twin.load_state_dict(json.loads(json.dumps(rule.state_dict())))
    assert twin.observe(7, 2.0**7) == rule.observe(7, 2.0**7) == []
    a, b = rule.observe(8, 2.0), twin.observe(8, 2.0)
    assert [v.level for v in a] == [v.level for v in b] == [Level.CRITICAL]


def test_defaults_on_the_loss_scale_suite():
    curves = loss_scale_suite(10, 10, seed=5)  # held out: tuned on seed 1

    def run(curve):
        rule = LossScaleRule()
        return [(v.step, str(v.level)) for s, x in curve.points() for v in rule.observe(s, x)]

    s = score(curves, run)
    assert s.recall("collapse") == 1.0, s.summary()
    assert s.false_warn == 0 and s.false_critical == 0, s.summary()
