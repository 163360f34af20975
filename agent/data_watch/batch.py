"""One batch's figures, pure numpy on the host: which token slots are real, each sequence's length,
the token-frequency sketch and each sequence's novelty.

*Lengths*: an attention mask says which slots hold tokens; else a ``pad_id`` marks padding; else
every slot is a token (the bundled trainer's fixed-length byte windows). Lengths go into log2 bins
(``LEN_BINS``, fixed for every run, so histograms compare across runs like the gradient ones).

*Sketch*: each token id is counted in one of ``buckets`` buckets: an id below ``buckets`` has its
own (a byte vocabulary is counted exactly), a larger one is hashed (Fibonacci hashing of the id),
so a vocabulary of any size fits a fixed, comparable sketch: one row of a count-min sketch.

*Novelty*: a sequence's mean surprisal, ``-log p`` per token, under the run's token frequencies
seen so far (add-one smoothed, this batch not yet counted). After a shift to other text the new
sequences are the surprising ones, so a drift verdict can name them.
"""

from __future__ import annotations

import numpy as np

LEN_BINS = 17
"""Length bins: 0 for an empty sequence, i for lengths in [2^(i-1), 2^i), the last open-ended (>= 32,768)."""
_MIX = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio: Fibonacci hashing


def token_slots(tokens: np.ndarray, mask: np.ndarray | None = None, pad_id: int | None = None) -> np.ndarray:
    """[B, T] bool: the slots that hold a token (not padding)."""
    if mask is not None:
        if mask.shape != tokens.shape:
            raise ValueError(f"attention_mask: shape {mask.shape} differs from the batch's {tokens.shape}")
        return mask.astype(bool)
    if pad_id is not None:
        return tokens != pad_id
    return np.ones(tokens.shape, dtype=bool)


def length_counts(lengths: np.ndarray) -> np.ndarray:
    """[LEN_BINS] counts of ``lengths`` in the log2 bins."""
    bins = np.zeros(len(lengths), dtype=np.int64)
    pos = lengths > 0
    bins[pos] = np.minimum(np.floor(np.log2(lengths[pos])).astype(np.int64) + 1, LEN_BINS - 1)
    return np.bincount(bins, minlength=LEN_BINS)


def bucket_ids(tokens: np.ndarray, buckets: int) -> np.ndarray:
    """Each token's sketch bucket (see the module docstring)."""
    ids = tokens.astype(np.int64, copy=False)
    if ids.size and (int(ids.max()) >= buckets or int(ids.min()) < 0):
        hashed = ((ids.astype(np.uint64) * _MIX) >> np.uint64(32)) % np.uint64(buckets)
        return np.where((ids >= 0) & (ids < buckets), ids, hashed.astype(np.int64))
    return ids


class TokenSketch:
    """The run's token frequencies so far, in buckets; ``observe`` scores a batch's novelty against
    them and then counts the batch in."""

    def __init__(self, buckets: int) -> None:
        self.buckets = buckets
        self.counts = np.zeros(buckets, dtype=np.float64)
        self.total = 0.0

    def observe(self, tokens: np.ndarray, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the batch's counts per bucket [buckets] int64, each sequence's novelty [B] in nats per token)."""
        b = bucket_ids(tokens, self.buckets)
        counts = np.bincount(b[slots], minlength=self.buckets)
        logp = np.log((self.counts + 1.0) / (self.total + self.buckets))
        n = slots.sum(1)
        novelty = -np.where(slots, logp[b], 0.0).sum(1) / np.maximum(n, 1)
        self.counts += counts
        self.total += float(counts.sum())
        return counts, novelty
