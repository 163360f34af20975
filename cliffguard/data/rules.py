"""The trainer's data rules (trainer/data_rules.py: garbled text, URL piles) applied to whole documents.

A document is cut into ``window``-byte windows (the trainer's samples are windows too) and
scanned by ``DataRules``; a rule that flags at least ``min_share`` of the windows flags the
document, which then gets the rule's ``flagged_weight``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cliffguard.core.declared import bounded, check_declared
from cliffguard.trainer.data_rules import DataRules


@dataclass(kw_only=True, slots=True)
class DocRulesConfig:
    window: int = bounded(128, ge=8)
    min_share: float = bounded(0.3, gt=0, le=1)
    """Share of a document's windows a rule must flag to flag the document."""
    max_windows: int = bounded(512, ge=1)
    """Windows scanned per document (its head): bounds the time per document."""

    def __post_init__(self) -> None:
        check_declared(self)


@dataclass(frozen=True, slots=True)
class DocFlag:
    rule: str
    share: float
    """Share of the document's windows the rule flagged."""
    weight: float


class DocRules:
    def __init__(self, cfg: DocRulesConfig | None = None, rules: DataRules | None = None) -> None:
        self.cfg = cfg or DocRulesConfig()
        self.rules = rules or DataRules()

    def check(self, text: str) -> list[DocFlag]:
        data = text.encode("utf-8")[: self.cfg.window * self.cfg.max_windows]
        w = self.cfg.window
        n = len(data) // w
        if n == 0:
            if len(data) < 8:
                return []
            data, w, n = data, len(data), 1  # a short document is one window
        x = torch.frombuffer(bytearray(data[: n * w]), dtype=torch.uint8).reshape(n, w)
        out = []
        for flag in self.rules.scan(x, list(range(n))):
            share = len(flag.sample_ids) / n
            if share >= self.cfg.min_share:
                out.append(DocFlag(rule=flag.rule, share=round(share, 4), weight=flag.weight))
        return out
