"""Data rules: flag samples that look garbled or are piles of URLs (pure; no I/O).

Each rule scores a sample and flags it above a threshold:

- ``nonprintable``: share of control bytes (not tab/newline/CR) plus bytes of U+FFFD (the UTF-8
  replacement character ``EF BF BD``, what a bad decode leaves behind). Clean text and code are ~0.
- ``entropy``: byte Shannon entropy as a share of the most a sample of that length can have
  (``log2(min(256, T))``). Natural language and code sit near 0.6–0.7 on 64–128-byte windows;
  random or compressed bytes near 0.95 (threshold 0.9).
- ``url_pile``: share of the sample's bytes inside URLs (``scheme://…`` or ``www.…``); link farms
  and navigation scrapes are mostly URLs, prose that cites one is not (at least two URLs needed).

A flagged sample's sampling weight drops to ``flagged_weight`` (the Sampler consults it): it is
still seen now and then — a rule can be wrong — but far less often. The scan is vectorised over a
[N, T] byte tensor (numpy on the host), so the whole default corpus is checked at load time in well
under a second, and a training batch in tens of microseconds (``garbled``, the data watch's score).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch

from cliffguard.core.declared import bounded, check_declared

_URL_RE = re.compile(rb"(?:[a-zA-Z][a-zA-Z0-9+.-]{1,10}://|www\.)[^\s\"'<>()\[\]]+")
_CONTROL = torch.zeros(256, dtype=torch.bool)
_CONTROL[torch.tensor([*range(0, 9), 11, 12, *range(14, 32), 127])] = True
_CONTROL_NP = _CONTROL.numpy()
GARBLED_RULES = ("nonprintable", "entropy")
"""The rules that say a sample is not text (a URL pile is text, of another kind)."""


@dataclass(kw_only=True, slots=True)
class DataRulesConfig:
    nonprintable_max: float = bounded(0.05, gt=0, le=1)
    """Flag when more than this share of bytes are control bytes or U+FFFD."""
    entropy_max: float = bounded(0.9, gt=0, le=1)
    """Flag when byte entropy exceeds this share of the maximum for the sample length."""
    url_max: float = bounded(0.5, gt=0, le=1)
    """Flag when more than this share of bytes belong to URLs ..."""
    url_min_count: int = bounded(2, ge=1)
    """... and the sample holds at least this many (one long URL in a short window is a citation)."""
    flagged_weight: float = bounded(0.1, ge=0, le=1)
    """Sampling weight given to a flagged sample (1 = unchanged, 0 = never drawn)."""

    def __post_init__(self) -> None:
        check_declared(self)


@dataclass(frozen=True, slots=True)
class DataFlag:
    """Samples one rule flagged: the ``data.flag`` event's payload plus the weight applied."""

    sample_ids: list[int]
    rule: str
    score: float
    """The highest score among the flagged samples."""
    weight: float

    def event_data(self) -> dict[str, object]:
        return {"sample_ids": self.sample_ids, "rule": self.rule, "score": self.score}


def _host(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().numpy()


def nonprintable_ratio(x: torch.Tensor) -> torch.Tensor:
    """[N, T] bytes -> [N] share of control bytes and replacement-character bytes."""
    a = _host(x)
    control = _CONTROL_NP[a].sum(1)
    repl = ((a[:, :-2] == 0xEF) & (a[:, 1:-1] == 0xBF) & (a[:, 2:] == 0xBD)).sum(1) * 3
    return torch.from_numpy((control + repl) / a.shape[1]).float()


def entropy_ratio(x: torch.Tensor) -> torch.Tensor:
    """[N, T] bytes -> [N] byte entropy / log2(min(256, T))."""
    a = _host(x).astype(np.int64)
    n, t = a.shape
    counts = np.bincount((np.arange(n)[:, None] * 256 + a).ravel(), minlength=n * 256).reshape(n, 256)
    p = counts / t
    h = -(p * np.log2(np.where(p > 0, p, 1.0))).sum(1)
    return torch.from_numpy(h / np.log2(min(256, t))).float()


def url_ratio(x: torch.Tensor, min_count: int = 1) -> torch.Tensor:
    """[N, T] bytes -> [N] share of bytes inside URLs, 0 where fewer than ``min_count`` URLs."""
    rows = x.to(torch.uint8).numpy()
    out = torch.zeros(x.shape[0])
    for i, row in enumerate(rows):
        raw = row.tobytes()
        if b"://" in raw or b"www." in raw:
            urls = [m.group(0) for m in _URL_RE.finditer(raw)]
            if len(urls) >= min_count:
                out[i] = sum(map(len, urls)) / len(raw)
    return out


class DataRules:
    def __init__(self, cfg: DataRulesConfig | None = None) -> None:
        self.cfg = cfg or DataRulesConfig()

    def scores(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"nonprintable": nonprintable_ratio(x), "entropy": entropy_ratio(x),
                "url_pile": url_ratio(x, self.cfg.url_min_count)}

    def garbled(self, x: torch.Tensor) -> torch.Tensor:
        """[N, T] bytes -> [N] the worst garbled-text rule's score over its limit (> 1 = flagged):
        the data watch's garbled score (trainer/data_watch.py)."""
        return torch.maximum(nonprintable_ratio(x) / self.cfg.nonprintable_max,
                             entropy_ratio(x) / self.cfg.entropy_max)

    def scan(self, x: torch.Tensor, sample_ids: torch.Tensor | list[int]) -> list[DataFlag]:
        """Flags for a [N, T] batch of byte samples, one DataFlag per rule that fired."""
        ids = torch.as_tensor(sample_ids)
        limits = {
            "nonprintable": self.cfg.nonprintable_max,
            "entropy": self.cfg.entropy_max,
            "url_pile": self.cfg.url_max,
        }
        flags = []
        for rule, score in self.scores(x).items():
            hit = score > limits[rule]
            if bool(hit.any()):
                flags.append(
                    DataFlag(
                        sample_ids=ids[hit].tolist(),
                        rule=rule,
                        score=round(float(score[hit].max()), 4),
                        weight=self.cfg.flagged_weight,
                    )
                )
        return flags
