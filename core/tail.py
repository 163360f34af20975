"""A curve's own upper tail: peaks over threshold with a generalised Pareto fit (pure, no I/O).

``TailModel`` learns how often a residual (a loss's robust z-score, or a grad norm's in log space)
reaches a given height *on this curve*, so a threshold can be set by a false-alarm rate rather
than a constant number of σ: a heavy-tailed per-rank log and a smooth all-reduced one get the
thresholds their own noise calls for.

How (the standard peaks-over-threshold model, Pickands 1975, Davison & Smith 1990): above a high
threshold ``u`` the exceedances of a stationary series are generalised-Pareto, so
``P(Z > z) = ζ · (1 + ξ (z - u) / β) ** (-1/ξ)`` for ``z > u``, with ``ζ`` the fraction of points
above ``u``. What is kept is bounded and small: the points arrive in blocks of ``block``; each block
keeps only its ``keep`` highest values (a heap), and the newest ``blocks`` blocks are pooled for the
fit, so the model follows a run whose noise changes and a burst cannot take over the pool (at most
``keep`` of one block's points count — the declustering POT fits use). Each block is centred on its
own median first, so a residual whose level drifts (a window median trailing a falling curve)
does not pass for a heavy tail. The fit runs once per block (amortised: never per point, on the
training thread or in the controller) — every ``REFIT_BLOCKS`` blocks — from ``MIN_EXCEEDANCES``
exceedances on.

The fit uses probability-weighted moments (Hosking & Wallis 1987), a closed form, rather than
``scipy.stats.genpareto.fit``: the maximum-likelihood fit costs ~7 ms (a generic optimiser,
measured) and is unstable below ~50 exceedances, where PWM is the recommended estimator; the tests
hold ``sf``/``isf`` to ``scipy.stats.genpareto`` and the fit to ``genpareto.fit`` on large samples.
Two choices keep it on the safe side, since a false alarm comes from a tail taken too light:
the shape is never below 0 (the tail is never assumed bounded, so a curve that has been quiet so
far is extrapolated exponentially, not cut off just above its largest point), and it is taken at
its upper one-standard-error bound, ``ξ + (1 + ξ)/√k`` for ``k`` exceedances — heavy on a short
history, tightening as points come (0.45 above the estimate at 5 exceedances, 0.1 at 100).
"""

from __future__ import annotations

import heapq
import math
import operator
from collections import deque
from typing import Any

MIN_EXCEEDANCES = 10
"""Fewest exceedances a fit uses; before, ``sf`` is the prior's (``ready`` is False). With 10 the
shape's bound is still 0.32 over its estimate; with 5 it was 0.45, so cautious that on the
development set a +20σ point 50 points into a quiet run was not critical (``bench.detection``:
recall 13/15 at 5, 14/15 at 10, 15 and 20; criticals per 10k negative points 0, 0.41, 0.41, 0.41;
per 10k hard-negative points 0.18, 0.55, 0.55, 1.09)."""
DIGITS = 4
"""Decimals a residual is kept to (in σ): far finer than a fit can tell, and the stored state, saved
with every batch the controller commits, stays a few kB instead of 15."""
REFIT_BLOCKS = 2
"""Blocks between two fits: a fit costs ~30 µs and its block summary as much (measured), so one
per 200 points costs a third of a microsecond a point."""
FIT_FRACTION = 0.5
"""Of the values kept per block (its top ``keep``), the upper half are the fit's exceedances: the
threshold ``u`` then sits near the ``1 - keep / (2 block)`` quantile of the pooled points."""


class TailModel:
    """Bounded POT model of one series' upper tail; feed it residuals with ``add``."""

    __slots__ = (
        "block",
        "keep",
        "blocks",
        "prior",
        "_done",
        "_cur",
        "_closed",
        "fit",
        "_loc",
        "_xi",
        "_beta",
        "_u",
        "_zeta",
    )

    def __init__(
        self,
        *,
        block: int = 100,
        keep: int = 10,
        blocks: int = 20,
        prior: tuple[float, float, float, float] | None = None,
    ) -> None:
        if not 1 <= keep <= block:
            raise ValueError("keep: must be between 1 and block")
        self.block, self.keep, self.blocks = block, keep, blocks
        self.prior = prior
        """(z1, p1, z2, p2): before the first fit, ``sf`` is the exponential tail through
        P(Z > z1) = p1 and P(Z > z2) = p2 (None: 1.0, nothing is rare before a fit)."""
        # per full block: (points, median, its `keep` highest values less the median, highest first)
        self._done: deque[tuple[int, float, list[float]]] = deque(maxlen=blocks)
        self._cur: list[float] = []  # the current block's residuals
        self._closed = 0  # blocks closed so far (a fit every REFIT_BLOCKS of them)
        self.fit: tuple[float, float, float, float, float] | None = None
        """(location, u, ζ, ξ, β) of the newest fit, None before the first."""
        self._loc = self._u = self._zeta = self._xi = self._beta = math.nan

    # -- feeding -----------------------------------------------------------------------------

    def add(self, z: float) -> None:
        """One residual (finite). O(1); refits every ``REFIT_BLOCKS`` blocks."""
        cur = self._cur
        cur.append(round(z, DIGITS))
        if len(cur) >= self.block:
            self._done.append(_summary(cur, self.keep))
            self._cur = []
            self._closed += 1
            if self._closed % REFIT_BLOCKS == 0:
                self._refit()

    @property
    def points(self) -> int:
        """Points the pooled (full) blocks stand for."""
        return sum(n for n, _, _ in self._done)

    @property
    def ready(self) -> bool:
        return self.fit is not None

    def _refit(self) -> None:
        blocks = self._done
        n = sum(b[0] for b in blocks)
        pool = sorted((v for _, _, vals in blocks for v in vals), reverse=True)
        k = min(max(MIN_EXCEEDANCES, int(FIT_FRACTION * self.keep * n / self.block)), len(pool) - 1)
        if k < MIN_EXCEEDANCES:
            return  # (two blocks of the default sizes: the first fit comes at 200 points)
        u = pool[k]
        excess = [v - u for v in reversed(pool[:k])]  # ascending
        xi_pwm, _ = pwm_fit(excess)
        xi = max(0.0, xi_pwm) if math.isfinite(xi_pwm) else 0.0
        # the shape at its upper one-σ bound (the estimate's standard error is about (1 + ξ)/√k):
        # a short history gives a heavy tail, hence a high threshold, and it tightens as points come
        xi = min(xi + (1.0 + xi) / math.sqrt(k), 0.9)  # below 1: a finite mean excess, a positive scale
        mean = sum(excess) / k
        beta = max(mean * (1.0 - xi), 1e-9)  # the mean excess of a GPD is β / (1 - ξ)
        # where the newest block's residuals sit, when above 0 (a curve climbing out of its window's
        # median); below 0 (a falling curve, its median trailing it) residuals are read as they are,
        # the cautious side: the location lags a block behind, and a falling curve falls faster early
        loc = max(blocks[-1][1], 0.0)
        self._loc, self._u, self._zeta, self._xi, self._beta = loc, u, k / n, xi, beta
        self.fit = (loc, u, k / n, xi, beta)

    # -- reading -----------------------------------------------------------------------------

    def sf(self, z: float) -> float:
        """P(Z > z) on this curve; 1.0 at or below the threshold (not in the modelled tail);
        before the first fit, the prior's."""
        if self.fit is None:
            return 1.0 if self.prior is None else anchored_sf(z, *self.prior)
        y = z - self._loc - self._u
        if y <= 0:
            return 1.0
        y /= self._beta
        xi = self._xi
        if xi < 1e-9:
            return self._zeta * math.exp(-y)
        return self._zeta * math.exp(-math.log1p(xi * y) / xi)

    def isf(self, p: float) -> float:
        """The level ``z`` with ``sf(z) == p`` for ``p`` below ζ (the threshold for any larger
        ``p``); +inf before the first fit."""
        if self.fit is None:
            return math.inf
        base = self._loc + self._u
        if p >= self._zeta:
            return base
        r = p / self._zeta
        xi = self._xi
        if xi < 1e-9:
            return base - self._beta * math.log(r)
        return base + self._beta / xi * (r**-xi - 1.0)

    # -- persistence -------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "done": [[n, med, list(vals)] for n, med, vals in self._done],
            "cur": list(self._cur),
            "closed": self._closed,
            "fit": None if self.fit is None else list(self.fit),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._done = deque(
            ((int(n), float(med), [float(v) for v in vals]) for n, med, vals in state.get("done", [])),
            maxlen=self.blocks,
        )
        self._cur = [float(v) for v in state.get("cur", [])]
        self._closed = int(state.get("closed", len(self._done)))
        fit = state.get("fit")
        if fit is None:
            self.fit = None
            self._loc = self._u = self._zeta = self._xi = self._beta = math.nan
        else:
            loc, u, zeta, xi, beta = (float(x) for x in fit)
            self.fit = (loc, u, zeta, xi, beta)
            self._loc, self._u, self._zeta, self._xi, self._beta = loc, u, zeta, xi, beta


CHUNK = 10
"""Points per stretch of a block whose median the block's trend is drawn through (``_summary``)."""


def _summary(values: list[float], keep: int) -> tuple[int, float, list[float]]:
    """A block as the fit needs it: its size, where its trend ends, and its ``keep`` highest
    excesses over that trend, highest first. The trend is a straight line through the medians of
    its stretches of ``CHUNK`` points (the slope is the median of their pairwise slopes, Theil-Sen,
    the level the median of their offsets): a residual that drifts — a window's median trailing a
    curve that falls fast, faster at the start — then does not pass for a heavy tail, and a spike
    stands out of the line as it does of the curve."""
    n = len(values)
    xs: list[float] = []
    meds: list[float] = []
    for i in range(0, n, CHUNK):
        ordered = sorted(values[i : i + CHUNK])
        m = len(ordered)
        meds.append(ordered[m // 2] if m % 2 else 0.5 * (ordered[m // 2 - 1] + ordered[m // 2]))
        xs.append(i + 0.5 * (m - 1))
    slopes = sorted(
        (meds[b] - meds[a]) / (xs[b] - xs[a]) for a in range(len(xs)) for b in range(a + 1, len(xs))
    )
    slope = _median(slopes) if slopes else 0.0
    level = _median(sorted(m - slope * x for x, m in zip(xs, meds, strict=True)))
    excess = heapq.nlargest(keep, [v - level - slope * i for i, v in enumerate(values)])
    return n, round(level + slope * (n - 1), DIGITS), [round(v, DIGITS) for v in excess]


def _median(ordered: list[float]) -> float:
    m = len(ordered)
    return ordered[m // 2] if m % 2 else 0.5 * (ordered[m // 2 - 1] + ordered[m // 2])


def anchored_sf(z: float, z1: float, p1: float, z2: float, p2: float) -> float:
    """The exponential tail through P(Z > z1) = p1 and P(Z > z2) = p2 (z1 < z2), at ``z``; 1.0
    below ``z1`` where it would exceed p1's side of the curve."""
    if z <= z1:
        return 1.0
    return p1 * (p2 / p1) ** ((z - z1) / (z2 - z1))


def pwm_fit(excess: list[float]) -> tuple[float, float]:
    """(ξ, β) of a generalised Pareto distribution (location 0, scipy's sign of ξ) from
    exceedances sorted ascending, by probability-weighted moments (Hosking & Wallis 1987, with
    the plotting positions (j - 0.35) / k). NaN when the moments give none (all equal)."""
    k = len(excess)
    total = sum(excess)
    a0 = total / k
    # Σ (1 - (j + 0.65)/k) y_j / k, as Σ y_j / k - Σ (j + 0.65) y_j / k²: one weighted sum in C
    a1 = a0 - (sum(map(operator.mul, range(k), excess)) + 0.65 * total) / (k * k)
    d = a0 - 2.0 * a1
    if not d > 0:
        return math.nan, math.nan
    return 2.0 - a0 / d, 2.0 * a0 * a1 / d
