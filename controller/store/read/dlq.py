"""Dead-letter counters (events the controller could not decode or apply)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from cliffguard.controller.store.models import DlqCountRow, DlqRunRow
from cliffguard.controller.store.read._rows import row_dict


def dlq_counts(session: Session) -> list[dict[str, Any]]:
    """Dead-letter counters: topic, reason, count, last_ts, last_detail; largest count first."""
    rows = session.scalars(select(DlqCountRow).order_by(DlqCountRow.count.desc(), DlqCountRow.topic, DlqCountRow.reason))
    return [row_dict(r) for r in rows]


def dlq_runs(session: Session, run: str | None = None) -> list[dict[str, Any]]:
    """Runs whose events are being dead-lettered: run_id, reason, count, first_ts, last_ts,
    last_detail; the most recent first (``run``: that run's only)."""
    q = select(DlqRunRow).order_by(DlqRunRow.last_ts.desc(), DlqRunRow.run_id, DlqRunRow.reason)
    if run is not None:
        q = q.where(DlqRunRow.run_id == run)
    return [row_dict(r) for r in session.scalars(q)]
