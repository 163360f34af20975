"""Near-duplicate sequences: MinHash signatures of shingles, banded (LSH) against the sequences of
the same batch and of the last ``dup_window_steps`` steps.

A sequence's shingles are its windows of ``shingle`` consecutive tokens (hashed with a rolling
polynomial; a window touching a padding slot does not count). Its signature is, for each of
``num_perm`` random affine hashes, the smallest value over its shingles, so two sequences agree in a
signature position with probability equal to the Jaccard similarity of their shingle sets. The
signature is cut into ``bands``; two sequences sharing a whole band are candidates, and a candidate
counts when the signatures agree in at least ``dup_threshold`` of their positions.

This is the scheme ``cliffguard data`` runs offline with datasketch (cliffguard/data/dedup.py), done
here for a whole batch at once in numpy: datasketch hashes each shingle with SHA-1 and builds one
``MinHash`` object per sequence (~4.6 ms for a batch of 8 byte windows on this machine, ~200 us
more for its LSH insert and query), where the vectorised signatures and a dict of band keys take
~0.1-0.2 ms, which is what lets it run every step.

A rollback replays steps the index has already seen; ``rewind(step)`` forgets those, so a replayed
batch is not its own duplicate.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from cliffguard.agent.data_watch.config import DataWatchConfig

_PRIME = np.uint64(1_099_511_628_211)  # FNV-64's prime: the rolling shingle hash
_EMPTY = np.uint64(2**64 - 1)


@dataclass(frozen=True, slots=True)
class _Entry:
    step: int
    sample_id: int
    sig: np.ndarray
    keys: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Duplicates:
    """One batch's verdicts, per sequence."""

    in_batch: np.ndarray
    """[B] bool: a near-duplicate of an earlier sequence of the same batch."""
    in_window: np.ndarray
    """[B] bool: a near-duplicate of a sequence of an earlier batch in the window (and not of its own batch's)."""
    similarity: np.ndarray
    """[B] float: the estimated Jaccard similarity to the closest match (0 = none)."""
    of: list[int | None]
    """The sample id each duplicates, or None."""

    @property
    def any(self) -> np.ndarray:
        return self.in_batch | self.in_window


class NearDuplicates:
    def __init__(self, cfg: DataWatchConfig) -> None:
        rng = np.random.default_rng(cfg.seed)
        self.k = cfg.shingle
        self.bands = cfg.bands
        self.rows = cfg.num_perm // cfg.bands
        self.threshold = cfg.dup_threshold
        self.window_steps = cfg.dup_window_steps
        self._a = rng.integers(1, 2**63, cfg.num_perm, dtype=np.uint64) | np.uint64(1)
        self._b = rng.integers(0, 2**63, cfg.num_perm, dtype=np.uint64)
        self._band_mix = rng.integers(1, 2**63, self.rows, dtype=np.uint64) | np.uint64(1)
        self._band_tag = rng.integers(0, 2**63, self.bands, dtype=np.uint64)
        self._by_band: dict[int, int] = {}  # band key -> the newest entry holding it
        self._entries: dict[int, _Entry] = {}
        self._order: deque[int] = deque()  # entry ids, oldest first (steps ascending)
        self._next = 0

    def __len__(self) -> int:
        return len(self._entries)

    def signatures(self, tokens: np.ndarray, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """([B, num_perm] MinHash signatures, [B] bool: the sequence has at least one whole shingle)."""
        b, t = tokens.shape
        k = min(self.k, t)
        n = t - k + 1
        h = _shingles(tokens, k)
        with np.errstate(over="ignore"):  # the hashes wrap modulo 2^64 on purpose
            h ^= h >> np.uint64(29)
            values = h[:, :, None] * self._a + self._b
        if slots.all():  # no padding (the bundled trainer's windows): every shingle counts
            return values.min(1), np.full(b, n > 0)
        whole = sliding_window_view(slots, k, axis=1).all(-1)
        values[~whole] = _EMPTY
        return values.min(1), whole.any(1)

    def _keys(self, sig: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            bands = sig.reshape(sig.shape[0], self.bands, self.rows)
            return (bands * self._band_mix).sum(-1, dtype=np.uint64) ^ self._band_tag

    def observe(self, steps: np.ndarray | int, sample_ids: list[int], sig: np.ndarray, has: np.ndarray) -> Duplicates:
        """Judge sequences against the index, then add them to it, row by row in order; ``steps``:
        each row's step (ascending; one int for a single batch)."""
        n = len(sample_ids)
        row_steps = np.full(n, steps) if np.isscalar(steps) else np.asarray(steps)
        in_batch, in_window = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        similarity, of = np.zeros(n), [None] * n
        keys = self._keys(sig).tolist()
        by_band, entries = self._by_band, self._entries
        current = None
        for i in range(n):
            step = int(row_steps[i])
            if step != current:
                self._expire(step)
                current = step
            row_keys = tuple(keys[i])
            if has[i]:
                best, best_j = None, -1.0
                for key in row_keys:
                    e = by_band.get(key)
                    entry = entries.get(e) if e is not None else None
                    if entry is None:
                        continue
                    j = float(np.count_nonzero(entry.sig == sig[i])) / sig.shape[1]
                    if j > best_j:
                        best, best_j = entry, j
                if best is not None and best_j >= self.threshold:
                    similarity[i], of[i] = best_j, best.sample_id
                    if best.step == step:
                        in_batch[i] = True
                    else:
                        in_window[i] = True
                self._add(_Entry(step, int(sample_ids[i]), sig[i], row_keys))
        return Duplicates(in_batch=in_batch, in_window=in_window, similarity=similarity, of=of)

    def rewind(self, step: int) -> None:
        """Forget the sequences of ``step`` and later (the loop went back to ``step``)."""
        while self._order and self._entries[self._order[-1]].step >= step:
            self._drop(self._order.pop())

    def _add(self, entry: _Entry) -> None:
        eid = self._next
        self._next += 1
        self._entries[eid] = entry
        self._order.append(eid)
        for key in entry.keys:
            self._by_band[key] = eid

    def _expire(self, step: int) -> None:
        oldest = step - self.window_steps
        while self._order and self._entries[self._order[0]].step < oldest:
            self._drop(self._order.popleft())

    def _drop(self, eid: int) -> None:
        entry = self._entries.pop(eid)
        for key in entry.keys:
            if self._by_band.get(key) == eid:
                del self._by_band[key]


def _shingles(tokens: np.ndarray, k: int) -> np.ndarray:
    """[B, T - k + 1] uint64 hashes of each window of ``k`` tokens. For 8-token windows the low byte
    of every token is read as one little-endian uint64 straight from memory (a byte vocabulary
    needs nothing else), and the tokens' higher bits, where any are set, are folded in by a
    rolling hash; other widths use the rolling hash of the whole ids."""
    b, t = tokens.shape
    n = t - k + 1
    ids = tokens.astype(np.int64, copy=False)
    if k != 8:
        return _rolling(ids.astype(np.uint64), k, n)
    low = np.ascontiguousarray(ids & 0xFF, dtype=np.uint8)
    h = np.ndarray((b, n), dtype=np.uint64, buffer=low, strides=(t, 1)).copy()
    if ids.size and (int(ids.max()) > 0xFF or int(ids.min()) < 0):
        h ^= _rolling((ids >> 8).astype(np.uint64), k, n)
    return h


def _rolling(a: np.ndarray, k: int, n: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        h = np.zeros((a.shape[0], n), dtype=np.uint64)
        for j in range(k):
            h = h * _PRIME + a[:, j : j + n]
    return h
