"""The agent's one way out: a draft of each event to the sink (agent/drafts.py, agent/sinks.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cliffguard.agent.drafts import EventDraft
from cliffguard.agent.ranks import Ranks
from cliffguard.agent.sinks import EventSink
from cliffguard.core.enums import EventType


class Emitter:
    """Stamps run, rank, world and (unless given) the current step; never validates or raises
    here: the sink builds the draft (the publisher on its own thread)."""

    def __init__(self, run: str, ranks: Ranks, sink: EventSink, step: Callable[[], int]) -> None:
        self.run = run
        self.ranks = ranks
        self.sink = sink
        self._step = step

    def emit(self, type: EventType, data: dict[str, Any], *, step: int | None = None) -> None:
        self.sink.publish(EventDraft(type, self.run, self._step() if step is None else step, dict(data),
                                     rank=self.ranks.rank, world=self.ranks.world))
