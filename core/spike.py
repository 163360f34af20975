"""The loss-spike rule: each curve's own tail sets its thresholds, evidence is counted in points (pure).

The in-process guard (before ``optimizer.step()``) and the controller run this same code, so
what the guard skips and what the controller acts on can never disagree about the rule itself.

Per logged point, in order:

1. **Residual.** ``z = (loss - median) / σ``: the median of the healthy window's newest
   ``window_steps`` steps (at least ``min_history`` points), σ from its successive differences
   (``core/sliding.LevelWindow``: not inflated by the trend of a falling curve) and at least
   ``sigma_floor_rel`` × median. A point at or above ``k_warn`` σ warns and stays out of the
   window. NaN/±inf is critical at once.
2. **How rare on this curve** (``core/tail.py``): ``p``, the tail probability of ``z`` under a
   generalised Pareto fit of this curve's own residuals, refitted every 200 points (never per
   point). A point is learnt once it has left the evidence window outside an alarm,
   so an excursion never teaches the tail that it is normal. Before the first fit the seed rule's
   calibration stands in: ``k_warn`` σ is the ``evidence_p`` quantile, ``k_crit`` σ the budget's.
3. **Evidence, counted in points** (``core/evidence.py``): a point at or above ``k_warn`` σ with
   ``p < evidence_p`` weighs ``ln(evidence_p / p)``; the weights of the newest
   ``evidence_points`` points add up, so a bump with a quiet point inside is one excursion and a
   point of a log written every 50 steps is one point, not 50 steps. Where a grad norm is logged
   its own residuals (log space, its own tail: ``core/norm_evidence.py``) add to the same window.
4. **Critical** when the sum reaches the level at which a point of a curve behaving as it has so
   far would cross it at most ``budget`` times per 10,000 points, and the point is loss evidence
   itself (a norm alone never pauses); a point that is the window's only evidence must also be
   ``k_crit`` σ up. The alarm lasts to the first point back below ``k_warn``, which spends its
   evidence: a second spike soon after is judged afresh.

**Cold start.** Before ``min_history`` healthy points there is no median or σ worth the name: a
point is evidence when it is ``cold_rise`` above the median of the healthy points so far, and ``cold_points`` of
them among the newest ``evidence_points`` are critical — a warm-up blow-up (the loss climbing to
several times where the run started), not the one- to three-point bump many runs make at step 2.

``SpikeConfig`` gives each default's figures; ``docs/detection.md`` the trade-off over the budget.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cliffguard.core.enums import Level
from cliffguard.core.evidence import EvidenceWindow, crossing_level, weight
from cliffguard.core.norm_evidence import NormEvidence
from cliffguard.core.sliding import MAD_TO_SIGMA, LevelWindow, sorted_robust
from cliffguard.core.spike_config import SpikeConfig
from cliffguard.core.tail import TailModel

__all__ = ["MAD_TO_SIGMA", "SpikeConfig", "SpikeDetector", "SpikeVerdict", "robust_stats", "window_stats"]

# An enum member read through its class costs ~10x a module global (the enum's metaclass):
# the per-point paths below use these.
_OK, _WARN, _CRITICAL = Level.OK, Level.WARN, Level.CRITICAL

REFRESH = 5
"""Healthy points between two readings of the window's σ and of its spread (``spread_stats``, the
divergence rule's unit): both move slowly, and a MAD per point costs as much as the rest of the
rule (the grad-norm rules read theirs as seldom: ``controller/rules/robust.py``)."""
# judge's reasons, as codes (verdict() words them): what a healthy point costs stays an int compare
_ABOVE, _SHORT, _CROSSED, _GOES_ON = "above", "short", "crossed", "goes on"
_COLD, _COLD_CROSSED, _COLD_GOES_ON, _WARMING = "cold", "cold crossed", "cold goes on", "warming up"

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
    weight: float = 0.0
    """The evidence in the window with this point (ln units: ``core/evidence.py``)..."""
    weight_level: float = 0.0
    """...and the level it must reach for a critical."""
    onset_back: int = 0
    """Points before this one where the evidence in the window began (0: this point)."""

    def evidence(self) -> dict[str, Any]:
        return {"level": str(self.level), "loss": self.loss, "median": self.median, "sigma": self.sigma,
                "sigmas": self.sigmas, "n": self.n, "reason": self.reason, "weight": self.weight,
                "weight_level": self.weight_level}


def robust_stats(values: Iterable[float]) -> tuple[float, float]:
    """(median, 1.4826·MAD) of a non-empty window, without any floor."""
    return sorted_robust(sorted(values))


def window_stats(values: Iterable[float], sigma_floor_rel: float) -> tuple[float, float]:
    """(median, robust σ with the relative floor) of a non-empty window."""
    med, raw = robust_stats(values)
    return med, max(raw, sigma_floor_rel * abs(med), 1e-12)


def tail_model(cfg: SpikeConfig) -> TailModel:
    """A series' tail model, with the seed rule's calibration as the prior before its first fit:
    ``k_warn`` σ is the ``evidence_p`` quantile and ``k_crit`` σ the budget's (exponential between
    and beyond), so the first points of a run are judged as the seed rule judged every point."""
    return TailModel(block=100, keep=10, blocks=20,
                     prior=(cfg.k_warn, cfg.evidence_p, cfg.k_crit, min(cfg.budget / 1e4, cfg.evidence_p)))


class SpikeDetector:
    """Stateful: feed it global losses (and grad norms, where logged) in step order.

    ``interval`` is the typical number of steps between logged points (for ``window_steps``)."""

    def __init__(self, config: SpikeConfig | None = None) -> None:
        self.config = cfg = config or SpikeConfig()
        # the window, with its newest span (see _span) kept sorted as it slides
        self._window = LevelWindow(cfg.window)
        self._tail = tail_model(cfg)
        self._norms = NormEvidence(cfg.window, cfg.min_history, tail_model(cfg))
        self._evidence = EvidenceWindow(cfg.evidence_points)
        self._alarm = False  # a critical excursion is going on (until a point below k_warn)
        self._pending: deque[float] = deque()  # residuals not yet learnt (still in the evidence window)
        self._cold_min = math.inf  # the lowest healthy loss before min_history
        self._noise: float | None = None  # the window's σ, read every REFRESH healthy points
        self._noise_stale = 0
        self._spread: float | None = None  # spread_stats' MAD, read every REFRESH healthy points
        self._spread_stale = 0
        self._spread_span = 0
        self._norm_seen = False  # a grad norm has been judged: the window holds two series
        rate = cfg.budget / 1e4
        self._levels = (crossing_level(rate, cfg.evidence_p, cfg.evidence_points, 1),
                        crossing_level(rate, cfg.evidence_p, cfg.evidence_points, 2))
        # robust_stats of the used window and the interval it was used at, until either changes
        self._raw: tuple[float, float] | None = None
        self._raw_interval = math.nan
        self._span_at: tuple[float, int] = (math.nan, 0)  # (interval, _span of it), cached

    def _span(self, interval: float) -> int:
        """Newest points of a full window the statistics use at this logging interval."""
        if interval != self._span_at[0]:  # the interval rarely changes: asked twice per point
            cfg = self.config
            span = cfg.window if not cfg.window_steps else max(
                cfg.min_history, int(round(cfg.window_steps / max(interval, 1e-9))))
            self._span_at = (interval, min(span, cfg.window))
        return self._span_at[1]

    def _robust(self, interval: float) -> tuple[float, float]:
        """(median, raw σ) of the used window: the median once per window and interval, σ once
        per ``REFRESH`` healthy points (it moves slowly; its MAD is the costliest read here)."""
        raw = self._raw
        if raw is None or interval != self._raw_interval:
            window = self._window
            span = self._span(interval)
            if span != window.span:
                window.set_span(span)
            noise = self._noise
            if noise is None or self._noise_stale >= REFRESH:
                noise = self._noise = window.noise()
                self._noise_stale = 0
            raw = self._raw = (window.median(), noise)
            self._raw_interval = interval
        return raw

    def evidence_level(self) -> float:
        """The evidence a window must reach for a critical, with the series judged so far."""
        return self._levels[self._norm_seen]

    def judge(self, loss: float, interval: float = 1.0, grad_norm: float | None = None
              ) -> tuple[Level, float | None, float | None, float | None, str]:
        """Judge ``loss`` and learn from it; (level, median, sigma, sigmas, reason), for callers
        that need a ``SpikeVerdict`` only when it is not healthy (``verdict`` builds one)."""
        cfg = self.config
        if not math.isfinite(loss):
            self._alarm = True
            self._evidence.push(0.0)
            return _CRITICAL, None, None, None, "non-finite loss"
        if len(self._window.items) < cfg.min_history:
            return self._cold(loss)
        raw_stats = self._raw
        med, raw = raw_stats if raw_stats is not None and interval == self._raw_interval else self._robust(interval)
        sigma = cfg.sigma_floor_rel * abs(med)  # max(raw, floor, 1e-12), as max would pick it
        if raw > sigma:
            sigma = raw
        if not sigma > 1e-12:
            sigma = 1e-12
        k = (loss - med) / sigma
        alarm = self._alarm
        norm_s = 0.0
        if grad_norm is not None:
            self._norm_seen = True
            norm_s = self._norms.weigh(grad_norm, cfg.k_warn, cfg.evidence_p, not alarm)
        if k < cfg.k_warn:  # healthy: into the window and the tail; an alarm ends here
            self._window.append(loss)
            self._raw = None
            self._spread_stale += 1
            self._noise_stale += 1
            pending = self._pending  # _learn, inlined: this path runs for nearly every point
            pending.append(k)
            if len(pending) > cfg.evidence_points:
                self._tail.add(pending.popleft())
            if alarm:
                self._alarm = False
                self._evidence.clear()
            self._evidence.push(norm_s)
            return _OK, med, sigma, k, ""
        s = weight(self._tail.sf(k), cfg.evidence_p)
        if not alarm:
            self._learn(k)
        total = self._evidence.push(s + norm_s)
        if alarm:
            return _CRITICAL, med, sigma, k, _GOES_ON
        if s > 0 and total >= self._levels[self._norm_seen] and (k >= cfg.k_crit or not self._evidence.alone()):
            self._alarm = True
            self._pending.clear()  # the window's points were the excursion's: the tail never learns them
            return _CRITICAL, med, sigma, k, _CROSSED
        return _WARN, med, sigma, k, _ABOVE if s <= 0 else _SHORT

    def _learn(self, z: float) -> None:
        """The tail learns a residual once it has left the evidence window outside any alarm (the
        points an alarm is raised on are its excursion's, not the curve's noise)."""
        pending = self._pending
        pending.append(z)
        if len(pending) > self.config.evidence_points:
            self._tail.add(pending.popleft())

    def _cold(self, loss: float) -> tuple[Level, float | None, float | None, float | None, str]:
        """Before ``min_history`` healthy points: the rise over the lowest loss so far."""
        cfg = self.config
        # the level is the median of the healthy points so far, not their lowest: a noisy curve's
        # lowest point is its most extreme draw, and +50 % over it is ordinary noise on a small
        # batch (a batch-8 regression paused at steps 10-23 of 30 against its minimum)
        items = self._window.items
        low = statistics.median(items) if items else math.inf
        if loss >= low * (1.0 + cfg.cold_rise) and low > 0 and math.isfinite(low):
            n = self._evidence.push(1.0)
            if self._alarm:
                return _CRITICAL, None, None, None, _COLD_GOES_ON
            if n >= cfg.cold_points:
                self._alarm = True
                return _CRITICAL, None, None, None, _COLD_CROSSED
            # counted, kept out of the window, but no alert: most runs make a bump at step 2 or so
            return _OK, None, None, None, _COLD
        if self._alarm:
            self._alarm = False
            self._evidence.clear()
        self._evidence.push(0.0)
        self._window.append(loss)
        self._raw = None
        self._spread_stale += 1
        self._noise_stale += 1
        self._cold_min = min(low, loss)
        if len(self._window.items) >= cfg.min_history:
            self._evidence.clear()  # the cold start's counts are not the tail's weights
        return _OK, None, None, None, _WARMING

    def observe(self, loss: float, interval: float = 1.0, grad_norm: float | None = None) -> SpikeVerdict:
        """Judge ``loss`` (and learn from it) as a ``SpikeVerdict``."""
        n = len(self._window)
        level, med, sigma, k, reason = self.judge(loss, interval, grad_norm)
        return self.verdict(level, loss, med, sigma, k, reason, n)

    def verdict(self, level: Level, loss: float, med: float | None, sigma: float | None, k: float | None,
                why: str, n: int | None = None) -> SpikeVerdict:
        """The ``SpikeVerdict`` of a ``judge`` that just returned these figures (its reason, a
        short code there so a healthy or warning point formats nothing, in words here)."""
        ev = self._evidence
        total, at = ev.total(), self.evidence_level()
        if why.startswith("cold"):
            items = self._window.items
            low = statistics.median(items) if items else self._cold_min
            reason = f"cold start: {loss / low - 1:+.0%} over the median so far {low:.4g}"
            if why == _COLD_CROSSED:
                reason += f", {total:.0f} such points of the newest {self.config.evidence_points}"
        elif k is None or why in (_WARMING, ""):
            reason = why
        else:
            reason = f"{k:.1f}σ above median"
            if why == _CROSSED:
                reason += f", evidence {total:.1f} >= {at:.1f}"
            elif why == _SHORT:
                reason += f", evidence {total:.1f} < {at:.1f}"
        if why in (_GOES_ON, _COLD_GOES_ON):
            reason += " (excursion goes on)"
        return SpikeVerdict(level, loss, med, sigma, k, len(self._window) if n is None else n, reason,
                            total, at, ev.back() or 0)

    @property
    def alarm(self) -> bool:
        """Whether a critical excursion is going on (it ends at the first point below ``k_warn``)."""
        return self._alarm

    def stats(self, sigma_floor_rel: float | None = None, interval: float = 1.0) -> tuple[float, float] | None:
        """(median, σ) of the healthy window as the rule judges by them (σ from successive
        differences), with the config's σ floor unless one is given."""
        if len(self._window.items) < 2:
            return None
        med, raw = self._robust(interval)
        floor = self.config.sigma_floor_rel if sigma_floor_rel is None else sigma_floor_rel
        return med, max(raw, floor * abs(med), 1e-12)

    def spread_stats(self, sigma_floor_rel: float, interval: float = 1.0) -> tuple[float, float] | None:
        """(median, 1.4826·MAD of the window's values, floored): the scatter of healthy points
        about their level, wiggles and trend included — the unit of the divergence rule's CUSUM,
        so a stationary wiggle does not add up as a rise."""
        if len(self._window.items) < 2:
            return None
        med, _ = self._robust(interval)
        spread = self._spread
        if spread is None or self._spread_stale >= REFRESH or self._spread_span != self._window.span:
            spread = self._spread = self._window.spread()
            self._spread_stale, self._spread_span = 0, self._window.span
        return med, max(spread, sigma_floor_rel * abs(med), 1e-12)

    def tail_fit(self) -> tuple[float, float, float, float, float] | None:
        """The loss residuals' tail fit now: (location, u, ζ, ξ, β) (``core/tail.py``), None before the first."""
        return self._tail.fit

    def __len__(self) -> int:
        return len(self._window.items)

    def restart_excursion(self) -> None:
        """Forget the excursion and its evidence, keep what was learnt (the trainer rolled back)."""
        self._alarm = False
        self._evidence.clear()

    def rebase(self, values: Iterable[float]) -> None:
        """A level shift that lasted is the new normal: the window becomes ``values``, the excursion
        ends; the tail (the curve's noise, in σ) is kept."""
        self._window = LevelWindow(self.config.window, (float(v) for v in values), self._window.span)
        self._raw = self._spread = self._noise = None
        self.restart_excursion()

    def state_dict(self) -> dict[str, Any]:
        return {"window": list(self._window.items), "tail": self._tail.state_dict(),
                "evidence": self._evidence.state_dict(), "alarm": self._alarm, "pending": list(self._pending),
                "cold_min": None if math.isinf(self._cold_min) else self._cold_min,
                "norms": self._norms.state_dict(), "norm_seen": self._norm_seen,
                "spread": [self._spread, self._spread_stale, self._spread_span],
                "noise": [self._noise, self._noise_stale]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._window = LevelWindow(self.config.window, (float(v) for v in state["window"]), self._window.span)
        self._raw = None
        self._tail.load_state_dict(state.get("tail", {}))
        self._evidence.load_state_dict(state.get("evidence", {}))
        self._alarm = bool(state.get("alarm", False))
        self._pending = deque(float(z) for z in state.get("pending", []))
        cold = state.get("cold_min")
        self._cold_min = math.inf if cold is None else float(cold)
        self._norms.load_state_dict(state.get("norms", {}))
        self._norm_seen = bool(state.get("norm_seen", False))
        spread = state.get("spread", [None, 0, 0])
        self._spread = None if spread[0] is None else float(spread[0])
        self._spread_stale, self._spread_span = int(spread[1]), int(spread[2])
        noise = state.get("noise", [None, 0])
        self._noise = None if noise[0] is None else float(noise[0])
        self._noise_stale = int(noise[1])
