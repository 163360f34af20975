"""core.sliding: the incrementally sorted window gives bit-identical median and MAD to a full sort."""

from __future__ import annotations

import random

import pytest

from cliffguard.core.sliding import LevelWindow, SlidingWindow, sorted_robust


def naive(values: list[float]) -> tuple[float, float]:
    vals = sorted(values)
    n, mid = len(vals), len(vals) // 2

    def med(v: list[float]) -> float:
        return v[mid] if n % 2 else 0.5 * (v[mid - 1] + v[mid])

    m = med(vals)
    return m, 1.4826 * med(sorted(abs(v - m) for v in vals))


@pytest.mark.parametrize("seed", range(5))
def test_sorted_robust_matches_a_full_sort_bit_for_bit(seed: int) -> None:
    rng = random.Random(seed)
    for n in range(1, 60):
        # ties and heavy tails on purpose: the split around the median must not matter
        vals = [rng.choice([rng.gauss(3, 1), rng.expovariate(0.1), 2.0, 2.5]) for _ in range(n)]
        assert sorted_robust(sorted(vals)) == naive(vals)


def test_sorted_robust_is_the_same_whatever_the_search_hint() -> None:
    rng = random.Random(3)
    for n in range(1, 40):
        vals = sorted(rng.choice([rng.gauss(3, 1), rng.expovariate(0.1), 2.0]) for _ in range(n))
        for h in range(-2, n + 3):
            hint = [h]
            assert sorted_robust(vals, hint) == naive(vals)
            assert sorted_robust(vals, hint) == naive(vals)  # the hint now where the search ended


def test_window_slides_with_a_changing_span() -> None:
    rng = random.Random(7)
    w = SlidingWindow(100)
    ref: list[float] = []
    for i in range(2000):
        x = rng.lognormvariate(0, 1)
        w.append(x)
        ref = (ref + [x])[-100:]
        if i % 97 == 0:
            w.set_span(rng.choice([20, 50, 100, 300]))
        tail = ref[-w.span:]
        assert w.tail() == sorted(tail)
        assert w.robust() == naive(tail)
        assert w.median() == naive(tail)[0]


def test_clear_and_rebuild_from_values() -> None:
    w = SlidingWindow(4, [5.0, 1.0, 3.0, 2.0, 4.0], span=3)
    assert list(w.items) == [1.0, 3.0, 2.0, 4.0]
    assert w.tail() == [2.0, 3.0, 4.0]
    w.clear()
    assert len(w) == 0 and w.tail() == []
    w.append(1.5)
    assert w.robust() == (1.5, 0.0)


def test_level_window_noise_is_the_noise_whatever_the_trend():
    # a steep linear fall with 1% noise: the spread of the values is mostly trend, their successive
    # differences are the noise's (√2 σ), so σ is the noise's alone
    rng = random.Random(7)
    values = [5.0 - 0.01 * i + 0.01 * rng.gauss(0, 1) for i in range(100)]
    window = LevelWindow(100, values)
    med, sigma = window.robust()
    assert sigma == pytest.approx(0.01, rel=0.25)
    assert naive(values)[1] > 10 * sigma  # a MAD of the values would be the trend's
    assert med == naive(values)[0]


def test_level_window_slides_like_its_values_and_rebuilds_exactly():
    rng = random.Random(8)
    window = LevelWindow(30, span=10)
    for _ in range(200):
        window.append(rng.gauss(0, 1))
    held = list(window.items)
    assert len(held) == 30 and window.span == 10
    diffs = [b - a for a, b in zip(held, held[1:], strict=False)]
    assert window.robust() == (naive(held[-10:])[0], naive(diffs)[1] / 2**0.5)
    twin = LevelWindow(30, held, span=10)
    assert twin.robust() == window.robust()
    assert LevelWindow(30, [2.0]).robust() == (2.0, 0.0)
