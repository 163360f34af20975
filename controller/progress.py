"""A consumer that reads nothing while its partitions' logs grow is said, and read again.

The soak (bench/soak, seed 5) left a controller alive through a broker restart and two restarts
from the log start: afterwards it polled and got nothing for 31 s while a reader with no group
read 85 new steps from the same partition, and nothing in its log said so. Whatever holds
kafka-python's fetch there, the controller can see the symptom itself: a partition whose
position has not moved for ``after_s`` while the broker's log end lies beyond it. The service
then logs a WARNING with the numbers and goes back to the store's offsets for it (a seek, and a
resume unless the controller itself paused it), which re-creates the fetch state. A partition
found stuck again, with nothing read since (the seek did not help), has a consumer whose group
state is wedged: the CI soak's seed 2 (the broker killed while the controller was stopped) left
kafka-python with its coordinator marked dead and never looked up again, fetching nothing for as
long as the soak waited. The service then builds a fresh consumer (``Stuck.times`` >= 2).

Pure: the service hands in the clock, the positions and the log ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TP = tuple[str, int]
RECHECK_DIVISOR = 3
"""A partition found stuck is looked at again after ``after_s / 3``: the soak holds the store to
standing still at most 20 s after the last fault, and a look, a seek and a rebuild must fit in it."""


@dataclass(slots=True)
class Stuck:
    tp: TP
    position: int
    end: int
    still_s: float
    times: int = 1
    """Stuck judgments in a row with nothing read in between (the seeks did not help)."""


@dataclass(slots=True)
class ProgressWatch:
    after_s: float
    """Seconds a partition may stand still with its log ahead before it counts as stuck (0 = off)."""
    _seen: dict[TP, tuple[int, float]] = field(default_factory=dict)
    """Per partition: the position last seen moving, and when."""
    _stuck: dict[TP, int] = field(default_factory=dict)
    """Per partition: stuck judgments in a row since it last moved."""

    def moved(self, tp: TP, position: int, now: float) -> None:
        """A batch of ``tp`` was processed up to ``position``."""
        last = self._seen.get(tp)
        if last is None or last[0] != position:
            self._seen[tp] = (position, now)
            self._stuck.pop(tp, None)

    def due(self, tps: list[TP], now: float) -> list[TP]:
        """The partitions that stood still for ``after_s``: worth a (blocking) look at the log end."""
        if not self.after_s:
            return []
        out = []
        for tp in tps:
            last = self._seen.setdefault(tp, (-1, now))
            # after a stuck look, the seek it made reads within a poll or two if it helps at all
            if now - last[1] >= (self.after_s / RECHECK_DIVISOR if tp in self._stuck else self.after_s):
                out.append(tp)
        return out

    def judge(self, tp: TP, position: int | None, end: int | None, now: float) -> Stuck | None:
        """Stuck when the log ends beyond a position that has not moved; either way the clock for
        ``tp`` starts again (one look per ``after_s``)."""
        last = self._seen.get(tp, (-1, now))
        if position is None and last[0] >= 0:
            # the client cannot say where it is (a wedged one cannot): it is where it last was
            position = last[0]
        self._seen[tp] = (position if position is not None else last[0], now)
        if position is None or end is None:
            return None
        if end <= position:  # caught up: nothing to read
            self._stuck.pop(tp, None)
            return None
        if last[0] not in (-1, position):  # a seek moved it since the last look: it gets ``after_s``
            return None
        self._stuck[tp] = times = self._stuck.get(tp, 0) + 1
        return Stuck(tp, position, end, now - last[1], times)

    def wait(self, tps: list[TP], now: float) -> None:
        """The controller holds these itself (a batch kept through a store failure, partitions
        paused for the store): their clocks start again, so the first empty poll after the hold is
        not taken for a stall."""
        for tp in tps:
            self._seen[tp] = (self._seen.get(tp, (-1, now))[0], now)

    def forget(self, tps: list[TP]) -> None:
        for tp in tps:
            self._seen.pop(tp, None)
            self._stuck.pop(tp, None)
