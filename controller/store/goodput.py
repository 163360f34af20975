"""The goodput ledgers in the store: written in the batch's transaction (with the offsets), read
back when a run's slot is loaded on another instance or after a restart."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from sqlalchemy.orm import Session

from cliffguard.controller.goodput.config import GoodputConfig
from cliffguard.controller.goodput.ledger import Ledger
from cliffguard.controller.goodput.summary import costs, summarize
from cliffguard.controller.store.models import GoodputCostRow, GoodputRow
from cliffguard.controller.store.upsert import built_once, insert_for
from cliffguard.core.floats import to_json

log = logging.getLogger(__name__)

_ROW_COLUMNS = ("updated_at", "started_at", "booked_until", "ended", "wall_s", "ettr", "ettr_gpu", "window_ettr",
                "steps_lost", "seconds", "gpu_seconds", "summary", "state")
_COST_COLUMNS = ("kind", "ts", "steps_lost", "seconds", "gpu_seconds", "buckets")


def load_ledger(session: Session, run_id: str, config: GoodputConfig) -> Ledger:
    """The run's stored ledger, or a new one (also when the stored state cannot be read: then with
    a warning, and the run's time from here on is booked afresh)."""
    ledger = Ledger(config)
    row = session.get(GoodputRow, run_id)
    if row is not None and row.state:
        try:
            ledger.load_state_dict(row.state)
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            log.warning("run %s: the stored goodput ledger is unreadable (%s); it starts afresh", run_id, exc)
            ledger = Ledger(config)
    return ledger


def _row_upsert(session: Session) -> Any:
    ins = insert_for(session, GoodputRow)
    return ins.on_conflict_do_update(index_elements=["run_id"], set_={c: getattr(ins.excluded, c) for c in _ROW_COLUMNS})


def _cost_upsert(session: Session) -> Any:
    ins = insert_for(session, GoodputCostRow)
    return ins.on_conflict_do_update(index_elements=["run_id", "key"],
                                     set_={c: getattr(ins.excluded, c) for c in _COST_COLUMNS})


def save_ledgers(session: Session, ledgers: Iterable[tuple[str, Ledger]], now: float) -> None:
    """Upsert each (run id, ledger)'s row and its changed cost records: one executemany each."""
    rows, cost_rows = [], []
    for run_id, ledger in ledgers:
        if ledger.started_at is None:
            continue  # nothing booked yet (no event of the run's speaking rank)
        s = summarize(ledger)
        rows.append({"run_id": run_id, "updated_at": now, "started_at": s["started_at"],
                     "booked_until": s["booked_until"], "ended": s["ended"], "wall_s": s["wall_s"],
                     "ettr": s["ettr"], "ettr_gpu": s["ettr_gpu"], "window_ettr": s["window_ettr"],
                     "steps_lost": s["steps_lost"], "seconds": s.pop("seconds"), "gpu_seconds": s.pop("gpu_seconds"),
                     "summary": to_json(s), "state": to_json(ledger.state_dict())})
        every = costs(ledger)
        for key in sorted(ledger.changed):
            c = every.get(key)
            if c is not None:
                cost_rows.append({"run_id": run_id, "key": key[:64], "kind": c["kind"], "ts": c["ts"],
                                  "steps_lost": c["steps_lost"], "seconds": c["seconds"],
                                  "gpu_seconds": c["gpu_seconds"], "buckets": c["buckets"]})
        ledger.changed.clear()
    conn = session.connection()
    if rows:
        conn.execute(built_once(session, "goodput.rows", _row_upsert), rows)
    if cost_rows:
        conn.execute(built_once(session, "goodput.costs", _cost_upsert), cost_rows)
