"""controller.rules.rank_window: ring rows behave as per-rank deques, medians are statistics.median's."""

from __future__ import annotations

import math
import random
import statistics
from collections import deque

import numpy as np
import pytest

from cliffguard.controller.rules.rank_window import RankWindows, fmean, full_row_medians, median, row_medians
from cliffguard.controller.rules.straggler import judge_points
from cliffguard.core.ranks import speaker


@pytest.mark.parametrize("seed", range(4))
def test_rows_hold_what_a_deque_per_rank_would(seed: int) -> None:
    rng = random.Random(seed)
    size = rng.choice([4, 5, 8])
    w = RankWindows(size, 2)
    ref: dict[int, deque[tuple[int, list[float]]]] = {}
    step = 0
    for _ in range(300):
        step += rng.choice([1, 1, 2])
        if rng.random() < 0.05:
            step -= rng.randrange(1, 6)  # a rollback: the MFU rule drops the replayed steps first
            rows_all = w.rows_for(np.array(list(ref), np.int64)) if ref else np.zeros(0, np.int64)
            w.drop_from(rows_all, step)
            for q in ref.values():
                while q and q[-1][0] >= step:
                    q.pop()
        ranks = rng.sample(range(40), rng.choice([1, 1, 3, 10]))
        vals = [[rng.random(), rng.random()] for _ in ranks]
        rows = w.rows_for(np.array(ranks, np.int64))
        w.push(rows, step, np.array(vals))
        for r, v in zip(ranks, vals, strict=True):
            ref.setdefault(r, deque(maxlen=size)).append((step, v))
    assert w.ranks == list(ref)  # rows in first-seen order
    steps, columns = w.ordered()
    for row, r in enumerate(w.ranks):
        assert w.points(row) == [(s, v) for s, v in ref[r]]
        assert steps[row] == [s for s, _ in ref[r]]
        assert [list(p) for p in zip(*(c[row] for c in columns), strict=True)] == [v for _, v in ref[r]]
    assert w.first_steps().tolist() == [q[0][0] for q in ref.values()]
    assert w.last_steps().tolist() == [q[-1][0] for q in ref.values()]
    assert w.valid().sum(axis=1).tolist() == [len(q) for q in ref.values()]
    again = RankWindows(size, 2)
    again.load((r, [(s, v) for s, v in q]) for r, q in ref.items())
    assert [again.points(i) for i in range(len(again))] == [w.points(i) for i in range(len(w))]


@pytest.mark.parametrize("seed", range(4))
def test_masked_medians_are_statistics_medians_bit_for_bit(seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = rng.lognormal(size=(60, 9))
    values[3, 2] = math.inf
    values[5, :] = 2.5  # ties
    mask = rng.random((60, 9)) < 0.6
    mask[7] = False  # a row with nothing in it
    meds, counts = row_medians(values, mask)
    for i in range(60):
        chosen = values[i][mask[i]].tolist()
        assert counts[i] == len(chosen)
        if chosen:
            assert meds[i] == statistics.median(chosen)
        else:
            assert math.isnan(meds[i])
    stacked, _ = row_medians(np.stack([values, 2 * values]), mask)
    assert np.array_equal(stacked[0], meds, equal_nan=True)


@pytest.mark.parametrize("width", [6, 7])
def test_full_row_medians_keep_statistics_types_for_ints(width: int) -> None:
    rng = np.random.default_rng(width)
    ints = rng.integers(0, 2**40, size=(20, width))
    for row, med in zip(ints, full_row_medians(ints), strict=True):
        want = statistics.median(row.tolist())
        assert med == want and isinstance(want, int) == (width % 2 == 1)
    floats = rng.random(11)
    assert median(floats) == statistics.median(floats.tolist())
    assert fmean(floats) == statistics.fmean(floats.tolist())


def test_judge_points_are_where_the_speaker_speaks() -> None:
    rng = random.Random(3)
    for _ in range(200):
        before = rng.choice([None, *range(10)])
        ranks = rng.sample(range(12), rng.randrange(1, 8))
        expected, current = [], before
        for i, r in enumerate(ranks):
            current = speaker([r] if current is None else [current, r])
            if r == current:
                expected.append(i)
        assert judge_points(np.array(ranks, np.int64), before) == expected
