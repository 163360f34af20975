"""Each rung of the recovery ladder has a budget per time window and per run (issue 22, item 5).

A rung is one kind of remedy the run got: ``retry`` (a transient fault the kit cured by retrying the
step), ``rerun`` (a step the kit re-ran to triage it: every ``step.triaged``), ``rollback``, ``restart``
(a worker-group restart) and ``evict`` (a restart that leaves a node out). ``BUDGETS`` declares, for
each, what one use is, the ``[recovery]`` fields of its budget, the trigger its exhaustion fires,
the rung it escalates to and why. Exhausting a rung is never silent: the move opens (or continues)
an incident whose evidence names the rung, its budget ("2 per 3600 s", "4 per run") and the uses
that spent it, and a critical alert goes out. ``cliffguard status RUN`` and the dashboard's header show
each rung's room (``left``: uses in its window and in the run, how many are left, what comes after),
by the limits the controller stores with each run's state (``limits_doc``).

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


def limits_doc(cfg: RecoveryConfig) -> dict[str, list[float]]:
    """rung -> [per window, window seconds, per run]: what the controller stores with each run's
    state, so a reader shows the room by the limits that are enforced, not by its own config."""
    return {b.rung: [float(x) for x in limits(cfg, b.rung)] for b in BUDGETS}


def _stored_limits(doc: Any, cfg: RecoveryConfig) -> RecoveryConfig | None:
    """``cfg`` with the stored limits over it; None when ``doc`` is not a whole, sane limits doc."""
    if not isinstance(doc, dict):
        return None
    over: dict[str, Any] = {}
    for b in BUDGETS:
        x = doc.get(b.rung)
        if not (isinstance(x, list) and len(x) == 3 and all(isinstance(v, (int, float)) for v in x)):
            return None
        over.update({b.per_window: int(x[0]), b.window_s: float(x[1]), b.per_run: int(x[2])})
    try:
        return replace(cfg, **over)
    except (TypeError, ValueError):  # out of the config's bounds: not the controller's
        return None


def left(cfg: RecoveryConfig, controller_state: dict[str, Any] | None, now: float) -> dict[str, Any]:
    """Each rung's budget as it stands for a stored run (``controller_state``: its ``recovery``, a
    ``RecoveryState.state_dict``, and the ``budget_limits`` the controller stored with it): uses in
    the window and in the run, the limits, and how many uses are ``left`` before the next one
    escalates (the smaller of the window's and the run's). ``source`` says whose limits: the
    controller's stored ones, else ``cfg`` (a state saved before they were stored). For
    ``cliffguard status RUN`` and the dashboard: an operator sees the ladder's room before it halts."""
    state = controller_state or {}
    stored = _stored_limits(state.get("budget_limits"), cfg)
    use = stored or cfg
    s = RecoveryState.from_state_dict(state["recovery"]) if state.get("recovery") else None
    rungs = []
    for b in BUDGETS:
        per_window, window, per_run = limits(use, b.rung)
        n = in_window(use, s, b.rung, now) if s is not None else 0
        total = getattr(s.rungs, b.rung).total if s is not None else 0
        room = per_window - n if not per_run else min(per_window - n, per_run - total)
        rungs.append({"rung": b.rung, "in_window": n, "per_window": per_window, "window_s": window,
                      "in_run": total, "per_run": per_run, "left": max(room, 0), "escalates_to": b.escalates_to,
                      "budget": describe(use, b.rung)})
    return {"rungs": rungs, "source": "controller" if stored is not None else "config"}
