"""The checkpoint interval's counterfactual: what a failure costs at interval k, what the stalls
cost, and the optimum of Young (1974) and Daly (2006).

With a checkpoint every τ seconds of training, a stall of δ per checkpoint, a restore of R per
failure and a mean time between failures M, the first-order expected waste per second of
training is ``δ/τ + (τ/2 + R)/M``: the stalls, plus on each failure half an interval of work redone
and the restore. It is least at Young's ``τ = √(2δM)``; Daly's higher-order optimum
``√(2δM)·(1 + ⅓√(δ/2M) + (δ/2M)/9) − δ`` (for δ < 2M, else M) is the better one when δ is not
small next to M. Pure functions; ``summary.py`` feeds them the run's measured figures.
"""

from __future__ import annotations

import math
from typing import Any


def young_interval_s(stall_s: float, mtbf_s: float) -> float:
    return math.sqrt(2.0 * stall_s * mtbf_s)


def daly_interval_s(stall_s: float, mtbf_s: float) -> float:
    if stall_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = stall_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * stall_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - stall_s


def waste_per_hour_s(interval_s: float, stall_s: float, restore_s: float, mtbf_s: float) -> float:
    """Expected seconds lost per hour of training at a checkpoint every ``interval_s``."""
    return 3600.0 * (stall_s / interval_s + (interval_s / 2.0 + restore_s) / mtbf_s)


def interval_table(*, step_s: float, interval_steps: int, stall_s: float, restore_s: float, mtbf_s: float
                   ) -> dict[str, Any]:
    """The counterfactual for a run that checkpoints every ``interval_steps`` steps of ``step_s``:
    per candidate interval (a quarter of it up to four times it, and the optimum), the expected
    loss per failure, the stall per hour and the expected waste per hour; and both optima."""
    young = young_interval_s(stall_s, mtbf_s)
    daly = daly_interval_s(stall_s, mtbf_s)
    best_steps = max(1, round(young / step_s))
    candidates = sorted({max(1, round(interval_steps * f)) for f in (0.25, 0.5, 1, 2, 4)} | {best_steps})
    rows = []
    for k in candidates:
        tau = k * step_s
        rows.append({"interval_steps": k, "interval_s": tau, "loss_per_failure_s": tau / 2.0 + restore_s,
                     "stall_per_hour_s": 3600.0 * stall_s / tau,
                     "waste_per_hour_s": waste_per_hour_s(tau, stall_s, restore_s, mtbf_s),
                     "current": k == interval_steps, "optimum": k == best_steps})
    return {"step_s": step_s, "interval_steps": interval_steps, "stall_s": stall_s, "restore_s": restore_s,
            "mtbf_s": mtbf_s, "young_interval_s": young, "young_interval_steps": best_steps,
            "daly_interval_s": daly, "daly_interval_steps": max(1, round(daly / step_s)), "rows": rows}
