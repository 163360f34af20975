"""Perplexity reweighting with a reference model trained locally: the add-k smoothed byte trigram LM
of trainer/byte_lm.py (the bundled trainer scores its batches with the same model while training).

A document's weight is ``clip(tolerance * median / ppl, floor, 1)``: documents up to ``tolerance``
times the median keep weight 1 (half the corpus is above the median, and that is no fault), one
twice as far out gets 0.5.
"""

from __future__ import annotations

from dataclasses import dataclass

from cliffguard.core.declared import bounded, check_declared
from cliffguard.trainer.byte_lm import ByteLMConfig, ByteTrigramLM

__all__ = ["ByteTrigramLM", "PerplexityConfig", "perplexity_weight"]


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

    def model(self) -> ByteLMConfig:
        """The reference model's own settings."""
        return ByteLMConfig(add_k=self.add_k, max_doc_bytes=self.max_doc_bytes)


def perplexity_weight(ppl: float | None, median: float, cfg: PerplexityConfig) -> float:
    if ppl is None or ppl <= 0 or median <= 0:
        return 1.0
    return round(min(1.0, max(cfg.floor, cfg.tolerance * median / ppl)), 4)
