"""The loss chart's statistics: the spike rule's own, as the controller stored them.

For each loss the band is what the controller's spike rule knew just before judging it (stored
per step by ``controller.batch``, read by ``controller.store.read.rule_stats``): the median of the
recent healthy window and its robust σ; warn = median + k_warn·σ, critical = median + k_crit·σ,
with the k's the run was judged with; ``level`` is the rule's verdict. Nothing is recomputed here,
so the chart's spikes are the controller's spikes. Rows the controller stored no statistics for
(a store from before they were recorded, other ranks, downsampled buckets) get no band and level
``ok``.

Rollbacks: the trainer replays steps after a rollback, so step numbers go back. Each stretch
without a step going back is a *branch*; a row is *superseded* when a later row re-did its step
(the abandoned branch is drawn faded, the rollback as a jump).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from cliffguard.controller.store.read.rule_stats import STAT_COLUMNS, SpikeRuleStats
from cliffguard.core.floats import from_store_kind

_KEY = ["step", "ts"]  # one step_metrics row of one rank (a replayed step has a later ts)


def loss_bands(curve: pd.DataFrame, stats: SpikeRuleStats) -> pd.DataFrame:
    """``curve`` (step, ts, loss, nonfinite, ...) in write order -> the same rows plus median, warn,
    crit, sigmas, level, branch, superseded and loss_plot (non-finite losses pinned to the top)."""
    out = curve.copy().reset_index(drop=True)
    points = (pd.DataFrame(stats.points, columns=STAT_COLUMNS).astype({"step": "int64", "ts": "float64"})
              .drop_duplicates(_KEY, keep="last"))
    if len(out) and "ts" in out:
        keys = out[_KEY].astype({"step": "int64", "ts": "float64"})
        judged = keys.merge(points, on=_KEY, how="left")  # a left merge keeps the curve's order
    else:
        judged = pd.DataFrame(np.nan, index=out.index, columns=STAT_COLUMNS)
    median = pd.to_numeric(judged["median"], errors="coerce").to_numpy(dtype=float)
    sigma = pd.to_numeric(judged["sigma"], errors="coerce").to_numpy(dtype=float)
    rule = stats.rule or {}
    k_warn, k_crit = float(rule.get("k_warn", np.nan)), float(rule.get("k_crit", np.nan))
    loss = np.array([_loss_value(r, k) for r, k in zip(out.get("loss", []), out.get("nonfinite", []), strict=True)],
                    dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        sigmas = np.where(np.isfinite(loss), (loss - median) / sigma, np.nan)
    out["median"], out["warn"], out["crit"] = median, median + k_warn * sigma, median + k_crit * sigma
    out["sigmas"] = sigmas
    out["level"] = judged["level"].fillna("ok").astype(str).to_numpy() if len(out) else []
    steps = out["step"].to_numpy() if len(out) else np.array([], dtype=int)
    out["branch"] = np.concatenate([[0], np.cumsum(np.diff(steps) <= 0)]) if len(steps) else []
    out["superseded"] = _superseded(steps)
    numeric = pd.to_numeric(out.get("loss"), errors="coerce")
    finite = numeric.where(np.isfinite(numeric))  # inf arrives as inf from the read API on any database
    top = float(finite.max()) if finite.notna().any() else 1.0
    out["loss_plot"] = finite.fillna(top)
    return out


def rollbacks(curve: pd.DataFrame) -> pd.DataFrame:
    """Where the step went back in the stream: from_step (last step reported before) -> to_step
    (the restored step: the first step reported afterwards is to_step + 1)."""
    rows = []
    steps = list(curve["step"]) if len(curve) else []
    for prev, cur in zip(steps, steps[1:], strict=False):
        if cur <= prev:
            rows.append((int(prev), int(cur) - 1))
    return pd.DataFrame(rows, columns=["from_step", "to_step"])


def _superseded(steps: np.ndarray) -> np.ndarray:
    if len(steps) == 0:
        return np.array([], dtype=bool)
    later_min = np.minimum.accumulate(steps[::-1])[::-1]
    later_min = np.append(later_min[1:], np.iinfo(np.int64).max)
    return steps >= later_min


def _loss_value(raw: object, nonfinite: object) -> float:
    if isinstance(nonfinite, str) and nonfinite:
        return from_store_kind(nonfinite)
    try:
        return float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return np.nan
