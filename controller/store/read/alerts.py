"""Alerts with their delivery state (the outbox), outbox totals and alert endpoints' state."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from cliffguard.controller.store.models import AlertEndpointStateRow, AlertRow, OutboxRow
from cliffguard.controller.store.read._rows import row_dict


def alerts(
    session: Session, run_id: str | None = None, *, incident_id: str | None = None, limit: int | None = 100
) -> list[dict[str, Any]]:
    """Alerts, newest first, each with ``deliveries``: one dict per outbox row for it (target,
    status, attempts, last_error, delivered_at, next_attempt_at), sorted by target."""
    stmt = select(AlertRow)
    if run_id is not None:
        stmt = stmt.where(AlertRow.run_id == run_id)
    if incident_id is not None:
        stmt = stmt.where(AlertRow.incident_id == incident_id)
    out = [row_dict(a) for a in session.scalars(stmt.order_by(AlertRow.ts.desc()).limit(limit))]
    if not out:
        return out
    by_id: dict[str, list[dict[str, Any]]] = {a["id"]: [] for a in out}
    rows = session.scalars(
        select(OutboxRow).where(OutboxRow.kind == "alert", OutboxRow.payload.in_([i.encode() for i in by_id]))
    )
    for o in rows:
        by_id[bytes(o.payload).decode()].append(
            {
                "target": o.target,
                "status": o.status,
                "attempts": o.attempts,
                "last_error": o.last_error,
                "delivered_at": o.delivered_at,
                "next_attempt_at": o.next_attempt_at,
            }
        )
    for a in out:
        a["deliveries"] = sorted(by_id[a["id"]], key=lambda d: d["target"])
    return out


def outbox_status(session: Session) -> dict[str, dict[str, int]]:
    """Outbox row counts: kind ("command"/"alert") -> status -> count."""
    out: dict[str, dict[str, int]] = {}
    for kind, status, n in session.execute(
        select(OutboxRow.kind, OutboxRow.status, func.count()).group_by(OutboxRow.kind, OutboxRow.status)
    ):
        out.setdefault(kind, {})[status] = int(n)
    return out


def alert_endpoints(session: Session) -> list[dict[str, Any]]:
    """One row per alert endpoint seen in the outbox or in the endpoint states, by name: endpoint,
    disabled, reason and ``counts`` (its outbox rows by status: delivered, pending, failed,
    disabled)."""
    rows: dict[str, dict[str, Any]] = {}

    def entry(name: str) -> dict[str, Any]:
        return rows.setdefault(name, {"endpoint": name, "disabled": False, "reason": None, "counts": {}})

    for target, status, n in session.execute(
        select(OutboxRow.target, OutboxRow.status, func.count())
        .where(OutboxRow.kind == "alert")
        .group_by(OutboxRow.target, OutboxRow.status)
    ):
        entry(target)["counts"][status] = int(n)
    for st in session.scalars(select(AlertEndpointStateRow)):
        entry(st.name).update(disabled=st.disabled, reason=st.disabled_reason)
    return [rows[k] for k in sorted(rows)]
