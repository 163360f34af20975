"""Live reweighting of sources (off by default, ``[data.reweight] enabled``): the sampler lowers the
weight of a manifest category whose batches keep scoring badly, within floors the manifest
declares, and says so each time.

Every ``every`` steps, at the start of a step (so the step's batch already follows it), every rank
scores rank 0's share of the last ``every`` steps' batches with the data watch's scorers: garbled
(the data rules) or, where the manifest names its reference model, a log-perplexity above
``ln(tolerance * median)`` (the bound ``cliffguard data`` keeps full weight within). Every rank
computes the same thing from the same corpus and sampler state, so the factors change at the same
step everywhere with no collective. A category with at least ``min_sequences`` scored and a bad
share of at least ``bad_share`` gets its factor times ``factor`` (down to its floor); one whose
share is back below half of it gets it divided back (up to 1). Rank 0 reports each change as a
``data.flag`` event (rule ``reweight:<category>``, score = the new factor, the bad samples it saw),
stored and shown with the run's flagged data.

The manifest declares the bounds: ``"live_reweight": {"floor": 0.25, "sources": {"web": {"floor":
0.1}}}`` (``cliffguard data --live-reweight-floor``); a category without one is never changed, and
the switch on without any is an error at start. The factors are the sampler's state (saved in every
checkpoint, kept across a rollback like the flags). To revert: resume with ``enabled = false``
(the sampler then ignores the saved factors), or let clean batches raise them back.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cliffguard.trainer.byte_lm import ByteTrigramLM
from cliffguard.trainer.data import Sampler
from cliffguard.trainer.data_rules import DataRules
from cliffguard.trainer.reweight_config import ReweightConfig


def manifest_bounds(manifest: str) -> tuple[dict[str, float], dict[str, Any]]:
    """(category -> floor, the manifest's ``perplexity_model`` entry) of a ``cliffguard data`` manifest."""
    try:
        doc = json.loads(Path(manifest).read_text(encoding="utf-8"))
        spec = doc.get("live_reweight") or {}
        default = spec.get("floor")
        per = {str(k): float(v["floor"]) for k, v in (spec.get("sources") or {}).items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"weights_manifest: {manifest!r}: bad live_reweight ({exc})") from None
    floors = dict(per)
    if default is not None:
        floors["*"] = float(default)
    if any(not 0 <= f <= 1 for f in floors.values()):
        raise ValueError(f"weights_manifest: {manifest!r}: live_reweight floors must be in [0, 1]")
    return floors, doc.get("perplexity_model") or {}


class SourceReweighter:
    def __init__(self, cfg: ReweightConfig, sampler: Sampler, manifest: str) -> None:
        if not manifest:
            raise ValueError("data.reweight: live reweighting needs [data] weights_manifest (its categories are the sources)")
        floors, model = manifest_bounds(manifest)
        if not floors:
            raise ValueError(f"data.reweight: the manifest {manifest!r} declares no live_reweight bounds "
                             "(cliffguard data --live-reweight-floor F)")
        self.cfg = cfg
        self.sampler = sampler
        self.floors = {c: floors.get(c, floors.get("*", 1.0)) for c in sampler.categories}
        self.rules = DataRules()
        self.lm = ByteTrigramLM.load(model["path"]) if model.get("path") and Path(model["path"]).is_file() else None
        median = float(model.get("median") or 0)
        self.limit = math.log(cfg.tolerance * median) if self.lm is not None and median > 0 else None
        """Log-perplexity per byte above which a sequence is bad (None: garbled only)."""
        self.decided = 0
        """The newest step a decision was made at (a replay makes none again)."""
        self.changes: list[dict[str, Any]] = []

    def at_step(self, step: int) -> list[dict[str, Any]]:
        """Decide at ``step`` (a multiple of ``every``, not yet decided); the changes made."""
        every = self.cfg.every
        if step == 0 or step % every or step <= self.decided:
            return []
        self.decided = step
        seen: dict[str, list[tuple[int, bool]]] = {}
        for s in range(step - every, step):
            ids = self.sampler.sample_ids(s, rank=0)
            for sid, bad in zip(ids, self._bad(ids).tolist(), strict=True):
                seen.setdefault(self.sampler.category_of(sid) or "", []).append((sid, bad))
        out = [c for cat, rows in sorted(seen.items()) if (c := self._decide(step, cat, rows)) is not None]
        self.changes += out
        return out

    def _bad(self, ids: list[int]) -> np.ndarray:
        x, _ = self.sampler.corpus.train_samples(torch.tensor(ids))
        bad = (self.rules.garbled(x) > 1).numpy()
        if self.lm is not None and self.limit is not None:
            bad |= self.lm.sequence_scores(x.numpy()) > self.limit
        return bad

    def _decide(self, step: int, category: str, rows: list[tuple[int, bool]]) -> dict[str, Any] | None:
        floor = self.floors.get(category, 1.0)
        if floor >= 1.0 or len(rows) < self.cfg.min_sequences:
            return None
        share = sum(b for _, b in rows) / len(rows)
        cat = self.sampler.categories.index(category)
        old = self.sampler.live.get(cat, 1.0)
        if share >= self.cfg.bad_share:
            new = max(floor, old * self.cfg.factor)
        elif share < self.cfg.bad_share / 2:
            new = min(1.0, old / self.cfg.factor)
        else:
            return None
        if math.isclose(new, old):
            return None
        self.sampler.live[cat] = new
        return {"step": step, "category": category, "from": old, "to": new, "bad_share": share,
                "sequences": len(rows), "sample_ids": [sid for sid, b in rows if b][:100]}

    def event(self, change: dict[str, Any]) -> dict[str, Any]:
        """A change as the ``data.flag`` event's payload (rule ``reweight:<category>``)."""
        return {"sample_ids": change["sample_ids"], "rule": f"reweight:{change['category']}", "score": change["to"]}
