"""The suspect-node store for people (``cliffguard nodes``, the dashboard's *Suspect nodes*): the
nodes the controller evicted, why and since when, and how each was cleared."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from cliffguard.controller.store.models import SuspectNodeRow
from cliffguard.controller.store.read._rows import row_dict

SUSPECT_COLUMNS = ("node", "cause", "reason", "run_id", "incident_id", "since", "recheck_at", "records", "cleared_at",
                   "cleared_by", "clear_reason")


def suspect_nodes(session: Session, *, cleared: bool = False, limit: int | None = 200) -> list[dict[str, Any]]:
    """Newest first: one row per eviction still open (``cleared``: every row, cleared ones too), with
    the model's columns and ``records``, the node's evictions in all (cleared or not)."""
    stmt = select(SuspectNodeRow)
    if not cleared:
        stmt = stmt.where(SuspectNodeRow.cleared_at.is_(None))
    rows = list(session.scalars(stmt.order_by(SuspectNodeRow.since.desc(), SuspectNodeRow.id.desc()).limit(limit)))
    if not rows:
        return []
    counts = {node: int(n) for node, n in session.execute(
        select(SuspectNodeRow.node, func.count()).where(SuspectNodeRow.node.in_({r.node for r in rows}))
        .group_by(SuspectNodeRow.node))}
    return [{**row_dict(r, exclude=("id",)), "records": int(counts.get(r.node, 0))} for r in rows]
