"""A batch kept through store failures (``controller/service.py``): the consumer's place is kept
by pausing every assigned partition (kafka-python then fetches nothing of them but the instance
stays in its group as long as it polls), and the next try is scheduled by capped backoff."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cliffguard.controller.edge_classify import EdgeBatch
from cliffguard.controller.store.errors import Backoff


def pause(edge: Any, tps: list[tuple[str, int]]) -> None:
    if tps and getattr(edge, "pause", None) is not None:
        edge.pause(tps)


def resume(edge: Any, tps: list[tuple[str, int]]) -> None:
    if tps and getattr(edge, "resume", None) is not None:
        edge.resume(tps)


class HeldBatch:
    def __init__(self, backoff: Backoff, clock: Callable[[], float] = time.monotonic) -> None:
        self.backoff = backoff
        self._clock = clock
        self.batch: EdgeBatch | None = None
        self.paused: set[tuple[str, int]] = set()
        self.transient_failures = 0
        """Transient store failures of the held batch in a row (they set its backoff)."""
        self.retry_at = 0.0

    def hold(self, batch: EdgeBatch, edge: Any) -> None:
        """Keep ``batch`` (or what is left of it) and pause every partition: it goes first."""
        assigned = set(edge.assignment()) if edge is not None else set()
        new = (set(batch.next_offsets) | assigned) - self.paused
        pause(edge, sorted(new))
        self.paused |= new
        self.batch = batch

    def release(self, edge: Any) -> None:
        """Done with it (applied, or a rebalance made the store's offsets the place to resume)."""
        self.batch = None
        if self.paused:
            paused, self.paused = sorted(self.paused), set()
            resume(edge, paused)
        self.transient_failures = 0
        self.retry_at = 0.0

    def wait_transient(self) -> float:
        """One more transient failure: the seconds until the next try."""
        self.transient_failures += 1
        delay = self.backoff.delay(self.transient_failures)
        self.retry_at = self._clock() + delay
        return delay

    def wait_left_s(self) -> float:
        return self.retry_at - self._clock()
