"""The recovery machine's whole policy as data: its transitions, their guards and their actions
(``controller/recovery.py`` walks them; ``docs/recovery-policy.md`` is drawn from ``TABLE``).

Each ``Transition`` names its guard: a conjunction of terms, each a named predicate of ``GUARDS``
(a pure function of (config, state, ...)) or a capability of ``CAPABILITIES`` (commands the run
declared), either one possibly negated (``not within_budget``). The handlers ask every term through
``holds`` and a move checks that the terms of its entry held, so the table cannot say one thing
while the code does another. ``fire`` raises ``TransitionNotAllowed`` for a (phase, trigger) the
table does not declare, so a bug cannot walk a run somewhere undeclared.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from cliffguard.controller import recovery_budgets as budgets
from cliffguard.controller.recovery_hang_types import NodeCheckIn, SuspectJoinedIn
from cliffguard.controller.recovery_state import Checkpoint, Incident, RecoveryState
from cliffguard.controller.recovery_types import Phase, RecoveryConfig, TriagedIn, Trigger, VerdictIn
from cliffguard.controller.rules.sdc import SDC
from cliffguard.controller.verdict import Action, Verdict
from cliffguard.core.enums import CommandType
from cliffguard.core.policy import rollback_step

P, T = Phase, Trigger


class TransitionNotAllowed(RuntimeError):
    def __init__(self, phase: Phase, trigger: str) -> None:
        super().__init__(f"no transition from {phase} on {trigger}")
        self.phase = phase
        self.trigger = trigger


@dataclass(frozen=True, slots=True)
class Transition:
    source: Phase
    trigger: Trigger
    target: Phase
    guard: tuple[str, ...] = ()
    """Terms that must all hold for this move (``GUARDS`` or ``CAPABILITIES`` names, ``not`` to negate)."""
    actions: tuple[str, ...] = ()
    """What the move asks the edges to do, in order (the ``ActionT`` it emits besides its record)."""


WAITING = (Phase.PAUSING, Phase.VALIDATING, Phase.ROLLING_BACK, Phase.RESUMING)
"""The phases that wait on a command the machine sent."""
_HOLDS_INCIDENT = (*WAITING, Phase.RECOVERING, Phase.HALTED, Phase.PREEMPTED)  # running never does: each way into it closes it
_TRAINING = tuple(p for p in Phase if p is not Phase.PREEMPTED)  # phases a trainer is there to act in
_HALT = ("close incident halted", "alert critical")
_ROLLBACK = "send rollback (lr_scale, skip_data)"
_RESTARTS = ("starts_restart", "can_restart", "within_restart_budget")
_HANG_SOURCES = (P.RUNNING, P.RECOVERING, P.REJOINING)
_HALT_LEFT_RUNNING = ("close incident halted", "alert critical (no restart to give it: the job is left running)")
_HALT_JOB = ("close incident halted", "send restart halt (when the run can apply it)", "alert critical")
_RECORD = "record the nodes suspect (controller/suspects.py: kept out of later groups until cleared)"
_RECORD_JUDGED = "record the node suspect when a bad rank, a repeated SDC or a failed node check named it"
_EXCLUDES = (*_RESTARTS, "wants_exclusion", "can_exclude", "within_evict_budget")
"""A restart that leaves a node out: every term of a restart's, and the eviction budget."""
_NODE_EVICT = (*_RESTARTS, "wants_exclusion", "not device_only", "can_exclude", "within_evict_budget")
_DEVICE_EVICT = (*_RESTARTS, "wants_exclusion", "device_only", "can_exclude", "within_evict_budget")
"""An eviction (a bad rank, a persistent SDC) leaves out the node, or only the culprit's device when
its node runs several ranks (``device_only``; the hangs' culprits stay at node granularity)."""
_RECORD_DEVICE = ("record the device suspect (node + slot: the node is still admitted, the device left out "
                  "for the rest of the launch)")


_HANG_CAUSES = "hang; bad_rank for an eviction, suspect_node for a suspect's beat"
_HALT_CAUSES = f"{_HANG_CAUSES}, sdc for a persistent SDC"
"""The incidents the hangs' halts open: a persistent SDC that cannot be evicted halts through them too."""


def _open_hang(p: Phase, cause: str = _HANG_CAUSES) -> tuple[str, ...]:
    """How a hang's move begins in phase ``p``: the incident it opens, closes or continues (a
    persistent SDC, recovering from its SDC incident's rollback, continues that incident)."""
    if p is P.RECOVERING:
        if cause == SDC:
            return _open_sdc(p)
        if cause == _HALT_CAUSES:
            return (f"continue an SDC incident (a persistent SDC), else close the recovering incident rolled_back "
                    f"and open incident (cause {cause})",)
        return ("close the recovering incident rolled_back", f"open incident (cause {cause})")
    return ("continue the incident",) if p is P.REJOINING else (f"open incident (cause {cause})",)
_HALT_SDC = ("close incident halted", "alert critical (the job is left running on the diverged replica)")
_SDC_ONCE = ("starts_sdc", "not sdc_repeats")
"""A divergence of a rank no SDC rollback of this run named yet (or of no named rank): a rollback."""


def _open_sdc(p: Phase) -> tuple[str, ...]:
    if p is P.RECOVERING:
        return ("continue an SDC incident, else close the recovering one rolled_back and open incident (cause sdc)",)
    return ("open incident (cause sdc)",)


_OPEN = "open incident (a rung up the ladder when soon after the previous one)"
_CONTINUE = "continue the incident a rung up (the rollback did not cure the run)"


def _alone(p: Phase, *actions: str) -> tuple[str, ...]:
    """What a trainer-side timeout's report does in phase ``p`` (the trainer acted alone)."""
    return ("open incident (the trainer's timeout)" if p is P.RUNNING else "continue the incident",
            *(("cancel the unanswered command",) if p in WAITING else ()), "adopt the trainer's lr_scale",
            *actions, "alert critical")


TABLE: tuple[Transition, ...] = (
    *(Transition(p, trig, P.PAUSING, ("starts_incident", "can_pause_cycle"),
                 (_OPEN if p is P.RUNNING else _CONTINUE, "send pause", "alert critical"))
      for trig in (T.SPIKE, T.HOLD) for p in (P.RUNNING, P.RECOVERING)),
    # a hold while the machine already waits on its own command: that command answers it
    *(Transition(p, T.HOLD, p, (), ("note the hold in the incident",)) for p in WAITING),
    Transition(P.PAUSING, T.PAUSE_APPLIED, P.VALIDATING, ("is_ours", "not escalation_spent"), ("send validate",)),
    Transition(P.PAUSING, T.ESCALATION_SPENT, P.HALTED, ("is_ours", "escalation_spent"), _HALT),
    Transition(P.VALIDATING, T.VALIDATION_NORMAL, P.RESUMING, ("is_ours", "not is_abnormal"),
               ("mark checkpoints stable", "flag the excursion's samples", "send resume")),
    Transition(P.VALIDATING, T.ROLLBACK_UNSUPPORTED, P.HALTED, ("is_ours", "is_abnormal", "not can_roll_back"), _HALT),
    Transition(P.VALIDATING, T.BUDGET_EXHAUSTED, P.HALTED,
               ("is_ours", "is_abnormal", "can_roll_back", "not within_budget"), _HALT),
    Transition(P.VALIDATING, T.NO_TARGET, P.HALTED,
               ("is_ours", "is_abnormal", "can_roll_back", "within_budget", "not rollback_target"), _HALT),
    Transition(P.VALIDATING, T.VALIDATION_ABNORMAL, P.ROLLING_BACK,
               ("is_ours", "is_abnormal", "can_roll_back", "within_budget", "rollback_target"),
               ("cut the LR scale by lr_factor", _ROLLBACK)),
    Transition(P.ROLLING_BACK, T.ROLLBACK_APPLIED, P.RECOVERING, ("is_ours",), ("forget checkpoints after the target",)),
    Transition(P.ROLLING_BACK, T.ROLLBACK_FAILED, P.ROLLING_BACK, ("is_ours", "rollback_target"),
               ("forget the failed target", _ROLLBACK)),
    Transition(P.ROLLING_BACK, T.NO_TARGET, P.HALTED, ("is_ours", "not rollback_target"),
               ("forget the failed target", *_HALT)),
    Transition(P.RECOVERING, T.RECOVERED, P.RUNNING, ("is_recovered",), ("close incident rolled_back", "alert info")),
    Transition(P.RESUMING, T.RESUME_APPLIED, P.RUNNING, ("is_ours",), ("close incident resumed", "alert info")),
    Transition(P.HALTED, T.OPERATOR_RESUMED, P.RUNNING, ("not is_ours",), ("close incident halted", "alert info")),
    *(t for p in WAITING for t in (
        Transition(p, T.COMMAND_RETRY, p, ("can_retry",),
                   ("mark the command timed out", "resend it (next attempt)", "alert warn")),
        Transition(p, T.COMMAND_GAVE_UP, P.HALTED, ("not can_retry",), ("mark the command timed out", *_HALT)),
        Transition(p, T.COMMAND_REFUSED, P.HALTED, ("is_ours",), _HALT),
    )),
    *(Transition(p, T.RUN_ENDED, P.RUNNING, (), (*(("cancel the unanswered command",) if p in WAITING else ()),
                                                 f"close incident {'halted' if p is P.HALTED else 'abandoned'}",
                                                 "alert warn"))
      for p in _HOLDS_INCIDENT),
    # hangs (controller/recovery_hang.py): restart in place, then without the node, then a human
    *(t for p in (P.RUNNING, P.RECOVERING) for t in (
        Transition(p, T.HANG, P.RESTARTING, (*_RESTARTS, "not wants_exclusion"),
                   (*_open_hang(p), "send restart in_place (none when torchrun restarted that life already)",
                    "alert critical")),
        Transition(p, T.HANG_AGAIN, P.RESTARTING, _EXCLUDES,
                   (*_open_hang(p), _RECORD, "send restart exclude (the culprit's nodes)", "alert critical")),
        # a bad rank the kit's re-runs found (step.triaged bad_rank): evicted, i.e. left out at once;
        # the halts below (no restart, budget, node) answer it as they answer a hang
        Transition(p, T.EVICT, P.RESTARTING, _NODE_EVICT,
                   (*_open_hang(p, "bad_rank"), _RECORD, "send restart exclude (the bad rank's node)",
                    "alert critical")),
        # ...only its device when its node runs several ranks (device_only): the node stays, its
        # launcher starts torchrun again with one process fewer (cliffguard/plan_watch.py)
        Transition(p, T.EVICT_DEVICE, P.RESTARTING, _DEVICE_EVICT,
                   (*_open_hang(p, "bad_rank"), _RECORD_DEVICE,
                    "send restart exclude (the bad rank's device; its node keeps the others)", "alert critical")),
    )),
    *(Transition(p, T.NODE_CHECK_FAILED, P.RESTARTING, _EXCLUDES,
                 (*_open_hang(p), _RECORD, "send restart exclude (the slow nodes)", "alert critical"))
      for p in _HANG_SOURCES),
    # a node the suspect-node store holds beats in the run (controller/recovery_suspect.py): it is not
    # admitted, so the group restarts without it; the halts below answer it when it cannot be left out
    *(Transition(p, T.SUSPECT_NODE, P.RESTARTING, _EXCLUDES,
                 (*_open_hang(p, "suspect_node"), "send restart exclude (the suspect node)", "alert critical"))
      for p in _HANG_SOURCES),
    *(t for p in _HANG_SOURCES for t in (
        Transition(p, T.RESTART_UNAVAILABLE, P.HALTED, ("starts_restart", "not can_restart"),
                   (*_open_hang(p, _HALT_CAUSES), _RECORD_JUDGED, *(_HALT_JOB if p is P.REJOINING else _HALT_LEFT_RUNNING))),
        Transition(p, T.RESTART_BUDGET_SPENT, P.HALTED, ("starts_restart", "can_restart", "not within_restart_budget"),
                   (*_open_hang(p, _HALT_CAUSES), _RECORD_JUDGED, *_HALT_JOB)),
        Transition(p, T.EXCLUDE_UNAVAILABLE, P.HALTED, (*_RESTARTS, "wants_exclusion", "not can_exclude"),
                   (*_open_hang(p, _HALT_CAUSES), _RECORD_JUDGED, *_HALT_JOB)),
        # the eviction budget (controller/recovery_budgets.py) is spent: a human, the node named
        Transition(p, T.EVICT_BUDGET_SPENT, P.HALTED,
                   (*_RESTARTS, "wants_exclusion", "can_exclude", "not within_evict_budget"),
                   (*_open_hang(p, _HALT_CAUSES), _RECORD_JUDGED, *_HALT_JOB[:2],
                    "alert critical (the node, the evict budget and its uses named)")),
    )),
    Transition(P.RESTARTING, T.WORKERS_STARTED, P.REJOINING, (), ("forget the old life's memory snapshots",)),
    Transition(P.RESTARTING, T.RUN_ENDED, P.RESTARTING, (), ("note the torn-down life's end",)),
    Transition(P.REJOINING, T.NODE_CHECK_PASSED, P.REJOINING, (), ("note the check in the incident",)),
    Transition(P.REJOINING, T.TRAINING_AGAIN, P.RUNNING, (),
               ("forget checkpoints after the resumed step", "close incident restarted", "alert info")),
    Transition(P.REJOINING, T.RUN_ENDED, P.RESTARTING, (), ("note the new life's end; torchrun may start another",)),
    *(Transition(p, T.RESTART_TIMED_OUT, P.HALTED, ("restart_timed_out",), _HALT_JOB) for p in (P.RESTARTING, P.REJOINING)),
    Transition(P.HALTED, T.WORKERS_STARTED, P.RUNNING, (), ("close incident halted (a new life: someone restarted the job)",
                                                          "alert info")),
    Transition(P.HALTED, T.TRAINING_AGAIN, P.RUNNING, ("trains_on",),
               ("close incident resumed (the stall a halt left running ended by itself)", "alert info")),
    # the trainer waited past a timeout with no command and acted alone (trainer.timeout); a
    # preempted run has no trainer until it trains again, and its first step ends ``preempted``
    *(Transition(p, T.TRAINER_ROLLED_BACK, P.RECOVERING, (), _alone(p, "forget checkpoints after the target"))
      for p in _TRAINING),
    *(Transition(p, T.TRAINER_RESUMED, P.RUNNING, (),
                 _alone(p, f"close incident {'halted' if p is P.HALTED else 'resumed'}")) for p in _TRAINING),
    *(Transition(p, T.TRAINER_STOPPED, P.HALTED, (), _alone(p, "close incident halted")) for p in _TRAINING),
    *(Transition(p, T.OPERATOR_LR_SCALE, p, (), ("adopt the operator's lr_scale",)) for p in Phase),
    # the scheduler's warning (run.preempted): an incident of its own kind, not a failure; a run
    # preempted mid-incident has that incident abandoned (the restart resumes from the saved step)
    Transition(P.RUNNING, T.PREEMPTED, P.PREEMPTED, (), ("open incident preemption",)),
    Transition(P.PREEMPTED, T.PREEMPTED, P.PREEMPTED, (), ("note the next warning in the incident",)),
    *(Transition(p, T.PREEMPTED, P.PREEMPTED, (),
                 (*(("cancel the unanswered command",) if p in WAITING else ()),
                  f"close incident {'halted' if p is P.HALTED else 'abandoned'}", "open incident preemption"))
      for p in Phase if p not in (P.RUNNING, P.PREEMPTED)),
    Transition(P.PREEMPTED, T.TRAINING_AGAIN, P.RUNNING, (), ("close incident requeued", "alert info")),
    # the kit re-ran a bad step and cured its cause itself (step.triaged: a data batch skipped and
    # listed, a transient fault retried): a record of its own; mid-incident the verdict is evidence only
    Transition(P.RUNNING, T.TRIAGE_CURED, P.RUNNING, (),
               ("open incident triage", "close incident cured",
                "alert info (critical, the spent budget named, when a run that cannot pause spent its retry or "
                "re-run budget)")),
    # ...but past its budget (controller/recovery_budgets.py) a cure is not taken as one: the spike's
    # path instead (pause, validate, resume or roll back with the LR cut), the budget in the incident
    Transition(P.RUNNING, T.RETRY_BUDGET_SPENT, P.PAUSING, ("not within_retry_budget", "can_pause_cycle"),
               (_OPEN + ", cause transient: the retry budget spent", "send pause", "alert critical")),
    Transition(P.RUNNING, T.RERUN_BUDGET_SPENT, P.PAUSING,
               ("within_retry_budget", "not within_rerun_budget", "can_pause_cycle"),
               (_OPEN + ", the triaged cause: the re-run budget spent", "send pause", "alert critical")),
    # a diverged replica (controller/recovery_sdc.py): its weights are known bad and no validation can
    # tell, so straight back to before the replicas last agreed, the LR kept and no data skipped
    *(t for p in (P.RUNNING, P.RECOVERING) for t in (
        Transition(p, T.SDC, P.ROLLING_BACK, (*_SDC_ONCE, "can_roll_back", "within_budget", "rollback_target"),
                   (*_open_sdc(p), "send rollback (to the last agreement; lr_scale kept, no data skipped)",
                    "remember the named rank (and its node)", "alert critical")),
        Transition(p, T.ROLLBACK_UNSUPPORTED, P.HALTED, (*_SDC_ONCE, "not can_roll_back"), (*_open_sdc(p), *_HALT_SDC)),
        Transition(p, T.BUDGET_EXHAUSTED, P.HALTED, (*_SDC_ONCE, "can_roll_back", "not within_budget"),
                   (*_open_sdc(p), *_HALT_SDC)),
        Transition(p, T.NO_TARGET, P.HALTED, (*_SDC_ONCE, "can_roll_back", "within_budget", "not rollback_target"),
                   (*_open_sdc(p), *_HALT_SDC)),
        # the rank an SDC rollback named diverged again: persistent SDC, evicted like a bad rank (its
        # node left out and recorded suspect); the hangs' halts answer it when it cannot be (no restart,
        # budget spent, too few nodes, or no node known for the rank: a human, the rank named)
        Transition(p, T.SDC_AGAIN, P.RESTARTING, ("starts_sdc", "sdc_repeats", *_NODE_EVICT),
                   (*_open_hang(p, SDC), _RECORD, "send restart exclude (the diverging rank's node)", "alert critical")),
        Transition(p, T.SDC_AGAIN_DEVICE, P.RESTARTING, ("starts_sdc", "sdc_repeats", *_DEVICE_EVICT),
                   (*_open_hang(p, SDC), _RECORD_DEVICE,
                    "send restart exclude (the diverging rank's device; its node keeps the others)", "alert critical")),
    )),
)
"""Every legal move; those of one phase and input in the order the handlers try them."""

TRANSITIONS: dict[tuple[Phase, str], Phase] = {(t.source, t.trigger): t.target for t in TABLE}
"""(from phase, trigger) -> to phase: the table as ``fire`` reads it."""
ENTRIES: dict[tuple[Phase, str], Transition] = {(t.source, t.trigger): t for t in TABLE}
assert len(ENTRIES) == len(TABLE), "one (phase, trigger) is declared twice"


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
    """The verdict asks for recovery and the run is running or recovering (not mid-incident)."""
    return inp.verdict.action is Action.RECOVER and s.phase in (Phase.RUNNING, Phase.RECOVERING)


def starts_sdc(cfg: RecoveryConfig, s: RecoveryState, inp: VerdictIn) -> bool:
    """The SDC watch's verdict (``Action.ROLLBACK``) while running or recovering (not mid-incident)."""
    return inp.verdict.action is Action.ROLLBACK and s.phase in (Phase.RUNNING, Phase.RECOVERING)


def sdc_node(s: RecoveryState, v: Verdict) -> str:
    """The node of an SDC verdict's rank, as the node heartbeats of the run's current life of the worker
    group said it (the edge adds it: controller/rank_nodes.py); "" when unknown or from another life."""
    node, life = v.evidence.get("node"), v.evidence.get("node_life")
    return node if isinstance(node, str) and node and (life is None or life == s.hang.life) else ""


def sdc_repeats(cfg: RecoveryConfig, s: RecoveryState, inp: VerdictIn) -> bool:
    """The SDC verdict names a rank an earlier SDC rollback of this run named too, in the same life of
    the worker group or on the same node: a persistent SDC (``HangState.diverged``)."""
    v = inp.verdict
    if v.rule != SDC or v.rank is None:
        return False
    node = sdc_node(s, v)
    return any(r == v.rank and (lf == s.hang.life or (node != "" and n == node)) for r, lf, n in s.hang.diverged)


def is_abnormal(cfg: RecoveryConfig, s: RecoveryState, val_loss: float) -> bool:
    """The validation loss is above the healthy baseline plus margins (or there is no baseline yet,
    or it is not finite)."""
    base = s.baseline()
    if base is None or not math.isfinite(val_loss):
        return True
    return val_loss > base * (1 + cfg.val_margin_rel) + cfg.val_margin_abs


def within_budget(cfg: RecoveryConfig, s: RecoveryState, now: float) -> bool:
    """Fewer than ``rollback_budget`` rollbacks within the last ``rollback_window_s``, and fewer than
    ``rollback_run_budget`` in the run (0 = no cap)."""
    return budgets.within(cfg, s, "rollback", now)


def within_evict_budget(cfg: RecoveryConfig, s: RecoveryState, now: float) -> bool:
    """Fewer than ``evict_budget`` restarts that left a node out within the last ``evict_window_s``,
    and fewer than ``evict_run_budget`` in the run (0 = no cap)."""
    return budgets.within(cfg, s, "evict", now)


def within_retry_budget(cfg: RecoveryConfig, s: RecoveryState, inp: TriagedIn) -> bool:
    """The triaged step is no transient, or fewer than ``retry_budget`` transients the kit retried within
    the last ``retry_window_s`` and fewer than ``retry_run_budget`` in the run (0 = no cap)."""
    return inp.cls != "transient" or budgets.within(cfg, s, "retry", inp.now)


def within_rerun_budget(cfg: RecoveryConfig, s: RecoveryState, now: float) -> bool:
    """Fewer than ``rerun_budget`` steps the kit re-ran to triage (``step.triaged``) within the last
    ``rerun_window_s``, and fewer than ``rerun_run_budget`` in the run (0 = no cap)."""
    return budgets.within(cfg, s, "rerun", now)


def rollback_target(cfg: RecoveryConfig, s: RecoveryState, before: int) -> Checkpoint | None:
    """The newest stable checkpoint at or before ``before`` (as a term: there is one)."""
    step = rollback_step((c.step for c in s.checkpoints if c.stable), before)
    return None if step is None else next(c for c in s.checkpoints if c.step == step and c.stable)


def can_retry(cfg: RecoveryConfig, s: RecoveryState) -> bool:
    """The pending command has sends left (``max_attempts``)."""
    return s.pending is not None and s.pending.attempt < cfg.max_attempts


def timed_out(cfg: RecoveryConfig, s: RecoveryState, now: float) -> bool:
    """The pending command went unanswered past its timeout (what makes a tick count)."""
    if s.pending is None:
        return False
    limit = cfg.validate_timeout_s if s.pending.type is CommandType.VALIDATE else cfg.command_timeout_s
    return now - s.pending.sent_at >= limit


def is_recovered(cfg: RecoveryConfig, s: RecoveryState) -> bool:
    """``recover_window`` healthy steps since the rollback target (and since the last unhealthy step)."""
    assert s.incident is not None and s.incident.rollback_to is not None
    healthy_since = max([s.incident.rollback_to, *s.unhealthy_steps])
    return s.last_step - healthy_since >= cfg.recover_window


def is_stable(cfg: RecoveryConfig, s: RecoveryState, c: Checkpoint) -> bool:
    """``stable_window`` healthy steps followed the checkpoint (what makes it a rollback target)."""
    if s.last_step < c.step + cfg.stable_window:
        return False
    # a checkpoint labelled s holds the state before step s ran (trainer/commands.py), so step s
    # itself is part of the window that must stay healthy
    return not any(c.step <= u <= c.step + cfg.stable_window for u in s.unhealthy_steps)


def is_ours(cfg: RecoveryConfig, s: RecoveryState, cmd_id: str) -> bool:
    """The ack or validation answers the command the machine is waiting on."""
    return s.pending is not None and s.pending.id == cmd_id


def starts_restart(cfg: RecoveryConfig, s: RecoveryState, inp: Any) -> bool:
    """A hang verdict (``Action.RESTART``), a bad rank the kit's re-runs found (``step.triaged``) or a
    persistent SDC (``sdc_repeats``) while running or recovering, or a failed node check or a suspect
    node's beat (the suspect-node store) while running, recovering or rejoining."""
    if isinstance(inp, VerdictIn):
        act = inp.verdict.action
        return (act is Action.RESTART or (act is Action.ROLLBACK and sdc_repeats(cfg, s, inp))) and s.phase in (
            Phase.RUNNING, Phase.RECOVERING)
    if isinstance(inp, TriagedIn):
        return evicts(cfg, inp) and s.phase in (Phase.RUNNING, Phase.RECOVERING)
    if isinstance(inp, SuspectJoinedIn):
        return s.phase in _HANG_SOURCES
    return isinstance(inp, NodeCheckIn) and not inp.ok and s.phase in _HANG_SOURCES


def evicts(cfg: RecoveryConfig, inp: TriagedIn) -> bool:
    """The kit's re-runs found a bad rank, or a rank's transient faults in this life reached
    ``transient_budget`` (``recorded_transient_budget`` when its node has a record in the
    suspect-node store: evicted sooner) (not a guard term: part of ``starts_restart``)."""
    if inp.cls == "bad_rank":
        return True
    return (inp.cls == "transient" and inp.rank is not None and bool(cfg.transient_budget)
            and inp.transient_counts.get(str(inp.rank), 0) >= transient_budget_of(cfg, inp))


def transient_budget_of(cfg: RecoveryConfig, inp: TriagedIn) -> int:
    """The transient budget of ``inp``'s rank: lower for a node with a record (issue 22's memory)."""
    return min(cfg.transient_budget, cfg.recorded_transient_budget) if inp.node_record else cfg.transient_budget


def can_restart(cfg: RecoveryConfig, s: RecoveryState) -> bool:
    """The run declared ``restart`` and torchrun has restarts left (``run.started``'s ``restarts_left``)."""
    return s.can(CommandType.RESTART) and s.hang.restarts_left > 0


def within_restart_budget(cfg: RecoveryConfig, s: RecoveryState, now: float) -> bool:
    """Fewer than ``restart_budget`` restarts within the last ``restart_window_s``, and fewer than
    ``restart_run_budget`` in the run (0 = no cap)."""
    return budgets.within(cfg, s, "restart", now)


def wants_exclusion(cfg: RecoveryConfig, s: RecoveryState, inp: Any, nodes: tuple[str, ...], now: float) -> bool:
    """The node failed a node check, the kit's re-runs found its rank bad (an eviction), its rank
    diverged again after an SDC rollback, the store holds it suspect, or one of the culprit's nodes
    hung before within ``repeat_window_s``."""
    if isinstance(inp, (NodeCheckIn, TriagedIn, SuspectJoinedIn)):
        return True
    if isinstance(inp, VerdictIn) and inp.verdict.action is Action.ROLLBACK:
        return True  # a persistent SDC (only asked once sdc_repeats held)
    return bool(cfg.repeat_window_s) and any(n in nodes and now - t < cfg.repeat_window_s for n, t in s.hang.hangs)


def can_exclude(cfg: RecoveryConfig, s: RecoveryState, nodes: tuple[str, ...], device: bool = False) -> bool:
    """The culprit's nodes are known and the run keeps ``min_nodes`` without them (a device-level
    eviction, ``device``, keeps every node)."""
    if device:
        return bool(nodes) and all(nodes)
    return bool(nodes) and all(nodes) and s.hang.nodes - len(set(nodes)) >= s.hang.min_nodes


def culprit_device(s: RecoveryState, inp: Any) -> tuple[int, int] | None:
    """(device slot, ranks on its node) of an eviction's culprit rank, as the node's heartbeats of this
    life said (controller/rank_nodes.py): a bad rank or one over its transient budget (``TriagedIn``)
    or a persistent SDC (an SDC ``VerdictIn`` whose node is known); None otherwise or unknown."""
    if isinstance(inp, TriagedIn):
        device, n = inp.device, inp.node_devices
    elif isinstance(inp, VerdictIn) and inp.verdict.rule == SDC and sdc_node(s, inp.verdict):
        device, n = inp.verdict.evidence.get("device"), inp.verdict.evidence.get("node_devices")
    else:
        return None
    return (device, n) if isinstance(device, int) and isinstance(n, int) else None


def device_only(cfg: RecoveryConfig, s: RecoveryState, inp: Any, nodes: tuple[str, ...]) -> bool:
    """An eviction's culprit is one device of a node that runs more than one rank: the restart leaves
    that device out and the node stays with one process fewer (a node with one rank goes whole)."""
    dev = culprit_device(s, inp)
    return dev is not None and dev[1] > 1 and len(set(nodes)) == 1 and all(nodes)


def restart_timed_out(cfg: RecoveryConfig, s: RecoveryState, now: float) -> bool:
    """``restart_timeout_s`` passed since the restart with no step of a restarted group."""
    r = s.hang.restart
    return r is not None and now - r.at >= cfg.restart_timeout_s


def trains_on(cfg: RecoveryConfig, s: RecoveryState, inp: Any) -> bool:
    """A step past a hang halted with the job left running, while that halt stands: the stall
    ended by itself."""
    inc = s.incident
    return (s.phase is Phase.HALTED and inc is not None and inc.id == s.hang.left_running
            and inp.step > inc.spike_step)


def escalation_spent(cfg: RecoveryConfig, s: RecoveryState) -> bool:
    """The incident is on the escalation ladder's last rung (``LADDER``): a human decides."""
    return s.incident is not None and rung_of(s.incident.rung).halt


GUARDS: dict[str, Callable[..., Any]] = {
    "starts_incident": starts_incident,
    "starts_sdc": starts_sdc,
    "sdc_repeats": sdc_repeats,
    "is_abnormal": is_abnormal,
    "within_budget": within_budget,
    "rollback_target": rollback_target,
    "can_retry": can_retry,
    "timed_out": timed_out,
    "is_recovered": is_recovered,
    "is_stable": is_stable,
    "is_ours": is_ours,
    "starts_restart": starts_restart,
    "can_restart": can_restart,
    "within_restart_budget": within_restart_budget,
    "within_evict_budget": within_evict_budget,
    "within_retry_budget": within_retry_budget,
    "within_rerun_budget": within_rerun_budget,
    "wants_exclusion": wants_exclusion,
    "can_exclude": can_exclude,
    "device_only": device_only,
    "restart_timed_out": restart_timed_out,
    "trains_on": trains_on,
    "escalation_spent": escalation_spent,
}

PAUSE_CYCLE = (CommandType.PAUSE, CommandType.VALIDATE, CommandType.RESUME)
"""What a run must apply for the machine to open an incident: pause, judge the frozen weights, resume."""
CAPABILITIES: dict[str, tuple[CommandType, ...]] = {
    "can_pause_cycle": PAUSE_CYCLE,
    "can_roll_back": (CommandType.ROLLBACK,),
}
"""Guard terms that hold when the run declared (``run.started``) every one of these commands."""


def holds(term: str, cfg: RecoveryConfig, s: RecoveryState, *args: Any) -> bool:
    """Whether a guard term holds: ``name`` or ``not name``, a key of GUARDS (called with ``args``)
    or of CAPABILITIES."""
    negated, name = term.startswith("not "), term.removeprefix("not ")
    value = bool(GUARDS[name](cfg, s, *args)) if name in GUARDS else s.can(*CAPABILITIES[name])
    return value != negated


def guard_terms(table: Iterable[Transition] = TABLE) -> set[str]:
    """Every name a guard of ``table`` uses (without ``not``)."""
    return {term.removeprefix("not ") for t in table for term in t.guard}


# ---------------------------------------------------------------------------------------------
# The escalation ladder: what a run that goes off its cliff again soon gets
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rung:
    """One rung of the escalation ladder."""

    lr_cuts: int
    """A rollback on this rung multiplies the LR scale by ``[policy] lr_factor`` this many times."""
    longer: bool
    """A rollback on this rung goes to a stable checkpoint before the previous rollback's target
    (when one lies there; else to the newest before the onset, as on the first rung)."""
    halt: bool = False
    """No validation and no rollback: once paused, the run is halted for a human."""
    why: str = ""


LADDER: tuple[Rung, ...] = (
    Rung(1, False, why="a first excursion: validate; resume, or roll back to the newest stable checkpoint "
                      "with the LR cut once"),
    Rung(2, True, why="again soon after a resume or a recovered rollback, or while recovering from one: "
                     "validate again; resume, or roll back further with the LR cut twice"),
    Rung(3, True, why="and again: validate; resume, or roll back further still with the LR cut three times"),
    Rung(0, False, halt=True, why="and again: pause and halt; a human decides"),
)
"""Rung ``level`` of an incident (the last one for any higher level). An incident starts on rung 0
unless ``escalation_level`` says otherwise, and climbs one rung when the run spikes or holds again
while it recovers from the incident's own rollback."""


def rung_of(level: int) -> Rung:
    return LADDER[min(level, len(LADDER) - 1)]


def escalation_level(cfg: RecoveryConfig, s: RecoveryState, onset: int) -> int:
    """The rung of an incident whose excursion starts at ``onset``: one above the previous
    incident's when it starts within ``[recovery] escalate_within`` steps of that one's end (a
    resume, or a rollback called recovered), else the first."""
    prev = s.previous
    if prev is None or not cfg.escalate_within or onset - prev.step > cfg.escalate_within:
        return 0
    return prev.rung + 1


def rollback_bound(cfg: RecoveryConfig, s: RecoveryState, inc: Incident) -> int:
    """The step a rollback target must be at or before: the excursion's onset, and on a rung that
    asks for a longer rollback also before the previous rollback's target (when a stable
    checkpoint lies there)."""
    prior = inc.rollback_to if inc.rollback_to is not None else inc.prior_target
    if not rung_of(inc.rung).longer or prior is None:
        return inc.onset_step
    bound = min(inc.onset_step, prior - 1)
    return bound if rollback_target(cfg, s, bound) is not None else inc.onset_step
