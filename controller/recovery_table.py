"""The recovery machine's declared graph and its guards (``controller/recovery.py`` walks them).

``TRANSITIONS`` is the complete list of legal moves, (phase, trigger) -> phase; ``fire`` raises
``TransitionNotAllowed`` for anything else, so a bug cannot walk a run somewhere undeclared. The
guards in ``GUARDS`` are named predicates, each a pure function of (config, state, ...). The
diagram and the policy they implement are in ``controller/recovery.py``'s docstring.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from cliffguard.controller.recovery_types import Checkpoint, Phase, RecoveryConfig, RecoveryState, VerdictIn
from cliffguard.controller.verdict import Action
from cliffguard.core.enums import CommandType
from cliffguard.core.policy import rollback_step


class TransitionNotAllowed(RuntimeError):
    def __init__(self, phase: Phase, trigger: str) -> None:
        super().__init__(f"no transition from {phase} on {trigger}")
        self.phase = phase
        self.trigger = trigger


# (from phase, trigger) -> to phase. The complete list of legal moves.
TRANSITIONS: dict[tuple[Phase, str], Phase] = {
    (Phase.RUNNING, "spike"): Phase.PAUSING,
    (Phase.RECOVERING, "spike"): Phase.PAUSING,
    (Phase.PAUSING, "pause_applied"): Phase.VALIDATING,
    (Phase.VALIDATING, "validation_normal"): Phase.RESUMING,
    (Phase.VALIDATING, "validation_abnormal"): Phase.ROLLING_BACK,
    (Phase.VALIDATING, "budget_exhausted"): Phase.HALTED,
    (Phase.VALIDATING, "no_target"): Phase.HALTED,
    (Phase.VALIDATING, "rollback_unsupported"): Phase.HALTED,
    (Phase.ROLLING_BACK, "rollback_applied"): Phase.RECOVERING,
    (Phase.ROLLING_BACK, "rollback_failed"): Phase.ROLLING_BACK,
    (Phase.ROLLING_BACK, "no_target"): Phase.HALTED,
    (Phase.RECOVERING, "recovered"): Phase.RUNNING,
    (Phase.RESUMING, "resume_applied"): Phase.RUNNING,
    (Phase.HALTED, "operator_resumed"): Phase.RUNNING,
}
WAITING = (Phase.PAUSING, Phase.VALIDATING, Phase.ROLLING_BACK, Phase.RESUMING)
for _p in WAITING:
    TRANSITIONS[(_p, "command_retry")] = _p
    TRANSITIONS[(_p, "command_gave_up")] = Phase.HALTED
    TRANSITIONS[(_p, "command_refused")] = Phase.HALTED
# Every phase that holds an incident; ``running`` never does (each way into it closes the incident).
for _p in (*WAITING, Phase.RECOVERING, Phase.HALTED):
    TRANSITIONS[(_p, "run_ended")] = Phase.RUNNING

def fire(phase: Phase, trigger: str) -> Phase:
    """The phase after ``trigger`` in ``phase``; raises TransitionNotAllowed if undeclared."""
    try:
        return TRANSITIONS[(phase, trigger)]
    except KeyError:
        raise TransitionNotAllowed(phase, trigger) from None


# ---------------------------------------------------------------------------------------------
# Guards: named predicates, each a pure function of (config, state, ...)
# ---------------------------------------------------------------------------------------------


def starts_incident(cfg: RecoveryConfig, s: RecoveryState, inp: VerdictIn) -> bool:
    return inp.verdict.action is Action.RECOVER and s.phase in (Phase.RUNNING, Phase.RECOVERING)


def is_abnormal(cfg: RecoveryConfig, s: RecoveryState, val_loss: float) -> bool:
    base = s.baseline()
    if base is None or not math.isfinite(val_loss):
        return True
    return val_loss > base * (1 + cfg.val_margin_rel) + cfg.val_margin_abs


def within_budget(cfg: RecoveryConfig, s: RecoveryState, now: float) -> bool:
    recent = [t for t in s.rollback_times if now - t < cfg.rollback_window_s]
    return len(recent) < cfg.rollback_budget


def rollback_target(cfg: RecoveryConfig, s: RecoveryState, before: int) -> Checkpoint | None:
    """Newest stable checkpoint at or before ``before``."""
    step = rollback_step((c.step for c in s.checkpoints if c.stable), before)
    return None if step is None else next(c for c in s.checkpoints if c.step == step and c.stable)


def can_retry(cfg: RecoveryConfig, s: RecoveryState) -> bool:
    return s.pending is not None and s.pending.attempt < cfg.max_attempts


def timed_out(cfg: RecoveryConfig, s: RecoveryState, now: float) -> bool:
    if s.pending is None:
        return False
    limit = cfg.validate_timeout_s if s.pending.type is CommandType.VALIDATE else cfg.command_timeout_s
    return now - s.pending.sent_at >= limit


def is_recovered(cfg: RecoveryConfig, s: RecoveryState) -> bool:
    assert s.incident is not None and s.incident.rollback_to is not None
    healthy_since = max([s.incident.rollback_to, *s.unhealthy_steps])
    return s.last_step - healthy_since >= cfg.recover_window


def is_stable(cfg: RecoveryConfig, s: RecoveryState, c: Checkpoint) -> bool:
    if s.last_step < c.step + cfg.stable_window:
        return False
    # a checkpoint labelled s holds the state before step s ran (trainer/commands.py), so step s
    # itself is part of the window that must stay healthy
    return not any(c.step <= u <= c.step + cfg.stable_window for u in s.unhealthy_steps)


def is_ours(cfg: RecoveryConfig, s: RecoveryState, cmd_id: str) -> bool:
    return s.pending is not None and s.pending.id == cmd_id


GUARDS: dict[str, Callable[..., Any]] = {
    "starts_incident": starts_incident,
    "is_abnormal": is_abnormal,
    "within_budget": within_budget,
    "rollback_target": rollback_target,
    "can_retry": can_retry,
    "timed_out": timed_out,
    "is_recovered": is_recovered,
    "is_stable": is_stable,
    "is_ours": is_ours,
}
