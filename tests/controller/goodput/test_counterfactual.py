"""The checkpoint-interval counterfactual on a case computed by hand."""

from __future__ import annotations

import math

import pytest

from cliffguard.controller.goodput.counterfactual import (
    daly_interval_s,
    interval_table,
    waste_per_hour_s,
    young_interval_s,
)


def test_young_and_daly_on_a_hand_computed_case():
    # stall 2 s per checkpoint, a failure every hour: Young sqrt(2*2*3600) = 120 s;
    # Daly 120 * (1 + sqrt(2/7200)/3 + (2/7200)/9) - 2 = 120 * 1.005586... - 2
    assert young_interval_s(2.0, 3600.0) == pytest.approx(120.0)
    assert daly_interval_s(2.0, 3600.0) == pytest.approx(120.0 * (1 + (1 / 60) / 3 + (1 / 3600) / 9) - 2.0)
    assert daly_interval_s(9000.0, 3600.0) == 3600.0  # a stall beyond 2 M: checkpoint once per MTBF


def test_the_table_for_a_run_that_checkpoints_every_100_steps_of_half_a_second():
    out = interval_table(step_s=0.5, interval_steps=100, stall_s=2.0, restore_s=10.0, mtbf_s=3600.0)
    rows = {r["interval_steps"]: r for r in out["rows"]}
    assert out["young_interval_steps"] == 240  # 120 s / 0.5 s
    now = rows[100]
    assert now["current"] and not now["optimum"]
    assert now["loss_per_failure_s"] == pytest.approx(25.0 + 10.0)  # half of 50 s redone, plus the restore
    assert now["stall_per_hour_s"] == pytest.approx(3600 * 2.0 / 50.0)  # 144 s
    assert now["waste_per_hour_s"] == pytest.approx(144.0 + 35.0)
    best = rows[240]
    assert best["optimum"] and best["waste_per_hour_s"] == pytest.approx(60.0 + 70.0)
    assert min(r["waste_per_hour_s"] for r in out["rows"]) == best["waste_per_hour_s"]
    assert sorted(rows) == [25, 50, 100, 200, 240, 400]


def test_waste_is_least_at_young_s_interval():
    tau = young_interval_s(3.0, 7200.0)
    here = waste_per_hour_s(tau, 3.0, 5.0, 7200.0)
    assert all(waste_per_hour_s(tau * f, 3.0, 5.0, 7200.0) > here for f in (0.5, 0.9, 1.1, 2.0))
    assert math.isfinite(here)
