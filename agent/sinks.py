"""Where the agent's events go: the one sink interface and its null and in-memory implementations.

A sink takes ``EventDraft``s (agent/drafts.py) only; the ``Publisher`` (agent/publisher.py) is the
Kafka one. ``publish`` never blocks and never raises into the training loop.
"""

from __future__ import annotations

import logging
from typing import Protocol

from cliffguard.agent.drafts import EventDraft
from cliffguard.core.events import Event

log = logging.getLogger(__name__)


class EventSink(Protocol):
    def publish(self, draft: EventDraft) -> None: ...

    def close(self, timeout: float = 10.0) -> None: ...


class NullSink:
    """Discards everything (the agent with monitoring switched off)."""

    def publish(self, draft: EventDraft) -> None:
        pass

    def close(self, timeout: float = 10.0) -> None:
        pass


class InMemorySink:
    """Builds every draft at once and keeps the events in ``.events`` (tests, notebooks); a draft
    that fails validation is logged and counted in ``.dropped``, as the publisher does."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.dropped = 0
        self.closed = False

    def publish(self, draft: EventDraft) -> None:
        try:
            self.events.append(draft.build())
        except ValueError:
            self.dropped += 1
            log.exception("dropping an invalid %s event", draft.type)

    def close(self, timeout: float = 10.0) -> None:
        self.closed = True
