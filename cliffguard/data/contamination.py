"""Benchmark contamination: exact n-gram matches of corpus documents against benchmark items.

Benchmark files hold one item per JSONL line (a ``"question"`` or ``"text"`` field) or per line of
plain text (``.txt``). Text is normalised (lowercase, ``\\w+`` words, so whitespace and punctuation
do not matter) and cut into ``n``-word grams; an item shorter than ``n`` words is one gram of all
its words (one under ``min_words`` words is ignored: a phrase that common is no evidence). A document containing any item's gram is contaminated by that item. The index maps
each gram to its first item, so memory is the benchmark's size, not the corpus's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from cliffguard.data.dedup import words

_JSON_FIELDS = ("question", "text")


@dataclass(frozen=True, slots=True)
class BenchmarkItem:
    source: str
    """``file:line`` of the item."""
    text: str


def load_benchmark(path: str | Path) -> list[BenchmarkItem]:
    """Items of one benchmark file; an unknown format is a ValueError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"benchmarks: {str(path)!r} does not exist")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise ValueError(f"benchmarks: {str(path)!r} is not UTF-8 text (want .jsonl or .txt)") from None
    items = []
    if path.suffix in (".jsonl", ".json"):
        for no, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"benchmarks: {str(path)!r} line {no} is not JSON ({exc.msg})") from None
            text = next((row[f] for f in _JSON_FIELDS if isinstance(row, dict) and isinstance(row.get(f), str)), None)
            if text is None:
                raise ValueError(f"benchmarks: {str(path)!r} line {no} has no string 'question' or 'text' field")
            items.append(BenchmarkItem(source=f"{path}:{no}", text=text))
    elif path.suffix == ".txt":
        items = [BenchmarkItem(source=f"{path}:{no}", text=line) for no, line in enumerate(lines, 1) if line.strip()]
    else:
        raise ValueError(f"benchmarks: {str(path)!r} has an unknown format {path.suffix or '(no suffix)'!r} "
                         "(want .jsonl with a 'question'/'text' field, or .txt with one item per line)")
    if not items:
        raise ValueError(f"benchmarks: {str(path)!r} holds no items")
    return items


@dataclass(frozen=True, slots=True)
class Contamination:
    item: str
    """Source (``file:line``) of the benchmark item matched."""
    ngram: str


class ContaminationIndex:
    def __init__(self, items: list[BenchmarkItem], n: int = 13, min_words: int = 8) -> None:
        if n < 1:
            raise ValueError("ngram: must be >= 1")
        if not 1 <= min_words <= n:
            raise ValueError("min_words: must be in [1, ngram]")
        self.n = n
        self.ignored: list[str] = []
        """Items shorter than ``min_words`` words: too common a phrase to call a match contamination."""
        self.grams: dict[tuple[str, ...], str] = {}
        self.short_lengths: set[int] = set()
        for item in items:
            w = words(item.text)
            if not w:
                continue
            if len(w) < min_words:
                self.ignored.append(item.source)
                continue
            if len(w) < n:
                self.grams.setdefault(tuple(w), item.source)
                self.short_lengths.add(len(w))
            for i in range(len(w) - n + 1):
                self.grams.setdefault(tuple(w[i : i + n]), item.source)
        self.lengths = sorted({n, *self.short_lengths})

    def __len__(self) -> int:
        return len(self.grams)

    def match(self, text: str) -> Contamination | None:
        """The first benchmark gram found in ``text`` (in text order), or None."""
        if not self.grams:
            return None
        w = words(text)
        for i in range(len(w)):
            for k in self.lengths:
                if i + k > len(w):
                    break
                src = self.grams.get(tuple(w[i : i + k]))
                if src is not None:
                    return Contamination(item=src, ngram=" ".join(w[i : i + k]))
        return None
