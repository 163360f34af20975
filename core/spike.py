"""The loss-spike rule: sliding median + k·σ over recent healthy losses (pure, no I/O).

The in-process guard (before ``optimizer.step()``) and the controller run this same code, so
what the guard skips and what the controller acts on can never disagree about the rule itself.

``σ`` is a robust spread: 1.4826 × the median absolute deviation (MAD) of the window, which
equals the standard deviation for Gaussian noise but is not inflated by the very outliers it is
meant to find. A floor of ``sigma_floor_rel × median`` keeps a flat, noiseless curve from
alarming on a 0.1% wiggle. Losses at or above ``k_warn`` σ are kept out of the window, so a spike
cannot raise the bar for the next one. NaN/±inf is critical at once. Before ``min_history``
healthy points the rule only reports non-finite losses.

Confirmation is severity-aware and counted in *steps*: a moderate excursion (``k_crit`` σ or
more) must last ``patience`` steps before it is critical, where a logged point stands for the
steps since the previous one (the caller passes that gap; the in-process guard sees every step,
so there a step is a point). A point at ``k_extreme`` σ *and* ``jump_extreme`` above the median
is critical at once: a +35%, 15σ point is not noise, whatever follows it. With ``window_steps``
the statistics use only the healthy points of the newest ``window_steps`` steps (never fewer than
``min_history`` points), so a curve logged every 10 steps is judged on the same stretch of
training as a per-step one rather than on ten times as much of a falling curve.

Defaults are chosen on the labelled synthetic suite in ``tests/controller/synthetic.py`` and
checked on real curves with ``python -m bench.detection``; see ``SpikeConfig`` for the figures.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cliffguard.core.declared import bounded, check_declared
from cliffguard.core.enums import Level
from cliffguard.core.sliding import MAD_TO_SIGMA, SlidingWindow, sorted_robust

__all__ = ["MAD_TO_SIGMA", "SpikeConfig", "SpikeDetector", "SpikeVerdict", "robust_stats", "window_stats"]

# An enum member read through its class costs ~10x a module global (the enum's metaclass):
# the per-point paths below use these.
_OK = Level.OK


@dataclass(kw_only=True, slots=True)
class SpikeConfig:
    """Figures for the step-aware and extreme settings, all controller defaults, on a development
    set of 25 real curves (``bench/detection.py``; 11 labelled windows, 44,000 points of healthy
    negatives, 5 per-rank speedrun logs with one-step +15-70% data outliers): recall 11/11, 0.68
    criticals per 10k negative points, 0 rollbacks (16 paused-and-resumed criticals) on the
    data-outlier curves, spike delay 0-1 logged points. ``window_steps`` 0 (a 100-point window,
    1000 steps of a falling curve logged every 10) misses 3 of its 4 spike windows (recall 8/11);
    ``k_crit`` 4/5/6 -> recall 11/11, 11/11, 10/11 at 2.27/0.68/0 criticals per 10k negative
    points; ``jump_extreme`` 0.15/0.25/0.5 -> 21/16/0 criticals on the data-outlier curves, all
    resumed. On the synthetic suite (seed 11) the extreme rule pauses for 583 of 788 benign
    outliers and resumes every one (0 rollbacks)."""

    window: int = bounded(100, ge=8)
    """Healthy losses kept for the median and σ."""
    k_warn: float = 3.0
    """σ above the median that warns."""
    k_crit: float = 5.0
    """σ above the median that is critical (the controller pauses; the guard skips)."""
    min_history: int = 20
    """Healthy points needed before the rule decides anything but non-finite losses."""
    sigma_floor_rel: float = bounded(0.01, ge=0, lt=1)
    """σ is at least this fraction of the median, so a flat curve does not alarm on noise."""
    patience: int = bounded(3, ge=1)
    """Steps at or above k_crit before the controller's verdict is critical (1 = at once); each
    logged point counts for the steps since the previous one; points before that are reported as
    warn. Measured on ``synthetic.suite(20, 8, seed=1)``
    (120k steps, 300 benign +15-70% outliers): 1 -> 267/300 outliers critical, 27.5 false
    criticals per 10k steps; 2 -> 0.083 per 10k; 3 -> 0 false criticals, few-step/step-up recall
    1.00 at a 2-step delay; 4 -> few-step recall 0.875. Hence 3."""
    guard_patience: int = bounded(1, ge=1)
    """The same for the in-process guard, which skips one update rather than pausing the run:
    skipping a batch is cheap, a pause is not, so it acts at once."""
    k_extreme: float = bounded(10.0, gt=0, why="it only matters at or above k_crit")
    """σ above the median beyond which a point is critical at once, patience or not..."""
    jump_extreme: float = bounded(0.25, ge=0)
    """...if it is also at least this fraction above the median (both must hold)."""
    window_steps: int = bounded(200, ge=0)
    """Judge on the healthy points of the newest this-many steps only (0 = the whole window);
    at least ``min_history`` points are always used."""

    def __post_init__(self) -> None:
        check_declared(self)
        if not 0 < self.k_warn <= self.k_crit:
            raise ValueError("k_warn: must be > 0 and <= k_crit")
        if not 2 <= self.min_history <= self.window:
            raise ValueError("min_history: must be between 2 and window")


@dataclass(frozen=True, slots=True)
class SpikeVerdict:
    level: Level
    loss: float
    median: float | None
    sigma: float | None
    sigmas: float | None
    """How many σ the loss is above the median (None before min_history or for non-finite)."""
    n: int
    """Healthy points in the window when the verdict was made."""
    reason: str = ""

    def evidence(self) -> dict[str, Any]:
        return {
            "level": str(self.level),
            "loss": self.loss,
            "median": self.median,
            "sigma": self.sigma,
            "sigmas": self.sigmas,
            "n": self.n,
            "reason": self.reason,
        }


def robust_stats(values: Iterable[float]) -> tuple[float, float]:
    """(median, 1.4826·MAD) of a non-empty window, without any floor."""
    return sorted_robust(sorted(values))


def window_stats(values: Iterable[float], sigma_floor_rel: float) -> tuple[float, float]:
    """(median, robust σ with the relative floor) of a non-empty window."""
    med, raw = robust_stats(values)
    return med, _floored(med, raw, sigma_floor_rel)


def _floored(med: float, raw_sigma: float, sigma_floor_rel: float) -> float:
    return max(raw_sigma, sigma_floor_rel * abs(med), 1e-12)


class SpikeDetector:
    """Stateful wrapper around the rule: feed it global losses in step order.

    ``gap`` is the number of steps since the previous point (1 for per-step losses) and
    ``interval`` the typical one (for ``window_steps``); both default to 1."""

    def __init__(self, config: SpikeConfig | None = None) -> None:
        self.config = config or SpikeConfig()
        # the window, with its newest span (see _span) kept sorted as it slides
        self._window = SlidingWindow(self.config.window)
        self._crit_run = 0  # steps at or above k_crit so far in this excursion
        # robust_stats of the used window and the interval it was used at, until either changes
        self._raw: tuple[float, float] | None = None
        self._raw_interval = math.nan
        self._span_at: tuple[float, int] = (math.nan, 0)  # (interval, _span of it), cached

    def _span(self, interval: float) -> int:
        """Newest points of a full window the statistics use at this logging interval (at most
        the window, as ``SlidingWindow.set_span`` would clamp it)."""
        if interval != self._span_at[0]:  # the interval rarely changes: asked twice per point
            cfg = self.config
            span = cfg.window if not cfg.window_steps else max(
                cfg.min_history, int(round(cfg.window_steps / max(interval, 1e-9))))
            self._span_at = (interval, min(span, cfg.window))
        return self._span_at[1]

    def _robust(self, interval: float) -> tuple[float, float]:
        """(median, raw σ) of the used window; computed once per window and interval (the spike
        and divergence rules both ask, at the same interval, once per point each)."""
        raw = self._raw
        if raw is None or interval != self._raw_interval:
            window = self._window
            span = self._span(interval)
            if span != window.span:
                window.set_span(span)
            raw = self._raw = window.robust()
            self._raw_interval = interval
        return raw

    def _judge(self, loss: float, gap: int, interval: float) -> tuple[Level, float | None, float | None,
                                                                     float | None, str]:
        """peek's figures: (level, median, sigma, sigmas, reason)."""
        cfg = self.config
        if not math.isfinite(loss):
            return Level.CRITICAL, None, None, None, "non-finite loss"
        if len(self._window.items) < cfg.min_history:
            return _OK, None, None, None, "warming up"
        med, raw = self._robust(interval)
        sigma = max(raw, cfg.sigma_floor_rel * abs(med), 1e-12)
        k = (loss - med) / sigma
        if k >= cfg.k_crit:
            why = f"{k:.1f}σ above median"
            if k >= cfg.k_extreme and loss >= med * (1 + cfg.jump_extreme):
                return Level.CRITICAL, med, sigma, k, f"{why} (extreme)"
            if self._crit_run + max(1, gap) >= cfg.patience:
                return Level.CRITICAL, med, sigma, k, why
            return Level.WARN, med, sigma, k, f"{why} (patience)"
        if k >= cfg.k_warn:
            return Level.WARN, med, sigma, k, f"{k:.1f}σ above median"
        return _OK, med, sigma, k, ""

    def peek(self, loss: float, gap: int = 1, interval: float = 1.0) -> SpikeVerdict:
        """The verdict for ``loss`` without changing any state."""
        level, med, sigma, k, reason = self._judge(loss, gap, interval)
        return SpikeVerdict(level, loss, med, sigma, k, len(self._window), reason)

    def judge(self, loss: float, gap: int = 1, interval: float = 1.0) -> tuple[Level, float | None, float | None,
                                                                               float | None, str]:
        """``observe``'s verdict as a tuple (level, median, sigma, sigmas, reason), for callers that
        judge a loss per event and need a ``SpikeVerdict`` only when it is not healthy (its ``n``
        is then ``len(self)``: only a healthy loss enters the window)."""
        judged = self._judge(loss, gap, interval)
        if judged[0] is _OK:  # finite, below k_warn (or warming up): into the window
            self._crit_run = 0
            self._window.append(loss)
            self._raw = None
        else:  # non-finite, or at or above k_warn
            k = judged[3]
            self._crit_run = self._crit_run + max(1, gap) if k is None or k >= self.config.k_crit else 0
        return judged

    def observe(self, loss: float, gap: int = 1, interval: float = 1.0) -> SpikeVerdict:
        """Judge ``loss`` and, if healthy, add it to the window."""
        n = len(self._window)
        level, med, sigma, k, reason = self.judge(loss, gap, interval)
        return SpikeVerdict(level, loss, med, sigma, k, n, reason)

    def stats(self, sigma_floor_rel: float | None = None, interval: float = 1.0) -> tuple[float, float] | None:
        """(median, σ) of the healthy window, with the config's σ floor unless one is given."""
        if len(self._window.items) < 2:
            return None
        med, raw = self._robust(interval)
        floor = self.config.sigma_floor_rel if sigma_floor_rel is None else sigma_floor_rel
        return med, max(raw, floor * abs(med), 1e-12)  # _floored, inlined: asked once per point

    def __len__(self) -> int:
        return len(self._window.items)

    def state_dict(self) -> dict[str, Any]:
        return {"window": list(self._window.items), "crit_run": self._crit_run}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._window = SlidingWindow(self.config.window, (float(v) for v in state["window"]), self._window.span)
        self._raw = None
        self._crit_run = int(state.get("crit_run", 0))
