"""Each rung of the recovery ladder has a budget per time window and per run (issue 22, item 5).

A rung is one kind of remedy the run got: ``retry`` (a transient fault the kit cured by retrying the
step), ``rerun`` (a step the kit re-ran to triage it: every ``step.triaged``), ``rollback``, ``restart``
(a worker-group restart) and ``evict`` (a restart that leaves a node out). ``BUDGETS`` declares, for
each, what one use is, the ``[recovery]`` fields of its budget, the trigger its exhaustion fires,
the rung it escalates to and why. Exhausting a rung is never silent: the move opens (or continues)
an incident whose evidence names the rung, its budget ("2 per 3600 s", "4 per run") and the uses
that spent it, and a critical alert goes out.

The guards of ``controller/recovery_table.py`` (``within_budget``, ``within_restart_budget``,
``within_evict_budget``, ``within_retry_budget``, ``within_rerun_budget``) read ``within``; the moves
that use a rung call ``note``; ``docs/recovery-policy.md`` draws ``BUDGETS`` with their defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from cliffguard.controller.recovery_state import RecoveryState, RungUse
from cliffguard.controller.recovery_types import RecoveryConfig, Trigger


@dataclass(frozen=True, slots=True)
class Budget:
    """One rung's budget, as declared data."""

    rung: str
    """retry | rerun | rollback | restart | evict (a field of ``RungUses``)."""
    use: str
    """What counts as one use."""
    per_window: str
    """The ``RecoveryConfig`` field: uses allowed within the window."""
    window_s: str
    """...the window's field, in seconds."""
    per_run: str
    """...uses allowed in the whole run (0 = no cap)."""
    spent: Trigger
    """The trigger a use past the budget fires."""
    escalates_to: str
    """What the run gets instead: ``rollback`` (the spike's path: pause, validate, roll back with the
    LR cut) or ``halt`` (a human)."""
    guard: str
    """The ``GUARDS`` term that asks it."""
    why: str


BUDGETS: tuple[Budget, ...] = (
    Budget("retry", "a transient fault the kit cured by retrying its step (`step.triaged` transient)",
           "retry_budget", "retry_window_s", "retry_run_budget", Trigger.RETRY_BUDGET_SPENT, "rollback",
           "within_retry_budget",
           "the retried step is not taken as cured: the run is paused and validated, and rolled back with the "
           "LR cut when its weights are off (faults this frequent may not all have been caught)"),
    Budget("rerun", "a step the kit re-ran to triage it (every `step.triaged`)",
           "rerun_budget", "rerun_window_s", "rerun_run_budget", Trigger.RERUN_BUDGET_SPENT, "rollback",
           "within_rerun_budget",
           "a cure the kit reports is answered as if no triage had happened: paused, validated, rolled back "
           "with the LR cut when the weights are off (a bad rank is still evicted: the evict budget)"),
    Budget("rollback", "a rollback applied (the machine's, or a trainer's own after its timeout)",
           "rollback_budget", "rollback_window_s", "rollback_run_budget", Trigger.BUDGET_EXHAUSTED, "halt",
           "within_budget", "an abnormal validation halts the run for a human, paused (an SDC: the job left "
                            "running on the diverged replica)"),
    Budget("restart", "a worker-group restart (in place or without a node)",
           "restart_budget", "restart_window_s", "restart_run_budget", Trigger.RESTART_BUDGET_SPENT, "halt",
           "within_restart_budget", "the hang (or eviction) halts the job for a human"),
    Budget("evict", "a restart that leaves a node out (bad rank, transients past budget, persistent SDC, "
                    "suspect node, a node that hung again or failed its node check)",
           "evict_budget", "evict_window_s", "evict_run_budget", Trigger.EVICT_BUDGET_SPENT, "halt",
           "within_evict_budget", "the job is halted for a human, the node named (and recorded suspect "
                                  "when judged bad)"),
)
"""Every budgeted rung, in ladder order (a spent retry or rerun climbs to the rollback's path)."""
BUDGET = {b.rung: b for b in BUDGETS}


def limits(cfg: RecoveryConfig, rung: str) -> tuple[int, float, int]:
    """(uses per window, window seconds, uses per run; 0 = no cap) of ``rung``."""
    b = BUDGET[rung]
    return int(getattr(cfg, b.per_window)), float(getattr(cfg, b.window_s)), int(getattr(cfg, b.per_run))


def times_of(s: RecoveryState, rung: str) -> tuple[float, ...]:
    """The times of ``rung``'s newest uses (rollbacks and restarts: where they were kept before)."""
    if rung == "rollback":
        return s.rollback_times
    if rung == "restart":
        return s.hang.restart_times
    return getattr(s.rungs, rung).times


def in_window(cfg: RecoveryConfig, s: RecoveryState, rung: str, now: float) -> int:
    _, window, _ = limits(cfg, rung)
    return sum(1 for t in times_of(s, rung) if now - t < window)


def within(cfg: RecoveryConfig, s: RecoveryState, rung: str, now: float) -> bool:
    """Fewer uses of ``rung`` than its budget within its window, and than its per-run budget (0 = no cap)."""
    per_window, _, per_run = limits(cfg, rung)
    return in_window(cfg, s, rung, now) < per_window and (not per_run or getattr(s.rungs, rung).total < per_run)


def describe(cfg: RecoveryConfig, rung: str) -> str:
    """The budget in words: ``2 per 3600 s and 4 per run``."""
    per_window, window, per_run = limits(cfg, rung)
    return f"{per_window} per {window:.0f} s" + (f" and {per_run} per run" if per_run else "")


def spent(cfg: RecoveryConfig, s: RecoveryState, rung: str, now: float) -> tuple[str, dict[str, Any]]:
    """Why ``rung`` is spent, in words and as evidence: which of its budgets, and the uses that spent it."""
    per_window, window, per_run = limits(cfg, rung)
    n, total = in_window(cfg, s, rung, now), getattr(s.rungs, rung).total
    which = (f"{per_window} per {window:.0f} s" if n >= per_window else f"{per_run} per run")
    b = BUDGET[rung]
    why = (f"the {rung} budget ({which}) is spent: {n} in the last {window:.0f} s, {total} in the run; "
           f"escalated to {b.escalates_to}")
    ev = {"rung": rung, "budget": which, "per_window": per_window, "window_s": window, "per_run": per_run,
          "in_window": n, "in_run": total, "escalates_to": b.escalates_to, "why": b.why}
    return why, ev


def note(cfg: RecoveryConfig, s: RecoveryState, rung: str, now: float) -> None:
    """``rung`` was used now (rollbacks' and restarts' window times are kept by their own moves)."""
    use: RungUse = getattr(s.rungs, rung)
    per_window = limits(cfg, rung)[0]
    use = replace(use, total=use.total + 1) if rung in ("rollback", "restart") else use.used(now, per_window)
    s.rungs = replace(s.rungs, **{rung: use})


def left(cfg: RecoveryConfig, recovery: dict[str, Any] | None, now: float) -> list[dict[str, Any]]:
    """Each rung's budget as it stands for a stored run (``controller_state["recovery"]``, a
    ``RecoveryState.state_dict``): uses in the window and in the run, the limits, and how many uses
    are ``left`` before the next one escalates (the smaller of the window's and the run's). For
    ``cliffguard status RUN`` and the dashboard: an operator sees the ladder's room before it halts."""
    s = RecoveryState.from_state_dict(recovery) if recovery else None
    out = []
    for b in BUDGETS:
        per_window, window, per_run = limits(cfg, b.rung)
        n = in_window(cfg, s, b.rung, now) if s is not None else 0
        total = getattr(s.rungs, b.rung).total if s is not None else 0
        room = per_window - n if not per_run else min(per_window - n, per_run - total)
        out.append({"rung": b.rung, "in_window": n, "per_window": per_window, "window_s": window, "in_run": total,
                    "per_run": per_run, "left": max(room, 0), "escalates_to": b.escalates_to,
                    "budget": describe(cfg, b.rung)})
    return out
