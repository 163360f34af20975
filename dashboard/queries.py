"""Read-side queries for the dashboard: SQLAlchemy over ``controller.store.models``, into frames.

Read-only (operator actions live in ``dashboard.actions``). Every function takes an open
``Session`` and returns a ``pandas.DataFrame`` (empty, with the expected columns, when there is
nothing yet) so sections never special-case a fresh store.

Rows come back in the order they were written (``ts``, then ``id``), not by step: after a
rollback the trainer replays steps it already reported, and the dashboard shows both branches.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from sqlalchemy import func, select
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

LOSS_COLUMNS = ["step", "ts", "loss", "nonfinite", "lr", "lr_scale", "grad_norm", "guard", "skipped", "loss_scale"]
RANK_COLUMNS = [
    "step", "rank", "ts", "mfu", "tokens_per_s", "step_time_s", "data_wait_s", "comm_exposed_s",
    "compute_s", "mem_allocated", "mem_reserved", "clipped_layers",
]


def _frame(rows: list[Any], columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame([tuple(r) for r in rows], columns=columns)


def _columns(model: Any, names: list[str]) -> list[Any]:
    return [getattr(model, n) for n in names]


def list_runs(session: Session) -> pd.DataFrame:
    cols = ["id", "status", "recovery_state", "last_step", "world_size", "lr_scale", "last_event_ts", "updated_at"]
    rows = session.execute(select(*_columns(Run, cols)).order_by(Run.updated_at.desc(), Run.id)).all()
    return _frame(rows, cols)


def get_run(session: Session, run_id: str) -> Run | None:
    return session.get(Run, run_id)


def primary_rank(session: Session, run_id: str) -> int | None:
    """The rank whose global ``loss`` the charts use: rank 0, or the lowest rank seen."""
    return session.execute(select(func.min(StepMetric.rank)).where(StepMetric.run_id == run_id)).scalar()


def loss_curve(session: Session, run_id: str, max_points: int) -> pd.DataFrame:
    """The newest ``max_points`` rows of the primary rank in write order (rollbacks included)."""
    rank = primary_rank(session, run_id)
    if rank is None:
        return pd.DataFrame(columns=LOSS_COLUMNS)
    q = (
        select(*_columns(StepMetric, LOSS_COLUMNS))
        .where(StepMetric.run_id == run_id, StepMetric.rank == rank)
        .order_by(StepMetric.ts.desc(), StepMetric.id.desc())
        .limit(max_points)
    )
    return _frame(session.execute(q).all()[::-1], LOSS_COLUMNS)


def rank_metrics(session: Session, run_id: str, last_steps: int) -> pd.DataFrame:
    """Per-rank timing, throughput and memory for the newest ``last_steps`` steps."""
    last = session.execute(select(func.max(StepMetric.step)).where(StepMetric.run_id == run_id)).scalar()
    if last is None:
        return pd.DataFrame(columns=RANK_COLUMNS)
    q = (
        select(*_columns(StepMetric, RANK_COLUMNS))
        .where(StepMetric.run_id == run_id, StepMetric.step > last - last_steps)
        .order_by(StepMetric.ts, StepMetric.id)
    )
    return _frame(session.execute(q).all(), RANK_COLUMNS)


def layer_grad_norms(session: Session, run_id: str, max_points: int) -> pd.DataFrame:
    """Long form (step, layer, norm) of the per-layer grad norms the primary rank reported."""
    rank = primary_rank(session, run_id)
    out: list[tuple[int, str, float]] = []
    if rank is not None:
        q = (
            select(StepMetric.step, StepMetric.layer_grad_norms)
            .where(StepMetric.run_id == run_id, StepMetric.rank == rank, StepMetric.layer_grad_norms.is_not(None))
            .order_by(StepMetric.ts.desc(), StepMetric.id.desc())
            .limit(max_points)
        )
        for step, norms in session.execute(q).all()[::-1]:
            out.extend((step, name, _num(v)) for name, v in (norms or {}).items())
    return pd.DataFrame(out, columns=["step", "layer", "norm"])


def grad_hists(session: Session, run_id: str, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` histogram emissions of the primary rank: {step, edges, layers}."""
    rank = session.execute(select(func.min(GradHist.rank)).where(GradHist.run_id == run_id)).scalar()
    if rank is None:
        return []
    q = (
        select(GradHist.step, GradHist.edges, GradHist.layers)
        .where(GradHist.run_id == run_id, GradHist.rank == rank)
        .order_by(GradHist.ts.desc(), GradHist.id.desc())
        .limit(limit)
    )
    return [{"step": s, "edges": e, "layers": ly} for s, e, ly in session.execute(q).all()[::-1]]


def checkpoints(session: Session, run_id: str) -> pd.DataFrame:
    cols = ["step", "kind", "verified", "stable", "stable_reason", "bytes", "seconds", "path", "sha256", "ts"]
    q = select(*_columns(CheckpointRow, cols)).where(CheckpointRow.run_id == run_id).order_by(CheckpointRow.step)
    return _frame(session.execute(q).all(), cols)


def incidents(session: Session, run_id: str) -> pd.DataFrame:
    cols = ["id", "opened_at", "closed_at", "rule", "level", "spike_step", "onset_step", "outcome",
            "rollback_to", "lr_scale", "evidence"]
    q = select(*_columns(Incident, cols)).where(Incident.run_id == run_id).order_by(Incident.opened_at)
    return _frame(session.execute(q).all(), cols)


def transitions(session: Session, run_id: str) -> pd.DataFrame:
    cols = ["incident_id", "ts", "step", "from_state", "to_state", "reason", "evidence"]
    q = select(*_columns(Transition, cols)).where(Transition.run_id == run_id).order_by(Transition.ts, Transition.id)
    return _frame(session.execute(q).all(), cols)


def validations(session: Session, run_id: str) -> pd.DataFrame:
    cols = ["step", "ts", "cmd", "val_loss", "batches"]
    q = select(*_columns(ValidationRow, cols)).where(ValidationRow.run_id == run_id).order_by(ValidationRow.ts)
    return _frame(session.execute(q).all(), cols)


def commands(session: Session, run_id: str) -> pd.DataFrame:
    cols = ["id", "incident_id", "type", "args", "source", "status", "ack_detail", "issued_at", "acked_at", "attempt"]
    q = select(*_columns(CommandRow, cols)).where(CommandRow.run_id == run_id).order_by(CommandRow.issued_at)
    return _frame(session.execute(q).all(), cols)


def audit(session: Session, run_id: str) -> pd.DataFrame:
    cols = ["ts", "actor", "action", "command_id", "detail"]
    q = select(*_columns(AuditRow, cols)).where(AuditRow.run_id == run_id).order_by(AuditRow.ts)
    return _frame(session.execute(q).all(), cols)


def alerts_with_delivery(session: Session, run_id: str) -> pd.DataFrame:
    """One row per (alert, endpoint): the alert and its outbox delivery state ("-" = no endpoint)."""
    cols = ["id", "ts", "level", "rule", "title", "action", "suppressed", "incident_id"]
    rows = session.execute(select(*_columns(Alert, cols)).where(Alert.run_id == run_id).order_by(Alert.ts)).all()
    alerts = _frame(rows, cols)
    if alerts.empty:
        return alerts.assign(endpoint=[], delivery=[], attempts=[], last_error=[], delivered_at=[])
    ids = [a.encode() for a in alerts["id"]]
    out_q = select(
        OutboxRow.payload, OutboxRow.target, OutboxRow.status, OutboxRow.attempts,
        OutboxRow.last_error, OutboxRow.delivered_at,
    ).where(OutboxRow.kind == "alert", OutboxRow.payload.in_(ids))
    deliveries = pd.DataFrame(
        [(bytes(p).decode(), t, s, n, e, d) for p, t, s, n, e, d in session.execute(out_q).all()],
        columns=["id", "endpoint", "delivery", "attempts", "last_error", "delivered_at"],
    )
    merged = alerts.merge(deliveries, on="id", how="left")
    merged["endpoint"] = merged["endpoint"].fillna("-")
    merged["delivery"] = merged["delivery"].fillna("no endpoint")
    merged.loc[merged["suppressed"].astype(bool), "delivery"] = "suppressed"
    return merged


def dlq_counts(session: Session) -> pd.DataFrame:
    cols = ["topic", "reason", "count", "last_ts", "last_detail"]
    q = select(*_columns(DlqCount, cols)).order_by(DlqCount.count.desc())
    return _frame(session.execute(q).all(), cols)


def data_flags(session: Session, run_id: str) -> pd.DataFrame:
    cols = ["step", "ts", "rule", "score", "sample_ids"]
    q = select(*_columns(DataFlag, cols)).where(DataFlag.run_id == run_id).order_by(DataFlag.ts)
    return _frame(session.execute(q).all(), cols)


def heartbeats(session: Session, run_id: str) -> pd.DataFrame:
    cols = ["rank", "ts", "step", "state"]
    q = select(*_columns(Heartbeat, cols)).where(Heartbeat.run_id == run_id).order_by(Heartbeat.rank)
    return _frame(session.execute(q).all(), cols)


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")
