"""The suspect-node store's writes (issue 22: a node the controller evicted is not admitted again
until cleared), and the index the controller's edge checks beats against.

- ``record_suspect``: the controller's edge, for the machine's ``RecordSuspect`` (one row per eviction);
- ``clear_suspect``: ``cliffguard nodes clear`` (an operator) or a passing node check after
  ``ask_recheck`` (the controller): every open record of the node gets its clearing, audited;
- ``ask_recheck``: ``cliffguard nodes recheck``: the node may join again, on probation, and the next
  node check that passes with it clears it (audited);
- ``standing``: node -> what the store holds about it (``Standing``), for ``controller/suspects.py``
  and for the suspect-node list published to launchers (``controller/admission.py``). A device record
  (``device`` set: a device-level eviction) gives its node a record (evicted sooner) but does not
  refuse it: the node is admitted; the launch that evicted the device runs on without it, and a
  fresh launch of the node leaves it out too (``Standing.devices``, on the suspect-node list).

The reads for people (``cliffguard nodes``, the dashboard) are ``controller/store/read/suspects.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from cliffguard.controller.store.fit import fit_row
from cliffguard.controller.store.models import AuditRow, SuspectNodeRow


@dataclass(frozen=True, slots=True)
class Record:
    """An open record, as plain values (the edge keeps them across sessions)."""

    cause: str
    reason: str
    run_id: str
    incident_id: str | None
    since: float
    id: int | None = None
    """The row's id (the record a launcher's refusal names)."""
    device: int | None = None
    """A device-level record's slot on the node (None: the whole node)."""


@dataclass(frozen=True, slots=True)
class Standing:
    """What the store holds about one node: its newest open record (None: cleared, or never one)."""

    node: str
    open: Record | None
    recheck: bool
    """An operator asked to re-admit it on a passing node check (it may join, on probation)."""
    devices: tuple[Record, ...] = ()
    """Open device-level records (``Record.device`` set): the node is admitted, a fresh launch of it
    leaves these device slots out (cliffguard/admission.py)."""

    @property
    def refused(self) -> bool:
        """Suspect and not on probation: a run it beats in leaves it out."""
        return self.open is not None and not self.recheck


def record_suspect(session: Session, *, node: str, cause: str, reason: str, run_id: str, incident_id: str | None,
                   at: float, device: int | None = None) -> None:
    session.add(SuspectNodeRow(**fit_row(SuspectNodeRow, dict(
        node=node, device=device, cause=cause, reason=reason, run_id=run_id, incident_id=incident_id, since=at))))


def clear_suspect(session: Session, node: str, *, by: str, reason: str, now: float, run_id: str | None = None) -> int:
    """Clear every open record of ``node``; audited. Returns how many were open (0: nothing to clear,
    and no audit row)."""
    n = session.execute(update(SuspectNodeRow).where(SuspectNodeRow.node == node, SuspectNodeRow.cleared_at.is_(None))
                        .values(cleared_at=now, cleared_by=by[:128], clear_reason=reason)).rowcount
    if n:
        session.add(AuditRow(ts=now, actor=by[:128], action="nodes.clear", run_id=run_id,
                             detail={"node": node, "reason": reason, "records": n}))
    return int(n)


def ask_recheck(session: Session, node: str, *, by: str, now: float) -> int:
    """Let ``node`` join again on probation, cleared by the next node check that passes with it;
    audited. Returns its open records (0: not suspect, nothing done)."""
    n = session.execute(update(SuspectNodeRow).where(SuspectNodeRow.node == node, SuspectNodeRow.cleared_at.is_(None))
                        .values(recheck_at=now)).rowcount
    if n:
        session.add(AuditRow(ts=now, actor=by[:128], action="nodes.recheck", run_id=None,
                             detail={"node": node, "records": n}))
    return int(n)


def standing(session: Session) -> dict[str, Standing]:
    """Every node with a record (cleared or not): its newest open record and whether it is on probation."""
    out: dict[str, Standing] = {}
    devices: dict[str, dict[int, Record]] = {}
    for row in session.scalars(select(SuspectNodeRow).order_by(SuspectNodeRow.since, SuspectNodeRow.id)):
        cur = out.get(row.node)
        if row.device is not None:  # one device of the node: the node is still admitted (it has a record)
            if row.cleared_at is None:  # the newest open record of a slot speaks for it
                devices.setdefault(row.node, {})[row.device] = Record(
                    row.cause, row.reason, row.run_id, row.incident_id, row.since, row.id, row.device)
            if cur is None:
                out[row.node] = Standing(row.node, None, False)
            continue
        if row.cleared_at is None:  # the newest open record decides: an eviction after a recheck refuses again
            rec = Record(row.cause, row.reason, row.run_id, row.incident_id, row.since, row.id)
            out[row.node] = Standing(row.node, rec, row.recheck_at is not None)
        elif cur is None:
            out[row.node] = Standing(row.node, None, False)
    for node, slots in devices.items():
        out[node] = replace(out[node], devices=tuple(slots[d] for d in sorted(slots)))
    return out
