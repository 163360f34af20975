"""Read-side queries for the dashboard and ``cliffguard status``.

Every function takes an open ``Session`` (``with store.session() as s:``) and returns plain data:
``list[dict]`` whose keys are the model's column names (see ``controller.store.models``) unless a
docstring says otherwise, newest first for logs (incidents, commands, alerts) and in step order for
curves. Nothing here writes.

Non-finite values come back as floats on both databases: a NaN loss reads as ``nan`` whether it
was stored as NaN (PostgreSQL) or as NULL plus ``nonfinite="nan"`` (SQLite); histogram and
per-layer values stored as "NaN"/"Infinity" strings in JSON come back as floats too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from sqlalchemy import Float, case, cast, func, or_, select
from sqlalchemy.orm import Session

from controller.store.models import (
    Alert,
    AuditRow,
    CheckpointRow,
    CommandRow,
    DataFlag,
    DlqCount,
    GradHist,
    Heartbeat,
    Incident,
    OutboxRow,
    Run,
    StepMetric,
    Transition,
    ValidationRow,
)
from core.floats import from_json, from_store_kind

SM = StepMetric

RANK_COLUMNS: tuple[str, ...] = (
    "loss_local",
    "lr",
    "lr_scale",
    "grad_norm",
    "tokens_per_s",
    "mfu",
    "step_time_s",
    "data_wait_s",
    "comm_exposed_s",
    "compute_s",
    "mem_allocated",
    "mem_reserved",
    "loss_scale",
)
"""Per-rank numeric columns ``rank_metrics`` returns (averaged within a bucket when decimated)."""


def _row(obj: Any, exclude: Sequence[str] = ()) -> dict[str, Any]:
    return {c.key: getattr(obj, c.key) for c in obj.__mapper__.column_attrs if c.key not in exclude}


def _num(value: Any) -> Any:
    return float(value) if isinstance(value, Decimal) else value  # PostgreSQL avg() of integers




# ---------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------


def list_runs(session: Session, *, limit: int = 100) -> list[dict[str, Any]]:
    """Runs, most recently active first (without the bulky ``controller_state``)."""
    rows = session.scalars(select(Run).order_by(Run.last_event_ts.desc().nulls_last(), Run.id).limit(limit))
    return [_row(r, exclude=("controller_state",)) for r in rows]


def get_run(session: Session, run_id: str) -> dict[str, Any] | None:
    """One run with every column (``config`` is the run.started payload), or None."""
    run = session.get(Run, run_id)
    return None if run is None else _row(run)


def heartbeats(session: Session, run_id: str) -> list[dict[str, Any]]:
    """The newest heartbeat per rank: run_id, rank, ts, step, state."""
    rows = session.scalars(select(Heartbeat).where(Heartbeat.run_id == run_id).order_by(Heartbeat.rank))
    return [_row(r) for r in rows]


# ---------------------------------------------------------------------------------------------
# Curves
# ---------------------------------------------------------------------------------------------


def _step_filter(run_id: str, from_step: int | None, to_step: int | None) -> list[Any]:
    conds = [SM.run_id == run_id]
    if from_step is not None:
        conds.append(SM.step >= from_step)
    if to_step is not None:
        conds.append(SM.step <= to_step)
    return conds


def _bucket_width(session: Session, conds: list[Any], max_points: int | None, series: int = 1) -> int:
    """1 when the rows fit in ``max_points`` per series, else the step width that makes them fit."""
    n, lo, hi = session.execute(
        select(func.count(), func.min(SM.step), func.max(SM.step)).where(*conds)
    ).one()
    if max_points is None or n <= max_points * series or lo is None:
        return 1
    return max(1, math.ceil((hi - lo + 1) / max_points))


def loss_curve(
    session: Session,
    run_id: str,
    *,
    rank: int = 0,
    max_points: int | None = 2000,
    from_step: int | None = None,
    to_step: int | None = None,
) -> list[dict[str, Any]]:
    """The global loss by step, as seen by ``rank`` (every rank reports the same all-reduced loss).

    Keys: step, loss, loss_min, loss_max, resolution (steps the point summarises), nonfinite
    ("nan"/"inf"/"-inf" when the point's loss, or for a summary any loss in it, was non-finite),
    ts. Full-resolution points have loss_min == loss_max == loss. When more than ``max_points``
    rows match, rows are merged into equal step buckets (mean of the finite losses, weighted by
    resolution; min and max kept so spikes stay visible), so the answer never exceeds
    ``max_points`` rows. After a rollback, re-trained steps appear twice (ordered by ts).
    """
    conds = [*_step_filter(run_id, from_step, to_step), SM.rank == rank]
    width = _bucket_width(session, conds, max_points)
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
    return [
        _loss_point(step, loss, lo, hi, width, nonfinite, ts) for step, loss, lo, hi, nonfinite, ts in rows
    ]


def _loss_point(step: int, loss: Any, lo: Any, hi: Any, resolution: int, nonfinite: str | None, ts: float):
    loss, lo, hi = _num(loss), _num(lo), _num(hi)
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


def rank_metrics(
    session: Session,
    run_id: str,
    *,
    columns: Sequence[str] = RANK_COLUMNS,
    max_points: int | None = 2000,
    from_step: int | None = None,
    to_step: int | None = None,
) -> list[dict[str, Any]]:
    """Per-rank step metrics for straggler/MFU/memory charts: keys step, rank and ``columns``,
    ordered by (step, rank). Averaged in equal step buckets when there are more than
    ``max_points`` points per rank (``step`` is then the bucket's first step)."""
    unknown = set(columns) - set(RANK_COLUMNS)
    if unknown:
        raise ValueError(f"columns: not per-rank metrics: {sorted(unknown)}")
    conds = _step_filter(run_id, from_step, to_step)
    n_ranks = session.scalar(select(func.count(func.distinct(SM.rank))).where(*conds)) or 1
    width = _bucket_width(session, conds, max_points, series=n_ranks)
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
    keys = ("step", "rank", *columns)
    return [dict(zip(keys, map(_num, r), strict=True)) for r in session.execute(stmt).all()]


def latest_rank_steps(session: Session, run_id: str) -> list[dict[str, Any]]:
    """Each rank's newest step row (every column), ordered by rank: the 'ranks now' table."""
    order = func.row_number().over(partition_by=SM.rank, order_by=(SM.step.desc(), SM.ts.desc()))
    newest = select(SM.id, order.label("n")).where(SM.run_id == run_id).subquery()
    rows = session.scalars(
        select(SM).join(newest, SM.id == newest.c.id).where(newest.c.n == 1).order_by(SM.rank)
    )
    return [_step_dict(r) for r in rows]


def _step_dict(r: StepMetric) -> dict[str, Any]:
    d = _row(r)
    if d["nonfinite"] is not None and d["resolution"] == 1:
        d["loss"] = from_store_kind(d["nonfinite"])
    if d["layer_grad_norms"] is not None:
        d["layer_grad_norms"] = from_json(d["layer_grad_norms"])
    return d


def grad_hists(
    session: Session, run_id: str, *, rank: int = 0, step: int | None = None, limit: int = 1
) -> list[dict[str, Any]]:
    """Gradient histograms of ``rank``, newest first (at most ``limit``; at or before ``step``
    if given). ``layers`` maps layer name -> {counts, zeros, nonfinite, p50, p99, max, norm,
    underflow}; ``edges`` are the fixed log2 bin edges of |g|."""
    conds = [GradHist.run_id == run_id, GradHist.rank == rank]
    if step is not None:
        conds.append(GradHist.step <= step)
    rows = session.scalars(
        select(GradHist).where(*conds).order_by(GradHist.step.desc(), GradHist.ts.desc()).limit(limit)
    )
    out = []
    for r in rows:
        d = _row(r)
        d["edges"], d["layers"] = from_json(d["edges"]), from_json(d["layers"])
        out.append(d)
    return out


def validations(session: Session, run_id: str, *, limit: int = 500) -> list[dict[str, Any]]:
    """Validation results (periodic and command-answering), oldest first."""
    rows = session.scalars(
        select(ValidationRow)
        .where(ValidationRow.run_id == run_id)
        .order_by(ValidationRow.ts.desc())
        .limit(limit)
    )
    out = []
    for r in rows:
        d = _row(r)
        if d["nonfinite"] is not None:
            d["val_loss"] = from_store_kind(d["nonfinite"])
        out.append(d)
    return out[::-1]


# ---------------------------------------------------------------------------------------------
# Decisions: incidents, transitions, commands, checkpoints
# ---------------------------------------------------------------------------------------------


def incidents(
    session: Session, run_id: str | None = None, *, open_only: bool = False, limit: int = 100
) -> list[dict[str, Any]]:
    """Incidents, newest first; all runs when ``run_id`` is None."""
    stmt = select(Incident)
    if run_id is not None:
        stmt = stmt.where(Incident.run_id == run_id)
    if open_only:
        stmt = stmt.where(Incident.outcome == "open")
    return [_row(r) for r in session.scalars(stmt.order_by(Incident.opened_at.desc()).limit(limit))]


def transitions(
    session: Session, run_id: str, *, incident_id: str | None = None, limit: int = 1000
) -> list[dict[str, Any]]:
    """State-machine transitions of a run (or one incident), oldest first: the timeline."""
    stmt = select(Transition).where(Transition.run_id == run_id)
    if incident_id is not None:
        stmt = stmt.where(Transition.incident_id == incident_id)
    rows = session.scalars(stmt.order_by(Transition.ts.desc(), Transition.id.desc()).limit(limit))
    return [_row(r) for r in rows][::-1]


def incident_detail(session: Session, incident_id: str) -> dict[str, Any] | None:
    """One incident with its whole story, or None: the incident's columns plus ``transitions``
    (oldest first), ``commands`` (oldest first, each with its ack), ``validations`` (the results
    answering its validate commands) and ``alerts`` (newest first, with deliveries)."""
    inc = session.get(Incident, incident_id)
    if inc is None:
        return None
    out = _row(inc)
    out["transitions"] = transitions(session, inc.run_id, incident_id=incident_id)
    out["commands"] = commands(session, inc.run_id, incident_id=incident_id)[::-1]
    cmd_ids = [c["id"] for c in out["commands"]]
    answers = [v for v in validations(session, inc.run_id) if v["cmd"] in cmd_ids] if cmd_ids else []
    out["validations"] = answers
    out["alerts"] = [a for a in alerts(session, inc.run_id, limit=1000) if a["incident_id"] == incident_id]
    return out


def commands(
    session: Session, run_id: str | None = None, *, incident_id: str | None = None, limit: int = 200
) -> list[dict[str, Any]]:
    """Commands issued (controller and operator) and their ack status, newest first."""
    stmt = select(CommandRow)
    if run_id is not None:
        stmt = stmt.where(CommandRow.run_id == run_id)
    if incident_id is not None:
        stmt = stmt.where(CommandRow.incident_id == incident_id)
    return [_row(r) for r in session.scalars(stmt.order_by(CommandRow.issued_at.desc()).limit(limit))]


def checkpoints(
    session: Session, run_id: str, *, kind: str | None = None, verified_only: bool = False
) -> list[dict[str, Any]]:
    """Checkpoints of a run, newest step first (``stable`` marks rollback candidates)."""
    stmt = select(CheckpointRow).where(CheckpointRow.run_id == run_id)
    if kind is not None:
        stmt = stmt.where(CheckpointRow.kind == kind)
    if verified_only:
        stmt = stmt.where(CheckpointRow.verified.is_(True))
    return [_row(r) for r in session.scalars(stmt.order_by(CheckpointRow.step.desc(), CheckpointRow.kind))]


def data_flags(session: Session, run_id: str, *, limit: int = 200) -> list[dict[str, Any]]:
    """Samples the data rules flagged, newest first."""
    rows = session.scalars(
        select(DataFlag).where(DataFlag.run_id == run_id).order_by(DataFlag.ts.desc()).limit(limit)
    )
    return [_row(r) for r in rows]


def audit_log(session: Session, run_id: str | None = None, *, limit: int = 100) -> list[dict[str, Any]]:
    """Operator actions, newest first."""
    stmt = select(AuditRow)
    if run_id is not None:
        stmt = stmt.where(AuditRow.run_id == run_id)
    return [_row(r) for r in session.scalars(stmt.order_by(AuditRow.ts.desc()).limit(limit))]


# ---------------------------------------------------------------------------------------------
# Alerts, outbox, DLQ
# ---------------------------------------------------------------------------------------------


def alerts(session: Session, run_id: str | None = None, *, limit: int = 100) -> list[dict[str, Any]]:
    """Alerts, newest first, each with ``deliveries``: one dict per outbox row for it (target,
    status, attempts, last_error, delivered_at, next_attempt_at)."""
    stmt = select(Alert)
    if run_id is not None:
        stmt = stmt.where(Alert.run_id == run_id)
    out = [_row(a) for a in session.scalars(stmt.order_by(Alert.ts.desc()).limit(limit))]
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


def dlq_counts(session: Session) -> list[dict[str, Any]]:
    """Dead-letter counters: topic, reason, count, last_ts, last_detail; largest count first."""
    rows = session.scalars(select(DlqCount).order_by(DlqCount.count.desc(), DlqCount.topic, DlqCount.reason))
    return [_row(r) for r in rows]
