"""Operator requests, newest first: what the dashboard's operator section lists."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from cliffguard.controller.store.models import CommandRequestRow

REQUEST_COLUMNS = ["id", "requested_at", "requested_by", "source", "type", "status", "detail", "command_id"]


def recent_requests(session: Session, run_id: str, limit: int = 10) -> list[dict[str, Any]]:
    """The newest requests for ``run_id`` (newest first), as the columns of ``REQUEST_COLUMNS``."""
    rows = session.execute(
        select(*(getattr(CommandRequestRow, c) for c in REQUEST_COLUMNS))
        .where(CommandRequestRow.run_id == run_id)
        .order_by(CommandRequestRow.requested_at.desc(), CommandRequestRow.id.desc())
        .limit(limit)
    ).all()
    return [dict(zip(REQUEST_COLUMNS, r, strict=True)) for r in rows]
