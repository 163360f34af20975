"""Bounds on what an event may say, checked at the edge before anything is stored or judged.

``StepBounds``: a run's steps move within ``max_step_jump`` of the highest step the controller
has accepted for it. A step further ahead goes to the DLQ as ``step_jump`` (a forged or corrupt
step 2^31-1 would otherwise become the run's newest step). Going back is normal within the
bound (ranks report out of order; one rank may replay its spill); further back only after the
run told the controller it rewound: an applied ``rollback`` ack, a ``trainer.timeout`` that rolled
back, a ``run.started`` (a restart or an elastic reload from a checkpoint), or ``rewound(run)``
called by code that knows of one.
Each of those forgets the run's high mark, so its next event sets it again. The first event of
a run the controller has not seen (or forgot after a restart) sets a *provisional* mark, which
a second event within the bound confirms; one that disagrees replaces it (still provisional).
So a lone forged first event (possible only without event signatures, ``core/keys.py``) cannot
lock the run's real events out; retention ignores its step (``store/retention.py``).

``out_of_range``: every integer an event carries must fit where it is stored. Fields that land in
a 32-bit ``Integer`` column (``controller/store/fit.py`` knows the columns) must fit 32 bits; any
other integer, top level or in a list, must fit 64 bits (PostgreSQL ``BIGINT``, SQLite's
integers). A value outside goes to the DLQ as ``out_of_range`` instead of being clipped.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from functools import cache
from typing import Any

from cliffguard.controller.store.fit import INT64, int_limits
from cliffguard.core.enums import AckStatus, CommandType, EventType
from cliffguard.core.events import Event

STEP_JUMP = "step_jump"
OUT_OF_RANGE = "out_of_range"


@cache
def _stored_model(etype: str) -> Any:
    """The table each event type's data lands in (its integer columns bound its fields)."""
    from cliffguard.controller.store import models

    return {
        EventType.RUN_STARTED: models.RunRow, EventType.STEP: models.StepMetricRow,
        EventType.HEARTBEAT: models.HeartbeatRow, EventType.CHECKPOINT: models.CheckpointRow,
        EventType.VALIDATION: models.ValidationRow, EventType.DATA_FLAG: models.DataFlagRow,
        EventType.DATA_STATS: models.DataStatsRow,
    }.get(etype)


def int_bounds(etype: str) -> Mapping[str, tuple[int, int]]:
    """{data field: (lowest, highest)} of the 32-bit columns ``etype``'s data lands in; every
    other integer must fit ``INT64``."""
    model = _stored_model(etype)
    return int_limits(model) if model is not None else {}


def out_of_range(event: Event) -> str | None:
    """``field: reason`` for the first integer of ``event.data`` that does not fit its storage."""
    columns = int_bounds(event.type)
    for name, value in event.data.items():
        kind = type(value)
        if kind is float or kind is str or kind is bool or value is None:
            continue  # most fields, checked for every event: no integer to bound
        if kind is list:
            values = value
        elif isinstance(value, int):
            values = (value,)
        else:
            continue
        lo, hi = columns.get(name, INT64)
        for v in values:
            if isinstance(v, int) and not isinstance(v, bool) and not lo <= v <= hi:
                return f"data.{name}: {v} outside [{lo}, {hi}]"
    return None


class StepBounds:
    """Each run's highest accepted step (see the module docstring); at most ``max_runs`` runs
    are remembered, the least recently heard from forgotten first."""

    def __init__(self, max_step_jump: int = 100_000, *, max_runs: int = 100_000) -> None:
        if max_step_jump < 1:
            raise ValueError("max_step_jump: must be >= 1")
        self.max_step_jump = max_step_jump
        self._high: OrderedDict[str, int] = OrderedDict()
        self._confirmed: set[str] = set()
        self._max_runs = max_runs

    def check(self, event: Event) -> str | None:
        """Why ``event``'s step is out of bounds (None: accepted, and the run's mark moved)."""
        run, step = event.run, event.step
        if event.type == EventType.RUN_STARTED or (
                event.type == EventType.COMMAND_ACK and event.data.get("cmd_type") == CommandType.ROLLBACK
                and event.data.get("status") == AckStatus.APPLIED) or (
                event.type == EventType.TRAINER_TIMEOUT and event.data.get("to_step") is not None):
            self.rewound(run)  # before the check: the ack itself carries the rolled-back step
        high = self._high.get(run)
        if high is not None and run not in self._confirmed:
            if abs(step - high) <= self.max_step_jump:
                self._confirmed.add(run)
            else:
                high = None  # two unconfirmed marks disagree: the newer one stands, unconfirmed
        elif high is not None:
            if step > high + self.max_step_jump:
                return (f"step: {step} is more than {self.max_step_jump} steps ahead of run {run!r}'s "
                        f"newest accepted step {high}")
            if step < high - self.max_step_jump:
                return (f"step: {step} is more than {self.max_step_jump} steps behind run {run!r}'s "
                        f"newest accepted step {high} with no rollback or reload reported")
            self._high.move_to_end(run)
        if high is None or step > high:
            self._high[run] = step
            self._high.move_to_end(run)
            while len(self._high) > self._max_runs:
                self._confirmed.discard(self._high.popitem(last=False)[0])
        return None

    def rewound(self, run: str) -> None:
        """The run went back (a rollback or reload): its next event sets the mark again."""
        self._high.pop(run, None)
        self._confirmed.discard(run)

    def high(self, run: str) -> int | None:
        return self._high.get(run)
