"""Evidence counted over the last few logged points, with a threshold set by a false-alarm rate (pure).

A point is *evidence* when its tail probability on its own curve (``core.tail``) is below
``p_w``; it then weighs ``s = ln(p_w / p)``: a point at the ``p_w`` quantile weighs nothing, one a
thousand times rarer weighs ln 1000 ≈ 6.9. ``EvidenceWindow`` sums the weights of the newest ``n``
points (the truncated product of p-values, Zaykin et al. 2002, over a sliding window), so a bump
with a quiet point inside is still one excursion — its points keep counting across the dip — and
on a sparse log a point counts as one point, whatever the steps between points.

``crossing_level`` turns the false-alarm budget into the level the sum must reach. Under the null
(independent points, so each point's p is uniform) an evidence point's weight is Exp(1), a point
is evidence with probability ``p_w``, and the sum of the window is a Gamma of as many units as it
holds evidence points. A window can only reach the level at a point that is itself evidence (any
other point adds nothing), so the rate of crossings per point is at most

    p_w · Σ_m P(M = m) · P(Gamma(m, 1) ≥ a),   M = 1 + Binomial(units - 1, p_w)

where ``units`` is the evidence a window can hold (``n`` points of each series judged). The
level is the ``a`` where that equals the budget: one point alone must have ``p ≲ budget``, two
points about its square root each, ten points a little under ``p_w`` each.
"""

from __future__ import annotations

import math
from collections import deque
from functools import lru_cache


@lru_cache(maxsize=64)
def crossing_level(rate: float, p_w: float, n: int, series: int = 1) -> float:
    """The window sum at which a point's crossing has probability ``rate`` under the null, for
    ``n`` points of ``series`` independent series per window (see the module docstring)."""
    if not 0 < p_w < 1 or n < 1 or series < 1:
        raise ValueError("crossing_level: needs 0 < p_w < 1, n >= 1, series >= 1")
    if rate >= p_w:
        return 0.0  # every evidence point is a crossing and still within the rate
    others = n * series - 1
    binom = [math.comb(others, k) * p_w**k * (1 - p_w) ** (others - k) for k in range(others + 1)]

    def crossing(a: float) -> float:
        # P(Gamma(m) >= a) = e^-a Σ_{j<m} a^j / j!, accumulated as m grows
        term, tail, total = math.exp(-a), 0.0, 0.0
        for k, w in enumerate(binom):
            tail += term
            term *= a / (k + 1)
            total += w * tail
        return p_w * total

    lo, hi = 0.0, 1.0
    while crossing(hi) > rate:
        hi *= 2.0
    for _ in range(60):  # bisection to ~1e-16 relative: the level is computed once per setting
        mid = 0.5 * (lo + hi)
        if crossing(mid) > rate:
            lo = mid
        else:
            hi = mid
    return hi


def weight(p: float, p_w: float) -> float:
    """A point's evidence: ``ln(p_w / p)`` below ``p_w``, else 0 (a probability that underflowed
    to 0 weighs as one of 1e-300)."""
    return math.log(p_w / max(p, 1e-300)) if p < p_w else 0.0


class EvidenceWindow:
    """The evidence of the newest ``n`` points: only the points that carry some are kept."""

    __slots__ = ("n", "_items", "_count")

    def __init__(self, n: int) -> None:
        self.n = n
        self._items: deque[tuple[int, float]] = deque()  # (point number, weight > 0)
        self._count = 0  # points pushed so far

    def push(self, s: float) -> float:
        """Add the newest point's evidence (0 for none) and return the window's sum."""
        self._count += 1
        items = self._items
        if not items and not s > 0:  # the usual case: nothing in the window, nothing added
            return 0.0
        oldest = self._count - self.n
        while items and items[0][0] <= oldest:
            items.popleft()
        if s > 0:
            items.append((self._count, s))
        return self.total() if items else 0.0

    def total(self) -> float:
        return sum(s for _, s in self._items)

    def alone(self) -> bool:
        """Whether the newest point is the window's only evidence."""
        return len(self._items) == 1 and self._items[0][0] == self._count

    def back(self) -> int | None:
        """How many points before the newest the oldest evidence in the window is (None if none)."""
        return self._count - self._items[0][0] if self._items else None

    def clear(self) -> None:
        self._items.clear()

    def __bool__(self) -> bool:
        return bool(self._items)

    def state_dict(self) -> dict[str, object]:
        return {"count": self._count, "items": [[i, s] for i, s in self._items]}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self._count = int(state.get("count", 0))  # type: ignore[call-overload]
        self._items = deque((int(i), float(s)) for i, s in state.get("items", []))  # type: ignore[union-attr]
