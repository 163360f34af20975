"""Elastic scale changes of a run and the world / global batch it trained at over time."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from cliffguard.controller.store.models import ElasticEventRow, RunRow
from cliffguard.controller.store.read._rows import row_dict


def elastic_events(session: Session, run_id: str, *, limit: int | None = 500) -> list[dict[str, Any]]:
    """Scale changes, oldest first (the newest ``limit``)."""
    rows = session.scalars(select(ElasticEventRow).where(ElasticEventRow.run_id == run_id)
                           .order_by(ElasticEventRow.ts.desc(), ElasticEventRow.id.desc()).limit(limit))
    return [row_dict(r) for r in rows][::-1]


def scale_timeline(session: Session, run_id: str) -> list[dict[str, Any]]:
    """``{step, ts, world, global_batch}`` from the run's start, then one point per scale change
    (oldest first): the world and batch hold from each point to the next. Empty for an unknown run."""
    run = session.get(RunRow, run_id)
    if run is None:
        return []
    events = elastic_events(session, run_id, limit=None)
    # run.config is the newest run.started's payload: after a scale change it is the new world's.
    start_batch = events[0]["from_global_batch"] if events else (run.config or {}).get("global_batch")
    start_world = events[0]["from_world"] if events else run.world_size
    first = {"step": 0, "ts": None, "world": start_world, "global_batch": start_batch}
    return [first, *({"step": e["step"], "ts": e["ts"], "world": e["to_world"], "global_batch": e["global_batch"]}
                     for e in events)]
