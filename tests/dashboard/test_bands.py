"""The loss chart's bands are the statistics the controller stored, never a second run of the rule."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from cliffguard.controller.store.read.rule_stats import SpikeRuleStats
from cliffguard.dashboard.bands import loss_bands, rollbacks

RULE = {"window": 20, "k_warn": 3.0, "k_crit": 5.0, "min_history": 10}


def _curve(losses: list[float], steps: list[int] | None = None) -> pd.DataFrame:
    steps = list(range(len(losses))) if steps is None else steps
    return pd.DataFrame({"step": steps, "ts": [100.0 + i for i in range(len(losses))], "loss": losses,
                         "nonfinite": [None] * len(losses)})


def _point(step: int, ts: float, median: float | None, sigma: float | None, level: str) -> dict:
    return {"step": step, "ts": ts, "median": median, "sigma": sigma, "level": level}


def test_bands_levels_and_sigmas_are_the_stored_statistics():
    curve = _curve([2.0, 2.1, 4.0, 2.0])
    stats = SpikeRuleStats(rule=RULE, points=[
        _point(0, 100.0, None, None, "ok"),  # warming up: no band yet
        _point(1, 101.0, 2.0, 0.1, "ok"),
        _point(2, 102.0, 2.0, 0.1, "critical"),
        _point(3, 103.0, 2.05, 0.2, "ok"),
    ])
    out = loss_bands(curve, stats)
    assert math.isnan(out.loc[0, "median"]) and math.isnan(out.loc[0, "warn"])
    assert (out.loc[2, "median"], out.loc[2, "warn"], out.loc[2, "crit"]) == pytest.approx((2.0, 2.3, 2.5))
    assert out.loc[2, "sigmas"] == pytest.approx(20.0)
    assert out.loc[3, "crit"] == pytest.approx(2.05 + 5 * 0.2)
    assert list(out["level"]) == ["ok", "ok", "critical", "ok"]


def test_rows_without_stored_statistics_get_no_band_and_level_ok():
    curve = _curve([2.0, 2.0, 9.0])
    for stats in (SpikeRuleStats(), SpikeRuleStats(rule=RULE, points=[_point(0, 100.0, 2.0, 0.1, "ok")])):
        out = loss_bands(curve, stats)
        assert out.loc[1:, "median"].isna().all() and out.loc[1:, "crit"].isna().all()
        assert list(out["level"]) == ["ok", "ok", "ok"]  # 9.0 is not re-judged here
    assert math.isnan(loss_bands(curve, SpikeRuleStats()).loc[0, "median"])


def test_a_replayed_step_takes_the_statistics_of_its_own_row():
    steps = [0, 1, 2, 1, 2]
    curve = _curve([2.0, 2.0, 9.0, 2.0, 2.0], steps)
    stats = SpikeRuleStats(rule=RULE, points=[_point(2, 102.0, 2.0, 0.1, "critical"), _point(2, 104.0, 2.0, 0.1, "ok")])
    out = loss_bands(curve, stats)
    assert list(out["level"]) == ["ok", "ok", "critical", "ok", "ok"]
    assert list(out["superseded"]) == [False, True, True, False, False]


def test_nonfinite_loss_is_pinned_to_the_top_with_the_stored_level():
    curve = _curve([2.0] * 12 + [float("nan")] + [2.0])
    curve.loc[12, "loss"] = None
    curve.loc[12, "nonfinite"] = "nan"  # how SQLite keeps a NaN loss
    out = loss_bands(curve, SpikeRuleStats(rule=RULE, points=[_point(12, 112.0, 2.0, 0.02, "critical")]))
    assert out.loc[12, "level"] == "critical" and math.isnan(out.loc[12, "sigmas"])
    assert out.loc[12, "median"] == pytest.approx(2.0)
    assert out.loc[12, "loss_plot"] == pytest.approx(2.0)


def test_rollback_makes_a_new_branch_and_marks_redone_steps():
    steps = [0, 1, 2, 3, 4, 5, 3, 4, 5, 6]
    out = loss_bands(_curve([2.0] * len(steps), steps), SpikeRuleStats())
    assert list(out["branch"]) == [0] * 6 + [1] * 4
    assert list(out["superseded"]) == [False, False, False, True, True, True, False, False, False, False]
    back = rollbacks(_curve([2.0] * len(steps), steps))
    assert back.to_dict("records") == [{"from_step": 5, "to_step": 2}]


def test_empty_curve():
    out = loss_bands(_curve([]), SpikeRuleStats(rule=RULE))
    assert out.empty and rollbacks(_curve([])).empty


def test_infinite_loss_is_pinned_to_the_largest_finite_loss():
    import math

    import pandas as pd

    from cliffguard.controller.store.read.rule_stats import SpikeRuleStats
    from cliffguard.dashboard.bands import loss_bands

    curve = pd.DataFrame({"step": [1, 2, 3], "ts": [1.0, 2.0, 3.0], "loss": [2.0, math.inf, 3.0],
                          "nonfinite": [None, None, None]})
    out = loss_bands(curve, SpikeRuleStats())
    assert list(out["loss_plot"]) == [2.0, 3.0, 3.0]
