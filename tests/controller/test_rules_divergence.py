"""The divergence rule (controller/rules/divergence.py): both tests, every branch, persistence."""

from __future__ import annotations

import json
import math

import pytest

from cliffguard.controller.rules.divergence import DivergenceConfig, DivergenceDetector


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"method": "ewma"}, "method"),
        ({"drift": -1}, "drift"),
        ({"threshold": 0}, "threshold"),
        ({"z_clip": 0.5, "drift": 0.5}, "z_clip"),
        ({"smooth": 2}, "smooth"),
        ({"smooth_steps": 0}, "smooth_steps"),
        ({"rise": 0}, "rise"),
        ({"rise_k": -1}, "rise_k"),
        ({"shift_rise": 0}, "shift_rise"),
        ({"shift_k": -1}, "shift_k"),
        ({"sigma_floor_rel": 1.0}, "sigma_floor_rel"),
        ({"grace_steps": -1}, "grace_steps"),
        ({"onset_margin": -1}, "onset_margin"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        DivergenceConfig(**kwargs)


def cusum(**kw) -> DivergenceDetector:
    return DivergenceDetector(DivergenceConfig(method="cusum", grace_steps=0, onset_margin=0, **kw))


def test_cusum_fires_on_a_sustained_small_excess_and_names_where_it_began():
    det = cusum(drift=0.5, threshold=10)
    for step in range(5):
        assert det.observe(step, 2.0, 2.0, 0.125).statistic == 0  # at the median: nothing
    fired = None
    for step in range(5, 100):
        v = det.observe(step, 2.25, 2.0, 0.125)  # 2σ, far below any spike threshold
        if v.fired:
            fired = v
            break
    assert fired is not None and fired.onset_step == 5
    assert fired.statistic >= 10 and step == 11  # 7 steps of 2σ - 0.5σ drift
    assert fired.evidence() == {"statistic": fired.statistic, "onset_step": 5, "test": "cusum"}


def test_the_onset_margin_moves_the_estimate_earlier_but_not_below_zero():
    det = DivergenceDetector(DivergenceConfig(method="cusum", grace_steps=0, onset_margin=50, threshold=1))
    det.observe(30, 2.0, 2.0, 0.1)
    assert det.observe(100, 9.0, 2.0, 0.1).onset_step == 50
    det.reset()
    assert det.observe(20, 9.0, 2.0, 0.1).onset_step == 0


def test_cusum_clips_single_outliers_and_drains_on_healthy_points():
    det = cusum(drift=0.5, threshold=10, z_clip=3.0)
    v = det.observe(0, 100.0, 2.0, 0.1)  # a +4900% outlier counts as 3σ
    assert v.statistic == pytest.approx(2.5) and not v.fired and v.onset_step == 0
    v = det.observe(1, 1.5, 2.0, 0.1)  # well below the median: the sum falls back to 0
    assert v.statistic == 0 and v.onset_step is None


def test_cusum_ignores_the_grace_period_missing_stats_and_nonfinite():
    det = DivergenceDetector(DivergenceConfig(method="cusum", grace_steps=10, threshold=1))
    assert not det.observe(5, 9.0, 2.0, 0.1).fired
    assert not det.observe(20, 9.0, None, None).fired
    assert not det.observe(21, math.nan, 2.0, 0.1).fired
    assert det.observe(22, 9.0, 2.0, 0.1).fired


def test_disabled_never_fires():
    det = DivergenceDetector(DivergenceConfig(enabled=False, threshold=1, grace_steps=0))
    assert not any(det.observe(s, 9.0, 2.0, 0.1).fired for s in range(50))


def test_runmin_fires_when_the_smoothed_log_loss_rises_above_its_running_minimum():
    det = DivergenceDetector(DivergenceConfig(method="runmin", smooth_steps=5, rise=0.08))
    assert det.observe(0, 2.0, None, None).statistic == 0  # smoothing window not yet full
    for s in range(1, 10):
        assert not det.observe(s, 2.0 - 0.01 * s, None, None).fired  # falling: the minimum follows
    fired = None
    for s in range(10, 40):
        v = det.observe(s, 2.0 + 0.05 * (s - 10), None, None)
        if v.fired:
            fired = v
            break
    assert fired is not None and fired.test == "runmin" and fired.statistic >= math.log1p(0.08)
    assert fired.onset_step is not None and 7 <= fired.onset_step <= 10  # the healthy bottom


def test_runmin_needs_no_grace_and_counts_its_smoothing_in_steps():
    # every 10 steps, smooth_steps 50 -> a median of 5 points; the turn right after warm-up is seen
    det = DivergenceDetector(DivergenceConfig(method="runmin", smooth_steps=50, rise=0.08, confirm_points=1))
    losses = [6.0, 5.5, 5.0, 4.8, 4.7, 4.66, 4.7, 5.0, 5.1, 5.2, 5.3, 5.5]
    fired = [s for s, x in zip(range(10, 130, 10), losses, strict=True) if det.observe(s, x, None, None, 10.0).fired]
    assert fired and fired[0] <= 120
    per_step = DivergenceDetector(DivergenceConfig(method="runmin", smooth_steps=50))
    assert per_step._span(1.0) == 50 and per_step._span(10.0) == 5 and per_step._span(100.0) == 3


def test_runmin_noise_bar_keeps_a_noisy_flat_curve_quiet():
    det = DivergenceDetector(DivergenceConfig(method="runmin", smooth_steps=5, rise=0.01, rise_k=6))
    noise = [0.9, 1.1, 1.0, 1.12, 0.88, 1.05, 0.95]  # ±12% point to point around a flat level
    assert not any(det.observe(s, 2.0 * noise[s % 7], None, None).fired for s in range(300))


def test_shift_fires_on_a_burst_over_the_window_median_and_names_its_first_point():
    det = DivergenceDetector(DivergenceConfig(method="all", smooth_steps=5, shift_rise=0.08, threshold=1e9,
                                              rise=10.0))
    flat = [2.0 + 0.02 * ((i % 5) - 2) for i in range(30)]
    assert not any(det.observe(s, x, 2.0, 0.03).fired for s, x in enumerate(flat))
    out = [det.observe(30 + i, 2.3, 2.0, 0.03) for i in range(5)]
    first = next(v for v in out if v.fired)
    assert first.test == "shift" and first.onset_step == 30 and first.statistic == pytest.approx(math.log(1.15))


def test_reset_and_state_dict_round_trip():
    for method in ("cusum", "runmin", "all"):
        det = DivergenceDetector(DivergenceConfig(method=method, smooth=3, threshold=50, grace_steps=0))
        for s in range(10):
            det.observe(s, 2.0 + 0.1 * s, 2.0, 0.1)
        twin = DivergenceDetector(det.config)
        twin.load_state_dict(json.loads(json.dumps(det.state_dict())))
        assert twin.observe(10, 3.5, 2.0, 0.1) == det.observe(10, 3.5, 2.0, 0.1)
        det.reset()
        assert det.state_dict() == DivergenceDetector(det.config).state_dict()


def test_runmin_and_shift_fire_only_once_their_test_held_at_confirm_points_of_the_newest():
    # 3 of the newest 5 points by default: a crossing by chance lasts a point or two, a divergence holds
    def fired(confirm: int, losses: list[float]) -> list[int]:
        det = DivergenceDetector(DivergenceConfig(method="runmin", smooth_steps=3, rise=0.05, rise_k=0,
                                                  confirm_points=confirm))
        return [i for i, x in enumerate(losses) if det.observe(i, x, None, None).fired]

    blip = [2.0] * 10 + [2.3, 2.3] + [2.0] * 10  # the 3-point median is up for two points
    assert fired(1, blip) == [11, 12] and fired(3, blip) == []
    climb = [2.0] * 10 + [2.3] * 10
    assert fired(1, climb)[0] == 11 and fired(3, climb)[0] == 13
