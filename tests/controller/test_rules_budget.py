"""The false-alarm budget's threshold (controller/rules/budget.py) and the divergence it judges."""

from __future__ import annotations

import math
import random

import pytest

from cliffguard.controller.rules.budget import Threshold, calibrate, js_divergence


def test_on_an_exponential_tail_the_declared_rate_holds():
    rng = random.Random(3)
    baseline = [1.0 + rng.expovariate(10.0) for _ in range(400)]
    t = calibrate(baseline, target=1e-3, floor=0.0)
    fresh = [1.0 + rng.expovariate(10.0) for _ in range(200_000)]
    rate = sum(v > t.level for v in fresh) / len(fresh)
    assert 0.2e-3 < rate < 4e-3  # the fit from 400 points lands within a few times the target
    assert t.n == 400 and t.median < t.rearm() < t.level


def test_a_few_bad_points_in_the_baseline_barely_move_the_threshold():
    rng = random.Random(5)
    clean = [1.0 + rng.expovariate(10.0) for _ in range(200)]
    assert calibrate([*clean[:198], 5.0, 5.5], 1e-4, 0.0).level == pytest.approx(calibrate(clean, 1e-4, 0.0).level,
                                                                               rel=0.1)


def test_a_lighter_tail_gets_fewer_false_alarms_than_declared():
    rng = random.Random(4)
    baseline = [rng.gauss(0, 1) for _ in range(400)]
    t = calibrate(baseline, target=1e-3, floor=0.0)
    fresh = [rng.gauss(0, 1) for _ in range(200_000)]
    assert sum(v > t.level for v in fresh) / len(fresh) < 1e-3


def test_the_floor_holds_for_a_baseline_that_never_moves_and_nan_is_left_out():
    t = calibrate([0.0] * 50 + [math.nan], target=1e-4, floor=0.1)
    assert (t.median, t.scale, t.level, t.n) == (0.0, 0.0, 0.1, 50)
    assert calibrate([0.0, 0.0, 0.001], target=1e-4, floor=0.1).level == pytest.approx(0.1)  # a tiny tail: the floor wins


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="^target:"):
        calibrate([1.0], target=0.0, floor=0.0)
    with pytest.raises(ValueError, match="^values: no finite"):
        calibrate([math.nan], target=1e-3, floor=0.0)


def test_state_round_trip():
    t = calibrate([1.0, 2.0, 3.0, 5.0], target=1e-2, floor=0.5)
    assert Threshold.from_state(t.to_state()) == t


def test_js_divergence():
    assert js_divergence([1, 2, 3], [2, 4, 6]) == pytest.approx(0.0)
    assert js_divergence([1, 0], [0, 1]) == pytest.approx(math.log(2))
    assert js_divergence([0, 0], [1, 1]) == 0.0
    a, b = [5, 1, 0, 2], [1, 3, 3, 1]
    assert js_divergence(a, b) == pytest.approx(js_divergence(b, a)) and 0 < js_divergence(a, b) < math.log(2)
    with pytest.raises(ValueError, match="lengths differ"):
        js_divergence([1], [1, 2])
