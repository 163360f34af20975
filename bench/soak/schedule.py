"""The fault schedule of one soak seed (pure): which faults hit the run, when, for how long.

``FAULT_KINDS`` is the one table of what the soak can do to a run: each kind's target (one fault
per target at a time: a second fault on a busy target waits for the first to end), how long it
lasts, drawn uniformly from its range, and what it does. ``make_schedule(seed, steps)`` draws
``events_min``..``events_max`` events from it with ``random.Random(seed)``, so a seed is the same
schedule on every machine: each event is keyed either to training progress (fires when rank 0
reports that step) or to wall time (seconds after the first progress line), for faults that land
while the trainer is paused or holding as well as while it trains.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

from cliffguard.core.declared import bounded, check_declared


@dataclass(frozen=True, slots=True)
class FaultKind:
    name: str
    target: str
    """What it acts on; one fault per target at a time."""
    low_s: float
    high_s: float
    """The fault lasts (or, for a kill, the target stays down) a uniform draw from [low_s, high_s]."""
    what: str


FAULT_KINDS: tuple[FaultKind, ...] = (
    FaultKind("controller_kill", "controller", 2.0, 20.0, "SIGKILL the controller, restart it after D s"),
    FaultKind("controller_stop", "controller", 5.0, 40.0, "SIGSTOP the controller for D s, then SIGCONT"),
    FaultKind("broker_kill", "broker", 1.0, 8.0, "SIGKILL the broker, restart it on the same port after D s"),
    FaultKind(
        "store_lock",
        "store",
        5.0,
        30.0,
        "another process holds the store's write lock for D s "
        "(SQLite: BEGIN EXCLUSIVE; PostgreSQL: LOCK TABLE step_metrics IN ACCESS EXCLUSIVE MODE)",
    ),
    FaultKind("rank_stop", "rank", 5.0, 15.0, "SIGSTOP one training rank for D s, then SIGCONT"),
)
KINDS: dict[str, FaultKind] = {k.name: k for k in FAULT_KINDS}

STEP, WALL = "step", "wall"
"""An event's key: a training step (rank 0's progress) or seconds after training started."""


@dataclass(kw_only=True, slots=True)
class ScheduleConfig:
    """How a seed's schedule is drawn."""

    events_min: int = bounded(6, ge=1)
    events_max: int = bounded(10, ge=1)
    first: float = bounded(0.05, ge=0, lt=1)
    """Step-keyed events fire from this fraction of the run's steps..."""
    last: float = bounded(0.9, gt=0, le=1)
    """... to this one (so the run's tail, after the faults, shows the recovery)."""
    wall_share: float = bounded(0.25, ge=0, le=1)
    """The share of events keyed to wall time instead of a step."""
    step_s: float = bounded(0.15, gt=0)
    """Seconds a step takes on 2 shared cores, to spread wall-time keys over about the same stretch."""
    world: int = bounded(2, ge=1)
    """Training ranks (``rank_stop`` picks one)."""
    kinds: tuple[str, ...] = field(default_factory=lambda: tuple(KINDS))
    max_s: float | None = bounded(None, gt=0)
    """Cap every fault's duration at this many seconds (a short smoke); None: each kind's own range."""
    controllers: int = bounded(1, ge=1, le=8)
    """Controller instances in one consumer group (the others stand by for the partition); with
    more than one, each controller fault hits the one drawn (``Event.which``)."""

    def __post_init__(self) -> None:
        check_declared(self)
        if self.events_min > self.events_max:
            raise ValueError(f"events_min: {self.events_min} is above events_max {self.events_max}")
        if self.first >= self.last:
            raise ValueError(f"first: {self.first} is not below last {self.last}")
        unknown = sorted(set(self.kinds) - KINDS.keys())
        if unknown or not self.kinds:
            raise ValueError(f"kinds: unknown or none: {unknown} (known: {', '.join(KINDS)})")


@dataclass(frozen=True, slots=True)
class Event:
    kind: str
    key: str
    """``step`` or ``wall``."""
    at: float
    """The step (key ``step``) or the seconds after training started (key ``wall``)."""
    duration_s: float
    rank: int | None = None
    """``rank_stop``: which rank."""
    which: int | None = None
    """A controller fault with several controllers: which one (None: the only one)."""

    @property
    def target(self) -> str:
        """What it holds while it lasts: one fault per target at a time (each controller is one)."""
        kind = KINDS[self.kind].target
        return kind if self.which is None else f"{kind}-{self.which}"

    def eta_s(self, step_s: float) -> float:
        """About when it fires, in seconds after training started (the schedule's order)."""
        return self.at * step_s if self.key == STEP else self.at

    def describe(self) -> str:
        when = f"at step {int(self.at)}" if self.key == STEP else f"at +{self.at:.1f} s"
        who = f" rank {self.rank}" if self.rank is not None else ""
        who += f" controller {self.which}" if self.which is not None else ""
        return f"{self.kind}{who} {when} for {self.duration_s:.1f} s"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Event:
        return cls(kind=d["kind"], key=d["key"], at=d["at"], duration_s=d["duration_s"], rank=d.get("rank"),
                   which=d.get("which"))


@dataclass(frozen=True, slots=True)
class Schedule:
    seed: int
    steps: int
    events: tuple[Event, ...]
    controllers: int = 1
    """Controller instances in the group (``ScheduleConfig.controllers``)."""

    def describe(self) -> str:
        both = f", {self.controllers} controllers in one group" if self.controllers > 1 else ""
        lines = [f"seed {self.seed}: {len(self.events)} events over {self.steps} steps{both}"]
        lines += [f"  {i:>2}. {e.describe()}" for i, e in enumerate(self.events, 1)]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"seed": self.seed, "steps": self.steps, "events": [e.to_dict() for e in self.events]}
        if self.controllers > 1:  # absent for one: a stored single-controller schedule reads as before
            out["controllers"] = self.controllers
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Schedule:
        return cls(seed=d["seed"], steps=d["steps"], events=tuple(Event.from_dict(e) for e in d["events"]),
                   controllers=int(d.get("controllers", 1)))


def make_schedule(seed: int, steps: int, cfg: ScheduleConfig | None = None) -> Schedule:
    """The seed's schedule: the same events for the same (seed, steps, cfg), ordered by when they fire."""
    cfg = cfg or ScheduleConfig()
    rng = random.Random(seed)
    lo, hi = max(1, int(steps * cfg.first)), max(2, int(steps * cfg.last))
    events = []
    for _ in range(rng.randint(cfg.events_min, cfg.events_max)):
        kind = KINDS[rng.choice(cfg.kinds)]
        high = kind.high_s if cfg.max_s is None else max(kind.low_s, min(kind.high_s, cfg.max_s))
        duration = round(rng.uniform(kind.low_s, high), 1)
        rank = rng.randrange(cfg.world) if kind.target == "rank" else None
        # drawn only with several controllers: a one-controller seed's schedule stays what it was
        which = rng.randrange(cfg.controllers) if kind.target == "controller" and cfg.controllers > 1 else None
        if rng.random() < cfg.wall_share:
            key, at = WALL, round(rng.uniform(lo, hi) * cfg.step_s, 1)
        else:
            key, at = STEP, float(rng.randint(lo, hi))
        events.append(Event(kind=kind.name, key=key, at=at, duration_s=duration, rank=rank, which=which))
    events.sort(key=lambda e: (e.eta_s(cfg.step_s), e.kind))
    return Schedule(seed=seed, steps=steps, events=tuple(events), controllers=cfg.controllers)
