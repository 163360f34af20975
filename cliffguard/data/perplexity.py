"""Perplexity reweighting with a reference model trained locally: an add-k smoothed byte trigram LM.

Trained on the corpus itself (a pass before scoring), nothing downloaded. Code and prose from
the corpus score low perplexity; bad OCR, mojibake and random bytes score high, because their
byte trigrams are rare in the corpus. A document's weight is ``clip(tolerance * median / ppl, floor, 1)``:
documents up to ``tolerance`` times the median keep weight 1 (half the corpus is above the median,
and that is no fault), one twice as far out gets 0.5.
Counts live in a 256^3 uint32 table (64 MiB) whatever the corpus size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cliffguard.core.declared import bounded, check_declared


@dataclass(kw_only=True, slots=True)
class PerplexityConfig:
    add_k: float = bounded(0.1, gt=0)
    """Additive smoothing per trigram count."""
    max_doc_bytes: int = bounded(65_536, ge=3)
    """Bytes of a document used to train on and to score (its head): bounds the time per document."""
    floor: float = bounded(0.1, gt=0, le=1)
    """Lowest weight perplexity gives."""
    tolerance: float = bounded(2.0, ge=1)
    """Perplexity up to this multiple of the median keeps weight 1."""

    def __post_init__(self) -> None:
        check_declared(self)


def _trigram_ids(data: bytes) -> np.ndarray:
    b = np.frombuffer(data, dtype=np.uint8).astype(np.int64)
    return (b[:-2] << 16) | (b[1:-1] << 8) | b[2:]


class ByteTrigramLM:
    def __init__(self, cfg: PerplexityConfig | None = None) -> None:
        self.cfg = cfg or PerplexityConfig()
        self.tri = np.zeros(1 << 24, dtype=np.uint32)
        self._ctx: np.ndarray | None = None

    def train(self, text: str) -> None:
        data = text.encode("utf-8")[: self.cfg.max_doc_bytes]
        if len(data) >= 3:
            ids, counts = np.unique(_trigram_ids(data), return_counts=True)  # sparse: a document is small
            self.tri[ids] += counts.astype(np.uint32)
            self._ctx = None

    def perplexity(self, text: str) -> float | None:
        """Per-byte perplexity of the text's head; None when it has under 3 bytes."""
        data = text.encode("utf-8")[: self.cfg.max_doc_bytes]
        if len(data) < 3:
            return None
        if self._ctx is None:
            self._ctx = self.tri.reshape(1 << 16, 256).sum(1, dtype=np.int64)
        ids = _trigram_ids(data)
        k = self.cfg.add_k
        p = (self.tri[ids] + k) / (self._ctx[ids >> 8] + 256 * k)
        return float(math.exp(-np.log(p).mean()))


def perplexity_weight(ppl: float | None, median: float, cfg: PerplexityConfig) -> float:
    if ppl is None or ppl <= 0 or median <= 0:
        return 1.0
    return round(min(1.0, max(cfg.floor, cfg.tolerance * median / ppl)), 4)
