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


def test_sparse_logs_a_second_spike_soon_after_a_first_adds_to_its_evidence():
    # every 10 steps: a point is one point of evidence, whatever the steps between points. The
    # single point at 1720 (+10%, 4.1σ) warns; the one at 1800 (+12%) eight points later brings the
    # window's evidence past the level, with its onset at 1720; the 8-point burst from 1020 is one
    # excursion. No other critical.
    crit = criticals(SPARSE_SPIKES)
    steps = {e.step for e, _ in crit}
    assert 1800 in steps and caught(crit, 1020, 1110) and 1720 not in steps
    assert all(1020 <= s <= 1110 or s == 1800 for s in steps)
    assert [e.onset_step for e, _ in crit if e.step == 1800] == [1720]
    # evidence counted over one point only (no window): the second spike is missed
    alone = criticals(SPARSE_SPIKES, RulesConfig(spike=LossSpikeConfig(evidence_points=1, cold_points=1)))
    assert not caught(alone, 1800, 1810)


def test_an_upward_turn_right_after_warmup_is_a_divergence_with_its_onset_at_the_bottom():
    crit = criticals(EARLY_DIVERGENCE)
    div = [e for e, _ in crit if e.rule == "divergence"]
    assert div and 120 <= div[0].step <= 200 and div[0].evidence["test"] == "runmin"
    assert 60 <= div[0].onset_step <= 120  # the rollback lands at the bottom, not inside the climb
    # the CUSUM alone waits for its 300-step grace and a spike window: no divergence in the climb
    cusum = criticals(EARLY_DIVERGENCE, RulesConfig(divergence=DivergenceConfig(method="cusum")))
    assert not any(e.rule == "divergence" and 120 <= e.step <= 280 for e, _ in cusum)


def test_bursts_on_a_noisy_plateau_are_caught_by_evidence_over_their_points():
    crit = criticals(PLATEAU_BURSTS)
    for first, last in ((1260, 1320), (1400, 1460), (1720, 1810)):
        assert caught(crit, first, last), (first, [e.step for e, _ in crit])
    assert [e.onset_step for e, _ in crit if 1260 <= e.step <= 1320] == [1260]
    # points judged one at a time against a fixed 10σ bar (the old extreme rule's), CUSUM beside:
    # all three are missed
    one_by_one = RulesConfig(spike=LossSpikeConfig(evidence_points=1, cold_points=1, k_crit=10),
                             divergence=DivergenceConfig(method="cusum"))
    assert not any(caught(criticals(PLATEAU_BURSTS, one_by_one), a, b)
                   for a, b in ((1260, 1320), (1400, 1460), (1720, 1810)))


def test_one_step_data_outliers_are_paused_for_and_resumed_never_rolled_back():
    crit = criticals(DATA_OUTLIERS)
    assert {e.step for e, _ in crit} == {919, 947}  # +33% and +38% at 12-14σ: each its own evidence
    assert all(o == "resume" and "evidence" in e.evidence["reason"] for e, o in crit)
    assert criticals(DATA_OUTLIERS, RulesConfig(spike=LossSpikeConfig(k_crit=20))) == []  # a 20σ bar: warns


def test_a_noisy_healthy_run_raises_no_critical():
    assert criticals(NOISY_NEGATIVE) == []
    # without the noise bar the level-shift test would fire on this 6%-noise curve
    loose = RulesConfig(divergence=DivergenceConfig(shift_k=0, rise_k=0, shift_rise=0.03, rise=0.03))
    assert criticals(NOISY_NEGATIVE, loose)
