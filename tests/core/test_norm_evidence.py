"""core/norm_evidence.py: the grad norm's own evidence, in log space, beside the loss's."""

from __future__ import annotations

import json
import math
import random

from cliffguard.core.norm_evidence import NormEvidence
from cliffguard.core.spike import SpikeConfig, tail_model


def fed(n: int = 400, seed: int = 0) -> NormEvidence:
    rng = random.Random(seed)
    series = NormEvidence(100, 20, tail_model(SpikeConfig()))
    for _ in range(n):
        assert series.weigh(math.exp(0.1 * rng.gauss(0, 1)), 3.0, 0.01, True) >= 0.0
    return series


def test_a_norm_many_times_its_median_is_evidence_a_usual_one_is_not():
    series = fed()
    assert series.weigh(1.05, 3.0, 0.01, True) == 0.0
    assert series.weigh(30.0, 3.0, 0.01, True) > 5.0  # 30x: log 3.4, 34 log-σ


def test_no_evidence_before_min_history_nor_from_a_norm_that_is_not_there():
    series = NormEvidence(100, 20, tail_model(SpikeConfig()))
    assert all(series.weigh(1.0 if i < 19 else 100.0, 3.0, 0.01, True) == 0.0 for i in range(20))
    warm = fed()
    for bad in (0.0, -1.0, math.nan, math.inf):
        assert warm.weigh(bad, 3.0, 0.01, True) == 0.0  # no gradient, or an overflow the scaler handles


def test_it_learns_nothing_when_told_not_to_and_round_trips():
    series = fed()
    state = series.state_dict()
    series.weigh(30.0, 3.0, 0.01, False)
    series.weigh(1.0, 3.0, 0.01, False)
    assert series.state_dict() == state
    twin = NormEvidence(100, 20, tail_model(SpikeConfig()))
    twin.load_state_dict(json.loads(json.dumps(state)))
    rng = random.Random(3)
    for _ in range(300):
        g = math.exp(0.1 * rng.gauss(0, 1)) * (20 if rng.random() < 0.02 else 1)
        assert twin.weigh(g, 3.0, 0.01, True) == series.weigh(g, 3.0, 0.01, True)
