"""The byte-trigram reference model: an add-k smoothed trigram LM over bytes, trained on the corpus
itself (nothing downloaded). ``cliffguard data`` trains it offline to reweight documents
(cliffguard/data/perplexity.py) and saves it beside its manifest; the bundled trainer loads that one
(or trains the same model on its training split) to score each batch while training
(trainer/data_watch.py). Code and prose of the corpus score low; bad OCR, mojibake and random bytes
score high, because their byte trigrams are rare in it.

Counts live in a 256^3 uint32 table (64 MiB) whatever the corpus size; the saved file holds only the
trigrams seen (``save``/``load``, a compressed ``.npz``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cliffguard.core.declared import bounded, check_declared

MODEL_SUFFIX = ".lm.npz"
"""The saved model's name: the manifest's with this suffix (``cliffguard data --out M.json`` -> ``M.lm.npz``)."""


@dataclass(kw_only=True, slots=True)
class ByteLMConfig:
    add_k: float = bounded(0.1, gt=0)
    """Additive smoothing per trigram count."""
    max_doc_bytes: int = bounded(65_536, ge=3)
    """Bytes of a document used to train on and to score (its head): bounds the time per document."""

    def __post_init__(self) -> None:
        check_declared(self)


def trigram_ids(data: bytes | np.ndarray) -> np.ndarray:
    """Each byte trigram's index into the table (a ``[..., T]`` array gives ``[..., T-2]``)."""
    b = (np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else data).astype(np.int64)
    return (b[..., :-2] << 16) | (b[..., 1:-1] << 8) | b[..., 2:]


class ByteTrigramLM:
    def __init__(self, cfg: ByteLMConfig | None = None) -> None:
        self.cfg = cfg or ByteLMConfig()
        self.tri = np.zeros(1 << 24, dtype=np.uint32)
        self._ctx: np.ndarray | None = None

    def train(self, text: str) -> None:
        """Count one document's trigrams (its head of ``max_doc_bytes``)."""
        data = text.encode("utf-8")[: self.cfg.max_doc_bytes]
        if len(data) >= 3:
            ids, counts = np.unique(trigram_ids(data), return_counts=True)  # sparse: a document is small
            self.tri[ids] += counts.astype(np.uint32)
            self._ctx = None

    def train_tokens(self, tokens: np.ndarray) -> None:
        """Count every trigram of a byte stream (the trainer's training split, whole)."""
        if tokens.size >= 3:
            ids, counts = np.unique(trigram_ids(tokens), return_counts=True)
            self.tri[ids] += counts.astype(np.uint32)
            self._ctx = None

    def _context(self) -> np.ndarray:
        if self._ctx is None:
            self._ctx = self.tri.reshape(1 << 16, 256).sum(1, dtype=np.int64)
        return self._ctx

    def perplexity(self, text: str) -> float | None:
        """Per-byte perplexity of the text's head; None when it has under 3 bytes."""
        data = text.encode("utf-8")[: self.cfg.max_doc_bytes]
        if len(data) < 3:
            return None
        return float(math.exp(self._log_p(trigram_ids(data)).mean() * -1))

    def sequence_scores(self, tokens: np.ndarray) -> np.ndarray:
        """[B, T] byte tokens -> [B] mean log-perplexity per byte (nats; 0 for a row under 3 bytes)."""
        if tokens.shape[-1] < 3:
            return np.zeros(tokens.shape[0])
        return -self._log_p(trigram_ids(tokens)).mean(-1)

    def _log_p(self, ids: np.ndarray) -> np.ndarray:
        k = self.cfg.add_k
        return np.log((self.tri[ids] + k) / (self._context()[ids >> 8] + 256 * k))

    def save(self, path: str | Path) -> None:
        """The trigrams seen and their counts (a compressed ``.npz``, written atomically)."""
        path = Path(path)
        ids = np.flatnonzero(self.tri).astype(np.uint32)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez_compressed(tmp, ids=ids, counts=self.tri[ids], add_k=np.float64(self.cfg.add_k),
                            max_doc_bytes=np.int64(self.cfg.max_doc_bytes))
        tmp.replace(path)

    @classmethod
    def load(cls, path: str | Path) -> ByteTrigramLM:
        """A saved model; anything else is a ValueError naming the file."""
        try:
            with np.load(path) as z:
                ids, counts = z["ids"], z["counts"]
                cfg = ByteLMConfig(add_k=float(z["add_k"]), max_doc_bytes=int(z["max_doc_bytes"]))
        except (OSError, KeyError, ValueError) as exc:
            raise ValueError(f"perplexity model: {str(path)!r} is not a saved byte-trigram model ({exc})") from None
        if ids.shape != counts.shape or (ids.size and int(ids.max()) >= 1 << 24):
            raise ValueError(f"perplexity model: {str(path)!r} holds trigram ids out of range")
        lm = cls(cfg)
        lm.tri[ids.astype(np.int64)] = counts.astype(np.uint32)
        return lm
