"""Preemptions (``run.preempted``): incidents of their own kind, not failures (issue 24).

The scheduler took the run's nodes back; the trainer saved at a step boundary within the grace
time and exited to be requeued (agent/recovery/preemption.py). The machine sends nothing: it opens
an incident (rule ``preemption``, level info, cause ``preemption``) holding what the trainer
measured (the signal, the deadline, signal -> saved seconds, whether the save verified) and waits
in ``preempted``. A run preempted mid-incident has that incident abandoned first (its pending
command cancelled: no trainer is left to answer it). The first step after the restart closes the
incident ``requeued`` with the work lost (steps reported before the preemption that the restart
runs again) and the seconds from the save until the run trained again. An elastic run that lost
only the warned nodes (scope ``nodes``, agent/recovery/preempt_leave.py) re-forms without them and
its first step closes the incident ``shrunk`` the same way.
"""

from __future__ import annotations

from typing import Any

from cliffguard.controller.recovery_step import Step, open_incident
from cliffguard.controller.recovery_types import MarkCommand, Phase, ProgressIn, RunPreemptedIn, Trigger
from cliffguard.core.enums import AlertAction, AlertLevel, IncidentOutcome, Level

PREEMPTION = "preemption"
"""The rule name (and the cause) of a preemption's incident."""
SHRINK = "nodes"
"""``run.preempted`` scope of an elastic run that loses only the warned nodes."""


def on_run_preempted(st: Step, inp: RunPreemptedIn) -> None:
    s = st.s
    ev: dict[str, Any] = {
        "cause": PREEMPTION, "decided_by": "scheduler", "signal": inp.signal, "deadline_s": inp.deadline_s,
        "save_s": inp.save_s, "verified": inp.verified, "saved_step": inp.step, "exit_code": inp.exit_code,
        "last_step": s.last_step, "preempted_at": inp.ts or inp.now, "scope": inp.scope,
    }
    if inp.nodes:  # an elastic launch's: which nodes left (all of them for scope job)
        ev.update(nodes=list(inp.nodes), ranks_leaving=inp.ranks_leaving, world=inp.world)
    saved = (f"saved step {inp.step} {inp.save_s:.2f} s after {inp.signal} (deadline {inp.deadline_s:g} s)"
             if inp.verified else f"no verified save within {inp.deadline_s:g} s of {inp.signal}")
    if s.phase is Phase.PREEMPTED:  # warned again before training again (a restart preempted at once)
        inc = s.incident
        assert inc is not None
        st.move(Trigger.PREEMPTED, f"preempted again: {saved}", ev, inp.now, step=inp.step)
        return
    if s.incident is not None:
        pend = s.pending
        if pend is not None and not pend.acked:
            st.actions.append(MarkCommand(id=pend.id, status="cancelled", detail="the run was preempted before answering"))
        s.pending = None
        st.close(IncidentOutcome.HALTED if s.phase is Phase.HALTED else IncidentOutcome.ABANDONED, inp.now)
        s.incident = None
    s.last_step = inp.step - 1  # steps redone after an older checkpoint are the run's newest again
    open_incident(st, PREEMPTION, str(Level.OK), inp.step, inp.step, ev, inp.now)
    then = (f"node(s) {', '.join(inp.nodes)} ({inp.ranks_leaving} of {inp.world} ranks) leave, the rest re-form and "
            "go on without them" if inp.scope == SHRINK else f"the run exits {inp.exit_code} to be requeued")
    st.move(Trigger.PREEMPTED, f"preempted: {saved}; {then}", ev, inp.now, step=inp.step)


def on_training_again(st: Step, inp: ProgressIn) -> None:
    """The first step after a preemption (called before the step is noted)."""
    s = st.s
    inc = s.incident
    assert inc is not None and s.phase is Phase.PREEMPTED
    last_step = int(inc.evidence.get("last_step", -1))
    preempted_at = float(inc.evidence.get("preempted_at", inc.opened_at))
    ev = {"cause": PREEMPTION, "step": inp.step, "steps_lost": max(last_step + 1 - inp.step, 0),
          "seconds_to_train": round(max((inp.ts or inp.now) - preempted_at, 0.0), 3), "save_s": inc.evidence.get("save_s"),
          "signal": inc.evidence.get("signal"), "saved_step": inc.evidence.get("saved_step"),
          "scope": inc.evidence.get("scope", "job")}
    shrunk = ev["scope"] == SHRINK
    reason = (f"training again at step {inp.step}, {ev['seconds_to_train']:.1f} s after the preemption"
              f"{' without node(s) ' + ', '.join(inc.evidence.get('nodes') or ()) if shrunk else ''}; "
              f"{ev['steps_lost']} step(s) lost")
    st.move(Trigger.TRAINING_AGAIN, reason, ev, inp.now, step=inp.step)
    st.close(IncidentOutcome.SHRUNK if shrunk else IncidentOutcome.REQUEUED, inp.now)
    st.alert(AlertLevel.INFO, PREEMPTION, f"run {s.run} trains again after a preemption", reason, ev,
             action=AlertAction.RESOLVE)
    s.incident = None
    s.last_step = inp.step - 1  # steps redone after an older checkpoint are the run's newest again
