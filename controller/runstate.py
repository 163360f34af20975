"""Per-run controller state: the run's detector and its recovery machine, and where they live.

A run's slot is serialised into ``runs.controller_state`` (and each rule's state that changed
since the last save into ``rule_states``: see ``RunSlot.encode``) in the same transaction as the consumer
offsets, so whichever instance owns the run's partition next (after a crash or a rebalance)
continues exactly where the last committed batch left it. ``partition`` is remembered too: on a
partition assignment the service reloads the runs that live there (a run waiting for an ack must
keep ticking even when no event arrives).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from cliffguard.controller.recovery import new_state
from cliffguard.controller.recovery_state import RecoveryState
from cliffguard.controller.store.json_text import orjson_text
from cliffguard.controller.store.models import RuleStateRow, RunRow
from cliffguard.controller.store.upsert import built_once, insert_for
from cliffguard.controller.verdict import Verdict
from cliffguard.core.events import Event
from cliffguard.core.floats import from_json, to_json

STATE_VERSION = 1
UNREADABLE_STATE = (ValueError, TypeError, KeyError, IndexError)
"""What a rule's ``load_state_dict`` raises on a stored state it cannot read (the packed layouts
raise controller.rules.packed.PackedStateError, a ValueError, with what was wrong)."""

log = logging.getLogger(__name__)


class Detector(Protocol):
    """What the service needs of ``controller.detect.RunDetector``."""

    def on_event(self, event: Event) -> list[Verdict]: ...

    def tick(self, now: float) -> list[Verdict]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class RulesApart(Protocol):
    """A detector whose rules' states are saved apart, each only when it changed
    (``controller.detect.RunDetector``); other detectors are saved whole in ``controller_state``."""

    rules: dict[str, Any]
    changed: set[str]
    """Rules that saw an event, a tick or a rewind since their state was last saved."""

    def own_state_dict(self) -> dict[str, Any]: ...


_APART: dict[type, bool] = {}


def rules_apart(detector: Any) -> bool:
    """``isinstance(detector, RulesApart)``, asked once per detector class (its instances all set
    the same attributes): a runtime protocol check walks the protocol's members every time, and
    this runs for every run of every batch."""
    kind = type(detector)
    known = _APART.get(kind)
    if known is None:
        known = _APART[kind] = isinstance(detector, RulesApart)
    return known


def encode_json(obj: Any) -> str:
    """JSON text; non-finite floats in the wire spelling (core.floats). orjson, where installed,
    does the common case (``store.json_text.orjson_text``: no non-finite float, tuple or non-text
    key anywhere) several times faster than the standard C encoder, whose float formatting is
    most of a rule state's cost; the C encoder does the next case 20x faster than the Python walk."""
    fast = orjson_text(obj)
    if fast is not None:
        return fast
    try:
        return json.dumps(obj, allow_nan=False)
    except (ValueError, TypeError):
        return json.dumps(to_json(obj), allow_nan=False)


PART_SEP = "#"
"""Between a rule's name and a part's in ``rule_states.rule``: ``mfu#recent.17`` (rule names have none)."""


def rule_texts(rules: dict[str, Any], changed: Collection[str]) -> dict[str, str]:
    """{row name: JSON text} of the ``changed`` rules' states: a rule with ``state_split`` (the
    per-rank window rules: ``controller/rules/rank_window_split.py``) gives its state less its
    bulk arrays, and a row per part that changed since its last split; the others their whole state."""
    out: dict[str, str] = {}
    for name in sorted(changed):
        rule = rules[name]
        split = getattr(rule, "state_split", None)
        if split is None:
            out[name] = encode_json(rule.state_dict())
            continue
        state, parts = split()
        out[name] = encode_json(state)
        for part, value in parts.items():
            out[f"{name}{PART_SEP}{part}"] = encode_json(value)
    return out


def fold_parts(rows: dict[str, Any]) -> dict[str, Any]:
    """Stored rows by name -> each rule's state, its parts' rows under its ``parts`` key. A rule
    whose own row or one of whose parts could not be read (None) is left out: it starts fresh."""
    out: dict[str, Any] = {}
    parts: dict[str, dict[str, Any]] = {}
    broken: set[str] = set()
    for name, state in rows.items():
        rule, sep, part = name.partition(PART_SEP)
        if state is None:
            broken.add(rule)
        elif sep:
            parts.setdefault(rule, {})[part] = state
        else:
            out[rule] = state
    for rule, held in parts.items():
        if isinstance(out.get(rule), dict):
            out[rule] = {**out[rule], "parts": held}
    return {rule: state for rule, state in out.items() if rule not in broken}


DetectorFactory = Callable[[], Detector]


def default_detector_factory(rules_config: Any = None) -> DetectorFactory:
    """RunDetector with the given (or default) RulesConfig."""
    from cliffguard.controller.detect import RulesConfig, RunDetector

    cfg = rules_config if rules_config is not None else RulesConfig()
    return lambda: RunDetector(cfg)


@dataclass(slots=True)
class RunSlot:
    run_id: str
    detector: Detector
    recovery: RecoveryState
    partition: int | None = None
    dirty: bool = False
    judged_ts: float = 0.0
    """The newest ``ts`` among the run's judged steps, rank arrays and validations: an event of
    those kinds at or before it may be a re-read (``controller/replays.py``)."""
    spike_rule: Any = None
    """The loss rules' spike settings this slot last wrote on the run's row (``controller.batch``
    writes them again only when they are not these); a reloaded slot starts with none."""
    ledger: Any = None
    """The run's goodput ledger (``controller/goodput/book.py`` builds it on the slot's first event)."""
    ledger_state: Any = None
    """The ledger's state as stored with the run's, until the ledger is built from it."""

    def to_json(self) -> dict[str, Any]:
        """The whole state as one JSON document (every rule inline)."""
        return json.loads(encode_json(self._state(self.detector.state_dict())))

    def encode(self) -> tuple[dict[str, Any], dict[str, str]]:
        """(``controller_state``, {rule: JSON text} of the rules changed since the last save).
        A 16k-rank run's per-rank windows hold ~10^6 numbers that change every ``ranks_every``
        steps: encoding and writing them with every batch cost seconds."""
        det = self.detector
        if not rules_apart(det):
            return self.to_json(), {}
        rules = rule_texts(det.rules, det.changed)
        state = json.loads(encode_json(self._state(det.own_state_dict())))
        state["rules_apart"] = True
        return state, rules

    def _state(self, detector: dict[str, Any]) -> dict[str, Any]:
        state = {"v": STATE_VERSION, "partition": self.partition, "detector": detector,
                 "recovery": self.recovery.state_dict(), "judged_ts": self.judged_ts}
        goodput = self.ledger.state_dict() if self.ledger is not None else self.ledger_state
        if goodput is not None:
            state["goodput"] = goodput
        return state


class RunTable:
    """The runs this instance owns, loaded from the store on first use."""

    def __init__(self, detector_factory: DetectorFactory) -> None:
        self._factory = detector_factory
        self.slots: dict[str, RunSlot] = {}

    def get(self, session: Session, run_id: str, partition: int | None = None) -> RunSlot:
        slot = self.slots.get(run_id)
        if slot is None:
            row = session.get(RunRow, run_id)
            slot = self._from_stored(session, run_id, row.controller_state if row is not None else None)
            self.slots[run_id] = slot
        if partition is not None and slot.partition != partition:
            slot.partition = partition
            slot.dirty = True
        return slot

    def _from_stored(self, session: Session, run_id: str, stored: dict[str, Any] | None) -> RunSlot:
        if stored and stored.get("v") == STATE_VERSION:
            apart: dict[str, Any] = {}
            rows = session.execute(select(RuleStateRow.rule, RuleStateRow.state).where(
                RuleStateRow.run_id == run_id)).all() if stored.get("rules_apart") else []
            for name, text in rows:
                try:
                    apart[name] = json.loads(text)
                except ValueError as exc:  # truncated text: the rule starts fresh (not in apart: saved again)
                    log.warning("run %s: the stored %s rule state is not JSON (%s); the rule starts fresh",
                                run_id, name, exc)
                    apart[name] = None  # fold_parts leaves its rule out (a part's rule cannot be whole either)
            apart = fold_parts(apart)
            det, unreadable = self._load_detector(run_id, from_json({**stored["detector"], **apart}))
            if rules_apart(det):
                # stored inline (older layout), new, or unreadable: save apart
                det.changed = set(det.rules) - set(apart) | unreadable
            rec = RecoveryState.from_state_dict(stored["recovery"])
            judged = stored.get("judged_ts")
            return RunSlot(run_id, det, rec, stored.get("partition"),
                           judged_ts=float(judged) if isinstance(judged, int | float) else 0.0,
                           ledger_state=stored.get("goodput"))
        return RunSlot(run_id, self._factory(), new_state(run_id, uuid.uuid4().hex), None, dirty=True)

    def _load_detector(self, run_id: str, state: dict[str, Any]) -> tuple[Detector, set[str]]:
        """A detector with the stored state, and the rules whose stored state could not be read:
        those start fresh, with a warning, rather than failing every batch of the run (the store
        is not trusted). What is not a rule's state still fails the load as before."""
        det = self._factory()
        try:
            det.load_state_dict(state)
            return det, set()
        except UNREADABLE_STATE:
            if not rules_apart(det):
                raise
        unreadable: set[str] = set()
        for name, rule in self._factory().rules.items():  # a fresh detector's: loads may fail half-way
            if name in state:
                try:
                    rule.load_state_dict(state[name])
                except UNREADABLE_STATE as exc:
                    log.warning("run %s: the stored %s rule state is unreadable (%s); the rule starts fresh",
                                run_id, name, exc)
                    unreadable.add(name)
        det = self._factory()
        det.load_state_dict({k: v for k, v in state.items() if k not in unreadable})
        return det, unreadable

    def load_partitions(self, session: Session, partitions: set[int]) -> int:
        """Load the live runs whose stored partition is in ``partitions``; returns how many."""
        rows = session.execute(select(RunRow.id, RunRow.controller_state).where(RunRow.status == "running")).all()
        n = 0
        for run_id, stored in rows:
            if stored and stored.get("partition") in partitions:
                self.slots[run_id] = self._from_stored(session, run_id, stored)
                n += 1
        return n

    def drop_partitions(self, partitions: set[int]) -> None:
        for run_id in [r for r, s in self.slots.items() if s.partition in partitions]:
            del self.slots[run_id]

    def clear(self) -> None:
        self.slots.clear()




def _run_update(session: Session) -> Any:
    t = RunRow.__table__
    return update(t).where(t.c.id == bindparam("b_id")).values(
        controller_state=bindparam("b_state", type_=t.c.controller_state.type),
        recovery_state=bindparam("b_phase"), lr_scale=bindparam("b_lr_scale"))


def _rule_upsert(session: Session) -> Any:
    ins = insert_for(session, RuleStateRow)
    return ins.on_conflict_do_update(index_elements=["run_id", "rule"], set_={"state": ins.excluded.state})


def save_slots(session: Session, slots: list[RunSlot], *, known: Collection[str] | None = None,
               budget_limits: dict[str, list[float]] | None = None) -> None:
    """Write the dirty slots' state (and the phase and LR scale the dashboard shows): one
    executemany for the run rows, without reading them back (each holds the previous state),
    and one for the rule states that changed. ``known``: the ids of the runs the store holds,
    when the caller has read them already (else one read here: a run only a tick touched may
    not be stored). ``budget_limits``: the recovery rungs' limits this controller enforces, kept
    with each state so that ``cliffguard status`` and the dashboard show the room left by them
    (``controller/recovery_budgets.py`` ``limits_doc``)."""
    if not slots:
        return
    if known is None:
        known = set(session.scalars(select(RunRow.id).where(RunRow.id.in_([s.run_id for s in slots]))))
    slots = [s for s in slots if s.run_id in known]
    if not slots:
        return
    runs, rules = [], []
    for slot in slots:
        state, changed = slot.encode()
        if budget_limits is not None:
            state["budget_limits"] = budget_limits
        runs.append({"b_id": slot.run_id, "b_state": state, "b_phase": str(slot.recovery.phase),
                     "b_lr_scale": slot.recovery.lr_scale})
        rules += [{"run_id": slot.run_id, "rule": name, "state": text} for name, text in changed.items()]
    conn = session.connection()
    conn.execute(built_once(session, "save_slots.runs", _run_update), runs)
    if rules:
        conn.execute(built_once(session, "save_slots.rules", _rule_upsert), rules)
    for slot in slots:
        if rules_apart(slot.detector):
            slot.detector.changed.clear()
        slot.dirty = False
