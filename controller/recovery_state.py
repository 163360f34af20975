"""The recovery state machine's memory of one run: checkpoints, the open incident, the pending command.

Plain data, JSON-able through ``RecoveryState.state_dict()`` so the service can store and restore it.
"""

from __future__ import annotations

import hashlib
import math
import operator
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from cliffguard.controller.recovery_hang_types import HangState
from cliffguard.controller.recovery_types import Phase
from cliffguard.core.capabilities import ALL as ALL_COMMANDS
from cliffguard.core.capabilities import normalize as normalize_capabilities
from cliffguard.core.enums import CommandType


@dataclass(frozen=True, slots=True)
class Checkpoint:
    step: int
    kind: str
    stable: bool = False
    sample_end: int | None = None
    """First sample index after this checkpoint (the start of a data-skip window)."""


@dataclass(frozen=True, slots=True)
class Pending:
    """The command the machine is waiting on."""

    id: str
    type: CommandType
    args: dict[str, Any]
    sent_at: float
    attempt: int
    acked: bool = False


@dataclass(frozen=True, slots=True)
class Incident:
    id: str
    rule: str
    level: str
    spike_step: int
    onset_step: int
    opened_at: float
    sample_end: int | None = None
    rollback_to: int | None = None
    rollbacks: int = 0
    evidence: dict[str, Any] = field(default_factory=dict)
    rung: int = 0
    """The incident's rung on the escalation ladder (``recovery_table.LADDER``)."""
    follows: str | None = None
    """The incident this one escalates (it began soon after that one ended)."""
    prior_target: int | None = None
    """The rollback target of the incident it escalates: a longer rollback goes before it."""
    lr_scales: tuple[float, ...] = ()
    """Every LR scale this incident set, in order."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Incident:
        return cls(**{**d, "lr_scales": tuple(float(x) for x in d.get("lr_scales", ()))})


@dataclass(frozen=True, slots=True)
class Closed:
    """The previous incident, as the escalation ladder needs it."""

    id: str
    step: int
    """The step at which it ended (resumed, or recovered after a rollback)."""
    rung: int
    rollback_to: int | None


@dataclass(frozen=True, slots=True)
class RungUse:
    """When a rung of the recovery ladder was used (``controller/recovery_budgets.py``)."""

    times: tuple[float, ...] = ()
    """The newest uses' times, newest last (bounded: what its window needs)."""
    total: int = 0
    """Every use in the run (its per-run budget)."""

    def used(self, now: float, keep: int) -> RungUse:
        return RungUse(times=(*self.times, now)[-max(keep, 1) * 2:], total=self.total + 1)


@dataclass(frozen=True, slots=True)
class RungUses:
    """Each budgeted rung's uses. The window times of ``rollback`` and ``restart`` are kept where they
    were before the budgets (``RecoveryState.rollback_times``, ``HangState.restart_times``): here only
    their totals."""

    retry: RungUse = RungUse()
    rerun: RungUse = RungUse()
    rollback: RungUse = RungUse()
    restart: RungUse = RungUse()
    evict: RungUse = RungUse()
    triaged_ts: float = 0.0
    """``ts`` of the newest ``step.triaged`` counted (a re-read report is not counted twice)."""

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: {"times": list(getattr(self, f.name).times), "total": getattr(self, f.name).total}
                   for f in fields(self) if f.type == "RungUse"}, "triaged_ts": self.triaged_ts}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> RungUses:
        d = d or {}  # a state saved before the budgets: nothing used yet
        return cls(**{f.name: RungUse(times=tuple(float(t) for t in d[f.name].get("times", ())),
                                      total=int(d[f.name].get("total", 0)))
                      for f in fields(cls) if isinstance(d.get(f.name), dict)},
                   triaged_ts=float(d.get("triaged_ts", 0.0)))


def _finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


@dataclass(slots=True)
class RecoveryState:
    """Everything the machine remembers about one run; JSON-able via state_dict()."""

    run: str
    salt: str
    """Random per-run text that makes command/incident ids unique across controller stores."""
    phase: Phase = Phase.RUNNING
    seq: int = 0
    lr_scale: float = 1.0
    last_step: int = -1
    last_sample_end: int | None = None
    unhealthy_steps: tuple[int, ...] = ()
    """Most recent unhealthy steps (bounded), for stability and recovery windows."""
    unhealthy_samples: tuple[tuple[int, int, int], ...] = ()
    """(step, first, end) sample ranges of the most recent steps whose loss the loss rule judged warn or
    critical (or that it did not judge), to flag a transient spike's data."""
    flagging: tuple[int, float, str] | None = None
    """(onset, score, reason) of a transient excursion that validation called normal while it was
    still going on: its later unhealthy steps are flagged as they arrive, until a healthy one."""
    checkpoints: tuple[Checkpoint, ...] = ()
    val_baseline: tuple[float, ...] = ()
    rollback_times: tuple[float, ...] = ()
    incident: Incident | None = None
    pending: Pending | None = None
    issued: tuple[str, ...] = ()
    cured: Incident | None = None
    """The last incident the trainer's triage cured, and ``cured_step`` its newest step: the next
    cured step of the same class right after it is the same excursion (one incident, not one per step)."""
    cured_step: int = -1
    """Ids of the commands this machine sent recently (to tell operator commands apart)."""
    capabilities: tuple[CommandType, ...] = ALL_COMMANDS
    """The commands the run declared it can apply (its newest ``run.started``); no other is sent."""
    hang: HangState = field(default_factory=HangState)
    """The worker group's life, restarts and hung nodes (controller/recovery_hang_types.py)."""
    previous: Closed | None = None
    """The last incident that ended with the run training on (resumed or recovered): an excursion
    soon after it escalates. A halt or an abandoned incident forgets it (a human decided)."""
    acted_alone_ts: float = 0.0
    """``ts`` of the newest trainer-side timeout report applied (a re-read one is not applied twice)."""
    rungs: RungUses = field(default_factory=RungUses)
    """When each budgeted rung (retry, rerun, rollback, restart, evict) was used, and how often in the run."""

    def can(self, *types: CommandType) -> bool:
        return all(t in self.capabilities for t in types)

    def clone(self) -> RecoveryState:
        # every nested value is immutable, so a shallow copy is a full one; positional construction
        # from one attrgetter is ~4x cheaper than dataclasses.replace, and clone runs once per event
        return RecoveryState(*_STATE_FIELDS(self))

    def new_id(self, what: str) -> str:
        self.seq += 1
        return hashlib.sha256(f"{self.salt}:{self.run}:{what}:{self.seq}".encode()).hexdigest()[:32]

    def baseline(self) -> float | None:
        if not self.val_baseline:
            return None
        vals = sorted(self.val_baseline)
        mid = len(vals) // 2
        return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2

    def state_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "salt": self.salt,
            "phase": str(self.phase),
            "seq": self.seq,
            "lr_scale": self.lr_scale,
            "last_step": self.last_step,
            "last_sample_end": self.last_sample_end,
            "unhealthy_steps": list(self.unhealthy_steps),
            "unhealthy_samples": [list(x) for x in self.unhealthy_samples],
            "checkpoints": [asdict(c) for c in self.checkpoints],
            "val_baseline": [v for v in self.val_baseline if _finite_or_none(v) is not None],
            "rollback_times": list(self.rollback_times),
            "incident": {**asdict(self.incident), "lr_scales": list(self.incident.lr_scales)} if self.incident else None,
            "pending": {**asdict(self.pending), "type": str(self.pending.type)} if self.pending else None,
            "issued": list(self.issued),
            "flagging": list(self.flagging) if self.flagging else None,
            "capabilities": [str(c) for c in self.capabilities],
            "hang": self.hang.to_dict(),
            "previous": asdict(self.previous) if self.previous else None,
            "acted_alone_ts": self.acted_alone_ts,
            "cured": {**asdict(self.cured), "lr_scales": list(self.cured.lr_scales)} if self.cured else None,
            "cured_step": self.cured_step,
            "rungs": self.rungs.to_dict(),
        }

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> RecoveryState:
        pend = d.get("pending")
        inc = d.get("incident")
        return cls(
            run=d["run"],
            salt=d["salt"],
            phase=Phase(d["phase"]),
            seq=int(d["seq"]),
            lr_scale=float(d["lr_scale"]),
            last_step=int(d["last_step"]),
            last_sample_end=d.get("last_sample_end"),
            unhealthy_steps=tuple(int(s) for s in d.get("unhealthy_steps", ())),
            unhealthy_samples=tuple((int(a), int(b), int(c)) for a, b, c in d.get("unhealthy_samples", ())),
            checkpoints=tuple(Checkpoint(**c) for c in d.get("checkpoints", ())),
            val_baseline=tuple(float(v) for v in d.get("val_baseline", ())),
            rollback_times=tuple(float(t) for t in d.get("rollback_times", ())),
            incident=Incident.from_dict(inc) if inc else None,
            cured=Incident.from_dict(d["cured"]) if d.get("cured") else None,
            cured_step=int(d.get("cured_step", -1)),
            pending=Pending(**{**pend, "type": CommandType(pend["type"])}) if pend else None,
            issued=tuple(d.get("issued", ())),
            flagging=(int(d["flagging"][0]), float(d["flagging"][1]), str(d["flagging"][2])) if d.get("flagging") else None,
            # a state saved before capabilities were declared belongs to a run that got every command
            capabilities=normalize_capabilities(d["capabilities"]) if "capabilities" in d else ALL_COMMANDS,
            hang=HangState.from_dict(d.get("hang")),
            previous=Closed(**d["previous"]) if d.get("previous") else None,
            acted_alone_ts=float(d.get("acted_alone_ts", 0.0)),
            rungs=RungUses.from_dict(d.get("rungs")),
        )

    def load_state_dict(self, d: dict[str, Any]) -> None:
        other = RecoveryState.from_state_dict(d)
        for name in self.__slots__:
            setattr(self, name, getattr(other, name))


_STATE_FIELDS = operator.attrgetter(*(f.name for f in fields(RecoveryState)))
