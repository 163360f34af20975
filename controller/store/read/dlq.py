"""Dead-letter counters (events the controller could not decode or apply)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from cliffguard.controller.store.models import DlqCountRow
from cliffguard.controller.store.read._rows import row_dict


def dlq_counts(session: Session) -> list[dict[str, Any]]:
    """Dead-letter counters: topic, reason, count, last_ts, last_detail; largest count first."""
    rows = session.scalars(select(DlqCountRow).order_by(DlqCountRow.count.desc(), DlqCountRow.topic, DlqCountRow.reason))
    return [row_dict(r) for r in rows]
