"""What every sink is handed: an event not yet built (``EventDraft``), and its one way to become one.

``make_event`` validates the whole payload (core/events.py) and the publisher encodes it; for a
step event with per-layer norms that is a few hundred microseconds of Python per step. So the
training thread hands a sink the plain fields, and the sink builds them where it pays least: the
``Publisher`` (agent/publisher.py) on its own thread, where a draft that fails validation is
logged and counted as a dropped event; the ``InMemorySink`` (agent/sinks.py) at once. Either way
through ``EventDraft.build``, the one path from a draft to an ``Event``. A draft made with
``draft_event`` (tools, tests, fault checks) carries its event's id, known before the build; the
agent's own drafts leave it empty and the build draws it, off the training thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from cliffguard.core.enums import EventType
from cliffguard.core.events import Event, make_event, new_id


@dataclass(frozen=True, slots=True)
class EventDraft:
    type: EventType
    run: str
    step: int
    data: dict[str, Any]
    """Owned by the draft from now on: the caller hands over a dict it no longer changes."""
    rank: int = 0
    world: int = 1
    ts: float = field(default_factory=time.time)
    """When it happened (the emit), not when the publisher thread got round to it."""
    id: str = ""
    """The built event's id; empty: the build draws a fresh one."""

    def build(self) -> Event:
        """The validated event (raises ``SchemaError``, a ``ValueError``, naming the field)."""
        return make_event(self.type, self.run, self.step, self.data, rank=self.rank, world=self.world, ts=self.ts,
                          id=self.id or None)


def draft_event(type: EventType | str, run: str, step: int, data: dict[str, Any], *, rank: int = 0,
                world: int = 1) -> EventDraft:
    """A draft from the same arguments as ``make_event`` (tools and tests that publish by hand),
    with its event's id drawn now."""
    return EventDraft(EventType(type), run, step, dict(data), rank=rank, world=world, id=new_id())
