"""core/evidence.py: the level a window's evidence must reach holds the false-alarm rate it is set
for (checked by simulation under the null), and the window counts points, not steps."""

from __future__ import annotations

import random

import pytest

from cliffguard.core.evidence import EvidenceWindow, crossing_level, weight


def crossings(rate: float, p_w: float, n: int, series: int, points: int, seed: int) -> float:
    """Crossings per point of the level by independent uniform p-values (the null)."""
    rng = random.Random(seed)
    level = crossing_level(rate, p_w, n, series)
    window, hits = EvidenceWindow(n), 0
    for _ in range(points):
        loss = weight(rng.random(), p_w)
        total = window.push(loss + sum(weight(rng.random(), p_w) for _ in range(series - 1)))
        hits += loss > 0 and total >= level
    return hits / points


@pytest.mark.parametrize("n, series", [(1, 1), (10, 1), (10, 2), (20, 1)])
def test_the_level_holds_the_rate_under_the_null(n, series):
    rate = 2e-3  # large enough to count in a few seconds; the formula is the same at 1e-4
    got = crossings(rate, 0.05, n, series, 200_000, seed=n * 10 + series)
    assert 0.5 * rate < got <= 1.15 * rate, got  # an upper bound on the rate, and a tight one


def test_the_level_rises_with_the_window_the_series_and_a_smaller_budget():
    base = crossing_level(1e-4, 0.01, 10)
    assert crossing_level(1e-4, 0.01, 1) < base < crossing_level(1e-4, 0.01, 20)
    assert base < crossing_level(1e-4, 0.01, 10, series=2)
    assert crossing_level(1e-5, 0.01, 10) > base > crossing_level(1e-3, 0.01, 10)
    assert crossing_level(0.5, 0.01, 10) == 0.0  # a budget past p_w: every evidence point crosses
    # one point alone needs p near the budget: ln(p_w / rate) and a little more
    assert base == pytest.approx(4.99, abs=0.01) and crossing_level(1e-4, 0.01, 1) == pytest.approx(
        4.605, abs=1e-3
    )
    with pytest.raises(ValueError):
        crossing_level(1e-4, 1.5, 10)


def test_weight_is_zero_above_p_w_and_survives_an_underflowed_p():
    assert weight(0.02, 0.01) == 0.0 and weight(0.01, 0.01) == 0.0
    assert weight(1e-5, 0.01) == pytest.approx(6.9078, abs=1e-4)
    assert 690 > weight(0.0, 0.01) > 680


def test_the_window_keeps_the_newest_n_points_and_says_where_its_evidence_began():
    w = EvidenceWindow(3)
    assert w.push(0.0) == 0.0 and not w
    assert w.push(2.0) == 2.0 and w.alone() and w.back() == 0
    assert w.push(0.0) == 2.0 and not w.alone() and w.back() == 1
    assert w.push(1.0) == 3.0 and w.back() == 2
    assert w.push(0.0) == 1.0 and w.back() == 1  # the 2.0 left: three points on
    w.clear()
    assert w.push(0.0) == 0.0 and w.back() is None
    twin = EvidenceWindow(3)
    w.push(4.0)
    twin.load_state_dict(w.state_dict())
    assert twin.push(0.5) == w.push(0.5) == 4.5
