"""The loss chart's bands are the spike rule's own statistics, replayed."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from core.spike import SpikeConfig, SpikeDetector, window_stats
from dashboard.bands import loss_bands, rollbacks

CFG = SpikeConfig(window=20, min_history=10, patience=1)


def _curve(losses: list[float], steps: list[int] | None = None) -> pd.DataFrame:
    steps = list(range(len(losses))) if steps is None else steps
    return pd.DataFrame({"step": steps, "loss": losses, "nonfinite": [None] * len(losses)})


def test_band_is_the_detectors_window_before_each_point():
    losses = [2.0 + 0.01 * ((i * 7) % 5) for i in range(30)]
    losses[20] = 5.0  # a spike
    out = loss_bands(_curve(losses), CFG)
    det = SpikeDetector(CFG)
    for i, loss in enumerate(losses):
        if len(det) >= CFG.min_history:
            med, sigma = window_stats(list(det.state_dict()["window"]), CFG.sigma_floor_rel)
            assert out.loc[i, "median"] == pytest.approx(med)
            assert out.loc[i, "warn"] == pytest.approx(med + CFG.k_warn * sigma)
            assert out.loc[i, "crit"] == pytest.approx(med + CFG.k_crit * sigma)
        else:
            assert math.isnan(out.loc[i, "median"])
        assert out.loc[i, "level"] == str(det.observe(loss).level)
    assert out.loc[20, "level"] == "critical"
    # the spike did not enter the window: the band after it is the band before it
    assert out.loc[21, "median"] == pytest.approx(out.loc[20, "median"])


def test_nonfinite_loss_is_critical_and_pinned_to_the_top():
    losses = [2.0] * 12 + [float("nan")] + [2.0]
    curve = _curve(losses)
    curve.loc[12, "loss"] = None
    curve.loc[12, "nonfinite"] = "nan"  # how SQLite keeps a NaN loss
    out = loss_bands(curve, CFG)
    assert out.loc[12, "level"] == "critical"
    assert out.loc[12, "loss_plot"] == pytest.approx(2.0)


def test_rollback_makes_a_new_branch_and_marks_redone_steps():
    steps = [0, 1, 2, 3, 4, 5, 3, 4, 5, 6]
    out = loss_bands(_curve([2.0] * len(steps), steps), CFG)
    assert list(out["branch"]) == [0] * 6 + [1] * 4
    assert list(out["superseded"]) == [False, False, False, True, True, True, False, False, False, False]
    back = rollbacks(_curve([2.0] * len(steps), steps))
    assert back.to_dict("records") == [{"from_step": 5, "to_step": 2}]


def test_empty_curve():
    out = loss_bands(_curve([]), CFG)
    assert out.empty and rollbacks(_curve([])).empty
