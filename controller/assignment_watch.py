"""A controller that holds no metrics partition for long is said, and rejoins its group unless
another member is visibly consuming.

A full CI run left every later in-process controller of one consumer group on the embedded broker
(Tansu) with no partitions at all: each polled nothing, readiness said "no partitions assigned",
and no log line said that events were piling up unread (nisshi-io/nisshi#625 reports a second
member of a Tansu group never getting an assignment). The stuck watch (controller/progress.py)
cannot see this: it watches assigned partitions, and there were none.

No partitions is also what a standby sees: a second controller of the group while the first holds
every partition. The broker cannot be asked to tell the two apart (Tansu's DescribeGroups answer
does not parse in kafka-python), so the store is the witness: the group's stored offsets are
written by whichever member consumes. Offsets of the group stored since this instance lost its
partitions and last stored any itself (so not its own), within ``after_s``, mean a peer is consuming (a standby: said once,
at INFO); none mean no member is, and this one
rejoins the group (a fresh consumer), again after twice as long each time it did not help, up to
``max_backoff_s``, each time a WARNING and from the second time on an ERROR.

Pure: the service hands in its wall clock (the one stored offsets are dated by), the assignment
and the store's newest offset write.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Unassigned(Enum):
    STANDBY = "standby"
    """Another member of the group stored offsets recently: it consumes, this one waits."""
    REJOIN = "rejoin"
    """No member consumes: build a fresh consumer (it joins the group again)."""


@dataclass(slots=True)
class UnassignedWatch:
    after_s: float
    """Seconds with no metrics partition before a look (0 = off). Longer than a normal join: two
    members joining a Tansu group at once waited ~23 s for their partitions here."""
    max_backoff_s: float = 900.0
    _since: float | None = None
    """When the assignment became empty (or the watch first saw it empty)."""
    _next_look: float = 0.0
    _rejoins: int = 0
    """Rejoins since partitions were last held: each doubles the wait before the next look."""
    _standby: bool = False
    _own_at: float = 0.0
    """When this instance last stored offsets itself (a batch read before its partitions went)."""

    def due(self, assigned: int, now: float) -> bool:
        """Whether a look is due now; ``assigned``: metrics partitions held."""
        if not self.after_s:
            return False
        if assigned:
            self._since, self._rejoins, self._standby = None, 0, False
            return False
        if self._since is None:
            self._since, self._next_look = now, now + self.after_s
        return now >= self._next_look

    def stored(self, now: float) -> None:
        """This instance committed a batch's offsets at ``now``: the group's newest write is its own."""
        self._own_at = max(self._own_at, now)

    def judge(self, newest_stored_at: float | None, now: float) -> Unassigned:
        """``newest_stored_at``: when the group last stored an offset (None: never). Schedules the
        next look either way."""
        since = max(self._since if self._since is not None else now, self._own_at)
        if newest_stored_at is not None and newest_stored_at > since and now - newest_stored_at <= self.after_s:
            self._next_look = now + self.after_s
            return Unassigned.STANDBY
        self._rejoins += 1
        self._next_look = now + min(self.after_s * 2 ** self._rejoins, self.max_backoff_s)
        return Unassigned.REJOIN

    def first_standby(self) -> bool:
        """True once per stretch of standby (the INFO line is said once, not every look)."""
        first, self._standby = not self._standby, True
        return first

    @property
    def rejoins(self) -> int:
        return self._rejoins

    def unassigned_s(self, now: float) -> float:
        return 0.0 if self._since is None else now - self._since
