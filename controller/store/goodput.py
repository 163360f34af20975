"""The goodput ledgers in the store. A ledger's state is saved with its run's (``runs.
controller_state``, every batch: ``controller/runstate.py``); what readers show is the ``goodput``
row, written in the same transaction whenever the chart gained a point, a cost changed, the run
started or ended, or ``[goodput] row_every_s`` of booked time passed; and ``goodput_costs``."""

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
                "steps_lost", "seconds", "gpu_seconds", "summary", "timeline")
_COST_COLUMNS = ("kind", "ts", "steps_lost", "seconds", "gpu_seconds", "buckets")


def load_ledger(session: Session, run_id: str, state: dict[str, Any] | None, config: GoodputConfig) -> Ledger:
    """The run's ledger from its saved ``state`` and its chart's points in the ``goodput`` row; a
    new one without a state (and, with a warning, when the state cannot be read: the run's time
    from here on is booked afresh)."""
    ledger = Ledger(config)
    if not state:
        return ledger
    try:
        ledger.load_state_dict(state)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        log.warning("run %s: the saved goodput ledger is unreadable (%s); it starts afresh", run_id, exc)
        return Ledger(config)
    row = session.get(GoodputRow, run_id)
    ledger.window.timeline = [[float(x) for x in p] for p in (row.timeline if row is not None else [])]
    return ledger


def _row_upsert(session: Session) -> Any:
    ins = insert_for(session, GoodputRow)
    return ins.on_conflict_do_update(index_elements=["run_id"], set_={c: getattr(ins.excluded, c) for c in _ROW_COLUMNS})


def _cost_upsert(session: Session) -> Any:
    ins = insert_for(session, GoodputCostRow)
    return ins.on_conflict_do_update(index_elements=["run_id", "key"],
                                     set_={c: getattr(ins.excluded, c) for c in _COST_COLUMNS})


def row_due(ledger: Ledger, every_s: float) -> bool:
    """Whether the run's ``goodput`` row must be written with this batch."""
    if ledger.cursor is None:
        return False
    return (ledger.row_at is None or ledger.window.moved or bool(ledger.changed) or ledger.ended
            or ledger.cursor - ledger.row_at >= every_s)


def save_ledgers(session: Session, ledgers: Iterable[tuple[str, Ledger]], now: float, every_s: float = 0.0) -> None:
    """Upsert the row of each (run id, ledger) that is due (``row_due``) and its changed cost
    records: one executemany each."""
    rows, cost_rows = [], []
    for run_id, ledger in ledgers:
        if not row_due(ledger, every_s) or (ledger.ended and ledger.row_at == ledger.cursor and not ledger.changed):
            continue
        s = summarize(ledger)
        rows.append({"run_id": run_id, "updated_at": now, "started_at": s["started_at"],
                     "booked_until": s["booked_until"], "ended": s["ended"], "wall_s": s["wall_s"],
                     "ettr": s["ettr"], "ettr_gpu": s["ettr_gpu"], "window_ettr": s["window_ettr"],
                     "steps_lost": s["steps_lost"], "seconds": s.pop("seconds"), "gpu_seconds": s.pop("gpu_seconds"),
                     "timeline": [list(p) for p in ledger.window.timeline], "summary": to_json(s)})
        every = costs(ledger)
        for key in sorted(ledger.changed):
            c = every.get(key)
            if c is not None:
                cost_rows.append({"run_id": run_id, "key": key[:64], "kind": c["kind"], "ts": c["ts"],
                                  "steps_lost": c["steps_lost"], "seconds": c["seconds"],
                                  "gpu_seconds": c["gpu_seconds"], "buckets": c["buckets"]})
        ledger.changed.clear()
        ledger.window.moved = False
        ledger.row_at = ledger.cursor
    conn = session.connection()
    if rows:
        conn.execute(built_once(session, "goodput.rows", _row_upsert), rows)
    if cost_rows:
        conn.execute(built_once(session, "goodput.costs", _cost_upsert), cost_rows)
