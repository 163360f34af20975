"""The controller's edge to the suspect-node store (issue 22, item 4: a node the controller evicted
is not admitted again until an operator or a passing node check clears it).

Where admission is enforced: every node's heartbeat names its node and life (agent/lifecycle.py
``beat``; the node's leader speaks for the node), from the first seconds of each life of a worker
group, whether a fresh job or a restarted one. ``SuspectIndex.inputs`` turns the beat of a node the
store holds suspect into a ``SuspectJoinedIn`` for the run's recovery machine, which leaves the
node out through the eviction's restart path or calls a human naming it
(``controller/recovery_suspect.py``). The index is the store's ``standing`` read again at most every
``REFRESH_S`` seconds (a clear from the CLI takes effect within that), and at once after this
controller wrote to it; a heartbeat costs one dict lookup.

It also hands the machine what the store knows for two other inputs (``annotate``): a transient or
bad rank's node with a record (``TriagedIn.node_record``: evicted sooner) and, on a node check, the
suspect nodes an operator asked to re-admit on a passing one (``NodeCheckIn.rechecking``). The
machine's ``RecordSuspect`` and ``ClearSuspect`` are written here (``apply``), in the batch's
transaction.

A device-level eviction's record (``RecordSuspect.device``: one device of a node that ran several
ranks) names the node and the device slot; it gives the node a record but does not refuse it (the
store's ``standing``): the node is admitted and the launch that evicted the device runs on without it
(cliffguard/commands/train.py). A fresh launch of that node reads the slot on the suspect-node
list and leaves the device out too (cliffguard/admission.py), until ``cliffguard nodes clear``.

The heartbeat refusal is the second line: a launcher first reads the suspect-node list the
controller publishes (``controller/admission.py``) and refuses to start on a suspect node before it
joins the rendezvous (``cliffguard/admission.py``); a launcher that could not read the list (broker
away, timeout, no key, ``--no-admission-check``) starts anyway and is caught here at its first beat.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from sqlalchemy.orm import Session

from cliffguard.controller.recovery_hang_types import (
    ClearSuspect,
    NodeCheckIn,
    RecordSuspect,
    SuspectJoinedIn,
)
from cliffguard.controller.recovery_types import Input, TriagedIn
from cliffguard.controller.store.suspects import Standing, clear_suspect, record_suspect, standing
from cliffguard.core.enums import EventType
from cliffguard.core.events import Event

log = logging.getLogger(__name__)

REFRESH_S = 10.0
"""How stale the edge's copy of the store may be: a node cleared or asked to recheck from the CLI (or
recorded by another controller instance) is seen within this many seconds."""
CHECK_CLEARED_BY = "node check"
_HEARTBEAT = EventType.HEARTBEAT


class SuspectIndex:
    def __init__(self, refresh_s: float = REFRESH_S) -> None:
        self.refresh_s = refresh_s
        self._nodes: dict[str, Standing] = {}
        self._read_at = float("-inf")
        self.writes = 0
        """Records and clears this edge wrote (the service wakes the suspect-node list's publisher,
        controller/admission.py, after a commit that moved it)."""

    def refresh(self, session: Session, now: float) -> None:
        """Read the store again when the copy is older than ``refresh_s`` (or this edge wrote to it)."""
        if now - self._read_at < self.refresh_s:
            return
        self._nodes = standing(session)
        self._read_at = now

    def inputs(self, ev: Event, now: float) -> list[Input]:
        """A ``SuspectJoinedIn`` when ``ev`` is the heartbeat of a node the store refuses."""
        if ev.type is not _HEARTBEAT or not self._nodes:
            return []
        node = ev.data.get("node")
        st = self._nodes.get(node) if isinstance(node, str) else None
        if st is None or not st.refused or st.open is None:
            return []
        rec, life = st.open, ev.data.get("life")
        return [SuspectJoinedIn(node=st.node, life=life if isinstance(life, int) else None, cause=rec.cause,
                                why=rec.reason, since=rec.since, record_run=rec.run_id,
                                record_incident=rec.incident_id, now=now)]

    def annotate(self, inp: Input) -> Input:
        """``inp`` with what the store knows of its nodes (see the module docstring)."""
        if type(inp) is TriagedIn and inp.node and inp.node in self._nodes:
            return replace(inp, node_record=True)
        if type(inp) is NodeCheckIn and inp.ok and inp.nodes:
            again = tuple(n for n in dict.fromkeys(inp.nodes)
                          if (st := self._nodes.get(n)) is not None and st.open is not None and st.recheck)
            return replace(inp, rechecking=again) if again else inp
        return inp

    def apply(self, session: Session, run_id: str, act: RecordSuspect | ClearSuspect) -> None:
        """Write the machine's action; the next batch reads the store again."""
        if isinstance(act, RecordSuspect):
            record_suspect(session, node=act.node, cause=act.cause, reason=act.reason, run_id=run_id,
                           incident_id=act.incident_id, at=act.at, device=act.device)
            if act.device is not None:
                log.error("run %s: device %d of node %s recorded suspect (%s): the node is still admitted, the "
                          "device left out of this launch and of the node's next ones until cleared (cliffguard nodes clear); "
                          "the node has a record (evicted sooner)", run_id,
                          act.device, act.node, act.cause)
            else:
                log.error("run %s: node %s recorded suspect (%s): not admitted again until cleared "
                          "(cliffguard nodes clear %s)", run_id, act.node, act.cause, act.node)
        else:
            for node in act.nodes:
                clear_suspect(session, node, by=CHECK_CLEARED_BY, reason=act.reason, now=act.at, run_id=run_id)
                log.warning("run %s: suspect node %s cleared: %s", run_id, node, act.reason)
        self._read_at = float("-inf")
        self.writes += 1
