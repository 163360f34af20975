"""bench/anchors.py: the other projects' spike rules bench.detection scores beside the controller's."""

from __future__ import annotations

import random

from bench.anchors import ANCHORS, foundry, olmo, seed
from cliffguard.core.enums import Level


def _curve(n: int = 400, bumps: dict[int, float] | None = None) -> list[tuple[int, float]]:
    rng = random.Random(3)
    bumps = bumps or {}
    return [(s, (3.0 * (1 + s) ** -0.05 + 0.01 * rng.gauss(0, 1)) * bumps.get(s, 1.0)) for s in range(n)]


def test_no_anchor_acts_on_a_quiet_curve():
    for name, rule in ANCHORS.items():
        assert rule(_curve(), None) == [], name


def test_a_single_outlier_is_one_act_for_the_sigma_rules_and_none_for_foundry():
    points = _curve(bumps={300: 1.5})
    for rule in (seed, olmo):
        acts = rule(points, None)
        assert [a.step for a in acts] == [300] and acts[0].level is Level.CRITICAL, rule.__name__
    assert foundry(points, None) == []  # one point is not more than patience (4) in a row


def test_a_doubled_stretch_is_one_act_each_foundry_at_its_fifth_point():
    points = _curve(bumps={s: 2.5 for s in range(300, 310)})
    assert [a.step for a in seed(points, None)] == [300]
    assert [a.step for a in olmo(points, None)] == [300]  # every loss enters: the first widens its std
    assert [a.step for a in foundry(points, None)] == [304]


def test_the_seed_rule_acts_on_a_non_finite_loss_at_once_and_olmo_does_not():
    points = _curve()
    points[250] = (250, float("nan"))
    assert [a.step for a in seed(points, None)] == [250]
    assert olmo(points, None) == []  # NaN compares false in OLMo-core's test
