"""Goodput: a run's ledger (buckets, ETTR, the stacked chart, the counterfactual), what each of its
incidents, restarts and scale changes cost, and what a kind of remedy cost across runs."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from cliffguard.controller.goodput.buckets import BUCKETS
from cliffguard.controller.goodput.record import chart
from cliffguard.controller.store.models import GoodputCostRow, GoodputRow, IncidentRow
from cliffguard.controller.store.read._rows import row_dict


def goodput(session: Session, run_id: str) -> dict[str, Any] | None:
    """The run's ledger: the ``goodput`` row's columns (``seconds``/``gpu_seconds`` by bucket) with
    ``summary`` merged in (counts, ``checkpoints`` with their ``counterfactual``) and ``timeline``
    (the stacked chart's points up to ``booked_until``); None before the run's first event was booked."""
    row = session.get(GoodputRow, run_id)
    if row is None:
        return None
    out = row_dict(row, exclude=("timeline", "summary"))
    seconds = [row.seconds.get(b.value, 0.0) for b in BUCKETS]
    return {**(row.summary or {}), **out, "timeline": chart(row.timeline or [], row.wall_s, seconds)}


def ettr_by_run(session: Session, run_ids: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """``{run id: {ettr, ettr_gpu, window_ettr, wall_s, steps_lost}}`` (a list of runs without the
    ledgers' charts and states)."""
    cols = (GoodputRow.run_id, GoodputRow.ettr, GoodputRow.ettr_gpu, GoodputRow.window_ettr, GoodputRow.wall_s,
            GoodputRow.steps_lost)
    stmt = select(*cols)
    if run_ids is not None:
        stmt = stmt.where(GoodputRow.run_id.in_(run_ids))
    return {r[0]: dict(zip(("ettr", "ettr_gpu", "window_ettr", "wall_s", "steps_lost"), r[1:], strict=True))
            for r in session.execute(stmt)}


def goodput_costs(session: Session, run_id: str | None = None, *, since: float | None = None,
                  until: float | None = None) -> list[dict[str, Any]]:
    """Cost records (oldest first), each with its incident's ``outcome``, ``rule`` and ``level``
    when it is an incident's (``remedy``: the outcome, or the record's kind for a restart or a
    scale change); one run's, or every run's between ``since`` and ``until`` (by when it began)."""
    stmt = select(GoodputCostRow, IncidentRow.outcome, IncidentRow.rule, IncidentRow.level).outerjoin(
        IncidentRow, IncidentRow.id == GoodputCostRow.key)
    if run_id is not None:
        stmt = stmt.where(GoodputCostRow.run_id == run_id)
    if since is not None:
        stmt = stmt.where(GoodputCostRow.ts >= since)
    if until is not None:
        stmt = stmt.where(GoodputCostRow.ts < until)
    out = []
    for cost, outcome, rule, level in session.execute(stmt.order_by(GoodputCostRow.ts, GoodputCostRow.key)):
        d = row_dict(cost)
        d.update(outcome=outcome, rule=rule, level=level, remedy=outcome if outcome else d["kind"])
        out.append(d)
    return out


def remedy_costs(session: Session, *, since: float | None = None, until: float | None = None,
                 run_id: str | None = None) -> list[dict[str, Any]]:
    """What each remedy cost (``rolled_back``, ``resumed``, ``halted``, ``restart``, ``elastic``,
    ...): ``{remedy, count, seconds, gpu_seconds, steps_lost, buckets}`` summed over the cost records
    that began in [since, until), most expensive first — "what did rollbacks cost this week"."""
    sums: dict[str, dict[str, Any]] = {}
    for c in goodput_costs(session, run_id, since=since, until=until):
        s = sums.setdefault(c["remedy"], {"remedy": c["remedy"], "count": 0, "seconds": 0.0, "gpu_seconds": 0.0,
                                          "steps_lost": 0, "buckets": {}})
        s["count"] += 1
        s["seconds"] += c["seconds"]
        s["gpu_seconds"] += c["gpu_seconds"]
        s["steps_lost"] += c["steps_lost"]
        for bucket, v in (c["buckets"] or {}).items():
            s["buckets"][bucket] = s["buckets"].get(bucket, 0.0) + v["seconds"]
    return sorted(sums.values(), key=lambda s: -s["gpu_seconds"])
