"""An event not yet built: what the training thread hands a sink that builds events itself.

``make_event`` validates the whole payload (core/events.py) and the publisher encodes it; for a
step event with per-layer norms that is a few hundred microseconds of Python per step. The agent
gives a ``Publisher`` (agent/publisher.py, ``builds_events``) the plain fields instead, and its
thread builds, validates and encodes them; a draft that fails validation is logged and counted
there as a dropped event. Other sinks get built events, validated on the caller's thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from cliffguard.core.enums import EventType
from cliffguard.core.events import Event, make_event


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

    def build(self) -> Event:
        """The validated event (raises ``SchemaError``, a ``ValueError``, naming the field)."""
        return make_event(self.type, self.run, self.step, self.data, rank=self.rank, world=self.world, ts=self.ts)


def builds_events(sink: Any) -> bool:
    """Whether ``sink.publish`` takes an ``EventDraft``."""
    return bool(getattr(sink, "builds_events", False))
