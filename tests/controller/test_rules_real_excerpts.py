"""The loss rules on short excerpts of real training logs (tests/controller/curve_excerpts.py):
one test per failure mode the synthetic suite did not show, each also run with the setting that
used to miss it, so none of these tests can pass by accident."""

from __future__ import annotations

from cliffguard.controller import backtest as bt
from cliffguard.controller.detect import RulesConfig
from cliffguard.controller.rules.divergence import DivergenceConfig
from cliffguard.controller.rules.loss import LossSpikeConfig
from tests.controller.curve_excerpts import (
    DATA_OUTLIERS,
    EARLY_DIVERGENCE,
    NOISY_NEGATIVE,
    PLATEAU_BURSTS,
    SPARSE_SPIKES,
)


def criticals(points, config: RulesConfig | None = None):
    events = bt.replay_points(points, config)
    return [(e, o) for e, o in zip(events, bt.outcomes(points, events), strict=True) if e.level == "critical"]


def caught(crit, first: int, last: int) -> bool:
    return any(first <= e.step <= last for e, _ in crit)


def test_sparse_logs_single_point_spikes_are_critical_at_once():
    # every 10 steps: one point covers 10 steps, more than the 3-step patience, and the window
    # spans 200 steps (20 points), not 1000 steps of a falling curve
    crit = criticals(SPARSE_SPIKES)
    steps = {e.step for e, _ in crit}
    assert {1720, 1800} <= steps and caught(crit, 1020, 1110)
    assert all(1020 <= s <= 1110 or s in (1720, 1800) for s in steps)
    assert all(e.onset_step == e.step for e, _ in crit if e.step in (1720, 1800))
    # the window in points (100 points = 1000 steps here) hides both single points
    old = criticals(SPARSE_SPIKES, RulesConfig(spike=LossSpikeConfig(window_steps=0)))
    assert not caught(old, 1720, 1730) and not caught(old, 1800, 1810)


def test_an_upward_turn_right_after_warmup_is_a_divergence_with_its_onset_at_the_bottom():
    crit = criticals(EARLY_DIVERGENCE)
    div = [e for e, _ in crit if e.rule == "divergence"]
    assert div and 120 <= div[0].step <= 200 and div[0].evidence["test"] == "runmin"
    assert 60 <= div[0].onset_step <= 120  # the rollback lands at the bottom, not inside the climb
    # the CUSUM alone waits for its 300-step grace and a spike window: only the blow-up is seen
    cusum = criticals(EARLY_DIVERGENCE, RulesConfig(divergence=DivergenceConfig(method="cusum")))
    assert not caught(cusum, 120, 280)


def test_bursts_on_a_noisy_plateau_are_caught_as_level_shifts():
    crit = criticals(PLATEAU_BURSTS)
    for first, last in ((1260, 1320), (1400, 1460), (1720, 1810)):
        assert caught(crit, first, last), (first, [e.step for e, _ in crit])
    assert all(o == "rollback" for _, o in crit)
    assert not criticals(PLATEAU_BURSTS, RulesConfig(divergence=DivergenceConfig(method="cusum")))


def test_one_step_data_outliers_are_paused_for_and_resumed_never_rolled_back():
    crit = criticals(DATA_OUTLIERS)
    assert {e.step for e, _ in crit} == {919, 947}  # +33% and +38% at 10-16σ: extreme, critical at once
    assert all(o == "resume" and "extreme" in e.evidence["reason"] for e, o in crit)
    strict = criticals(DATA_OUTLIERS, RulesConfig(spike=LossSpikeConfig(k_extreme=1e9)))
    assert strict == []  # with patience alone the outliers only warn (and real spikes wait too)


def test_a_noisy_healthy_run_raises_no_critical():
    assert criticals(NOISY_NEGATIVE) == []
    # without the noise bar the level-shift test would fire on this 6%-noise curve
    loose = RulesConfig(divergence=DivergenceConfig(shift_k=0, rise_k=0, shift_rise=0.03, rise=0.03))
    assert criticals(NOISY_NEGATIVE, loose)
