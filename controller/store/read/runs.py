"""Runs and their newest heartbeat per rank."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controller.store.models import Heartbeat, Run
from controller.store.read._rows import row_dict


def list_runs(session: Session, *, limit: int | None = 100) -> list[dict[str, Any]]:
    """Runs, most recently active first (without the bulky ``controller_state``)."""
    rows = session.scalars(select(Run).order_by(Run.last_event_ts.desc().nulls_last(), Run.id).limit(limit))
    return [row_dict(r, exclude=("controller_state",)) for r in rows]


def get_run(session: Session, run_id: str) -> dict[str, Any] | None:
    """One run with every column (``config`` is the run.started payload), or None."""
    run = session.get(Run, run_id)
    return None if run is None else row_dict(run)


def heartbeats(session: Session, run_id: str) -> list[dict[str, Any]]:
    """The newest heartbeat per rank: run_id, rank, ts, step, state; ordered by rank."""
    rows = session.scalars(select(Heartbeat).where(Heartbeat.run_id == run_id).order_by(Heartbeat.rank))
    return [row_dict(r) for r in rows]
