"""Row helpers shared by the read modules (ORM object -> plain dict, numbers, the speaking rank)."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from cliffguard.controller.store.models import StepMetricRow
from cliffguard.core.floats import from_json, from_store_kind


def row_dict(obj: Any, exclude: Sequence[str] = ()) -> dict[str, Any]:
    """Every mapped column of ``obj`` by its attribute name, less ``exclude``."""
    return {c.key: getattr(obj, c.key) for c in obj.__mapper__.column_attrs if c.key not in exclude}


def num(value: Any) -> Any:
    return float(value) if isinstance(value, Decimal) else value  # PostgreSQL avg() of integers


def speaker_rank(session: Session, run_id: str, model: Any = StepMetricRow) -> int | None:
    """The rank that speaks for the run among those with rows in ``model``'s table (step
    metrics unless told otherwise), or None: ``core.ranks.speaker`` done in SQL."""
    return session.scalar(select(func.min(model.rank)).where(model.run_id == run_id))


def step_dict(r: StepMetricRow) -> dict[str, Any]:
    """A step row with its non-finite loss and per-layer norms back as floats."""
    d = row_dict(r)
    if d["nonfinite"] is not None and d["resolution"] == 1:
        d["loss"] = from_store_kind(d["nonfinite"])  # NULL on SQLite, NaN on PostgreSQL
    if d["layer_grad_norms"] is not None:
        d["layer_grad_norms"] = from_json(d["layer_grad_norms"])
    return d
