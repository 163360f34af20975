"""The order a batch's events are judged in: the urgent first, the bulk arrays and heartbeats last (pure).

Booking on the goodput ledger stays in the log's order (``controller/batch.py``): only the
detector's judging of the bulk events waits for the rest of the batch.

A loss spike's pause leaves the moment its step is judged (``BatchProcessor.on_command``), so
every event judged before it in the batch is latency. Measured with six 16k-rank runs on
PostgreSQL: verdict p50 68-74 ms, p99 92-110 ms, most of a batch being node heartbeats.
"""

from __future__ import annotations

from typing import Any

from cliffguard.core.enums import EventType

BULK: frozenset[EventType] = frozenset({EventType.HEARTBEAT, EventType.RANKS})
"""The events a batch judges last: a 16k-rank run's ~400 node heartbeats a second and its ``ranks``
arrays are most of a batch and none of its urgent verdicts (a loss spike's pause leaves as its step
is judged: ``on_command``). The heartbeat rule, which reads every event as a sign of life, keeps
each rank's newest by its ``ts``, not by arrival, so judging them after the batch's other events
changes no verdict but when a step's goes out (their own verdicts are warnings: a hung or silent rank
is judged by the clock, on ticks). Within each group the log's order is kept."""
_LIFE_EVENTS = frozenset({EventType.RUN_STARTED, EventType.RUN_FINISHED, EventType.RUN_FAILED,
                          EventType.RUN_PREEMPTED, EventType.ELASTIC_SCALED_DOWN, EventType.ELASTIC_SCALED_UP})
"""A batch with one of these is judged in the log's order: a new life clears the heartbeat rule's
ranks, and a heartbeat of the old life judged after it would count as the new one's."""


def judge_later(records: list[Any]) -> bool:
    """Whether the batch's ``BULK`` events are judged after its others: yes, unless a run's life
    changes in it (``_LIFE_EVENTS``: then every event is judged in the log's order)."""
    return not any(r.event.type in _LIFE_EVENTS for r in records)
