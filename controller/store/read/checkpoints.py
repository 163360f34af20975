"""Checkpoints a run reported and the controller's stability verdict on each."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from cliffguard.controller.store.models import CheckpointRow
from cliffguard.controller.store.read._rows import row_dict


def checkpoints(
    session: Session, run_id: str, *, kind: str | None = None, verified_only: bool = False
) -> list[dict[str, Any]]:
    """Checkpoints of a run, newest step first (``stable`` marks rollback candidates)."""
    stmt = select(CheckpointRow).where(CheckpointRow.run_id == run_id)
    if kind is not None:
        stmt = stmt.where(CheckpointRow.kind == kind)
    if verified_only:
        stmt = stmt.where(CheckpointRow.verified.is_(True))
    return [row_dict(r) for r in session.scalars(stmt.order_by(CheckpointRow.step.desc(), CheckpointRow.kind))]
