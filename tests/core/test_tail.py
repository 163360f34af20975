"""core/tail.py: the peaks-over-threshold model a curve's thresholds come from, held to scipy's
generalised Pareto distribution; the refit schedule; bounded, exact persistence."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
from scipy.stats import genpareto

from cliffguard.core.tail import TailModel, anchored_sf, pwm_fit


def with_fit(loc: float, u: float, zeta: float, xi: float, beta: float) -> TailModel:
    tail = TailModel()
    tail.load_state_dict({"fit": [loc, u, zeta, xi, beta]})
    return tail


@pytest.mark.parametrize("xi", [0.0, 0.1, 0.45, 0.9])
def test_sf_and_isf_are_scipys_generalised_pareto(xi):
    tail = with_fit(0.5, 2.0, 0.05, xi, 0.7)
    for y in (0.01, 0.5, 3.0, 20.0, 200.0):
        z = 0.5 + 2.0 + y
        assert tail.sf(z) == pytest.approx(0.05 * genpareto.sf(y, xi, scale=0.7), rel=1e-9)
    for p in (0.04, 1e-3, 1e-4, 1e-7):
        assert tail.sf(tail.isf(p)) == pytest.approx(p, rel=1e-9)
        assert tail.isf(p) == pytest.approx(2.5 + genpareto.isf(p / 0.05, xi, scale=0.7), rel=1e-9)
    assert tail.sf(2.5) == tail.sf(-10.0) == 1.0  # at or below the threshold: not the modelled tail
    assert tail.isf(0.5) == 2.5


@pytest.mark.parametrize("xi", [0.0, 0.2, 0.4])
def test_the_pwm_fit_agrees_with_scipys_maximum_likelihood_on_a_large_sample(xi):
    y = np.sort(genpareto.rvs(xi, scale=1.3, size=4000, random_state=np.random.default_rng(int(xi * 10))))
    xi_pwm, beta_pwm = pwm_fit(list(y))
    xi_mle, _, beta_mle = genpareto.fit(y, floc=0)
    assert xi_pwm == pytest.approx(xi, abs=0.06) and xi_pwm == pytest.approx(xi_mle, abs=0.06)
    assert beta_pwm == pytest.approx(beta_mle, rel=0.08)
    assert pwm_fit([1.0, 1.0, 1.0])[0] < 0  # no spread: a bounded tail (the model takes ξ >= 0)
    assert math.isnan(pwm_fit([0.0, 0.0, 0.0])[0])  # no excess at all: no fit


def test_no_fit_before_enough_points_then_the_prior_then_a_fit_per_block():
    tail = TailModel(prior=(3.0, 0.01, 5.0, 1e-4))
    assert not tail.ready and tail.sf(5.0) == pytest.approx(1e-4) and tail.sf(4.0) == pytest.approx(1e-3)
    fits = []
    rng = random.Random(0)
    for i in range(1, 501):
        tail.add(rng.gauss(0, 1))
        if tail.fit is not None and (not fits or tail.fit != fits[-1][1]):
            fits.append((i, tail.fit))
    # once per two blocks of 100, from MIN_EXCEEDANCES (10) exceedances: two blocks' top halves
    assert [i for i, _ in fits] == [200, 400]


def test_the_shape_is_never_below_zero_and_cautious_on_a_short_history():
    rng = random.Random(1)
    bounded = TailModel()
    for _ in range(2000):
        bounded.add(rng.uniform(-1, 1))  # a bounded tail: ξ < 0
    assert bounded.fit[3] >= 0.0
    short, long = TailModel(), TailModel()
    for i in range(2000):
        x = rng.gauss(0, 1)
        long.add(x)
        if i < 200:
            short.add(x)
    assert short.fit[3] > long.fit[3] > 0.0  # the upper-bound shape tightens as points come
    assert short.sf(5.0) > long.sf(5.0)


def test_a_heavier_tail_gives_a_higher_threshold():
    rng = random.Random(2)
    light, heavy = TailModel(), TailModel()
    for _ in range(3000):
        light.add(rng.gauss(0, 1))
        heavy.add(rng.gauss(0, 1) / math.sqrt(rng.gammavariate(1.5, 1 / 1.5)))  # Student-t, 3 dof
    assert heavy.isf(1e-4) > 1.5 * light.isf(1e-4)


def test_blocks_are_centred_so_a_drifting_residual_does_not_fake_a_heavy_tail():
    rng = random.Random(3)
    steady, drifting = TailModel(), TailModel()
    for i in range(2000):
        x = rng.gauss(0, 1)
        steady.add(x)
        drifting.add(x - 20.0 + i / 100)  # the residual climbs from -20 to 0: one σ per block
    assert drifting.isf(1e-4) == pytest.approx(steady.isf(1e-4), rel=0.25)


def test_memory_is_bounded_and_the_state_round_trips_exactly():
    rng = random.Random(4)
    tail = TailModel()
    for _ in range(10_000):
        tail.add(rng.gauss(0, 1))
    state = tail.state_dict()
    assert len(state["done"]) == 20 and all(len(vals) == 10 for _, _, vals in state["done"])
    twin = TailModel()
    twin.load_state_dict(json.loads(json.dumps(state)))
    for _ in range(350):
        x = rng.gauss(0, 1)
        tail.add(x)
        twin.add(x)
        assert twin.sf(3.0) == tail.sf(3.0)
    assert twin.state_dict() == tail.state_dict()


def test_the_anchored_prior_passes_through_both_points():
    assert anchored_sf(3.0, 3.0, 0.01, 5.0, 1e-4) == 1.0  # at the first anchor: not in the tail
    assert anchored_sf(5.0, 3.0, 0.01, 5.0, 1e-4) == pytest.approx(1e-4)
    assert anchored_sf(7.0, 3.0, 0.01, 5.0, 1e-4) == pytest.approx(1e-6)
