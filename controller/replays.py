"""Recognise an event the controller has judged already: a re-read is stored once and judged once.

A log gets read twice. A topic re-created by a broker that restarted empty is read again from
its start (and the agents re-send what they had sent just before: agent/publisher.py); an agent
re-sends a batch that the broker wrote but did not acknowledge in time; a controller's successor
reads on from offsets stored with the state. The store has always ignored a second copy of a row
(event ids are unique). The rules must too: a re-read spike opened a second incident with six more
commands, and re-read old losses after newer ones looked like a divergence (issue 29 B).

Which events: the ones the rules judge and that become one row each under a unique event id —
steps (``step_metrics``), rank arrays (``rank_arrays``) and validations (``validations``). Other
events change state that is idempotent already: heartbeats and checkpoints by ``ts``, acks by
command id, a run's start and end by its lifecycle columns.

How, without a lookup per event: each run slot keeps ``judged_ts``, the newest ``ts`` among its
judged events of those kinds. An event newer than that cannot have been judged, which is the
common case. An older one (a re-read, an agent's spill replayed late, a clock that stepped back)
is a suspect: all of a batch's suspects are looked up by id in one query per table, before the
batch writes anything. A second copy of an event judged earlier in the same batch is recognised
by id, and a step below the run's downsampling watermark was judged before it was folded into a
bucket, so a re-read of it is recognised by its step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from cliffguard.controller.store.models import RankArrayRow, StepMetricRow, ValidationRow
from cliffguard.controller.store.retention import run_watermarks
from cliffguard.core.enums import EventType
from cliffguard.core.events import Event

JUDGED_ONCE: dict[EventType, Any] = {
    EventType.STEP: StepMetricRow,
    EventType.RANKS: RankArrayRow,
    EventType.VALIDATION: ValidationRow,
}
"""Event type -> the table that holds one row per event of it, under a unique ``event_id``."""


class Replays:
    """The judged-before test for one batch. ``judged_ts(run, partition)`` is the run slot's
    ``judged_ts`` at the batch's start; ``seen(event)`` is asked in the batch's order, and
    ``judged(event)`` told of each event the batch went on to judge."""

    def __init__(self, session: Session, events: Iterable[tuple[Event, int]],
                 judged_ts: Callable[[str, int], float]) -> None:
        self._here: set[str] = set()
        self.count = 0
        suspects: dict[Any, list[str]] = {}
        step_runs: set[str] = set()
        for ev, partition in events:
            table = JUDGED_ONCE.get(ev.type)
            if table is not None and ev.ts <= judged_ts(ev.run, partition):
                suspects.setdefault(table, []).append(ev.id)
                if ev.type is EventType.STEP:
                    step_runs.add(ev.run)
        self._suspects = {eid for ids in suspects.values() for eid in ids}
        self._stored: set[str] = set()
        for table, ids in suspects.items():
            self._stored.update(session.scalars(select(table.event_id).where(table.event_id.in_(ids))))
        self._folded_below = run_watermarks(session, step_runs) if step_runs else {}

    def seen(self, ev: Event) -> bool:
        """Whether ``ev`` was judged before (in an earlier batch or earlier in this one)."""
        if ev.type not in JUDGED_ONCE:
            return False
        eid = ev.id
        if eid in self._here or eid in self._stored or (
                # only a suspect: a step re-run after a rollback past the watermark is new (newer ts)
                eid in self._suspects and ev.type is EventType.STEP
                and ev.step < (self._folded_below.get(ev.run) or 0)):
            self.count += 1
            return True
        return False

    def judged(self, ev: Event) -> None:
        if ev.type in JUDGED_ONCE:
            self._here.add(ev.id)
