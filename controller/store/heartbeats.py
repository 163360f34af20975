"""Heartbeats in the store: one row per beating rank (a node's leader carries its node's ranks).

Written by ``upsert_heartbeats`` in the batch's transaction, newest wins: a row moves only for a
beat with a newer ``ts`` (a re-delivery or an older beat changes nothing). A 16k-rank run sends
~400 node heartbeats a second; one row per node (not one per rank) keeps that one small
executemany per batch. ``per_rank`` expands rows to each rank's newest sign of life for readers
(the dashboard's liveness view), taking for each rank the newest of the rows that name it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy.orm import Session

from cliffguard.controller.store.fit import fit_row
from cliffguard.controller.store.models import HeartbeatRow
from cliffguard.controller.store.upsert import insert_for
from cliffguard.core.events import Event

_MOVED = ("ts", "step", "state", "ranks", "steps", "seen_ts", "collectives")


def heartbeat_row(ev: Event) -> dict[str, Any]:
    """A heartbeat event -> its row (a node heartbeat's arrays as they came)."""
    d = ev.data
    node = d.get("ranks") is not None
    row = dict(run_id=ev.run, rank=ev.rank, ts=ev.ts, step=ev.step, state=d["state"],
               ranks=list(d["ranks"]) if node else None, steps=list(d["steps"]) if node else None,
               seen_ts=[ev.ts - a for a in d["ages_s"]] if node else None,
               collectives=list(d["collectives"]) if node else None)
    return fit_row(HeartbeatRow, row)


def upsert_heartbeats(session: Session, events: Iterable[Event]) -> int:
    """Store the newest beat per (run, beating rank) of ``events``; returns how many rows moved."""
    newest: dict[tuple[str, int], Event] = {}
    for ev in events:
        cur = newest.get((ev.run, ev.rank))
        if cur is None or ev.ts > cur.ts:
            newest[(ev.run, ev.rank)] = ev
    if not newest:
        return 0
    # executemany with RETURNING: drivers disagree on an upsert's rowcount
    rows = [heartbeat_row(ev) for ev in newest.values()]
    return len(session.connection().execute(_upsert(session), rows).all())


_UPSERTS: dict[str, Any] = {}


def _upsert(session: Session) -> Any:
    """The upsert statement, built once per dialect (building ``excluded`` costs ~1 ms a time)."""
    dialect = session.get_bind().dialect.name
    stmt = _UPSERTS.get(dialect)
    if stmt is None:
        ins = insert_for(session, HeartbeatRow)
        exc = ins.excluded
        stmt = _UPSERTS[dialect] = ins.on_conflict_do_update(
            index_elements=["run_id", "rank"], set_={c: getattr(exc, c) for c in _MOVED},
            where=HeartbeatRow.ts < exc.ts).returning(HeartbeatRow.rank)
    return stmt


def per_rank(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stored rows -> the newest sign of life per rank: run_id, rank, ts, step, state,
    collective, and ``via`` (the rank whose beat said so); ordered by rank."""
    out: dict[int, dict[str, Any]] = {}

    def offer(rank: int, item: dict[str, Any]) -> None:
        cur = out.get(rank)
        if cur is None or item["ts"] > cur["ts"]:
            out[rank] = item

    for row in rows:
        base = {"run_id": row["run_id"], "state": row["state"], "via": row["rank"]}
        if row.get("ranks") is None:
            offer(row["rank"], {**base, "rank": row["rank"], "ts": row["ts"], "step": row["step"], "collective": ""})
            continue
        for r, step, ts, coll in zip(row["ranks"], row["steps"], row["seen_ts"], row["collectives"], strict=True):
            offer(r, {**base, "rank": r, "ts": ts, "step": step, "collective": coll})
    return [out[r] for r in sorted(out)]
