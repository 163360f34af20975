"""Near-duplicate removal, streaming: MinHash signatures of word shingles in an LSH index (datasketch).

A document's shingles are its overlapping ``shingle``-word windows (lowercased ``\\w+`` words).
Documents arrive one at a time; each is looked up in the LSH index of the documents kept so
far. LSH returns *candidates* (pairs whose banded signatures collide); a candidate counts only
when the signatures' estimated Jaccard similarity is at least ``threshold`` too, which trims the
LSH false positives. A document with such a match is a duplicate of the most similar kept one
(its cluster's representative, the first seen); otherwise it is kept and indexed. Memory is the
index plus one signature per kept document (num_perm * 8 bytes), never the texts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from datasketch import MinHash, MinHashLSH

from cliffguard.core.declared import bounded, check_declared

_WORD = re.compile(r"\w+")


@dataclass(kw_only=True, slots=True)
class DedupConfig:
    threshold: float = bounded(0.8, gt=0, lt=1)
    """Jaccard similarity of shingle sets at or above which two documents are near-duplicates."""
    num_perm: int = bounded(128, ge=16)
    """MinHash permutations (signature length); more = a tighter Jaccard estimate, slower."""
    shingle: int = bounded(5, ge=1)
    """Words per shingle."""
    seed: int = 1

    def __post_init__(self) -> None:
        check_declared(self)


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def shingles(text: str, k: int) -> set[str]:
    """The set of k-word windows (a text shorter than k words is one shingle; no words = empty)."""
    w = words(text)
    if len(w) <= k:
        return {" ".join(w)} if w else set()
    return {" ".join(w[i : i + k]) for i in range(len(w) - k + 1)}


def jaccard(a: set[str], b: set[str]) -> float:
    """Exact Jaccard similarity of two shingle sets (1.0 for two empty sets)."""
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


@dataclass(frozen=True, slots=True)
class DedupVerdict:
    duplicate_of: str | None
    """Key of the kept representative, or None when the document is kept."""
    estimated_jaccard: float | None = None


class Deduplicator:
    """Feed documents in order with ``add``; the first of each near-duplicate cluster is kept."""

    def __init__(self, cfg: DedupConfig | None = None) -> None:
        self.cfg = cfg or DedupConfig()
        # LSH only proposes candidates and the signature estimate then confirms them, so its bands are
        # tuned against false negatives (a missed duplicate is never looked at again).
        self.lsh = MinHashLSH(threshold=self.cfg.threshold, num_perm=self.cfg.num_perm, weights=(0.1, 0.9))
        self.signatures: dict[str, MinHash] = {}
        self.clusters: dict[str, list[str]] = {}
        """representative -> its removed duplicates (only clusters with at least one)."""

    def signature(self, shingle_set: set[str]) -> MinHash:
        m = MinHash(num_perm=self.cfg.num_perm, seed=self.cfg.seed)
        m.update_batch([s.encode("utf-8") for s in shingle_set])
        return m

    def add(self, key: str, text: str) -> DedupVerdict:
        sh = shingles(text, self.cfg.shingle)
        if not sh:
            return DedupVerdict(duplicate_of=None)  # no words: nothing to compare, never indexed
        m = self.signature(sh)
        best, best_j = None, -1.0
        for cand in self.lsh.query(m):
            j = m.jaccard(self.signatures[cand])
            if j > best_j or (j == best_j and cand < str(best)):
                best, best_j = cand, j
        if best is not None and best_j >= self.cfg.threshold:
            self.clusters.setdefault(best, []).append(key)
            return DedupVerdict(duplicate_of=best, estimated_jaccard=round(best_j, 4))
        self.lsh.insert(key, m)
        self.signatures[key] = m
        return DedupVerdict(duplicate_of=None)
