"""The publisher's link to the broker, as a declared state machine (agent/publisher.py reads it).

States and the moves between them, each caused by one event::

    DOWN ──connected──► REPLAYING ──spill_drained──► LIVE
     ▲                     │  ▲                       │
     │                     │  └──────log_lost─────────┤
     └─────send_failed─────┴───────send_failed────────┘
    crashed (the thread restarts): any open state -> DOWN;  shut_down: any -> CLOSED

- ``DOWN``: every event goes to the spill file; the thread probes the broker with backoff.
- ``REPLAYING``: connected; events the broker acknowledged but then lost with its log are sent
  again first (agent/acked_tail.py), then the spill oldest first; newer events wait behind them.
- ``LIVE``: connected with an empty spill; events are sent directly.
- ``CLOSED``: the thread has ended; what was left is in the spill for the next start.

A move that is not in ``MOVES`` is a bug in the publisher: it raises ``MoveNotDeclared`` (the
thread's crash handler logs and counts it, and training goes on).
"""

from __future__ import annotations

from collections import deque
from enum import StrEnum


class LinkState(StrEnum):
    DOWN = "down"
    REPLAYING = "replaying"
    LIVE = "live"
    CLOSED = "closed"


class LinkEvent(StrEnum):
    CONNECTED = "connected"
    """A probe built a producer and found the topic."""
    SPILL_DRAINED = "spill_drained"
    """Connected, and nothing is left to send again or in the spill."""
    LOG_LOST = "log_lost"
    """The broker lost the log that acknowledged events were written to (a new topic id, or
    offsets that went back): they are sent again before anything newer."""
    SEND_FAILED = "send_failed"
    """A batch was not acknowledged within ``send_timeout_s``."""
    CRASHED = "crashed"
    """The publisher thread raised; it drops its producer and restarts."""
    SHUT_DOWN = "shut_down"
    """The thread ended (``close``)."""


_OPEN = (LinkState.DOWN, LinkState.REPLAYING, LinkState.LIVE)

MOVES: dict[tuple[LinkState, LinkEvent], LinkState] = {
    (LinkState.DOWN, LinkEvent.CONNECTED): LinkState.REPLAYING,
    (LinkState.REPLAYING, LinkEvent.SPILL_DRAINED): LinkState.LIVE,
    (LinkState.LIVE, LinkEvent.LOG_LOST): LinkState.REPLAYING,
    (LinkState.REPLAYING, LinkEvent.LOG_LOST): LinkState.REPLAYING,
    (LinkState.REPLAYING, LinkEvent.SEND_FAILED): LinkState.DOWN,
    (LinkState.LIVE, LinkEvent.SEND_FAILED): LinkState.DOWN,
    **{(s, LinkEvent.CRASHED): LinkState.DOWN for s in _OPEN},
    **{(s, LinkEvent.SHUT_DOWN): LinkState.CLOSED for s in _OPEN},
}
"""Every allowed (state, event) -> next state."""


class MoveNotDeclared(RuntimeError):
    """An event that ``MOVES`` does not allow in the current state."""


class Link:
    """The current state; ``move`` follows ``MOVES`` only. Used by the publisher thread alone."""

    def __init__(self) -> None:
        self.state = LinkState.DOWN
        self.history: deque[tuple[LinkState, LinkEvent, LinkState]] = deque(maxlen=256)
        """The latest moves taken (from, event, to), for diagnostics and tests."""

    @property
    def up(self) -> bool:
        """Connected to the broker (replaying or live)."""
        return self.state in (LinkState.REPLAYING, LinkState.LIVE)

    def move(self, event: LinkEvent) -> LinkState:
        try:
            to = MOVES[(self.state, event)]
        except KeyError:
            raise MoveNotDeclared(f"publisher link: {event} is not a move from {self.state}") from None
        self.history.append((self.state, event, to))
        self.state = to
        return to
