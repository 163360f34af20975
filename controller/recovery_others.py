"""What the trainer decided without the machine: a trainer-side timeout that fired (``trainer.timeout``).

The trainer holds (its guard skipped ``hold_after`` updates in a row) or waits paused; when no
command comes within its timeout it applies its own policy (agent/recovery/timeouts.py): a
rollback with the LR cut, a resume, or a stop. Whatever the machine was doing, the trainer has
moved on, so its report becomes an incident's move: the incident open (or a new one, with the
cause: the guard held and nobody answered), the unanswered command cancelled, the trainer's LR
scale adopted as the run's (so ``cliffguard status`` shows no "asked" value nobody asked for,
and the next rollback cuts from it) and every field of the report kept as the move's evidence,
naming the trainer-side timeout as who decided. Then: a rollback -> ``recovering`` (closed as
rolled back after a healthy window, like the machine's own), a resume -> ``running`` (closed
resumed), a stop or a policy that could not apply -> ``halted`` (a human restarts it).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cliffguard.controller import recovery_budgets as budgets
from cliffguard.controller.recovery_hang import on_bad_rank
from cliffguard.controller.recovery_step import Step, open_incident, rolled_back
from cliffguard.controller.recovery_table import evicts
from cliffguard.controller.recovery_types import MarkCommand, Phase, TrainerTimeoutIn, TriagedIn, Trigger
from cliffguard.core.enums import AlertAction, AlertLevel, CommandType, IncidentOutcome, Level
from cliffguard.core.triage import CURED_IN_PROCESS, TriageClass

TRAINER_TIMEOUT = "trainer_timeout"
TRIAGE = "triage"
"""The rule name of a triage record: the kit re-ran a bad step and cured the cause itself."""

"""The rule name of an incident the trainer's own timeout opened."""


def _who(inp: TrainerTimeoutIn) -> str:
    what = "the guard held" if inp.wait == "hold" else "the run was paused"
    return f"{what} for {inp.waited_s:g}s at step {inp.at_step} with no controller command"


def on_trainer_timeout(st: Step, inp: TrainerTimeoutIn) -> None:
    s = st.s
    if inp.ts and inp.ts <= s.acted_alone_ts:
        return  # a re-read of a report already applied (controller/replays.py covers the judged events only)
    s.acted_alone_ts = max(s.acted_alone_ts, inp.ts)
    ev: dict[str, Any] = {
        "decided_by": "trainer-side timeout", "cause": "held" if inp.wait == "hold" else "controller_silent",
        "wait": inp.wait, "policy": inp.policy, "applied": inp.applied, "waited_s": inp.waited_s,
        "at_step": inp.at_step, "first_bad_step": inp.first_bad_step, "to_step": inp.to_step,
        "lr_scale_before": inp.lr_scale_before, "lr_scale": inp.lr_scale, "detail": inp.detail,
        "phase": str(s.phase), "cmd": s.pending.id if s.pending else None,
    }
    onset = inp.first_bad_step if inp.first_bad_step is not None else inp.at_step
    if s.incident is None:
        open_incident(st, TRAINER_TIMEOUT, str(Level.CRITICAL), inp.at_step, onset, ev, inp.now)
    pend = s.pending
    if pend is not None:
        st.actions.append(MarkCommand(id=pend.id, status="cancelled",
                                      detail=f"superseded: {_who(inp)}, the trainer applied {inp.policy} itself"))
        s.pending = None
    if inp.lr_scale != s.lr_scale:
        inc = s.incident
        assert inc is not None
        s.incident = replace(inc, lr_scales=(*inc.lr_scales, inp.lr_scale))
    lr = f"lr_scale {inp.lr_scale_before:g} -> {inp.lr_scale:g}" if inp.lr_scale != inp.lr_scale_before else \
        f"lr_scale {inp.lr_scale:g}"
    s.lr_scale = inp.lr_scale
    halted_before = s.phase is Phase.HALTED
    if inp.policy == "rollback" and inp.applied and inp.to_step is not None:
        reason = (f"{_who(inp)}: the trainer rolled back to step {inp.to_step} itself, {lr} "
                  f"(decided by the trainer-side timeout): {inp.detail}")
        st.move(Trigger.TRAINER_ROLLED_BACK, reason, ev, inp.now, step=inp.to_step)
        rolled_back(st, inp.to_step, inp.now)
    elif inp.policy == "resume" and inp.applied:
        reason = f"{_who(inp)}: the trainer resumed itself, {lr} (decided by the trainer-side timeout)"
        st.move(Trigger.TRAINER_RESUMED, reason, ev, inp.now, step=inp.step)
        st.close(IncidentOutcome.HALTED if halted_before else IncidentOutcome.RESUMED, inp.now)
    else:
        did = "stopped" if inp.applied else f"could not apply {inp.policy} and stopped"
        reason = f"{_who(inp)}: the trainer {did} (decided by the trainer-side timeout): {inp.detail}"
        st.move(Trigger.TRAINER_STOPPED, reason, ev, inp.now, step=inp.step)
        st.close(IncidentOutcome.HALTED, None)
    inc = s.incident
    assert inc is not None
    st.alert(AlertLevel.CRITICAL, inc.rule, f"run {s.run}: the trainer acted alone after its {inp.wait} timeout",
             reason, ev)
    if s.phase is Phase.RUNNING:
        s.incident = None


TRIAGE_JOIN_STEPS = 2
"""A cured step at most this many steps after the last cured one of the same class continues its
incident (a corrupted stretch is one excursion; one healthy step between is still the same one)."""


def _count(st: Step, inp: TriagedIn) -> None:
    """Every report is a step the kit re-ran (the ``rerun`` rung); a transient one a retry too
    (``controller/recovery_budgets.py``). A re-read report counts once."""
    s = st.s
    if inp.ts and inp.ts <= s.rungs.triaged_ts:
        return
    budgets.note(st.cfg, s, "rerun", inp.now)
    if inp.cls == TriageClass.TRANSIENT:
        budgets.note(st.cfg, s, "retry", inp.now)
    s.rungs = replace(s.rungs, triaged_ts=max(s.rungs.triaged_ts, inp.ts))


def on_triaged(st: Step, inp: TriagedIn) -> None:
    """A step the kit re-ran and cured (data, transient): an incident opened and closed ``cured`` at
    once with the re-runs' verdict, and an info alert. A bad rank is evicted (``on_bad_rank``). Mid-incident, or a class the kit does not
    cure, the verdict stays the store's evidence (``cliffguard badbatches``) and nothing moves.

    Budgets: every report uses the ``rerun`` rung, a transient the ``retry`` rung. A cure past either
    budget is not taken as one (``_escalate``: the spike's path, pause and validate); a run that cannot
    pause records the cure with a critical alert naming the spent budget."""
    s = st.s
    if inp.ts and inp.ts <= s.acted_alone_ts:
        return  # a re-read of a report already applied: the trainer acted alone here too
    if inp.cls == TriageClass.BAD_RANK or evicts(st.cfg, inp):
        # a bad rank, or a cured transient whose rank's transients reached the budget: evicted
        # (controller/recovery_hang.py; the evict budget decides whether a human does it instead)
        _count(st, inp)
        s.acted_alone_ts = max(s.acted_alone_ts, inp.ts)
        on_bad_rank(st, inp)
        return
    if inp.cls not in CURED_IN_PROCESS or s.phase is not Phase.RUNNING or s.incident is not None:
        _count(st, inp)
        return
    s.acted_alone_ts = max(s.acted_alone_ts, inp.ts)
    within_retry = st.holds("within_retry_budget", inp)
    within_rerun = st.holds("within_rerun_budget", inp.now)
    rung = None if within_retry and within_rerun else "retry" if not within_retry else "rerun"
    spent = None if rung is None else budgets.spent(st.cfg, s, rung, inp.now)
    _count(st, inp)
    ev: dict[str, Any] = {"cause": inp.cls, "decided_by": "trainer triage", "remedy": inp.remedy, "rank": inp.rank,
                          "reason": inp.reason, "reruns": inp.reruns, "rerun_s": inp.rerun_s,
                          "sample_ids": list(inp.sample_ids), "update_applied": inp.update_applied,
                          "reruns_by_rank": inp.evidence}
    cure = (f"batch skipped and listed ({len(inp.sample_ids)} samples)" if inp.cls == "data"
            else "step retried and applied" if inp.update_applied else "step retried")
    reason = f"step {inp.step} re-run {inp.reruns}x: {inp.cls} ({inp.reason}); {cure}"
    if spent is not None:
        ev["budget"] = spent[1]
        if st.holds("can_pause_cycle"):
            _escalate(st, inp, rung == "retry", f"{reason}; but {spent[0]}", ev)
            return
        reason += f"; {spent[0]}, but the run cannot pause: look at it"
    prev = s.cured
    if prev is not None and prev.evidence.get("cause") == inp.cls and 0 < inp.step - s.cured_step <= TRIAGE_JOIN_STEPS:
        # the next step of the same excursion (a corrupted stretch): the same incident, not one per step
        s.incident = prev
        st.move(Trigger.TRIAGE_CURED, f"{reason} (the excursion of step {prev.spike_step} goes on)", ev, inp.now,
                step=inp.step)
        st.close(IncidentOutcome.CURED, inp.now)
    else:
        open_incident(st, TRIAGE, str(Level.WARN), inp.step, inp.step, ev, inp.now)
        st.move(Trigger.TRIAGE_CURED, reason, ev, inp.now, step=inp.step)
        st.close(IncidentOutcome.CURED, inp.now)
        if spent is None:
            st.alert(AlertLevel.INFO, TRIAGE, f"run {s.run}: step {inp.step} was {inp.cls}; the trainer cured it",
                     reason, ev, action=AlertAction.RESOLVE)
    if spent is not None:  # never silent: a spent budget the machine cannot act on is a human's to see
        st.alert(AlertLevel.CRITICAL, TRIAGE, f"run {s.run}: the {rung} budget is spent at step {inp.step} and "
                 "the run cannot pause", reason, ev)
    s.cured, s.cured_step = s.incident, inp.step
    s.incident = None


def _escalate(st: Step, inp: TriagedIn, retry: bool, reason: str, ev: dict[str, Any]) -> None:
    """A cure past the retry or re-run budget: answered as a spike is (pause, validate, then resume or
    roll back with the LR cut), in an incident of its own whose evidence names the spent budget."""
    s = st.s
    open_incident(st, TRIAGE, str(Level.CRITICAL), inp.step, inp.step, ev, inp.now)
    reason += "; pausing to validate (a rollback with the LR cut when the weights are off)"
    st.move(Trigger.RETRY_BUDGET_SPENT if retry else Trigger.RERUN_BUDGET_SPENT, reason, ev, inp.now, step=inp.step)
    st.send(CommandType.PAUSE, {"reason": reason[:200]}, inp.now, reason)
    st.alert(AlertLevel.CRITICAL, TRIAGE, f"run {s.run}: the {ev['budget']['rung']} budget is spent at step "
             f"{inp.step}: pausing", reason, ev)
