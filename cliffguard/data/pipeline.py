"""The data-quality pass: two streaming passes over the corpus, then removal of contamination last.

Pass 1, per document: near-duplicate lookup (dedup.py; a duplicate is removed and takes no
further part), benchmark n-gram match (contamination.py; recorded, applied last), the trainer's
data rules (rules.py; lower weight) and training the byte trigram reference model
(perplexity.py). Pass 2 re-reads the documents still kept to score their perplexity against the
finished model (memory stays bounded: texts are never held). Last, contaminated documents are
removed. Then a sample of removed duplicates is re-read to compute their exact Jaccard against
the kept representative: the report's estimate of the threshold's precision.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cliffguard.data.contamination import ContaminationIndex
from cliffguard.data.corpus import CorpusStats, iter_documents, read_document
from cliffguard.data.curriculum import Curriculum
from cliffguard.data.dedup import DedupConfig, Deduplicator, jaccard, shingles
from cliffguard.data.manifest import DocEntry, manifest_json
from cliffguard.data.perplexity import ByteTrigramLM, PerplexityConfig, perplexity_weight
from cliffguard.data.rules import DocRules


@dataclass(kw_only=True, slots=True)
class PassConfig:
    dedup: DedupConfig = field(default_factory=DedupConfig)
    perplexity: PerplexityConfig = field(default_factory=PerplexityConfig)
    precision_sample: int = 50
    """Removed duplicate pairs re-read for their exact Jaccard."""
    examples: int = 10
    """Examples per reason in the report."""

    def __post_init__(self) -> None:
        if self.precision_sample < 0 or self.examples < 0:
            raise ValueError("precision_sample/examples: must be >= 0")


Progress = Callable[[str, int, int], None]


def run_pass(root: str | Path, files: list[Path], *, cfg: PassConfig | None = None,
             contamination: ContaminationIndex | None = None, curriculum: Curriculum | None = None,
             rules: DocRules | None = None, progress: Progress | None = None,
             model_path: str | Path | None = None) -> tuple[dict, dict]:
    """(manifest, report) for ``files`` under ``root``; ``progress(phase, done, total)`` is called as it goes.
    ``model_path``: save the reference model there and name it in the manifest (``perplexity_model``),
    for the trainer to score its batches with while training."""
    cfg = cfg or PassConfig()
    curriculum = curriculum or Curriculum()
    rules = rules or DocRules()
    root = Path(root).resolve()
    t0 = time.monotonic()
    stats = CorpusStats()
    dedup = Deduplicator(cfg.dedup)
    lm = ByteTrigramLM(cfg.perplexity.model())
    docs: list[DocEntry] = []
    contaminated: dict[int, Any] = {}
    pairs: list[tuple[str, str, float | None]] = []
    for doc in iter_documents(files, stats):
        rel = str(Path(doc.path).relative_to(root)) if Path(doc.path).is_relative_to(root) else doc.path
        entry = DocEntry(path=doc.path, category=curriculum.category(rel))
        verdict = dedup.add(doc.path, doc.text)
        if verdict.duplicate_of is not None:
            entry.remove({"reason": "near_duplicate", "of": verdict.duplicate_of,
                          "estimated_jaccard": verdict.estimated_jaccard})
            pairs.append((doc.path, verdict.duplicate_of, verdict.estimated_jaccard))
        else:
            if contamination is not None and (hit := contamination.match(doc.text)) is not None:
                contaminated[len(docs)] = hit
            for flag in rules.check(doc.text):
                entry.lower(flag.weight, {"reason": flag.rule, "share": flag.share})
            lm.train(doc.text)
        docs.append(entry)
        if progress:
            progress("scan", stats.files, len(files))
    if not docs:
        raise ValueError(f"corpus: {str(root)!r} holds no text documents "
                         f"({len(stats.skipped_binary)} binary, {len(stats.skipped_unreadable)} unreadable)")
    t_scan = time.monotonic() - t0

    ppl: dict[int, float] = {}
    kept_idx = [i for i, d in enumerate(docs) if d.kept]
    for n, i in enumerate(kept_idx, 1):
        d = read_document(docs[i].path)
        if d is not None and (p := lm.perplexity(d.text)) is not None:
            ppl[i] = p
        if progress:
            progress("perplexity", n, len(kept_idx))
    median = statistics.median(ppl.values()) if ppl else 0.0
    for i, p in ppl.items():
        w = perplexity_weight(p, median, cfg.perplexity)
        if w < 1.0:
            docs[i].lower(w, {"reason": "perplexity", "perplexity": round(p, 3), "median": round(median, 3)})

    for i, hit in contaminated.items():  # removal is the last step
        docs[i].remove({"reason": "contamination", "benchmark_item": hit.item, "ngram": hit.ngram})

    sample = []
    for dup, rep, est in pairs[: cfg.precision_sample]:
        a, b = read_document(dup), read_document(rep)
        if a is None or b is None:
            continue
        j = jaccard(shingles(a.text, cfg.dedup.shingle), shingles(b.text, cfg.dedup.shingle))
        sample.append({"removed": dup, "kept": rep, "estimated_jaccard": est, "exact_jaccard": round(j, 4)})
    above = sum(s["exact_jaccard"] >= cfg.dedup.threshold for s in sample)

    reasons = Counter(r["reason"] for d in docs for r in d.reasons)
    examples: dict[str, list] = {}
    for d in docs:
        for r in d.reasons:
            bucket = examples.setdefault(r["reason"], [])
            if len(bucket) < cfg.examples:
                bucket.append({"path": d.path, **r})
    report = {
        "root": str(root),
        "files": stats.files,
        "documents": stats.documents,
        "bytes": stats.bytes,
        "skipped_binary": {"count": len(stats.skipped_binary), "examples": stats.skipped_binary[: cfg.examples]},
        "skipped_unreadable": {"count": len(stats.skipped_unreadable),
                               "examples": stats.skipped_unreadable[: cfg.examples]},
        "kept": sum(d.kept for d in docs),
        "removed": sum(not d.kept for d in docs),
        "reasons": dict(reasons),
        "dedup": {
            "threshold": cfg.dedup.threshold, "num_perm": cfg.dedup.num_perm, "shingle": cfg.dedup.shingle,
            "duplicates_removed": len(pairs),
            "clusters": [{"kept": rep, "removed": dups} for rep, dups in sorted(dedup.clusters.items())],
            "precision_sample": sample,
            "precision_estimate": round(above / len(sample), 4) if sample else None,
        },
        "contamination": [{"path": docs[i].path, "benchmark_item": h.item, "ngram": h.ngram}
                          for i, h in contaminated.items()],
        "perplexity": {"median": round(median, 3), "scored": len(ppl)},
        "examples": examples,
        "seconds": {"scan": round(t_scan, 2), "total": round(time.monotonic() - t0, 2)},
    }
    if contamination is not None:
        report["benchmark_items_ignored_short"] = contamination.ignored[: cfg.examples]
    manifest = manifest_json(str(root), docs, curriculum.to_json())
    if model_path is not None:
        lm.save(model_path)
        manifest["perplexity_model"] = {"path": str(Path(model_path).resolve()), "median": round(median, 3)}
    return manifest, report
