"""The spike rule (core/spike.py): every branch, config validation, persistence."""

from __future__ import annotations

import json
import math

import pytest

from cliffguard.core.enums import Level
from cliffguard.core.spike import SpikeConfig, SpikeDetector, window_stats


def fed(values, **cfg) -> SpikeDetector:
    det = SpikeDetector(SpikeConfig(**{"patience": 1, **cfg}))
    for v in values:
        det.observe(v)
    return det


MODERATE = 2.2
"""On ``noisy(40)`` (median 2, σ 0.03): 6.7σ and +10%, past k_crit but short of the extreme rule."""


def noisy(n: int, center: float = 2.0, amp: float = 0.02) -> list[float]:
    # a deterministic cycle of center + {-2,-1,0,1,2}·amp: median = center, MAD = amp
    return [center + amp * ((i % 5) - 2) for i in range(n)]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"window": 7}, "window"),
        ({"k_warn": 0}, "k_warn"),
        ({"k_warn": 6, "k_crit": 5}, "k_warn"),
        ({"min_history": 1}, "min_history"),
        ({"min_history": 101}, "min_history"),
        ({"sigma_floor_rel": 1.0}, "sigma_floor_rel"),
        ({"sigma_floor_rel": -0.1}, "sigma_floor_rel"),
        ({"patience": 0}, "patience"),
        ({"guard_patience": 0}, "guard_patience"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        SpikeConfig(**kwargs)


def test_warming_up_judges_nothing_but_nonfinite():
    det = SpikeDetector(SpikeConfig(min_history=20))
    for _ in range(19):
        assert det.observe(2.0).level is Level.OK
    assert det.peek(100.0).reason == "warming up"
    assert det.peek(math.nan).level is Level.CRITICAL


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nonfinite_is_critical_at_once_and_stays_out_of_the_window(bad):
    det = fed(noisy(30))
    v = det.observe(bad)
    assert v.level is Level.CRITICAL and v.reason == "non-finite loss" and v.sigmas is None
    assert len(det) == 30


def test_levels_by_sigmas_above_the_median():
    det = fed(noisy(40), sigma_floor_rel=0.0)
    med, sigma = det.stats()
    assert med == pytest.approx(2.0)
    assert det.peek(med + 2.9 * sigma).level is Level.OK
    assert det.peek(med + 3.1 * sigma).level is Level.WARN
    crit = det.peek(med + 5.1 * sigma)
    assert crit.level is Level.CRITICAL and crit.sigmas == pytest.approx(5.1)
    assert det.peek(med - 10 * sigma).level is Level.OK  # falling is never a spike


def test_spikes_are_kept_out_of_the_window():
    det = fed(noisy(40))
    before = det.stats()
    for _ in range(5):
        assert det.observe(10.0).level is not Level.OK
    assert det.stats() == before and len(det) == 40


def test_sigma_floor_keeps_a_flat_curve_from_alarming():
    flat = [2.0] * 40
    assert fed(flat, sigma_floor_rel=0.01).peek(2.01).level is Level.OK  # 0.5% of a flat curve
    assert fed(flat, sigma_floor_rel=0.0).peek(2.01).level is Level.CRITICAL
    _, sigma = window_stats(flat, 0.0)
    assert sigma == pytest.approx(1e-12)  # the absolute floor keeps the division finite


def test_patience_reports_warn_until_enough_consecutive_criticals():
    det = fed(noisy(40), patience=3)
    levels = [det.observe(MODERATE).level for _ in range(3)]
    assert levels == [Level.WARN, Level.WARN, Level.CRITICAL]
    assert "patience" in fed(noisy(40), patience=3).observe(MODERATE).reason
    det.observe(2.0)  # a healthy point resets the run
    assert det.observe(MODERATE).level is Level.WARN


def test_nonfinite_counts_toward_patience_and_is_critical_regardless():
    det = fed(noisy(40), patience=2)
    assert det.observe(math.nan).level is Level.CRITICAL
    assert det.observe(MODERATE).level is Level.CRITICAL  # second consecutive point above k_crit


def test_peek_does_not_change_state():
    det = fed(noisy(40), patience=2)
    state = det.state_dict()
    det.peek(MODERATE)
    det.peek(2.0)
    assert det.state_dict() == state


def test_state_dict_round_trips_through_json():
    det = fed(noisy(40), patience=3)
    det.observe(MODERATE)
    state = json.loads(json.dumps(det.state_dict()))
    twin = SpikeDetector(SpikeConfig(patience=3))
    twin.load_state_dict(state)
    assert twin.observe(MODERATE).level == det.observe(MODERATE).level == Level.WARN
    assert twin.observe(MODERATE).level is Level.CRITICAL
    assert twin.stats() == det.stats()


def test_load_state_dict_without_crit_run_defaults_to_zero():
    det = SpikeDetector(SpikeConfig(patience=2))
    det.load_state_dict({"window": noisy(40)})
    assert det.observe(MODERATE).level is Level.WARN


def test_stats_need_two_points_and_take_an_explicit_floor():
    det = SpikeDetector()
    assert det.stats() is None
    det.observe(2.0)
    det.observe(2.0)
    assert det.stats() == (2.0, pytest.approx(0.02))
    assert det.stats(sigma_floor_rel=0.1) == (2.0, pytest.approx(0.2))


def test_evidence_names_the_window_stats():
    det = fed(noisy(40))
    ev = det.observe(10.0).evidence()
    assert ev["level"] == "critical" and ev["n"] == 40 and ev["median"] == pytest.approx(2.0)
    assert ev["sigmas"] > 5 and ev["loss"] == 10.0


def test_an_extreme_point_is_critical_at_once_a_moderate_one_waits_for_patience():
    det = fed(noisy(40), patience=3)
    v = det.peek(2.0 * 1.35)  # +35%, ~24σ: both extreme thresholds
    assert v.level is Level.CRITICAL and "extreme" in v.reason
    assert det.peek(MODERATE).level is Level.WARN  # +10%: past k_crit, below jump_extreme
    # both thresholds must hold: far in σ but a small jump, or a big jump but few σ
    assert fed(noisy(40), patience=3, jump_extreme=0.5).peek(2.0 * 1.35).level is Level.WARN
    assert fed(noisy(40), patience=3, k_extreme=50).peek(2.0 * 1.35).level is Level.WARN


def test_patience_is_counted_in_steps_a_sparse_point_covers_its_gap():
    det = fed(noisy(40), patience=3)
    assert det.peek(MODERATE, gap=10).level is Level.CRITICAL  # one point logged every 10 steps
    assert det.peek(MODERATE, gap=2).level is Level.WARN
    det.observe(MODERATE, gap=2)
    assert det.observe(MODERATE, gap=1).level is Level.CRITICAL  # 2 + 1 steps
    assert det.state_dict()["crit_run"] == 3


def test_window_steps_judges_on_the_newest_stretch_of_training():
    # a falling curve: 100 points logged every 10 steps; only the newest 200 steps (20 points) count
    falling = [4.0 - 0.01 * i for i in range(100)]
    det = fed(falling, window_steps=200, min_history=20, sigma_floor_rel=0.0)
    med, _ = det.stats(interval=10.0)
    assert med == pytest.approx(3.105)  # median of the newest 20 (3.20 .. 3.01)
    assert det.stats(interval=1.0)[0] == pytest.approx(3.505)  # per step: all 100
    assert det.peek(3.5, interval=10.0).level is Level.CRITICAL  # 5.3σ over the newest 200 steps
    assert det.peek(3.5, interval=1.0).level is Level.OK  # the whole falling window: its median


@pytest.mark.parametrize(
    "kwargs, field",
    [({"k_extreme": 0}, "k_extreme"), ({"jump_extreme": -0.1}, "jump_extreme"), ({"window_steps": -1}, "window_steps")],
)
def test_new_fields_are_validated(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        SpikeConfig(**kwargs)
