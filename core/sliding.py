"""A sliding window kept sorted as it slides: median and 1.4826·MAD without a sort per point (pure).

``SlidingWindow`` holds the newest ``maxlen`` values in arrival order and, beside them, the newest
``span`` of those values in sorted order, updated by one ``bisect.insort`` and one removal per
appended value. ``robust()`` then reads the median in O(1) and the median absolute deviation in
O(log n): the deviations left of the median, read outward, and those right of it are two sorted
sequences, and their k-th smallest is found by a binary search over how many come from each.

The figures are bit for bit those of ``core.spike.robust_stats`` over the same values (the same
subtractions, the same halving of the middle pair), so the rules that use it judge exactly as
they did when they sorted their window for every point.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterable

MAD_TO_SIGMA = 1.4826


def sorted_median(vals: list[float]) -> float:
    """Median of an already sorted, non-empty list."""
    n = len(vals)
    mid = n // 2
    return vals[mid] if n % 2 else 0.5 * (vals[mid - 1] + vals[mid])


def sorted_robust(vals: list[float], hint: list[int] | None = None) -> tuple[float, float]:
    """(median, 1.4826·MAD) of an already sorted, non-empty list, without sorting the deviations.

    ``hint`` (a one-item list, updated in place) carries where the search for the MAD ended last
    time: a window that slid by one value ends it at or next to the same place, so it is tried
    first. The figures do not depend on it."""
    n = len(vals)
    mid = n // 2
    if n % 2:
        med = vals[mid]
        return med, MAD_TO_SIGMA * _kth_deviations(vals, med, bisect_left(vals, med), mid, hint)[1]
    med = 0.5 * (vals[mid - 1] + vals[mid])
    below, at = _kth_deviations(vals, med, bisect_left(vals, med), mid, hint)  # vals[:split] < med <= vals[split:]
    return med, MAD_TO_SIGMA * (0.5 * (below + at))


def _kth_deviations(vals: list[float], med: float, split: int, k: int,
                    hint: list[int] | None = None) -> tuple[float, float]:
    """The (k-1)-th and k-th smallest (0-based; k >= 1 for the first) of ``abs(v - med)`` over ``vals``.

    Left of ``split`` the deviations ``med - v`` grow as v moves left; right of it ``v - med``
    grows as v moves right. ``med - v`` is exactly ``abs(v - med)`` for v < med (IEEE rounding is
    symmetric), so the values found are the ones a sort of the deviations would put at k-1 and k:
    the k+1 smallest are the first ``lo`` of the left and the first ``j`` of the right, the k-th
    is the larger of the two sides' last, the (k-1)-th the larger of what is left then."""
    n_left, n_right = split, len(vals) - split
    lo = k + 1 - n_right if k + 1 > n_right else 0
    hi = k + 1 if k + 1 < n_left else n_left
    # lo is the smallest count i taken from the left with left[i] >= right[k - i] (hi if none):
    # the condition below holds for every i under it and for none at or over it, so any search
    # finds the same lo. The hint's neighbourhood is probed first, then the rest is bisected.
    if hint is not None and lo < hint[0] <= hi:
        h = hint[0]
        if med - vals[split - h] < vals[split + k - h + 1] - med:  # it holds at h - 1: lo >= h
            lo = h
            if h < hi:
                if not med - vals[split - 1 - h] < vals[split + k - h] - med:
                    hi = h
                else:
                    lo = h + 1
                    if h + 1 < hi and not med - vals[split - 2 - h] < vals[split + k - h - 1] - med:
                        hi = h + 1
        else:  # lo <= h - 1
            hi = h - 1
            if lo < hi and med - vals[split - h + 1] < vals[split + k - h + 2] - med:  # it holds at h - 2
                lo = hi
    while lo < hi:
        i = (lo + hi) // 2
        if med - vals[split - 1 - i] < vals[split + k - i] - med:
            lo = i + 1
        else:
            hi = i
    if hint is not None:
        hint[0] = lo
    j = k + 1 - lo
    left = med - vals[split - lo] if lo > 0 else -math.inf
    right = vals[split + j - 1] - med if j > 0 else -math.inf
    if left >= right:  # the k-th is the left side's last: the (k-1)-th is its previous or the right's last
        return max(med - vals[split - lo + 1] if lo > 1 else -math.inf, right), left
    return max(vals[split + j - 2] - med if j > 1 else -math.inf, left), right


class SlidingWindow:
    """The newest ``maxlen`` values, and the newest ``span`` of them sorted (``span`` <= maxlen)."""

    __slots__ = ("items", "span", "_sorted", "_hint")

    def __init__(self, maxlen: int, values: Iterable[float] = (), span: int | None = None) -> None:
        self.items: deque[float] = deque(values, maxlen=maxlen)
        self.span = maxlen if span is None else min(span, maxlen)
        self._sorted: list[float] = []
        self._hint = [0]  # where robust()'s last search ended (see sorted_robust)
        self._rebuild()

    def _rebuild(self) -> None:
        items = self.items
        tail = list(items)[-self.span:] if self.span < len(items) else items
        self._sorted = sorted(tail)

    def __len__(self) -> int:
        return len(self.items)

    def append(self, value: float) -> None:
        items = self.items
        if len(items) >= self.span:  # the value leaving the sorted span
            sv = self._sorted
            del sv[bisect_left(sv, items[-self.span])]
        insort(self._sorted, value)
        items.append(value)

    def clear(self) -> None:
        self.items.clear()
        self._sorted = []

    def set_span(self, span: int) -> None:
        """Sort the newest ``span`` values from now on (a re-sort only when the span changes)."""
        span = min(span, self.items.maxlen or span)
        if span != self.span:
            self.span = span
            self._rebuild()

    def tail(self) -> list[float]:
        """The newest ``min(len, span)`` values, sorted (the caller must not change it)."""
        return self._sorted

    def median(self) -> float:
        return sorted_median(self._sorted)

    def robust(self) -> tuple[float, float]:
        """(median, 1.4826·MAD) of the sorted span; the window must not be empty."""
        return sorted_robust(self._sorted, self._hint)


class LevelWindow:
    """A curve's healthy values: their level (the median of the newest ``span``) and their noise
    (σ from successive differences: 1.4826·MAD of ``x[i] - x[i-1]`` over the whole window, / √2).

    The noise is read from differences so that the trend of a falling curve does not inflate it:
    it can then use every point of the window, and be precise, while the level follows only the
    newest span. For independent noise it is the noise's σ; for noise correlated from point to
    point it is smaller, and the tail model (``core/tail.py``) learns how far points stray. The
    differences are those of the values held, so the window alone restores it exactly."""

    __slots__ = ("values", "diffs", "items")

    def __init__(self, maxlen: int, values: Iterable[float] = (), span: int | None = None) -> None:
        self.values = SlidingWindow(maxlen, values, span)
        self.items: deque[float] = self.values.items
        """The values, oldest first (the caller must not change it)."""
        held = list(self.items)
        self.diffs = SlidingWindow(max(1, maxlen - 1), (b - a for a, b in zip(held, held[1:], strict=False)))

    @property
    def span(self) -> int:
        return self.values.span

    def __len__(self) -> int:
        return len(self.values.items)

    def append(self, value: float) -> None:
        items = self.items
        if items:  # the two SlidingWindow.append, written out: this runs for every healthy point
            diffs = self.diffs
            d = value - items[-1]
            ditems, dsorted = diffs.items, diffs._sorted
            if len(ditems) >= diffs.span:
                del dsorted[bisect_left(dsorted, ditems[-diffs.span])]
            insort(dsorted, d)
            ditems.append(d)
        values = self.values
        vsorted = values._sorted
        if len(items) >= values.span:
            del vsorted[bisect_left(vsorted, items[-values.span])]
        insort(vsorted, value)
        items.append(value)

    def set_span(self, span: int) -> None:
        self.values.set_span(span)

    def spread(self) -> float:
        """1.4826·MAD of the newest span's values themselves: how far they scatter about their
        median, slow wiggles and trend included (what a CUSUM of residuals needs as its unit)."""
        return self.values.robust()[1]

    def median(self) -> float:
        """Median of the newest span; the window must not be empty."""
        return self.values.median()

    def noise(self) -> float:
        """σ from the successive differences (0 with fewer than two values)."""
        return self.diffs.robust()[1] / SQRT2 if self.diffs.items else 0.0

    def robust(self) -> tuple[float, float]:
        """(median of the newest span, σ from the differences); the window must not be empty
        (σ is 0 with fewer than two values)."""
        med = self.values.median()
        if not self.diffs.items:
            return med, 0.0
        return med, self.diffs.robust()[1] / SQRT2


SQRT2 = math.sqrt(2.0)
