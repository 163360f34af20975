"""Commands (controller and operator, with their acks) and the operator audit log."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from cliffguard.controller.store.models import AuditRow, CommandRow
from cliffguard.controller.store.read._rows import row_dict


def commands(
    session: Session, run_id: str | None = None, *, incident_id: str | None = None, limit: int | None = 200
) -> list[dict[str, Any]]:
    """Commands issued (controller and operator) and their ack status, newest first."""
    stmt = select(CommandRow)
    if run_id is not None:
        stmt = stmt.where(CommandRow.run_id == run_id)
    if incident_id is not None:
        stmt = stmt.where(CommandRow.incident_id == incident_id)
    return [row_dict(r) for r in session.scalars(stmt.order_by(CommandRow.issued_at.desc()).limit(limit))]


def audit_log(session: Session, run_id: str | None = None, *, limit: int | None = 100) -> list[dict[str, Any]]:
    """Operator actions, newest first."""
    stmt = select(AuditRow)
    if run_id is not None:
        stmt = stmt.where(AuditRow.run_id == run_id)
    return [row_dict(r) for r in session.scalars(stmt.order_by(AuditRow.ts.desc()).limit(limit))]
