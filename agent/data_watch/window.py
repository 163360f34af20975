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

    def add(self, steps: np.ndarray, sample_ids: list[int], slots: np.ndarray, counts: np.ndarray,
            novelty: np.ndarray, dups: Duplicates, garbled: np.ndarray | None, ppl: np.ndarray | None) -> None:
        """A group of batches, row by row: ``steps`` [N] each row's step (ascending), ``garbled``
        [N] scores (> 1 = flagged), ``ppl`` [N] log-perplexity per token; ``counts`` the group's sketch."""
        n, width = slots.shape
        uniq, inv = np.unique(steps, return_inverse=True)
        rows = np.bincount(inv).astype(np.float64)
        lengths = slots.sum(1)
        self.last_step = int(uniq[-1])
        self.batches += len(uniq)
        self.sequences += n
        self.tokens += int(lengths.sum())
        self.slots += n * width
        self.len_counts += length_counts(lengths)
        self.sketch += counts
        dup = dups.any
        self.dups += int(dup.sum())
        self.dups_in_batch += int(dups.in_batch.sum())
        had = len(self.steps)
        self.steps += uniq.tolist()
        self.step_dup += (np.bincount(inv, weights=dup) / rows).tolist()
        self.step_pad += (1.0 - np.bincount(inv, weights=lengths) / (rows * width)).tolist()
        everyone = np.ones(n, dtype=bool)
        self._keep("novelty", steps, sample_ids, novelty, everyone)
        self._keep("duplicate", steps, sample_ids, dups.similarity, dup)
        # a scorer that raised for this group (the watcher logs it) leaves NaN at its steps
        if garbled is not None:
            flagged = garbled > 1.0
            self.garbled += int(flagged.sum())
            self.has_garbled = _aligned(self.step_garbled, had, (np.bincount(inv, weights=flagged) / rows).tolist())
            self._keep("garbled", steps, sample_ids, garbled, flagged)
        elif self.has_garbled:
            self.step_garbled += [float("nan")] * len(uniq)
        if ppl is not None:
            w = np.maximum(lengths, 1).astype(np.float64)
            self.has_ppl = _aligned(self.step_ppl, had,
                                    (np.bincount(inv, weights=ppl * w) / np.bincount(inv, weights=w)).tolist())
            self._keep("perplexity", steps, sample_ids, ppl, everyone)
        elif self.has_ppl:
            self.step_ppl += [float("nan")] * len(uniq)

    def _keep(self, reason: str, steps: np.ndarray, sample_ids: list[int], scores: np.ndarray,
              which: np.ndarray) -> None:
        """Candidates of one group: its ``top_k`` highest (the window's are chosen in ``payload``)."""
        if not self.top_k:
            return
        idx = np.flatnonzero(which)
        if len(idx) > self.top_k:
            idx = idx[np.argsort(scores[idx])[-self.top_k :]]
        self._outliers[reason].extend((float(scores[i]), int(steps[i]), int(sample_ids[i])) for i in idx)

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


def _aligned(values: list[float], had: int, new: list[float]) -> bool:
    """Append a group's values after ``had`` steps, NaN-filling earlier steps that had none; True."""
    values.extend([float("nan")] * (had - len(values)))
    values.extend(new)
    return True
