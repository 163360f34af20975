"""A window's figures, batch by batch, and the ``data.stats`` payload they become (core/payloads.py
``DataStatsData``). Outliers are kept per reason, the ``top_k`` highest scores of the window:

- ``novelty``: the most surprising sequences under the run's token frequencies so far;
- ``perplexity``: the highest log-perplexity under the reference model (when there is one);
- ``garbled``: sequences the garbled-text rules flag (score: how far past its limit the worst rule is);
- ``duplicate``: near-duplicates (score: the estimated Jaccard similarity).
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from cliffguard.agent.data_watch.batch import LEN_BINS, length_counts
from cliffguard.agent.data_watch.near_dup import Duplicates

REASONS = ("novelty", "perplexity", "garbled", "duplicate")


class Window:
    def __init__(self, buckets: int, top_k: int) -> None:
        self.buckets = buckets
        self.top_k = top_k
        self.reset(0)

    def reset(self, first_step: int) -> None:
        self.first_step = first_step
        self.last_step = first_step
        self.batches = self.sequences = self.tokens = self.slots = 0
        self.len_counts = np.zeros(LEN_BINS, dtype=np.int64)
        self.sketch = np.zeros(self.buckets, dtype=np.int64)
        self.dups = self.dups_in_batch = self.garbled = 0
        self.has_garbled = self.has_ppl = False
        self.steps: list[int] = []
        self.step_dup: list[float] = []
        self.step_pad: list[float] = []
        self.step_garbled: list[float] = []
        self.step_ppl: list[float] = []
        self._outliers: dict[str, list[tuple[float, int, int]]] = {r: [] for r in REASONS}  # (score, step, id)

    def __bool__(self) -> bool:
        return self.batches > 0

    def add(self, step: int, sample_ids: list[int], slots: np.ndarray, counts: np.ndarray, novelty: np.ndarray,
            dups: Duplicates, garbled: np.ndarray | None, ppl: np.ndarray | None) -> None:
        """One batch: ``garbled`` [B] scores (> 1 = flagged), ``ppl`` [B] log-perplexity per token."""
        n, width = slots.shape
        lengths = slots.sum(1)
        self.last_step = step
        self.batches += 1
        self.sequences += n
        tokens = int(lengths.sum())
        self.tokens += tokens
        self.slots += n * width
        self.len_counts += length_counts(lengths)
        self.sketch += counts
        dup = dups.any
        self.dups += int(dup.sum())
        self.dups_in_batch += int(dups.in_batch.sum())
        self.steps.append(step)
        self.step_dup.append(float(dup.mean()) if n else 0.0)
        self.step_pad.append(1.0 - tokens / max(n * width, 1))
        self._keep("novelty", step, sample_ids, novelty, np.ones(n, dtype=bool))
        self._keep("duplicate", step, sample_ids, dups.similarity, dup)
        # a scorer missing for one batch (it raised: the watcher logs it) leaves NaN at that step
        if garbled is not None:
            flagged = garbled > 1.0
            self.garbled += int(flagged.sum())
            self.has_garbled = _aligned(self.step_garbled, len(self.steps), float(flagged.mean()) if n else 0.0)
            self._keep("garbled", step, sample_ids, garbled, flagged)
        elif self.has_garbled:
            self.step_garbled.append(float("nan"))
        if ppl is not None:
            weight = np.maximum(lengths, 1)
            self.has_ppl = _aligned(self.step_ppl, len(self.steps), float((ppl * weight).sum() / weight.sum()) if n else 0.0)
            self._keep("perplexity", step, sample_ids, ppl, np.ones(n, dtype=bool))
        elif self.has_ppl:
            self.step_ppl.append(float("nan"))

    def _keep(self, reason: str, step: int, sample_ids: list[int], scores: np.ndarray, which: np.ndarray) -> None:
        """Candidates of one batch: its ``top_k`` highest (the window's are chosen in ``payload``)."""
        if not self.top_k:
            return
        idx = np.flatnonzero(which)
        if len(idx) > self.top_k:
            idx = idx[np.argsort(scores[idx])[-self.top_k :]]
        self._outliers[reason].extend((float(scores[i]), step, int(sample_ids[i])) for i in idx)

    def payload(self, dropped: int = 0) -> dict[str, Any]:
        """The window as a ``data.stats`` payload (outliers worst first within each reason)."""
        out_steps, out_ids, out_reasons, out_scores = [], [], [], []
        for reason in REASONS:
            for score, step, sid in heapq.nlargest(self.top_k, self._outliers[reason]):
                out_steps.append(step)
                out_ids.append(sid)
                out_reasons.append(reason)
                out_scores.append(round(score, 4))
        seqs = max(self.sequences, 1)
        data: dict[str, Any] = {
            "first_step": self.first_step, "batches": self.batches, "sequences": self.sequences,
            "tokens": self.tokens, "pad_share": 1.0 - self.tokens / max(self.slots, 1),
            "len_counts": self.len_counts.tolist(), "sketch": self.sketch.tolist(),
            "dup_share": self.dups / seqs, "dup_in_batch": self.dups_in_batch / seqs,
            "steps": list(self.steps), "step_dup": list(self.step_dup), "step_pad": list(self.step_pad),
            "outlier_steps": out_steps, "outlier_ids": out_ids, "outlier_reasons": out_reasons,
            "outlier_scores": out_scores,
        }
        if self.has_garbled:
            data["garbled"] = self.garbled / seqs
            data["step_garbled"] = list(self.step_garbled)
        if self.has_ppl:
            data["step_ppl"] = list(self.step_ppl)
        if dropped:
            data["dropped"] = dropped
        return data


def _aligned(values: list[float], steps: int, value: float) -> bool:
    """Append ``value`` as the newest step's, NaN-filling steps that had none; True."""
    values.extend([float("nan")] * (steps - 1 - len(values)))
    values.append(value)
    return True
