"""A false-alarm budget as a threshold: from a baseline sample of a statistic on a clean stretch of
the run, the level that clean data exceeds at the declared rate.

The baseline's tail above its median ``u`` is modelled as exponential (a generalised Pareto tail of
shape 0): ``P(x > u + e) = p_u * exp(-e / scale)``, where ``p_u`` is the share of the sample above ``u``
and ``scale`` is estimated from the median excess over ``u`` (an exponential's median is
``scale * ln 2``), not the mean: a baseline that caught a bad batch or two (a fault during the first
200 steps) keeps the threshold a clean one would have. The threshold for a
target rate ``r`` (false alarms per judged point) is ``u + scale * ln(p_u / r)``, and never less than
``u + floor``: the floor keeps a statistic that barely moves on clean data (a duplicate share of 0
throughout) from alarming on its first small wiggle. Statistics whose tail is lighter than
exponential (a divergence of sampling noise, a bounded share) get a threshold above what they need:
fewer false alarms than declared, not more. Pure; ``Threshold`` is plain data (it is rule state).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from statistics import median
from typing import Any


@dataclass(frozen=True, slots=True)
class Threshold:
    median: float
    """The baseline's median ``u``."""
    scale: float
    """The exponential tail's scale: median excess over the median / ln 2 (0 for a baseline that
    never rises above its median)."""
    level: float
    """The threshold: a value above it is an alarm."""
    n: int
    """Baseline points it was fitted on."""

    def rearm(self) -> float:
        """Halfway back from the threshold to the median: an excursion ends below it (hysteresis)."""
        return self.median + (self.level - self.median) / 2

    def to_state(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Threshold:
        return cls(median=float(state["median"]), scale=float(state["scale"]), level=float(state["level"]),
                   n=int(state["n"]))


def calibrate(values: Iterable[float], target: float, floor: float) -> Threshold:
    """The threshold for ``target`` false alarms per point on data like ``values`` (finite ones),
    at least ``floor`` above their median (see the module docstring)."""
    if not 0 < target < 1:
        raise ValueError("target: must be in (0, 1)")
    xs = [v for v in values if math.isfinite(v)]
    if not xs:
        raise ValueError("values: no finite baseline value to calibrate on")
    u = median(xs)
    excess = [v - u for v in xs if v > u]
    scale = median(excess) / math.log(2) if excess else 0.0
    p_u = len(excess) / len(xs)
    margin = scale * math.log(p_u / target) if excess and p_u > target else 0.0
    return Threshold(median=u, scale=scale, level=u + max(margin, floor), n=len(xs))


def js_divergence(p: Iterable[float], q: Iterable[float]) -> float:
    """Jensen-Shannon divergence (nats, in [0, ln 2]) of two count vectors of one length, each
    normalised; 0 when either is all zeros (nothing to compare)."""
    ps, qs = list(p), list(q)
    if len(ps) != len(qs):
        raise ValueError(f"counts: lengths differ ({len(ps)} and {len(qs)})")
    sp, sq = sum(ps), sum(qs)
    if sp <= 0 or sq <= 0:
        return 0.0
    out = 0.0
    for a, b in zip(ps, qs, strict=True):
        a, b = a / sp, b / sq
        m = (a + b) / 2
        if a > 0:
            out += 0.5 * a * math.log(a / m)
        if b > 0:
            out += 0.5 * b * math.log(b / m)
    return max(out, 0.0)
