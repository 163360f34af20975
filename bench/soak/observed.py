"""What one soak seed left behind, as the invariants read it (``Observed``), and one check's result.

The runner saves it as ``<seed dir>/observed.json``, so ``python -m bench.soak --recheck`` judges a
kept seed again with changed invariants without running it again."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Observed:
    run: str
    steps: int
    training_faults: list[str]
    record: list[dict[str, Any]]
    """trainer-record.jsonl, line by line."""
    train_rc: int | None
    events: dict[str, dict[str, Any]]
    """The witness's metrics events by id (bench/soak/witness.py)."""
    commands_seen: dict[str, dict[str, Any]]
    store: dict[str, Any]
    """bench/soak/collect.py's facts."""
    logs: dict[str, str]
    controller_exits: list[dict[str, Any]]
    fault_windows: list[tuple[str, str, float, float]]
    """(kind, target, start, end) of every fault that fired, epoch seconds."""
    polls: list[tuple[float, float | None]] = field(default_factory=list)
    """(time, newest stored rank-0 step's ts) sampled during the run."""
    ended_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        # rows the controller wrote itself (a resumed incident's data flags) carry no event id
        d["store"]["ids"] = {
            kind: sorted(i for i in ids if i is not None) for kind, ids in self.store["ids"].items()
        }
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Observed:
        store = {**d["store"], "ids": {kind: set(ids) for kind, ids in d["store"]["ids"].items()}}
        return cls(
            **{
                **d,
                "store": store,
                "fault_windows": [tuple(w) for w in d["fault_windows"]],
                "polls": [tuple(p) for p in d["polls"]],
            }
        )


@dataclass
class Check:
    count: int = 0
    detail: list[str] = field(default_factory=list)

    def fail(self, n: int, text: str) -> None:
        self.count += n
        self.detail.append(text)
