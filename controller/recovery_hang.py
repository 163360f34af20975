"""The recovery machine's hang handlers: from the hang rule's verdict (or a failed node check) to
a restarted worker group training again, or to a human (``controller/recovery_table.py``
declares every move; this walks them).

- ``on_restart_verdict``: a culprit named (controller/rules/hang.py). The remedy is the table's:
  restart the worker group in place; without the culprit's node when that node hung before
  within ``repeat_window_s`` (or failed a node check) and the run keeps ``min_nodes`` without it;
  halt when torchrun has no restart left, the restart budget is spent, or the node cannot be left
  out, or the eviction budget (restarts that leave a node out: ``controller/recovery_budgets.py``) is
  spent, the node named. The ``restart`` command goes to rank 0 of the hung life, which leaves at once
  (agent/hang/part.py); a life torchrun already restarted (a rank that died) gets none.
- A bad rank, one over its transient budget, or a persistent SDC on a node that runs more than one
  rank (``device_only``: the node's heartbeats of this life named the rank's device slot) leaves out
  only that device: the ``restart`` command's ``exclude_devices`` names (node, slot), the node stays
  and its launcher starts torchrun again with one process fewer; the incident and the alert say
  "device N of node X left out (the node keeps M)", and the record names the device. The hangs'
  culprits (hang_again, a failed node check, a suspect node) stay at node granularity.
- ``on_started``: the next life's ``run.started`` is the restart begun (``restarting`` ->
  ``rejoining``; the old life's memory snapshots died with it); after a halt, a new life means
  someone restarted the job.
- ``on_node_check``: a restarted group's check passed (noted) or found a slow node (restart
  without it, or halt).
- ``on_progress``: the restarted group's first step is training again: the incident closes
  ``restarted``.
- ``on_tick``: no restarted group trained within ``restart_timeout_s``: halt.

Every move is a transition row with its time: the hang's detection (the first evidence's time
is in the incident's evidence), the culprit named (the incident opened), the restart begun and
training again, the marks the goodput ledger books the hang and the restart by.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cliffguard.controller import recovery_budgets as budgets
from cliffguard.controller.recovery_hang_types import NodeCheckIn, Restart, SuspectJoinedIn
from cliffguard.controller.recovery_state import Incident
from cliffguard.controller.recovery_step import Step, record_suspects
from cliffguard.controller.recovery_table import culprit_device, transient_budget_of
from cliffguard.controller.recovery_types import (
    OpenIncident,
    Phase,
    ProgressIn,
    RunEndedIn,
    SendCommand,
    StartedIn,
    TickIn,
    TriagedIn,
    Trigger,
    VerdictIn,
)
from cliffguard.controller.rules.sdc import SDC
from cliffguard.core.enums import AlertAction, AlertLevel, CheckpointKind, CommandType, IncidentOutcome, Level

EVICTION = "bad_rank"
"""The rule of an eviction's incident: a rank the kit's re-runs found wrong whatever shard it gets."""
SUSPECT = "suspect_node"
"""The rule of the incident of a suspect node found in a run (controller/recovery_suspect.py)."""
HANGS_KEEP = 32
HANG_PHASES = (Phase.RESTARTING, Phase.REJOINING)


def on_restart_verdict(st: Step, inp: VerdictIn) -> None:
    v, s = inp.verdict, st.s
    if not st.holds("starts_restart", inp):
        if s.phase not in HANG_PHASES:  # mid-restart a second verdict is the same hang's echo
            st.alert(AlertLevel.CRITICAL, v.rule, f"hang on run {s.run} at step {v.step} while {s.phase}: "
                     "no automatic restart from this phase", v.message, dict(v.evidence))
        return
    ev = dict(v.evidence)
    nodes = tuple(str(n) for n in ev.get("nodes") or ())
    life = int(ev.get("life", s.hang.life))
    _decide(st, inp, ev, nodes, tuple(int(r) for r in ev.get("culprit") or ()), life, v.step, v.message)


def on_bad_rank(st: Step, inp: TriagedIn) -> None:
    """A bad rank (``step.triaged``), or one whose transient faults reached the budget: evict it,
    i.e. restart the worker group without its node."""
    s = st.s
    flaky = inp.cls != "bad_rank"
    ev = {"cause": EVICTION, "class": inp.cls, "rank": inp.rank, "node": inp.node, "reason": inp.reason, "reruns": inp.reruns,
          "rerun_s": inp.rerun_s, "culprit": [] if inp.rank is None else [inp.rank], "nodes": [inp.node] if inp.node else [],
          "reruns_by_rank": inp.evidence}
    if not st.holds("starts_restart", inp):
        if s.incident is not None and s.incident.rule == EVICTION:
            return  # the eviction (or its halt) in progress answers the next bad steps of that rank
        st.alert(AlertLevel.CRITICAL, EVICTION, f"run {s.run}: rank {inp.rank} is bad at step {inp.step} while "
                 f"{s.phase}; evicted after the incident in progress, or by hand", inp.reason, ev)
        return
    if flaky:
        n = inp.transient_counts.get(str(inp.rank), 0)
        ev["transient_count"] = n
        record = ", lower: its node has a record" if inp.node_record else ""
        msg = (f"step {inp.step}: rank {inp.rank}'s transient fault {n} in this life (budget "
               f"{transient_budget_of(st.cfg, inp)}{record}): a rank this flaky is bad")
    else:
        msg = f"step {inp.step} re-run {inp.reruns}x: rank {inp.rank} is bad ({inp.reason})"
    _decide(st, inp, ev, (inp.node,) if inp.node else (), () if inp.rank is None else (inp.rank,), s.hang.life,
            inp.step, msg)


def on_node_check(st: Step, inp: NodeCheckIn) -> None:
    s = st.s
    ev = {"ok": inp.ok, "life": inp.life, "slow": list(inp.slow), "slow_nodes": list(inp.slow_nodes),
          "detail": inp.detail}
    if inp.ok:
        if s.phase is Phase.REJOINING:
            r = s.hang.restart
            if r is not None:
                s.hang = replace(s.hang, restart=replace(r, check=inp.detail))
            st.move(Trigger.NODE_CHECK_PASSED, f"node check of life {inp.life} passed: {inp.detail}", ev, inp.now)
        return
    if not st.holds("starts_restart", inp):
        st.alert(AlertLevel.WARN, "node_check", f"run {s.run}: node check of life {inp.life} failed while {s.phase}",
                 inp.detail, ev)
        return
    msg = f"node check of life {inp.life} found ranks {list(inp.slow)} slow (nodes {', '.join(inp.slow_nodes)}): {inp.detail}"
    _decide(st, inp, {**ev, "cause": "hang", "culprit": list(inp.slow), "nodes": list(inp.slow_nodes)},
            inp.slow_nodes, inp.slow, inp.life, max(s.last_step, 0), msg)


def _decide(st: Step, inp: VerdictIn | NodeCheckIn | TriagedIn | SuspectJoinedIn, ev: dict[str, Any],
            nodes: tuple[str, ...], ranks: tuple[int, ...], life: int, step: int, message: str) -> None:
    """The table's remedy for a named culprit (see the module docstring); a bad rank the kit's
    re-runs found (``TriagedIn``), a rank that diverged again after an SDC rollback (an SDC
    ``VerdictIn``: recovery_sdc.py) and a suspect node's beat (``SuspectJoinedIn``) are always left out."""
    s, now = st.s, inp.now
    check = isinstance(inp, NodeCheckIn)
    sdc = isinstance(inp, VerdictIn) and inp.verdict.rule == SDC
    evict = isinstance(inp, TriagedIn) or sdc
    suspect = isinstance(inp, SuspectJoinedIn)
    exclude = False
    device: tuple[int, int] | None = None  # (slot, ranks on the node): a device-level eviction
    spent: dict[str, Any] | None = None
    if not st.holds("can_restart"):
        trigger, why = Trigger.RESTART_UNAVAILABLE, (f"torchrun has no restart left (--max-restarts "
                                                     f"{s.hang.max_restarts}, life {s.hang.life})"
                                                     if s.can(CommandType.RESTART) else "the run cannot apply a restart")
    elif not st.holds("within_restart_budget", now):
        trigger = Trigger.RESTART_BUDGET_SPENT
        why, spent = budgets.spent(st.cfg, s, "restart", now)
    elif st.holds("wants_exclusion", inp, nodes, now):
        if evict and st.holds("device_only", inp, nodes):
            device = culprit_device(s, inp)
        what_out = f"node {', '.join(nodes)}" if device is None else f"device {device[0]} of node {nodes[0]}"
        if st.holds("can_exclude", nodes, device is not None) and not st.holds("within_evict_budget", now):
            trigger = Trigger.EVICT_BUDGET_SPENT
            why, spent = budgets.spent(st.cfg, s, "evict", now)
            why = f"{what_out} should be left out, but {why}: a human decides (evict it by hand)"
        elif st.held["can_exclude"] and device is not None:
            trigger = Trigger.SDC_AGAIN_DEVICE if sdc else Trigger.EVICT_DEVICE
            left_out = f"device {device[0]} of node {nodes[0]} left out (the node keeps {device[1] - 1})"
            why, exclude = f"restarting with {left_out}", True
            ev = {**ev, "scope": "device", "device": device[0], "node_devices": device[1], "left_out": left_out}
        elif st.held["can_exclude"]:
            trigger = (Trigger.SDC_AGAIN if sdc else Trigger.EVICT if evict else Trigger.SUSPECT_NODE if suspect
                       else Trigger.NODE_CHECK_FAILED if check else Trigger.HANG_AGAIN)
            why, exclude = (f"restarting without node{'s' if len(nodes) > 1 else ''} {', '.join(nodes)}"
                            + ("" if check or evict or suspect
                               else f" (it hung again within {st.cfg.repeat_window_s:.0f} s)")), True
            if evict:
                ev = {**ev, "scope": "node"}
        else:
            trigger, why = Trigger.EXCLUDE_UNAVAILABLE, (
                f"node {', '.join(nodes) or '?'} should be left out, but the run cannot keep "
                f"{s.hang.min_nodes} node(s) without it ({s.hang.nodes} now)" if nodes
                else "the culprit's node is unknown, so it cannot be left out")
    else:
        trigger, why = Trigger.HANG, "restarting the worker group in place from the newest checkpoint"
    rule = SDC if sdc else EVICTION if evict else SUSPECT if suspect else "hang"
    if spent is not None:
        ev = {**ev, "budget": spent}
    _open(st, ev, step, now, rule=rule)
    reason = f"{message}; {why}"
    s.hang = replace(s.hang, hangs=(*s.hang.hangs, *((n, now) for n in nodes if n))[-HANGS_KEEP:])
    if (evict or check or exclude) and not suspect:  # judged bad by its own evidence (not a first hang)
        cause = (inp.cls if isinstance(inp, TriagedIn) else SDC if sdc else "node_check_failed" if check
                 else "hang_again")
        record_suspects(st, nodes, cause, reason, now, device=device[0] if device is not None and exclude else None)
    if trigger is Trigger.RESTART_UNAVAILABLE and (evict or suspect) and s.phase is not Phase.REJOINING:
        # the guard keeps skipping a bad rank's updates; leaving the node is a human's call now
        what = ("the diverged replica trains on" if sdc else "its guard skips the bad rank's updates" if evict
                else "the suspect node trains with it")
        st.halt(trigger, f"{reason}; the job is left running ({what}): evict node "
                f"{', '.join(nodes) or '(unknown)'} by hand", ev, now)
        return
    if trigger is Trigger.RESTART_UNAVAILABLE and s.phase is not Phase.REJOINING:
        # No restart to give it: halting the job would turn a stall that ends by itself (a rank
        # stopped for seconds, a slow filesystem) into a dead run, and a real hang fails at the
        # collective timeout anyway. A human is told; the job is left running (the soak: a rank
        # SIGSTOPped 12.5 s on a run without restarts was halted at step 376 of 600).
        st.halt(trigger, f"{reason}; the job is left running (a stall that ends by itself trains on, one "
                "that does not fails at the collective timeout)", ev, now)
        s.hang = replace(s.hang, left_running=s.incident.id if s.incident is not None else None)
        return
    if trigger in (Trigger.RESTART_UNAVAILABLE, Trigger.RESTART_BUDGET_SPENT, Trigger.EXCLUDE_UNAVAILABLE,
                   Trigger.EVICT_BUDGET_SPENT):
        st.halt(trigger, reason, ev, now)
        _send_restart(st, "halt", life, ranks, (), reason, now, nodes)
        return
    st.move(trigger, reason, ev, now, step=step)
    mode = "exclude" if exclude else "in_place"
    gone = () if device is not None else nodes  # a device-level eviction leaves every node in
    out_devices = ((nodes[0], device[0]),) if device is not None and exclude else ()
    s.hang = replace(s.hang, restart_times=(*s.hang.restart_times, now)[-max(st.cfg.restart_budget, 1) * 2:])
    budgets.note(st.cfg, s, "restart", now)
    if exclude:
        budgets.note(st.cfg, s, "evict", now)
    if s.hang.life > life:  # torchrun restarted that life already (a rank died): no command to send
        s.hang = replace(s.hang, restart=Restart(mode=mode, life=life, at=now, ranks=ranks, nodes=nodes,
                                                 exclude=gone if exclude else (), started_at=now))
        st.move(Trigger.WORKERS_STARTED, f"torchrun restarted the worker group already (life {s.hang.life})",
                {"life": s.hang.life}, now)
        _forget_memory(st)
    else:
        _send_restart(st, mode, life, ranks, gone if exclude else (), reason, now, nodes, out_devices)
    what = "a persistent SDC" if sdc else "a bad rank" if evict else "a suspect node" if suspect else "hang"
    left = (f": device {device[0]} of node {nodes[0]} left out (the node keeps {device[1] - 1})"
            if out_devices and device is not None else "")
    st.alert(AlertLevel.CRITICAL, rule,
             f"{what} on run {s.run} at step {step}: {mode.replace('_', ' ')} restart{left}", reason, ev)


def _open(st: Step, ev: dict[str, Any], step: int, now: float, rule: str = "hang") -> None:
    """Open the hang's (or an eviction's) incident (closing a recovering rollback's first); in
    rejoining, or recovering from an incident of the same rule (an SDC's rollback), continue it."""
    s = st.s
    if s.phase is Phase.REJOINING and s.incident is not None:
        return
    if s.phase is Phase.RECOVERING and s.incident is not None and s.incident.rule == rule:
        return
    if s.phase is Phase.RECOVERING and s.incident is not None:
        st.close(IncidentOutcome.ROLLED_BACK, now)  # it rolled back and trained on; the hang is a new failure
    inc = Incident(id=s.new_id("incident"), rule=rule, level=str(Level.CRITICAL), spike_step=step, onset_step=step,
                   opened_at=now, evidence=ev)
    s.incident = inc
    st.actions.append(OpenIncident(id=inc.id, rule=rule, level=inc.level, spike_step=step, onset_step=step,
                                   opened_at=now, evidence=ev))


def _send_restart(st: Step, mode: str, life: int, ranks: tuple[int, ...], exclude: tuple[str, ...], reason: str,
                  now: float, nodes: tuple[str, ...], devices: tuple[tuple[str, int], ...] = ()) -> None:
    """The ``restart`` command: a side request (no ack awaited; the next life's ``run.started`` is
    the answer), so it takes no pending slot."""
    s = st.s
    if mode == "halt" and not s.can(CommandType.RESTART):
        return
    if mode != "halt":
        s.hang = replace(s.hang, restart=Restart(mode=mode, life=life, at=now, ranks=ranks, nodes=nodes,
                                                 exclude=exclude))
    cmd_id = s.new_id("cmd")
    s.issued = (*s.issued, cmd_id)[-32:]
    args: dict[str, Any] = {"mode": mode, "life": life, "ranks": list(ranks), "reason": reason[:300],
                            "incident": s.incident.id if s.incident else ""}
    if exclude:
        args["exclude_nodes"] = list(exclude)
    if devices:
        args["exclude_devices"] = [{"node": n, "slot": slot} for n, slot in devices]
    st.actions.append(SendCommand(id=cmd_id, type=CommandType.RESTART, args=args,
                                  incident_id=s.incident.id if s.incident else None, attempt=1,
                                  ttl_s=st.cfg.policy.command_ttl_s, reason=reason[:300]))


def _forget_memory(st: Step) -> None:
    st.s.checkpoints = tuple(c for c in st.s.checkpoints if c.kind != CheckpointKind.MEMORY)


def on_started(st: Step, inp: StartedIn) -> None:
    s = st.s
    s.hang = s.hang.started(inp.life, inp.max_restarts, inp.restarts_left, inp.nodes, inp.min_nodes)
    if s.phase is Phase.RESTARTING:
        r = s.hang.restart
        if r is not None:
            s.hang = replace(s.hang, restart=replace(r, started_at=inp.now))
        st.move(Trigger.WORKERS_STARTED, f"worker group life {inp.life} started ({inp.nodes} node(s))",
                {"life": inp.life, "nodes": inp.nodes, "max_restarts": inp.max_restarts}, inp.now)
        _forget_memory(st)
    elif s.phase is Phase.HALTED and s.incident is not None:
        inc = s.incident
        st.move(Trigger.WORKERS_STARTED, f"worker group life {inp.life} started while halted: the job was restarted",
                {"life": inp.life}, inp.now)
        st.close(IncidentOutcome.HALTED, inp.now)
        st.alert(AlertLevel.INFO, inc.rule, f"run {s.run} started again after a halt", f"life {inp.life}", {},
                 action=AlertAction.RESOLVE)
        s.incident = None
        s.pending = None


def on_progress(st: Step, inp: ProgressIn) -> None:
    """A step while rejoining: the restarted group trains again."""
    s = st.s
    inc, r = s.incident, s.hang.restart
    s.last_step = inp.step
    s.checkpoints = tuple(c for c in s.checkpoints if c.step <= inp.step)
    s.unhealthy_steps = tuple(u for u in s.unhealthy_steps if u <= inp.step)
    ev = {"step": inp.step, "life": s.hang.life, "mode": r.mode if r else None,
          "restart_s": round(inp.now - r.at, 3) if r else None, "check": r.check if r else ""}
    st.move(Trigger.TRAINING_AGAIN, f"worker group life {s.hang.life} trains again at step {inp.step}", ev, inp.now,
            step=inp.step)
    s.hang = replace(s.hang, restart=None)
    if inc is not None:
        st.close(IncidentOutcome.RESTARTED, inp.now)
        st.alert(AlertLevel.INFO, inc.rule, f"run {s.run} trains again after a restart",
                 f"life {s.hang.life} at step {inp.step}", ev, action=AlertAction.RESOLVE)
    s.incident = None


def on_trains_on(st: Step, inp: ProgressIn) -> None:
    """The stall a halt left running ended by itself: the run is running again, and the halted
    incident says so (``resumed``), so the next fault gets an incident of its own rather than being
    absorbed by a halt nobody needs to answer any more (the soak's seed 102: a rank stopped 9 s on a
    run with no restart left, then an LR blow-up that no rule could act on)."""
    s = st.s
    inc = s.incident
    assert inc is not None
    ev = {"step": inp.step, "hung_at": inc.spike_step}
    st.move(Trigger.TRAINING_AGAIN, f"trains again at step {inp.step}: the stall at step {inc.spike_step} ended "
            "by itself", ev, inp.now, step=inp.step)
    s.hang = replace(s.hang, left_running=None)
    st.close(IncidentOutcome.RESUMED, inp.now)
    s.previous = None  # a stall that ended says nothing of the loss: no rung for the next excursion
    st.alert(AlertLevel.INFO, inc.rule, f"run {s.run} trains again after a stall",
             f"the stall at step {inc.spike_step} ended by itself; step {inp.step}", ev, action=AlertAction.RESOLVE)
    s.incident = None


def on_run_ended(st: Step, inp: RunEndedIn) -> None:
    s = st.s
    which = "the torn-down life" if s.phase is Phase.RESTARTING else "the restarted life before its first step"
    st.move(Trigger.RUN_ENDED, f"{which} ended ({inp.detail or ('failed' if inp.failed else 'finished')}); "
            "waiting for torchrun's next life", {"failed": inp.failed, "detail": inp.detail}, inp.now)


def on_tick(st: Step, inp: TickIn) -> None:
    s = st.s
    if not st.holds("restart_timed_out", inp.now):
        return
    r = s.hang.restart
    assert r is not None
    why = (f"no restarted worker group trained within {st.cfg.restart_timeout_s:.0f} s of the {r.mode} restart of "
           f"life {r.life}")
    ev = {"life": r.life, "mode": r.mode, "waited_s": round(inp.now - r.at, 1)}
    st.halt(Trigger.RESTART_TIMED_OUT, why, ev, inp.now)
    s.hang = replace(s.hang, restart=None)
    _send_restart(st, "halt", s.hang.life, r.ranks, (), why, inp.now, r.nodes)
