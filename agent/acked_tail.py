"""What the broker acknowledged lately, kept so it can be sent again if the broker loses its log.

An acknowledgement means the broker has the event, not that anyone has read it. A broker that
keeps its log in memory (the embedded Tansu: ``memory://`` is the only storage its wheel is built
with) loses, when it crashes, everything the controller had not consumed yet — because the
controller was stopped, restarting, or holding a batch through a store lock. The spill only covers
what the broker did *not* acknowledge. So the publisher keeps the events the broker acknowledged
in the last ``window_s`` seconds (at most ``max_bytes``), with where they landed, and sends them
again when it learns that the log they were written to is gone:

- the metrics topic has a new topic id (KIP-516) after a reconnect: it was created again;
- or an acknowledged offset in a partition is not beyond the last one acknowledged there under the
  same topic id: the log restarted under a producer whose metadata had not caught up yet.

A re-sent event keeps its event id, so a controller that had read it already stores it once and
judges it once (controller/replays.py). What is older than the window when the log is lost cannot
be sent again; the publisher says how far back it reached (``lost_log`` returns the span).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

Record = tuple[bytes, bytes]  # (key, value)


@dataclass(frozen=True, slots=True)
class Acked:
    record: Record
    at: float  # monotonic seconds
    partition: int
    offset: int
    topic_id: object


@dataclass(frozen=True, slots=True)
class LostLog:
    """Events to send again, oldest first, and what the window could not cover."""

    records: list[Record]
    oldest_age_s: float
    """Age of the oldest event sent again (how far back the window reached)."""
    trimmed: int
    """Events acknowledged under the lost log that had already left the window."""
    why: str


class AckedTail:
    def __init__(self, window_s: float, max_bytes: int) -> None:
        self.window_s = window_s
        self.max_bytes = max_bytes
        self._entries: deque[Acked] = deque()
        self._bytes = 0
        self._last_offset: dict[int, int] = {}
        self._topic_id: object = None
        self._trimmed_since_id = 0  # left the window since the current topic id was first seen

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def enabled(self) -> bool:
        return self.window_s > 0 and self.max_bytes > 0

    def check_topic(self, topic_id: object, now: float | None = None) -> LostLog | None:
        """After a (re)connect: the topic's id now. A new id means the log the tail was written
        to is gone: returns what to send again (and forgets it here)."""
        if topic_id is None:
            return None
        if self._topic_id is None or topic_id == self._topic_id:
            self._topic_id = topic_id
            return None
        return self._lose(topic_id, f"the metrics topic was created again (topic id {self._topic_id} -> {topic_id})",
                          now)

    def add(self, acked: list[tuple[Record, int, int]], topic_id: object, now: float | None = None) -> LostLog | None:
        """Records the broker acknowledged, with (partition, offset). Returns what to send again
        when these offsets show the log restarted (and forgets that part here)."""
        now = time.monotonic() if now is None else now
        lost = None
        if topic_id is not None and self._topic_id is not None and topic_id != self._topic_id:
            lost = self._lose(topic_id, f"the metrics topic was created again (topic id {self._topic_id} -> "
                              f"{topic_id})", now)
        elif topic_id is not None:
            self._topic_id = topic_id
        # an offset the broker did not say (-1) shows nothing about its log: only known ones count
        back = next((p for _, p, o in acked if 0 <= o <= self._last_offset.get(p, -1)), None)
        if lost is None and back is not None:
            went = min(o for _, p, o in acked if p == back and o >= 0)
            lost = self._lose(self._topic_id, f"partition {back}'s offsets went back to {went} "
                              f"(last acknowledged {self._last_offset[back]}): the broker restarted with an empty log",
                              now)
        if self.enabled:
            for record, partition, offset in acked:
                self._entries.append(Acked(record, now, partition, offset, self._topic_id))
                self._bytes += len(record[0]) + len(record[1])
        for _, partition, offset in acked:
            if offset > self._last_offset.get(partition, -1):
                self._last_offset[partition] = offset
        self._trim(now)
        return lost

    def _lose(self, topic_id: object, why: str, now: float | None) -> LostLog:
        now = time.monotonic() if now is None else now
        entries = list(self._entries)
        self._entries.clear()
        self._bytes = 0
        self._last_offset.clear()
        trimmed, self._trimmed_since_id = self._trimmed_since_id, 0
        self._topic_id = topic_id
        return LostLog([e.record for e in entries], now - entries[0].at if entries else 0.0, trimmed, why)

    def _trim(self, now: float) -> None:
        entries = self._entries
        while entries and (now - entries[0].at > self.window_s or self._bytes > self.max_bytes):
            e = entries.popleft()
            self._bytes -= len(e.record[0]) + len(e.record[1])
            self._trimmed_since_id += 1
