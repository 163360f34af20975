"""The run's curves: the global loss by step (bucketed for charts), the step rows of the rank
that speaks for the run (``core.ranks``) in the order they were reported, and how many steps a
rollback made the trainer redo."""

from __future__ import annotations

import math
from typing import Any, Literal

from sqlalchemy import Float, case, cast, func, or_, select
from sqlalchemy.orm import Session

from cliffguard.controller.store.models import StepMetricRow as SM
from cliffguard.controller.store.read._rows import num, speaker_rank, step_dict
from cliffguard.core.floats import from_store_kind


def step_filter(run_id: str, from_step: int | None, to_step: int | None) -> list[Any]:
    """WHERE conditions for a run's step rows in ``[from_step, to_step]`` (either end open)."""
    conds = [SM.run_id == run_id]
    if from_step is not None:
        conds.append(SM.step >= from_step)
    if to_step is not None:
        conds.append(SM.step <= to_step)
    return conds


def bucket_width(session: Session, conds: list[Any], max_points: int | None, series: int = 1) -> int:
    """1 when the rows fit in ``max_points`` per series, else the step width that makes them fit."""
    n, lo, hi = session.execute(select(func.count(), func.min(SM.step), func.max(SM.step)).where(*conds)).one()
    if max_points is None or n <= max_points * series or lo is None:
        return 1
    return max(1, math.ceil((hi - lo + 1) / max_points))


def loss_curve(
    session: Session,
    run_id: str,
    *,
    rank: int | None = None,
    max_points: int | None = 2000,
    from_step: int | None = None,
    to_step: int | None = None,
) -> list[dict[str, Any]]:
    """The global loss by step, as ``rank`` reported it (default: the rank that speaks for the
    run; every rank reports the same all-reduced loss).

    Keys: step, loss, loss_min, loss_max, resolution (steps the point summarises), nonfinite
    ("nan"/"inf"/"-inf" when the point's loss, or for a summary any loss in it, was non-finite),
    ts. Full-resolution points have loss_min == loss_max == loss. When more than ``max_points``
    rows match, rows are merged into equal step buckets (mean of the finite losses, weighted by
    resolution; min and max kept so spikes stay visible), so the answer never exceeds
    ``max_points`` rows. After a rollback, re-trained steps appear twice (ordered by ts).
    """
    if rank is None:
        rank = speaker_rank(session, run_id)
        if rank is None:
            return []
    conds = [*step_filter(run_id, from_step, to_step), SM.rank == rank]
    width = bucket_width(session, conds, max_points)
    if width == 1:
        rows = session.execute(
            select(SM.step, SM.loss, SM.loss_min, SM.loss_max, SM.resolution, SM.nonfinite, SM.ts)
            .where(*conds)
            .order_by(SM.step, SM.ts)
        ).all()
        return [_loss_point(*r) for r in rows]
    finite = or_(SM.nonfinite.is_(None), SM.resolution > 1)
    weight = cast(SM.resolution, Float)
    bucket = SM.step // width
    rows = session.execute(
        select(
            func.min(SM.step),
            func.sum(case((finite, SM.loss * weight))) / func.nullif(func.sum(case((finite, weight))), 0),
            func.min(case((finite, func.coalesce(SM.loss_min, SM.loss)))),
            func.max(case((finite, func.coalesce(SM.loss_max, SM.loss)))),
            func.max(SM.nonfinite),
            func.max(SM.ts),
        )
        .where(*conds)
        .group_by(bucket)
        .order_by(bucket)
    ).all()
    return [_loss_point(step, loss, lo, hi, width, nonfinite, ts) for step, loss, lo, hi, nonfinite, ts in rows]


def _loss_point(step: int, loss: Any, lo: Any, hi: Any, resolution: int, nonfinite: str | None, ts: float):
    loss, lo, hi = num(loss), num(lo), num(hi)
    if nonfinite is not None and (resolution == 1 or loss is None):
        loss = from_store_kind(nonfinite)  # the raw value (NULL on SQLite, NaN on PostgreSQL)
    if resolution == 1 and lo is None and hi is None and nonfinite is None:
        lo = hi = loss
    return {
        "step": step,
        "loss": loss,
        "loss_min": lo,
        "loss_max": hi,
        "resolution": resolution,
        "nonfinite": nonfinite,
        "ts": ts,
    }


def step_rows(
    session: Session,
    run_id: str,
    *,
    all_ranks: bool = False,
    newest: int | None = None,
    full_resolution: bool = False,
    order: Literal["reported", "ingested"] = "reported",
) -> list[dict[str, Any]]:
    """Step rows (every column; a non-finite loss and the per-layer norms back as floats) of the
    rank that speaks for the run, or of every rank with ``all_ranks``, oldest first.

    ``order``: "reported" sorts by the trainer's ts (then ingest id), so after a rollback both
    branches appear as the trainer reported them; "ingested" sorts by ingest id, the order the
    controller consumed them. ``newest`` keeps only that many of the last rows;
    ``full_resolution`` leaves out rows retention folded.
    """
    conds = [SM.run_id == run_id]
    if not all_ranks:
        rank = speaker_rank(session, run_id)
        if rank is None:
            return []
        conds.append(SM.rank == rank)
    if full_resolution:
        conds.append(SM.resolution == 1)
    keys = (SM.ts, SM.id) if order == "reported" else (SM.id,)
    stmt = select(SM).where(*conds).order_by(*(k.desc() for k in keys)).limit(newest)
    return [step_dict(r) for r in session.scalars(stmt)][::-1]


def redone_steps(session: Session, run_id: str) -> int:
    """Steps the trainer reported more than once (the steps rollbacks cost), counted on the rank
    that speaks for the run."""
    rank = speaker_rank(session, run_id)
    if rank is None:
        return 0
    rows, distinct = session.execute(
        select(func.count(), func.count(func.distinct(SM.step))).where(SM.run_id == run_id, SM.rank == rank)
    ).one()
    return int(rows - distinct)
