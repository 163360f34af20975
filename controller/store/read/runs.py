"""Runs and their newest heartbeat per rank (expanded from the node rows)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from cliffguard.controller.store.heartbeats import per_rank
from cliffguard.controller.store.models import HeartbeatRow, RunRow
from cliffguard.controller.store.read._rows import row_dict
from cliffguard.core.ranks import rank_spans


def list_runs(session: Session, *, limit: int | None = 100) -> list[dict[str, Any]]:
    """Runs, most recently active first (without the bulky ``controller_state``)."""
    rows = session.scalars(select(RunRow).order_by(RunRow.last_event_ts.desc().nulls_last(), RunRow.id).limit(limit))
    return [row_dict(r, exclude=("controller_state",)) for r in rows]


def get_run(session: Session, run_id: str) -> dict[str, Any] | None:
    """One run with every column (``config`` is the run.started payload), or None."""
    run = session.get(RunRow, run_id)
    return None if run is None else row_dict(run)


def heartbeats(session: Session, run_id: str) -> list[dict[str, Any]]:
    """The newest sign of life per rank: run_id, rank, ts, step, state, collective, ``via`` (the
    rank whose heartbeat carried it: the node's leader); ordered by rank."""
    rows = session.scalars(select(HeartbeatRow).where(HeartbeatRow.run_id == run_id))
    return per_rank(row_dict(r) for r in rows)


def liveness(session: Session, run_id: str, *, now: float, silent_after_s: float = 30.0) -> dict[str, Any]:
    """A run's liveness in a few numbers (a 16k-rank run has 16k ranks: the dashboard shows
    these, not a line per rank): ``ranks``, ``silent`` (ranks silent ``silent_after_s`` or more,
    as ranges), ``lowest_step``/``highest_step``, ``behind`` (ranks below the highest step, as
    ranges, with ``lowest_ranks`` those at the lowest), ``in_collective`` (collective -> count),
    ``newest_ts`` and ``states``."""
    beats = heartbeats(session, run_id)
    if not beats:
        return {"ranks": 0}
    steps = [b["step"] for b in beats]
    low, high = min(steps), max(steps)
    colls: dict[str, int] = {}
    for b in beats:
        if b["collective"]:
            colls[b["collective"]] = colls.get(b["collective"], 0) + 1
    return {"ranks": len(beats), "newest_ts": max(b["ts"] for b in beats),
            "silent": rank_spans(b["rank"] for b in beats if now - b["ts"] >= silent_after_s),
            "lowest_step": low, "highest_step": high,
            "behind": rank_spans(b["rank"] for b in beats if b["step"] < high),
            "lowest_ranks": rank_spans(b["rank"] for b in beats if b["step"] == low) if low < high else "",
            "in_collective": colls, "states": sorted({b["state"] for b in beats})}
