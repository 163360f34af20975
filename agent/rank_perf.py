"""Per-rank performance for the ``ranks`` event: each rank's means since the last one, carried to
every rank by the step's packed all-reduce (agent/hooks.py), and cut into events by the ranks
that publish them.

Layout in the packed tensor, every ``ranks_every`` steps: ``len(PERF_FIELDS)`` blocks of
``world`` slots, field-major (``block[f * world + rank]``); each rank writes only its own slots
and the SUM leaves every rank holding all of them. The first rank of each ``ranks_per_event``
chunk publishes that chunk ([0, world) in one event from rank 0 while the world fits in one), so
a large world's events come from several ranks (local rank 0 of a node when the chunk is a
multiple of the node size) and none grows beyond ``core.rank_arrays.MAX_RANKS_PER_EVENT``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

PERF_FIELDS: tuple[str, ...] = ("step_time_s", "data_wait_s", "comm_exposed_s", "mfu", "tokens_per_s",
                                "mem_allocated", "mem_reserved")
"""The per-rank fields of a ``ranks`` event that come from a rank's own step events."""
_MEANS = PERF_FIELDS[:5]  # means over the interval; memory is the newest value
_INTS = ("mem_allocated", "mem_reserved")


class PerfAccumulator:
    """This rank's step events since the last ``ranks`` event."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.n = 0
        self._sums = dict.fromkeys(_MEANS, 0.0)
        self._last: dict[str, float] = dict.fromkeys(_INTS, 0.0)

    def add(self, data: Mapping[str, Any]) -> None:
        self.n += 1
        for name in _MEANS:
            self._sums[name] += float(data[name])
        for name in _INTS:
            self._last[name] = float(data[name])

    def slot(self) -> list[float]:
        """This rank's value of each of ``PERF_FIELDS``."""
        n = max(self.n, 1)
        return [self._sums[name] / n for name in _MEANS] + [self._last[name] for name in _INTS]


def publishes_chunk(rank: int, per_event: int) -> bool:
    return rank % per_event == 0


def ranks_payload(block: Sequence[float], losses: Sequence[float], *, world: int, rank: int, per_event: int,
                  steps: int) -> dict[str, Any]:
    """The ``ranks`` event data for the chunk starting at ``rank`` (which must publish one)."""
    stop = min(world, rank + per_event)
    data: dict[str, Any] = {"first_rank": rank, "steps": steps}
    for f, name in enumerate(PERF_FIELDS):
        values = block[f * world + rank : f * world + stop]
        data[name] = [_int(v) for v in values] if name in _INTS else [float(v) for v in values]
    data["loss_local"] = [float(v) for v in losses[rank:stop]]
    return data


def _int(value: float) -> int:
    return int(value) if math.isfinite(value) else 0
