"""The trainer-side timeouts: what a loop does when the controller goes quiet while it waits.

Two waits, two policies, each ``resume``, ``stop`` or ``rollback``:

- **guard hold** (``held``: the guard skipped ``hold_after`` updates in a row and asked for the
  controller): after ``[agent.guard] hold_timeout_s`` with no command, ``[agent.guard] on_timeout``
  (default rollback: the controller would have rolled back a real spike, so the trainer does it
  alone, with the same rule and LR cut, core/policy.py);
- **controller silence** (``paused`` by the controller, or waiting on its verdict after a
  validation): after ``[agent.recovery] pause_timeout_s`` with no command, ``on_pause_timeout``
  (default resume: the guard still skips bad updates, so training on is safe).

Every command answered restarts the clock. Rank 0 decides (clocks differ between ranks) and the
decision travels with the commands of the same tick (``Agent.exchange``), so every rank applies
the same policy at the same boundary. Both are logged at ERROR: a run that acts alone should be
seen; and both are reported (``TimeoutHost.report_timeout``: a ``trainer.timeout`` event with the
wait, the policy, whether it applied, the LR scale before and after, the steps), from which the
controller records an incident saying the trainer decided it and why, so no LR change goes unexplained.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from cliffguard.agent.command_target import Outcome
from cliffguard.agent.guard import GuardConfig
from cliffguard.agent.modes import HELD, PAUSED, RUNNING, ModeMachine
from cliffguard.agent.recovery.config import KitConfig
from cliffguard.core.policy import rollback_step, rolled_back_lr_scale

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Timeout:
    """Which wait timed out (``hold`` or ``pause``), the policy to apply and after how long."""

    wait: str
    policy: str
    after_s: float


def timed_out(mode: ModeMachine, guard: GuardConfig, kit: KitConfig, waited_s: float) -> Timeout | None:
    """The timeout due after ``waited_s`` seconds with no command in the current mode, if any."""
    if mode.mode is HELD and waited_s >= guard.hold_timeout_s:
        return Timeout("hold", guard.on_timeout, guard.hold_timeout_s)
    if mode.mode is PAUSED and kit.pause_timeout_s and waited_s >= kit.pause_timeout_s:
        return Timeout("pause", kit.on_pause_timeout, kit.pause_timeout_s)
    return None


class TimeoutHost(Protocol):
    """What applying a policy needs from the loop: the facts, and the two commands it may apply
    itself (the recovery kit is one)."""

    @property
    def step(self) -> int: ...

    def available_steps(self) -> list[int]: ...

    def first_bad_step(self) -> int | None: ...

    def current_lr_scale(self) -> float: ...

    def lr_factor(self) -> float: ...

    def fail(self, reason: str) -> None:
        """End the run as failed (mode ``stopping``, ``run.failed`` at close)."""
        ...

    def resume(self) -> Outcome: ...

    def rollback(self, to_step: int, lr_scale: float, skip_data: tuple[int, int] | None) -> Outcome: ...

    def report_timeout(self, data: dict[str, Any]) -> None:
        """Tell the controller what the timeout did (rank 0 sends the ``trainer.timeout`` event)."""
        ...


def apply_timeout(host: TimeoutHost, modes: ModeMachine, timeout: Timeout) -> None:
    """Apply ``timeout.policy`` on this rank (every rank calls it at the same tick), then report it."""
    what = "held by the guard" if timeout.wait == "hold" else "paused by a controller that fell silent"
    at, before, first = host.step, host.current_lr_scale(), host.first_bad_step()
    log.error("%s for %gs without a controller command: applying policy %r at step %d",
              what, timeout.after_s, timeout.policy, at)
    applied, detail, to_step = _apply(host, modes, timeout, first)
    data: dict[str, Any] = {"wait": timeout.wait, "policy": timeout.policy, "waited_s": float(timeout.after_s),
                            "at_step": at, "applied": applied, "lr_scale_before": before,
                            "lr_scale": host.current_lr_scale(), "detail": detail[:500]}
    if first is not None:
        data["first_bad_step"] = first
    if to_step is not None:
        data["to_step"] = to_step
    host.report_timeout(data)


def _apply(host: TimeoutHost, modes: ModeMachine, timeout: Timeout, first: int | None) -> tuple[bool, str, int | None]:
    """(applied, what happened, the step restored)."""
    if timeout.policy == "resume":
        host.resume()
        modes.move(RUNNING)
        return True, f"resumed at step {host.step} with no controller command", None
    if timeout.policy == "stop":
        reason = f"{timeout.wait} timed out after {timeout.after_s:g}s with no controller command"
        host.fail(reason)
        return True, f"stopping: {reason}", None
    to_step = rollback_step(host.available_steps(), host.step if first is None else first)
    if to_step is None:
        reason = f"{timeout.wait} timed out and there is no checkpoint to roll back to"
        host.fail(reason)
        return False, reason, None
    scale = rolled_back_lr_scale(host.current_lr_scale(), host.lr_factor())
    try:
        outcome = host.rollback(to_step, scale, None)
    except Exception as exc:  # noqa: BLE001 - no controller to tell: end the run as failed
        reason = f"local rollback to {to_step} failed: {exc}"
        host.fail(reason)
        return False, reason, None
    log.error("local rollback: %s", outcome.detail)
    modes.move(RUNNING)
    return True, f"rolled back: {outcome.detail}", to_step
