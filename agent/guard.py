"""The in-process guard: the spike rule on the all-reduced loss, before the update.

``Guard.decide(global_loss, step, grad_norm)`` runs ``core.spike.SpikeDetector`` — the very code
the controller runs — on the loss (and the global grad norm) every rank got from the same
all-reduce, so every rank reaches the same decision without talking:

- ``ok`` / ``warn``: the update is applied (warn is reported in the step event);
- ``skip``: the spike rule is critical (evidence past the ``[spike] guard_budget`` level, or a
  non-finite loss): ``optimizer.step()`` is not called on any rank, so no bad update is applied;
  training goes on with the next batch;
- ``hold``: ``hold_after`` consecutive skips: the update is skipped and the trainer holds
  (heartbeats say ``held``) waiting for the controller's commands.

Timeout policy while held. If no command arrives within ``hold_timeout_s`` the loop applies
``on_timeout``, decided by rank 0 and broadcast so all ranks act at the same boundary:

- ``rollback`` (default): restore the newest checkpoint at or before the first skipped step
  (memory ring first, then disk) and multiply ``lr_scale`` by the deployment's ``[policy]
  lr_factor`` — what the controller would have done for a real spike, taken locally when it is
  unreachable (the same rule, ``core/policy.py``);
- ``resume``: clear the hold and train on (for runs where a stall costs more than a bad step);
- ``stop``: save a checkpoint and end the run with ``run.failed``.

Any command answered while held (applied or failed; a rejected one changes nothing) means the
controller has taken over: the hold timeout is cancelled and the run follows the commands
(pause → paused, resume/rollback → training); the moves are agent/dispatch.py's and
agent/modes.py's.

A resume answers the skips so far (``answer_hold``) but does not forget the stretch: a corrupted
stretch longer than the controller's pause latency goes on after the resume, and every update in
it must still be skipped. So the count and the stretch's first skipped step stay (a rollback, the
controller's or the timeout's, goes to before its start), and the next hold comes ``hold_after``
skips after the answered ones: the controller hears of a stretch that goes on within a few steps,
and a step that passes ends the stretch. A rollback restores the guard as it was (``clear_hold``).
The detector's state (its windows, its tail model, its evidence) and the skip counts are in
``state_dict`` so a rollback restores the guard exactly as it was at that step.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from cliffguard.core.declared import bounded, check_declared, one_of
from cliffguard.core.deployment import PolicyConfig
from cliffguard.core.enums import GuardDecision, Level
from cliffguard.core.settings import shared_field
from cliffguard.core.spike import SpikeConfig, SpikeDetector, SpikeVerdict

TIMEOUT_POLICIES = ("rollback", "resume", "stop")
COLD_START = "cold start"
"""How core/spike.py's reason begins for a verdict of its cold start."""


@dataclass(kw_only=True, slots=True)
class GuardConfig:
    enabled: bool = True
    """Skip updates on critical losses. When false the guard only reports (never skips)."""
    spike: SpikeConfig = shared_field("spike", SpikeConfig)
    """The deployment's spike rule (``[spike]``, the controller's too); the guard's threshold is
    set for ``guard_budget`` false skips per 10,000 steps where the controller's is set for
    ``budget`` false pauses."""
    hold_after: int = bounded(3, ge=1)
    """Consecutive skipped steps after which the trainer holds for the controller."""
    hold_timeout_s: float = bounded(120.0, gt=0)
    """Seconds to wait, held, for a controller command before applying ``on_timeout``."""
    on_timeout: str = one_of("rollback", TIMEOUT_POLICIES)
    """Local policy when held past the timeout: rollback, resume or stop."""
    policy: PolicyConfig = shared_field("policy", PolicyConfig)
    """The deployment's rollback policy (``[policy]``): the local rollback cuts the LR by its factor."""

    MOVED: ClassVar[dict[str, str]] = {"timeout_lr_factor": "[policy] lr_factor"}

    def __post_init__(self) -> None:
        check_declared(self)


class Guard:
    """Stateful: the spike window, the run of consecutive skips (the stretch), the skips of it a
    resume answered, and the stretch's first skipped step."""

    def __init__(self, config: GuardConfig | None = None) -> None:
        self.config = config or GuardConfig()
        spike = self.config.spike
        self.detector = SpikeDetector(dataclasses.replace(spike, budget=spike.guard_budget))
        self.consecutive_skips = 0
        self.answered_skips = 0
        """Skips of the current stretch the controller answered (a resume): it holds again
        ``hold_after`` skips after these."""
        self.first_skip_step: int | None = None
        self.last_verdict: SpikeVerdict | None = None
        self.trips = 0

    def decide(self, loss: float, step: int, grad_norm: float | None = None) -> GuardDecision:
        """``grad_norm``: the step's global gradient norm where the loop computed one (NaN or None
        where it did not: the loss is judged alone)."""
        verdict = self.detector.observe(loss, grad_norm=grad_norm)
        self.last_verdict = verdict
        # Before min_history the rule has no noise estimate, only a rise over the median so far
        # (core/spike.py's cold start): the controller may pause and validate on it, but the guard
        # does not skip or hold on a guess. A batch-8 loss with random targets swings 8x from step
        # to step; the README's plain loop held there, with no controller, until it timed out.
        cold = verdict.reason.startswith(COLD_START)
        if verdict.level is Level.CRITICAL and self.config.enabled and not cold:
            self.trips += 1
            if self.consecutive_skips == 0:
                self.first_skip_step = step
            self.consecutive_skips += 1
            if self.consecutive_skips - self.answered_skips >= self.config.hold_after:
                return GuardDecision.HOLD
            return GuardDecision.SKIP
        self.clear_hold()  # a step that passes ends the stretch
        if verdict.level is Level.OK and math.isfinite(loss):
            return GuardDecision.OK
        return GuardDecision.WARN

    @staticmethod
    def applies_update(decision: GuardDecision) -> bool:
        return decision in (GuardDecision.OK, GuardDecision.WARN)

    def answer_hold(self) -> None:
        """The controller answered the skips so far (a resume): the next hold comes ``hold_after``
        skips from now, while the stretch (its length, its first step) is kept."""
        self.answered_skips = self.consecutive_skips

    def clear_hold(self) -> None:
        """No stretch: after a step that passed, or a rollback to before the stretch."""
        self.consecutive_skips = 0
        self.answered_skips = 0
        self.first_skip_step = None

    def state_dict(self) -> dict[str, Any]:
        return {
            "detector": self.detector.state_dict(),
            "consecutive_skips": self.consecutive_skips,
            "answered_skips": self.answered_skips,
            "first_skip_step": self.first_skip_step,
            "trips": self.trips,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.detector.load_state_dict(state["detector"])
        self.consecutive_skips = int(state.get("consecutive_skips", 0))
        self.answered_skips = int(state.get("answered_skips", 0))
        self.first_skip_step = state.get("first_skip_step")
        self.trips = int(state.get("trips", 0))
