"""A diverged replica (the SDC watch, controller/rules/sdc.py): straight back to before it diverged.

The data-parallel replicas' parameters stopped being bit-identical: one rank computed wrong numbers
without crashing. Its weights are known bad, and a validation could not tell (each rank would
judge its own copy), so the machine neither pauses nor validates: it opens an incident (rule
``sdc``, the suspect rank when a majority named one) and rolls back at once to the newest stable
checkpoint at or before the last step at which every replica agreed (the state labelled that step
is the newest known clean one). The LR scale is kept and no data is skipped: neither the optimizer
nor the data caused it. The run then recovers like any rollback (``recovering``, closed
``rolled_back`` after a healthy window, including agreeing checks).

Diverging again while recovering from such a rollback continues the same incident with another
rollback, within the rollback budget; a recovering incident of another cause is closed
``rolled_back`` first. A run that cannot roll back, has spent its budget or has no stable
checkpoint before the divergence is halted for a human, with the job left running (it never
declared a pause the machine could trust more than the operator's judgement). In any other phase
(mid-incident) the verdict is a critical alert only; the replicas stay diverged, so the next check
after the incident reports it again.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cliffguard.controller.recovery_step import Step, open_incident, start_rollback
from cliffguard.controller.recovery_table import rollback_target
from cliffguard.controller.recovery_types import Phase, Trigger, VerdictIn
from cliffguard.controller.rules.sdc import SDC
from cliffguard.core.enums import AlertLevel, IncidentOutcome, Level

NO_CLEAN_STATE = -1
"""The rollback bound when no check ever agreed: no checkpoint is at or before it."""


def on_sdc_verdict(st: Step, inp: VerdictIn) -> None:
    v, s, now = inp.verdict, st.s, inp.now
    ev: dict[str, Any] = {**v.evidence, "step": v.step, "rank": v.rank, "last_agreed": v.onset_step}
    if not st.holds("starts_sdc", inp):
        inc = s.incident
        if inc is None or inc.rule != SDC:  # an SDC incident in progress already answers it
            st.alert(AlertLevel.CRITICAL, SDC, f"run {s.run}: replicas diverged at step {v.step} while {s.phase}; "
                     "answered after the incident in progress (the next check reports it again)", v.message, ev)
        return
    _open(st, v.step, v.onset_step, ev, now)
    bound = NO_CLEAN_STATE if v.onset_step is None else v.onset_step
    if st.holds("not can_roll_back"):
        ev["capabilities"] = [str(c) for c in s.capabilities]
        _halt(st, Trigger.ROLLBACK_UNSUPPORTED, f"{v.message}; the run cannot roll back", ev, now)
    elif st.holds("not within_budget", now):
        ev["budget"] = st.cfg.rollback_budget
        _halt(st, Trigger.BUDGET_EXHAUSTED, f"{v.message}; the rollback budget ({st.cfg.rollback_budget} per "
              f"{st.cfg.rollback_window_s:.0f}s) is spent", ev, now)
    elif st.holds("not rollback_target", bound):
        _halt(st, Trigger.NO_TARGET, f"{v.message}; no stable checkpoint at or before step {v.onset_step}", ev, now)
    else:
        target = rollback_target(st.cfg, s, bound)
        assert target is not None
        start_rollback(st, Trigger.SDC, target, v.message, ev, now)
        st.alert(AlertLevel.CRITICAL, SDC, f"run {s.run}: replicas diverged at step {v.step}; rolling back to "
                 f"step {target.step}", v.message, ev)


def _open(st: Step, step: int, last_agreed: int | None, ev: dict[str, Any], now: float) -> None:
    """The SDC incident: a new one, or (recovering from one) the same one again."""
    s = st.s
    onset = step if last_agreed is None else last_agreed + 1
    if s.phase is Phase.RECOVERING and s.incident is not None:
        if s.incident.rule == SDC:
            s.incident = replace(s.incident, spike_step=step, onset_step=onset)
            return
        st.close(IncidentOutcome.ROLLED_BACK, now)  # it rolled back and trained on; this is a new failure
        s.incident = None
    open_incident(st, SDC, str(Level.CRITICAL), step, onset, ev, now)


def _halt(st: Step, trigger: Trigger, reason: str, ev: dict[str, Any], now: float) -> None:
    st.halt(trigger, f"{reason}; the job is left running on the diverged replica: a human decides", ev, now)
