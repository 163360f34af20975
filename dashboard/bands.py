"""The loss chart's statistics, computed by replaying the very spike rule the controller runs.

For each loss (in write order) the band is what ``core.spike.SpikeDetector`` knew just before
judging it: the median of the recent healthy window and the robust σ of
``core.spike.window_stats``; warn = median + k_warn·σ, critical = median + k_crit·σ. Spikes do
not enter the window, exactly as in the detector, so a spike does not widen its own band.

Rollbacks: the trainer replays steps after a rollback, so step numbers go back. Each stretch
without a step going back is a *branch*; a row is *superseded* when a later row re-did its step
(the abandoned branch is drawn faded, the rollback as a jump).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from core.spike import SpikeConfig, SpikeDetector


def loss_bands(curve: pd.DataFrame, cfg: SpikeConfig) -> pd.DataFrame:
    """``curve`` (step, loss, nonfinite, ...) in write order -> the same rows plus median, warn,
    crit, sigmas, level, branch, superseded and loss_plot (non-finite losses pinned to the top)."""
    out = curve.copy().reset_index(drop=True)
    det = SpikeDetector(cfg)
    med, warn, crit, sigmas, levels = [], [], [], [], []
    for raw, nonfinite in zip(out.get("loss", []), out.get("nonfinite", []), strict=True):
        loss = _loss_value(raw, nonfinite)
        stats = det.stats() if len(det) >= cfg.min_history else None
        verdict = det.observe(loss)
        if stats is None:
            med.append(np.nan), warn.append(np.nan), crit.append(np.nan)
        else:
            m, s = stats
            med.append(m), warn.append(m + cfg.k_warn * s), crit.append(m + cfg.k_crit * s)
        sigmas.append(np.nan if verdict.sigmas is None else verdict.sigmas)
        levels.append(str(verdict.level))
    out["median"], out["warn"], out["crit"] = med, warn, crit
    out["sigmas"], out["level"] = sigmas, levels
    steps = out["step"].to_numpy() if len(out) else np.array([], dtype=int)
    out["branch"] = np.concatenate([[0], np.cumsum(np.diff(steps) <= 0)]) if len(steps) else []
    out["superseded"] = _superseded(steps)
    finite = pd.to_numeric(out.get("loss"), errors="coerce")
    top = float(np.nanmax(finite)) if finite.notna().any() else 1.0
    out["loss_plot"] = finite.where(finite.notna() & np.isfinite(finite), top)
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
        return {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}.get(nonfinite, math.nan)
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan
    return value
