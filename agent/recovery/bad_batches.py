"""The bad-batch list (issue 22, part 2): batches a re-run classified as data, never fed again.

Each entry is the step and the sample ids of one bad shard (or of a whole batch). The list is
knowledge about the data, not training state: ``load_state_dict`` adds what it loads to what is
already known, so a rollback to a state saved before a batch went bad does not forget it, and a
restart from a disk checkpoint brings back what was known when it was written. ``exclude`` is the
loop's hook to make its sampler skip the ids (the bundled trainer's ``Sampler.flag(ids, 0.0)``:
weight 0 is never drawn, and its weights are merged the same way on a load).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class BadBatch:
    step: int
    sample_ids: tuple[int, ...]
    rank: int | None
    """The rank whose shard it was (None: the whole global batch)."""
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step, "sample_ids": list(self.sample_ids), "rank": self.rank, "reason": self.reason}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> BadBatch:
        ids = d.get("sample_ids")
        if not isinstance(d.get("step"), int) or not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise ValueError(f"bad batch: need an int step and a list of int sample_ids, got {d!r}")
        rank = d.get("rank")
        if rank is not None and not isinstance(rank, int):
            raise ValueError(f"bad batch: rank must be an int or null, got {rank!r}")
        return BadBatch(d["step"], tuple(ids), rank, str(d.get("reason", "")))


class BadBatchList:
    def __init__(self, exclude: Callable[[list[int]], None] | None = None) -> None:
        self.entries: list[BadBatch] = []
        self.exclude = exclude
        """Called with the sample ids of every entry added (the loop's sampler skips them)."""

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def sample_ids(self) -> set[int]:
        return {i for e in self.entries for i in e.sample_ids}

    def add(self, entry: BadBatch) -> bool:
        """Record ``entry``; False when the same step and ids are known already."""
        if any(e.step == entry.step and e.sample_ids == entry.sample_ids for e in self.entries):
            return False
        self.entries.append(entry)
        if self.exclude is not None:
            self.exclude(list(entry.sample_ids))
        return True

    def extend(self, entries: Iterable[BadBatch]) -> int:
        return sum(self.add(e) for e in entries)

    def state_dict(self) -> dict[str, Any]:
        return {"entries": [e.as_dict() for e in self.entries]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Add the loaded entries to the known ones (never forgets: see the module docstring)."""
        entries = state.get("entries")
        if not isinstance(entries, list):
            raise ValueError(f"bad-batch list: state has no list of entries ({type(entries).__name__})")
        parsed = [BadBatch.from_dict(d) for d in entries]  # all checked before any is added
        self.extend(parsed)
