"""A held run is a verdict of its own: the trainer's guard gave up on the updates (pure, no I/O).

The in-process guard (agent/guard.py) skips an update whose loss is critical and, after
``hold_after`` skips in a row, holds the trainer at the next step boundary until the controller
answers. The loss rules report an excursion once per level, so a stretch of bad batches that goes
on after the controller resumed the run (its pause landed inside the stretch) is, to them, the
excursion already handled: without this rule nobody answers the hold, and the trainer waits out
its ``hold_timeout_s`` and acts alone. This rule reads what the guard decided (``guard`` of each
step event, from the rank that speaks for the run) and asks for recovery:

- at once when the guard says ``hold``;
- after ``skips_after`` skipped updates in a row without a hold (a guard that holds later than
  that, or never): a run that keeps skipping is answered too.

Each verdict restarts the count, so a stretch that goes on after the answer is reported again
after as many skips (or at the guard's next hold). The verdict's ``onset_step`` is the stretch's
first skipped step, so a rollback goes to before it. A rollback (the step going back) rewinds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cliffguard.controller.rules.base import STEP_EVENTS, RankScope
from cliffguard.controller.verdict import Action, Verdict
from cliffguard.core.declared import bounded, check_declared
from cliffguard.core.enums import GuardDecision, Level
from cliffguard.core.events import Event
from cliffguard.core.triage import CURED_IN_PROCESS

GUARD_HOLD = "guard_hold"
"""``Verdict.rule`` of this rule's verdicts (the recovery machine answers it as a hold)."""

_SKIPPED = frozenset({GuardDecision.SKIP, GuardDecision.HOLD})


@dataclass(kw_only=True, slots=True)
class HeldConfig:
    enabled: bool = True
    """Answer the guard's holds (and long runs of skips) with a recovery of their own."""
    skips_after: int = bounded(6, ge=1)
    """Skipped updates in a row, without a hold, that are a verdict too. Above the guard's
    ``hold_after`` (3), so with the default guard it is the hold that speaks first."""

    def __post_init__(self) -> None:
        check_declared(self)


class GuardHoldRule:
    name = "held"
    consumes = STEP_EVENTS
    scope = RankScope.LOSS_RANK

    def __init__(self, config: HeldConfig | None = None) -> None:
        self.config = config or HeldConfig()
        self._first: int | None = None  # the stretch's first skipped step
        self._skips = 0  # skipped updates in the stretch
        self._unanswered = 0  # ... since the last verdict

    def observe(self, step: int, decision: GuardDecision) -> list[Verdict]:
        if not self.config.enabled:
            return []
        if decision not in _SKIPPED:
            self._first, self._skips, self._unanswered = None, 0, 0
            return []
        if self._first is None:
            self._first = step
        self._skips += 1
        self._unanswered += 1
        held = decision is GuardDecision.HOLD
        if not held and self._unanswered < self.config.skips_after:
            return []
        self._unanswered = 0
        what = "holds for the controller" if held else "keeps skipping"
        return [Verdict(
            rule=GUARD_HOLD, level=Level.CRITICAL, step=step, onset_step=self._first, action=Action.RECOVER,
            message=f"the trainer's guard {what}: {self._skips} updates skipped in a row since step {self._first}",
            evidence={"guard": str(decision), "skips": self._skips, "first_skip_step": self._first, "held": held})]

    def on_event(self, event: Event) -> list[Verdict]:
        if event.data.get("triaged") in CURED_IN_PROCESS:
            return []  # a skip the kit's triage explained and cured: the guard did not give up on it
        decision = event.data.get("guard")
        return self.observe(event.step, GuardDecision(decision) if decision is not None else GuardDecision.OK)

    def rewind(self) -> None:
        self._first, self._skips, self._unanswered = None, 0, 0

    def state_dict(self) -> dict[str, Any]:
        return {"first": self._first, "skips": self._skips, "unanswered": self._unanswered}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        first = state.get("first")
        self._first = None if first is None else int(first)
        self._skips = int(state.get("skips", 0))
        self._unanswered = int(state.get("unanswered", 0))
