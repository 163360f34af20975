"""What a detection rule is to ``controller.detect.RunDetector``: the ``Rule`` protocol.

A rule is a pure, stateful judge of one run's events. It declares which event types it reads
(``consumes``) and whose events (``scope``): per-rank metrics (step time, MFU, memory) come from
every rank, while all-reduced metrics (loss, gradient norm, loss scale) are identical on every
rank, so the detector hands such rules one event per step from the rank that speaks for the run
(see controller/detect.py). The detector calls the rules in registry order (controller/detect.py,
``RULES``), each isolated: one raising does not stop the others.

Two hooks are optional, so a rule without them need not carry no-op methods:

* ``tick(now) -> list[Verdict]``: the wall clock, for rules that judge silence (heartbeat).
* ``rewind()``: the trainer rolled back and replays steps (the loss-rank step went backwards);
  the rule resets whatever belonged to the abandoned timeline (only ``LOSS_RANK`` rules get it).

``state_dict``/``load_state_dict`` persist the rule with the run's controller state, stored under
the rule's ``name`` (so a rule's name is also its state key: renaming one drops its state).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

import numpy as np

from cliffguard.controller.verdict import Verdict
from cliffguard.core.enums import EventType
from cliffguard.core.events import Event
from cliffguard.core.rank_arrays import is_detail, is_run_level


class RankScope(StrEnum):
    EVERY_RANK = "every_rank"
    """Every rank's events (per-rank metrics, signs of life)."""
    LOSS_RANK = "loss_rank"
    """One event per step, from the rank that speaks for the run (all-reduced metrics)."""


STEP_EVENTS: frozenset[EventType] = frozenset({EventType.STEP})
RANK_METRIC_EVENTS: frozenset[EventType] = frozenset({EventType.STEP, EventType.RANKS})
"""What the per-rank metric rules read: ``ranks`` arrays, and per-rank ``step`` events of agents
that send one per rank (``rank_columns``)."""
ALL_EVENTS: frozenset[EventType] = frozenset(EventType)


@runtime_checkable
class Rule(Protocol):
    name: str
    """Registry key, state key and the name in logs (not necessarily ``Verdict.rule``: one rule
    may report under several verdict names, e.g. loss -> loss_spike, divergence, nonfinite)."""
    consumes: frozenset[EventType]
    scope: RankScope

    def on_event(self, event: Event) -> list[Verdict]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class TickingRule(Protocol):
    def tick(self, now: float) -> list[Verdict]: ...


@runtime_checkable
class RewindingRule(Protocol):
    def rewind(self) -> None: ...


def rank_columns(event: Event, fields: Sequence[tuple[str, Any]], dtype: type = np.float64
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The per-rank samples in an event, for the per-rank metric rules (straggler, MFU, memory):
    the ranks, and (len(fields), samples) values, a row per ``(field, default)``, sample by sample.

    * a ``ranks`` event: one sample per rank, highest rank first, so a rule that judges on the
      speaking rank's sample (core.ranks) judges once the whole chunk is in;
    * a ``step`` event from an agent that sends one per rank (no ``rank_losses``): its sender's
      (``default`` for a field it lacks);
    * a run-level ``step`` event, or a per-rank one sent for a detail command: none — the arrays
      already carry every rank, and a rank counted twice would outweigh the others.
    """
    data = event.data
    if event.type is EventType.RANKS:
        n = len(data["step_time_s"])
        ranks = np.arange(data["first_rank"] + n - 1, data["first_rank"] - 1, -1, dtype=np.int64)
        return ranks, np.array([data[name] for name, _ in fields], dtype)[:, ::-1]
    if carries_rank_samples(event):
        return np.array([event.rank], np.int64), np.array([[data.get(name, d)] for name, d in fields], dtype)
    return np.zeros(0, np.int64), np.zeros((len(fields), 0), dtype)


def carries_rank_samples(event: Event) -> bool:
    """Whether ``rank_columns`` finds any sample in the event (the detector skips the per-rank
    metric rules for the others, so their large state is not saved again for nothing)."""
    if event.type is EventType.RANKS:
        return True
    return event.type is EventType.STEP and not is_run_level(event.data) and not is_detail(event.data)
