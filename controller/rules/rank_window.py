"""Every rank's sliding window in one numpy array, for the per-rank metric rules (pure).

The straggler, MFU and memory rules keep, per rank, the newest ``size`` points (a step and a few
values). A 16,384-rank run sends those as ``ranks`` arrays every few steps, so the windows live
in ring-buffer rows of one array and a whole chunk of ranks is appended, and every rank's median
taken, by a handful of array operations instead of a Python loop per rank.

Row ``i`` belongs to ``ranks[i]``: rows are added in the order the ranks were first seen, which is
the order the rules' earlier per-rank dicts iterated in (ties between ranks go to the first seen).
The medians are ``statistics.median``'s figures exactly: the middle value, or the two middle
values' sum halved, over the same values (a sort moves no value), so the rules judge as before.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

_NONE = -1


class RankWindows:
    """The newest ``size`` points of each rank: a step and ``width`` values each."""

    def __init__(self, size: int, width: int, dtype: type = np.float64) -> None:
        self.size, self.width, self.dtype = size, width, dtype
        self._clear()

    def _clear(self) -> None:
        size, width = self.size, self.width
        self.ranks: list[int] = []
        self._row = np.full(0, _NONE, np.int64)  # rank -> row
        self.steps = np.zeros((0, size), np.int64)
        self.values = np.zeros((width, 0, size), self.dtype)  # column-major: values[c, row] is one window
        self.start = np.zeros(0, np.int64)  # ring position of each row's oldest point
        self.count = np.zeros(0, np.int64)

    def __len__(self) -> int:
        return len(self.ranks)

    # -- rows ---------------------------------------------------------------------------------

    def row_of(self, rank: int) -> int | None:
        row = int(self._row[rank]) if 0 <= rank < len(self._row) else _NONE
        return None if row == _NONE else row

    def rows_for(self, ranks: np.ndarray) -> np.ndarray:
        """The rows of ``ranks`` (distinct), adding rows for new ranks in the order given."""
        if len(ranks) == 1:  # one rank's step event: no array work beyond the lookup
            row = self.row_of(int(ranks[0]))
            if row is not None:
                return np.array([row])
        if len(ranks) and int(ranks.max()) >= len(self._row):
            grown = np.full(max(int(ranks.max()) + 1, 2 * len(self._row)), _NONE, np.int64)
            grown[: len(self._row)] = self._row
            self._row = grown
        rows = self._row[ranks]
        new = rows == _NONE
        if new.any():
            fresh = ranks[new]
            first = len(self.ranks)
            self._grow(first + len(fresh))
            rows[new] = self._row[fresh] = np.arange(first, first + len(fresh))
            self.ranks += fresh.tolist()
        return rows

    def _grow(self, n: int) -> None:
        cap = len(self.start)
        if n <= cap:
            return
        cap = max(n, 2 * cap, 8)
        steps = np.zeros((cap, self.size), np.int64)
        values = np.zeros((self.width, cap, self.size), self.dtype)
        start, count = np.zeros(cap, np.int64), np.zeros(cap, np.int64)
        old = len(self.start)
        steps[:old], values[:, :old], start[:old], count[:old] = self.steps, self.values, self.start, self.count
        self.steps, self.values, self.start, self.count = steps, values, start, count

    # -- points -------------------------------------------------------------------------------

    def push(self, rows: np.ndarray, step: int, values: np.ndarray) -> None:
        """Append one point to each of ``rows`` (distinct); ``values`` is (len(rows), width)."""
        if len(rows) == 1:  # one rank's step event: plain indexing
            row = int(rows[0])
            start, count = int(self.start[row]), int(self.count[row])
            pos = (start + count) % self.size
            self.steps[row, pos] = step
            self.values[:, row, pos] = values[0]
            if count == self.size:
                self.start[row] = (start + 1) % self.size
            else:
                self.count[row] = count + 1
            return
        pos = (self.start[rows] + self.count[rows]) % self.size
        self.steps[rows, pos] = step
        self.values[:, rows, pos] = values.T
        full = self.count[rows] == self.size
        self.start[rows[full]] = (self.start[rows[full]] + 1) % self.size  # the oldest point left
        self.count[rows[~full]] += 1

    def drop_from(self, rows: np.ndarray, step: int) -> None:
        """Drop each row's newest points at or after ``step`` (rows whose steps only grow)."""
        if len(rows) == 1:  # one rank's step event: plain indexing
            row = int(rows[0])
            while self.count[row] and self.steps[row, (self.start[row] + self.count[row] - 1) % self.size] >= step:
                self.count[row] -= 1
            return
        while len(rows):
            rows = rows[(self.count[rows] > 0) & (self.steps[rows, (self.start[rows] + self.count[rows] - 1) % self.size] >= step)]
            self.count[rows] -= 1

    def valid(self) -> np.ndarray:
        """(rows, size): which ring slots hold a point."""
        n = len(self)
        if n and self.count[:n].min() == self.size:
            return np.ones((n, self.size), bool)  # every window full: the common case
        rel = np.arange(self.size) - self.start[:n, None]  # slot minus the oldest point's slot
        return np.where(rel >= 0, rel, rel + self.size) < self.count[:n, None]

    def first_steps(self) -> np.ndarray:
        n = len(self)
        return self.steps[np.arange(n), self.start[:n]]

    def last_steps(self) -> np.ndarray:
        n = len(self)
        return self.steps[np.arange(n), (self.start[:n] + self.count[:n] - 1) % self.size]

    def column(self, c: int) -> np.ndarray:
        """(rows, size) values of column ``c``, in ring order."""
        return self.values[c, : len(self)]

    def points(self, row: int) -> list[tuple[int, list[float | int]]]:
        """One row's points oldest first: (step, [values...]) as Python numbers."""
        idx = (self.start[row] + np.arange(self.count[row])) % self.size
        steps = self.steps[row, idx].tolist()
        cols = self.values[:, row, idx].T.tolist()
        return list(zip(steps, cols, strict=True))

    def ordered(self) -> tuple[list[list[int]], list[list[list[float | int]]]]:
        """Every row's steps, and each column's values per row, oldest first, as Python lists (the
        rules' stored state): a few array operations, and no Python object per point but the numbers."""
        n = len(self)
        rows = np.arange(n)[:, None]
        slots = (self.start[:n, None] + np.arange(self.size)) % self.size
        counts = self.count[:n].tolist()

        def cut(table: np.ndarray) -> list[list[float | int]]:
            return [r[:c] for r, c in zip(table[rows, slots].tolist(), counts, strict=True)]

        return cut(self.steps), [cut(self.values[c]) for c in range(self.width)]  # type: ignore[return-value]

    def load(self, per_rank: Iterable[tuple[int, Sequence[tuple[int, Sequence[float | int]]]]]) -> None:
        """Replace every row: (rank, its points oldest first), ranks in first-seen order."""
        self._clear()
        ranks: list[int] = []
        counts: list[int] = []
        steps: list[list[int]] = []
        values: list[list[Sequence[float | int]]] = []
        blank = [0] * self.width
        for rank, pts in per_rank:
            kept = list(pts)[-self.size:]  # a deque of maxlen size keeps the newest
            pad = self.size - len(kept)
            ranks.append(rank)
            counts.append(len(kept))
            steps.append([s for s, _ in kept] + [0] * pad)
            values.append([v for _, v in kept] + [blank] * pad)
        if not ranks:
            return
        rows = self.rows_for(np.array(ranks, np.int64))
        self.steps[rows] = steps
        shaped = np.array(values, self.dtype).reshape(len(ranks), self.size, self.width)
        self.values[:, rows] = np.moveaxis(shaped, -1, 0)
        self.count[rows] = counts


def row_medians(values: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's median over its masked slots and how many there were (NaN where none).

    ``values`` is (rows, slots), or (series, rows, slots) for several series under one mask."""
    keep = mask.any(axis=0)
    if not keep.all():  # slots no row uses (windows are usually aligned): less to sort
        values, mask = values[..., keep], mask[:, keep]
    a = np.where(mask, values, np.nan)
    a.sort(axis=-1)  # NaN (the padding) sorts last
    counts = mask.sum(axis=1)
    return _middle(a, counts), counts


def full_row_medians(values: np.ndarray) -> np.ndarray:
    """Each row's median over all its slots, in the rows' dtype's arithmetic (ints stay exact)."""
    a = np.sort(values, axis=1)
    n = a.shape[1]
    if n % 2:
        return a[:, n // 2]
    return (a[:, n // 2 - 1] + a[:, n // 2]) / 2


def _middle(sorted_rows: np.ndarray, counts: np.ndarray) -> np.ndarray:
    if sorted_rows.shape[-1] == 0:
        return np.full(sorted_rows.shape[:-1], np.nan)
    r = np.arange(len(counts))
    # counts <= slots, so counts // 2 is a slot; (0 - 1) // 2 is -1, a slot too, blanked below
    lo = sorted_rows[..., r, (counts - 1) // 2]
    hi = sorted_rows[..., r, counts // 2]
    out = np.where(counts % 2 == 1, lo, (lo + hi) / 2)
    out[..., counts == 0] = np.nan
    return out


def median(values: np.ndarray) -> float:
    """``statistics.median`` of a non-empty 1-D array, as a Python float."""
    a = np.sort(values)
    n = len(a)
    return float(a[n // 2]) if n % 2 else float((a[n // 2 - 1] + a[n // 2]) / 2)


def fmean(values: Sequence[float]) -> float:
    """``statistics.fmean``: the correctly rounded sum over the count."""
    return math.fsum(values) / len(values)
