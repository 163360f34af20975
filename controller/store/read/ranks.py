"""Per-rank step metrics (stragglers, MFU, memory) and each rank's newest step, from the per-rank
step rows and the ``ranks`` events stored one row per event (``controller/store/rank_arrays.py``).

The rank whose rows speak for the whole run is decided by ``core.ranks``; in SQL that is
``_rows.speaker_rank`` (the lowest rank with rows), which the curve and histogram readers use.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from cliffguard.controller.store.models import RankArrayRow as RA
from cliffguard.controller.store.models import StepMetricRow as SM
from cliffguard.controller.store.rank_arrays import per_rank, rank_points
from cliffguard.controller.store.read._rows import num, step_dict
from cliffguard.controller.store.read.curves import bucket_width, step_filter
from cliffguard.controller.store.step_metrics import PER_RANK_METRICS

RANK_COLUMNS: tuple[str, ...] = PER_RANK_METRICS
"""Per-rank numeric columns ``rank_metrics`` returns (averaged within a bucket when decimated)."""


def rank_metrics(
    session: Session,
    run_id: str,
    *,
    columns: Sequence[str] = RANK_COLUMNS,
    max_points: int | None = 2000,
    from_step: int | None = None,
    to_step: int | None = None,
    last_steps: int | None = None,
) -> list[dict[str, Any]]:
    """Per-rank step metrics for straggler/MFU/memory charts: keys step, rank and ``columns``,
    ordered by (step, rank). Averaged in equal step buckets when there are more than
    ``max_points`` points per rank (``step`` is then the bucket's first step). ``last_steps``
    keeps the newest that many steps (counted back from the run's highest step; it overrides
    ``from_step``)."""
    unknown = set(columns) - set(RANK_COLUMNS)
    if unknown:
        raise ValueError(f"columns: not per-rank metrics: {sorted(unknown)}")
    if last_steps is not None:
        last = max((x for x in (session.scalar(select(func.max(SM.step)).where(SM.run_id == run_id)),
                                session.scalar(select(func.max(RA.step)).where(RA.run_id == run_id)))
                    if x is not None), default=None)
        if last is None:
            return []
        from_step = last - last_steps + 1
    conds = step_filter(run_id, from_step, to_step)
    keys = ("step", "rank", *columns)
    arrays = rank_points(session, run_id, from_step, to_step)
    if arrays:  # ranks events stored one row per event: merged and bucketed here
        cols = [getattr(SM, c) for c in columns]
        rows = [dict(zip(keys, map(num, r), strict=True)) for r in session.execute(
            select(SM.step, SM.rank, *cols).where(*conds).order_by(SM.step, SM.rank, SM.ts)).all()]
        return _bucketed(rows + [{k: p.get(k) for k in keys} for p in arrays], columns, max_points)
    n_ranks = session.scalar(select(func.count(func.distinct(SM.rank))).where(*conds)) or 1
    width = bucket_width(session, conds, max_points, series=n_ranks)
    cols = [getattr(SM, c) for c in columns]
    if width == 1:
        stmt = select(SM.step, SM.rank, *cols).where(*conds).order_by(SM.step, SM.rank, SM.ts)
    else:
        bucket = SM.step // width
        stmt = (
            select(func.min(SM.step), SM.rank, *[func.avg(c) for c in cols])
            .where(*conds)
            .group_by(bucket, SM.rank)
            .order_by(bucket, SM.rank)
        )
    return [dict(zip(keys, map(num, r), strict=True)) for r in session.execute(stmt).all()]


def _bucketed(points: list[dict[str, Any]], columns: Sequence[str], max_points: int | None) -> list[dict[str, Any]]:
    """``rank_metrics``' SQL bucketing done on merged points: at full resolution when they fit in
    ``max_points`` per rank, else averaged (non-null values) per (step bucket, rank)."""
    points.sort(key=lambda p: (p["step"], p["rank"]))
    if not points:
        return []
    lo, hi = points[0]["step"], points[-1]["step"]
    n_ranks = len({p["rank"] for p in points}) or 1
    if max_points is None or len(points) <= max_points * n_ranks:
        return points
    width = max(1, math.ceil((hi - lo + 1) / max_points))
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for p in points:
        groups.setdefault((p["step"] // width, p["rank"]), []).append(p)
    out = []
    for (_, rank), members in sorted(groups.items()):
        row: dict[str, Any] = {"step": min(m["step"] for m in members), "rank": rank}
        for c in columns:
            vals = [m[c] for m in members if m[c] is not None]
            row[c] = sum(vals) / len(vals) if vals else None
        out.append(row)
    return out


DETAIL_COLUMNS: tuple[str, ...] = ("loss_local", "step_time_s", "data_wait_s", "comm_exposed_s", "mfu",
                                   "tokens_per_s", "grad_norm", "mem_reserved")
"""The columns ``rank_detail`` returns besides step and rank."""


def rank_detail(session: Session, run_id: str, *, steps: int = 50,
                columns: Sequence[str] = DETAIL_COLUMNS) -> list[dict[str, Any]]:
    """Every rank's full step rows (from per-rank ``step`` events: those a detail command asked
    for, or an older agent's) over the newest ``steps`` steps that have one from a rank other
    than the speaker; ordered by (step, rank). Rows made from ``ranks`` arrays carry no guard
    decision, which is how they are told apart. Empty when no such rows exist."""
    full = SM.guard.is_not(None)
    last = session.scalar(select(func.max(SM.step)).where(SM.run_id == run_id, full, SM.rank > 0))
    if last is None:
        return []
    cols = [getattr(SM, c) for c in columns]
    stmt = (select(SM.step, SM.rank, *cols)
            .where(SM.run_id == run_id, full, SM.resolution == 1, SM.step > last - steps, SM.step <= last)
            .order_by(SM.step, SM.rank))
    keys = ("step", "rank", *columns)
    return [dict(zip(keys, map(num, r), strict=True)) for r in session.execute(stmt).all()]


def latest_rank_steps(session: Session, run_id: str) -> list[dict[str, Any]]:
    """Each rank's newest step row (every column), ordered by rank: the 'ranks now' table. A rank
    whose newest report is a stored ``ranks`` event gets a row of the same keys from it."""
    order = func.row_number().over(partition_by=SM.rank, order_by=(SM.step.desc(), SM.ts.desc()))
    newest = select(SM.id, order.label("n")).where(SM.run_id == run_id).subquery()
    rows = session.scalars(select(SM).join(newest, SM.id == newest.c.id).where(newest.c.n == 1).order_by(SM.rank))
    out = {d["rank"]: d for d in map(step_dict, rows)}
    last = session.execute(select(RA.step, RA.ts, RA.first_rank, RA.arrays).where(
        RA.run_id == run_id, RA.step == select(func.max(RA.step)).where(RA.run_id == run_id).scalar_subquery())).all()
    blank = dict.fromkeys(c.name for c in SM.__table__.columns)
    for step, ts, first, arrays in last:
        for p in per_rank(step, ts, first, arrays):
            cur = out.get(p["rank"])
            if cur is None or (cur["step"], cur["ts"]) < (step, ts):
                out[p["rank"]] = {**blank, "run_id": run_id, "resolution": 1, **p}
    return [out[r] for r in sorted(out)]
