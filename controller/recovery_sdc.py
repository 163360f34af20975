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

A persistent SDC is evicted rather than rolled back again (issue 22, item 4). Each rollback that named
one rank remembers it, with its life of the worker group and its node (``HangState.diverged``). A
later verdict naming the same rank in that life or on that node (``sdc_repeats``: within the same
incident while recovering, or a later one) restarts the worker group without the rank's node, the
eviction's path (``recovery_hang._decide``: transition ``--sdc_again--> restarting``, the node
recorded suspect); the incident says "rank R diverged again after a rollback: persistent silent data
corruption". The rank's node is what the node heartbeats of the current life said (the edge adds it
to the verdict: controller/rank_nodes.py). With no restart to give, the restart budget spent, too
few nodes, or no node known for the rank (it is never guessed), a human is called with the rank
named (the hangs' halts).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cliffguard.controller import recovery_budgets as budgets
from cliffguard.controller.recovery_hang import _decide
from cliffguard.controller.recovery_step import Step, open_incident, start_rollback
from cliffguard.controller.recovery_table import rollback_target, sdc_node
from cliffguard.controller.recovery_types import Phase, Trigger, VerdictIn
from cliffguard.controller.rules.sdc import SDC
from cliffguard.core.enums import AlertLevel, IncidentOutcome, Level

NO_CLEAN_STATE = -1
"""The rollback bound when no check ever agreed: no checkpoint is at or before it."""
DIVERGED_KEEP = 16
"""(rank, life, node) of the SDC rollbacks a run remembers (``HangState.diverged``)."""


def on_sdc_verdict(st: Step, inp: VerdictIn) -> None:
    v, s, now = inp.verdict, st.s, inp.now
    ev: dict[str, Any] = {**v.evidence, "step": v.step, "rank": v.rank, "last_agreed": v.onset_step}
    if not st.holds("starts_sdc", inp):
        inc = s.incident
        if inc is None or inc.rule != SDC:  # an SDC incident in progress already answers it
            st.alert(AlertLevel.CRITICAL, SDC, f"run {s.run}: replicas diverged at step {v.step} while {s.phase}; "
                     "answered after the incident in progress (the next check reports it again)", v.message, ev)
        return
    if st.holds("sdc_repeats", inp):
        _persistent(st, inp, ev)
        return
    _open(st, v.step, v.onset_step, ev, now)
    bound = NO_CLEAN_STATE if v.onset_step is None else v.onset_step
    if st.holds("not can_roll_back"):
        ev["capabilities"] = [str(c) for c in s.capabilities]
        _halt(st, Trigger.ROLLBACK_UNSUPPORTED, f"{v.message}; the run cannot roll back", ev, now)
    elif st.holds("not within_budget", now):
        spent, ev["budget"] = budgets.spent(st.cfg, s, "rollback", now)
        _halt(st, Trigger.BUDGET_EXHAUSTED, f"{v.message}; {spent}", ev, now)
    elif st.holds("not rollback_target", bound):
        _halt(st, Trigger.NO_TARGET, f"{v.message}; no stable checkpoint at or before step {v.onset_step}", ev, now)
    else:
        target = rollback_target(st.cfg, s, bound)
        assert target is not None
        start_rollback(st, Trigger.SDC, target, v.message, ev, now)
        if v.rank is not None:  # its next divergence is a persistent SDC (sdc_repeats)
            seen = (v.rank, s.hang.life, sdc_node(s, v))
            s.hang = replace(s.hang, diverged=(*s.hang.diverged, seen)[-DIVERGED_KEEP:])
        st.alert(AlertLevel.CRITICAL, SDC, f"run {s.run}: replicas diverged at step {v.step}; rolling back to "
                 f"step {target.step}", v.message, ev)


def _persistent(st: Step, inp: VerdictIn, ev: dict[str, Any]) -> None:
    """The rank an SDC rollback named diverged again: evict its node (or a human, the rank named)."""
    v, s = inp.verdict, st.s
    assert v.rank is not None  # sdc_repeats holds only for a named rank
    node = sdc_node(s, v)
    ev.update({"cause": SDC, "persistent": True, "culprit": [v.rank], "node": node, "nodes": [node] if node else [],
               "diverged_before": [{"rank": r, "life": lf, "node": n} for r, lf, n in s.hang.diverged if r == v.rank]})
    known = f" (node {node})" if node else " (its node is not known: no node heartbeat of this life named it)"
    msg = f"step {v.step}: rank {v.rank} diverged again after a rollback: persistent silent data corruption{known}"
    starts = st.holds("starts_restart", inp)  # the table's eviction and its halts ask it
    assert starts, "sdc_repeats in a training phase is a restart"
    _decide(st, inp, ev, (node,) if node else (), (v.rank,), s.hang.life, v.step, msg)


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
