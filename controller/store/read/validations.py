"""Validation results (periodic and command-answering) and the samples the data rules flagged."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from cliffguard.controller.store.models import DataFlagRow, ValidationRow
from cliffguard.controller.store.read._rows import row_dict
from cliffguard.core.floats import from_store_kind


def validations(session: Session, run_id: str, *, limit: int | None = 500) -> list[dict[str, Any]]:
    """Validation results, oldest first (the newest ``limit``); a non-finite val_loss as a float."""
    rows = session.scalars(
        select(ValidationRow).where(ValidationRow.run_id == run_id).order_by(ValidationRow.ts.desc()).limit(limit)
    )
    out = []
    for r in rows:
        d = row_dict(r)
        if d["nonfinite"] is not None:
            d["val_loss"] = from_store_kind(d["nonfinite"])
        out.append(d)
    return out[::-1]


def data_flags(session: Session, run_id: str, *, limit: int | None = 200) -> list[dict[str, Any]]:
    """Samples the data rules flagged, newest first."""
    rows = session.scalars(select(DataFlagRow).where(DataFlagRow.run_id == run_id).order_by(DataFlagRow.ts.desc()).limit(limit))
    return [row_dict(r) for r in rows]
