"""Slow divergence: a sustained rise that no single point makes obvious (pure, no I/O).

Two tests were built and measured on the labelled suite (``tests/controller/synthetic.py``):

* ``cusum`` — a one-sided CUSUM of standardized residuals against the spike rule's healthy
  window: ``S = max(0, S + min(z, z_clip) - drift)``, alarm when ``S >= threshold``. Clipping
  ``z`` keeps one +70% outlier from contributing more than ``z_clip - drift``; the drift
  allowance makes a flat or falling curve pull ``S`` back to zero. The estimated onset is the
  step at which ``S`` last left zero (the classical CUSUM change-point estimate), moved
  ``onset_margin`` steps earlier.
* ``runmin`` — the median of the newest ``smooth`` losses against the running minimum of that
  median; alarm when it is ``threshold`` σ above the minimum. The onset is the step at which the
  minimum was reached.

See ``DivergenceConfig`` for the chosen default and the figures behind it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from statistics import median
from typing import Any

METHODS = ("cusum", "runmin")


@dataclass(kw_only=True, slots=True)
class DivergenceConfig:
    """Defaults chosen on the labelled suite (``synthetic.suite``; divergences climb at 1-2.5σ of
    lag behind a 100-step median, so the spike rule alone catches none of them at patience 3).

    ``suite(20, 8, seed=1)``, 120k steps, σ floor 0.01: cusum drift 0.5 threshold 20/40/80 ->
    divergence recall 1.00/1.00/0.875, median delay 68/86/128 steps, 0 false criticals; drift 1.0
    -> recall 0.75/0.625/0.625. runmin threshold 3/5/8 σ -> recall 1.00/0.75/0.625, delay
    170/220/342 steps. CUSUM wins (same recall, half the delay).

    ``suite(40, 10, seed=3, length=3000)``, 270k steps, with the whole controller rule set: the
    spike rule's σ floor (1% of the median) hid one divergence on a 0.57%-noise curve (recall 0.9);
    a 0.2% floor here -> recall 1.00, median delay 101 steps. One warmup bump (step ~290) then
    tripped it; ``grace_steps`` 300 -> recall 1.00, delay 101, 0 false criticals (0/40 clean curves,
    0/731 outliers). Largest CUSUM on 40 other clean 3000-step curves: 14.9 (threshold 40 leaves
    a 2.7x margin); the threshold 60 costs 30 steps of delay for no measured gain.

    Held out, all defaults (``python -m tests.controller.synthetic --seed 11``: 40 clean + 50
    injected 3000-step curves, 270k steps, 788 benign outliers): recall 1.00 for every kind,
    divergence median delay 85.5 steps, 0 false criticals, 0 outliers called critical."""

    enabled: bool = True
    """Run the rule at all."""
    method: str = "cusum"
    """``cusum`` or ``runmin`` (see the module docstring)."""
    drift: float = 0.5
    """CUSUM allowance per step, in σ: residuals below it pull the sum down."""
    threshold: float = 40.0
    """CUSUM: alarm when the sum reaches this many σ·steps. runmin: σ above the minimum."""
    z_clip: float = 3.0
    """CUSUM: a residual counts at most this many σ, so single outliers cannot trip it."""
    smooth: int = 50
    """runmin: losses in the running median compared with its minimum."""
    sigma_floor_rel: float = 0.002
    """σ floor relative to the median for the residuals (lower than the spike rule's: a CUSUM
    needs a sustained rise, so it can afford to see small σ on quiet curves)."""
    onset_margin: int = 50
    """Steps subtracted from the estimated onset. CUSUM starts counting when the residuals
    already lean up: on ``suite(0, 8, seed=11, length=3000)`` its start lagged the true onset by
    3-45 steps (median 23), and a rollback target must not be inside the excursion."""
    grace_steps: int = 300
    """Steps at the start of a run the rule ignores: warmup bumps are normal there (spikes and
    non-finite losses are still caught by the spike rule from its ``min_history`` on)."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method: must be one of {', '.join(METHODS)}")
        if self.drift < 0:
            raise ValueError("drift: must be >= 0")
        if self.threshold <= 0:
            raise ValueError("threshold: must be > 0")
        if self.z_clip <= self.drift:
            raise ValueError("z_clip: must be > drift")
        if self.smooth < 3:
            raise ValueError("smooth: must be >= 3")
        if not 0 <= self.sigma_floor_rel < 1:
            raise ValueError("sigma_floor_rel: must be in [0, 1)")
        if self.grace_steps < 0:
            raise ValueError("grace_steps: must be >= 0")
        if self.onset_margin < 0:
            raise ValueError("onset_margin: must be >= 0")


@dataclass(frozen=True, slots=True)
class DivergenceVerdict:
    fired: bool
    statistic: float
    """CUSUM sum, or σ above the running minimum."""
    onset_step: int | None

    def evidence(self) -> dict[str, Any]:
        return {"statistic": self.statistic, "onset_step": self.onset_step}


class DivergenceDetector:
    """Feed ``observe(step, loss, median, sigma)`` with the spike window's healthy stats."""

    def __init__(self, config: DivergenceConfig | None = None) -> None:
        self.config = config or DivergenceConfig()
        self._sum = 0.0
        self._start: int | None = None  # first step of the current positive CUSUM run
        self._recent: deque[float] = deque(maxlen=self.config.smooth)
        self._min: float | None = None
        self._min_step: int | None = None

    def reset(self) -> None:
        """Forget the current excursion (after a rollback or once it has been reported)."""
        self._sum = 0.0
        self._start = None
        self._recent.clear()
        self._min = None
        self._min_step = None

    def observe(self, step: int, loss: float, med: float | None, sigma: float | None) -> DivergenceVerdict:
        cfg = self.config
        if not cfg.enabled or med is None or sigma is None or not math.isfinite(loss) or step < cfg.grace_steps:
            return DivergenceVerdict(False, self._sum if cfg.method == "cusum" else 0.0, None)
        if cfg.method == "cusum":
            z = min((loss - med) / sigma, cfg.z_clip)
            new = max(0.0, self._sum + z - cfg.drift)
            if new > 0 and self._sum == 0:
                self._start = step
            elif new == 0:
                self._start = None
            self._sum = new
            onset = None if self._start is None else max(0, self._start - cfg.onset_margin)
            return DivergenceVerdict(new >= cfg.threshold, new, onset)
        self._recent.append(loss)
        if len(self._recent) < cfg.smooth:
            return DivergenceVerdict(False, 0.0, None)
        smoothed = median(self._recent)
        if self._min is None or smoothed < self._min:
            self._min, self._min_step = smoothed, step
        rise = (smoothed - self._min) / sigma
        return DivergenceVerdict(rise >= cfg.threshold, rise, self._min_step)

    def state_dict(self) -> dict[str, Any]:
        return {
            "sum": self._sum,
            "start": self._start,
            "recent": list(self._recent),
            "min": self._min,
            "min_step": self._min_step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._sum = float(state["sum"])
        self._start = state.get("start")
        self._recent = deque((float(v) for v in state.get("recent", [])), maxlen=self.config.smooth)
        self._min = state.get("min")
        self._min_step = state.get("min_step")
