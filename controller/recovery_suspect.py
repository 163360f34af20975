"""The recovery machine's side of the suspect-node store (issue 22: evict, then diagnose).

A node the machine evicted (a bad rank, a rank out of transient budget, a hang's culprit that hung
again, a failed node check) is recorded suspect by ``recovery_hang._decide`` (``RecordSuspect``;
``controller/suspects.py`` writes the row). Here, what the machine does when such a node shows up
again, and when a node check clears one:

- ``on_suspect_joined``: a suspect node beats in a run (``SuspectJoinedIn``: its node heartbeat named
  it and the store holds it suspect). It is not admitted: while running, recovering or rejoining the
  worker group restarts without it (``suspect_node``, the eviction's restart path); with no restart to
  give, or a node that cannot be left out, a human is called, the node named (the table's halts).
  In any other phase (an incident of another kind under way, restarting, halted) a critical alert
  says the node is there: the machine has no move to make then. Each node is answered once per
  life of the worker group (``HangState.suspects``), so its next beats add nothing.
- ``on_check_cleared``: a node check passed on suspect nodes an operator asked to re-admit
  (``cliffguard nodes recheck``): they are cleared (``ClearSuspect``).
"""

from __future__ import annotations

from dataclasses import replace

from cliffguard.controller.recovery_hang import SUSPECT, _decide
from cliffguard.controller.recovery_hang_types import ClearSuspect, NodeCheckIn, SuspectJoinedIn
from cliffguard.controller.recovery_step import SUSPECTS_KEEP, Step
from cliffguard.core.enums import AlertLevel


def on_suspect_joined(st: Step, inp: SuspectJoinedIn) -> None:
    s = st.s
    if inp.life is not None and inp.life != s.hang.life:
        return  # a beat of another life (the torn-down one's last, or one not started here yet)
    if (inp.node, s.hang.life) in s.hang.suspects:
        return  # answered in this life already (or recorded by this run's own incident)
    s.hang = replace(s.hang, suspects=(*s.hang.suspects, (inp.node, s.hang.life))[-SUSPECTS_KEEP:])
    ev = {"cause": SUSPECT, "node": inp.node, "nodes": [inp.node], "life": s.hang.life,
          "record": {"cause": inp.cause, "why": inp.why, "since": inp.since, "run": inp.record_run,
                     "incident": inp.record_incident}}
    msg = (f"node {inp.node} is suspect since {inp.since:.0f} ({inp.cause}, run {inp.record_run}: {inp.why}) "
           "and is not admitted until cleared (cliffguard nodes clear)")
    if not st.holds("starts_restart", inp):
        st.alert(AlertLevel.CRITICAL, SUSPECT, f"run {s.run}: suspect node {inp.node} is in life {s.hang.life} "
                 f"while {s.phase}; it is left out at the next restart, or by hand", msg, ev)
        return
    _decide(st, inp, ev, (inp.node,), (), s.hang.life, max(s.last_step, 0), msg)


def on_check_cleared(st: Step, inp: NodeCheckIn) -> None:
    if not inp.ok or not inp.rechecking:
        return
    nodes = tuple(sorted(set(inp.rechecking)))
    why = f"node check of life {inp.life} passed on run {st.s.run}: {inp.detail}"
    st.actions.append(ClearSuspect(nodes=nodes, reason=why[:500], at=inp.now))
    st.alert(AlertLevel.INFO, SUSPECT, f"run {st.s.run}: node{'s' if len(nodes) > 1 else ''} {', '.join(nodes)} "
             "passed a node check and is admitted again", why, {"nodes": list(nodes), "life": inp.life})
