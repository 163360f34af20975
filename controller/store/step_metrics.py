"""The step-metric table: every numeric field of a ``step`` event that the store keeps as a column
of ``step_metrics``, with its SQL type, how retention folds it into a bucket, and whether the
per-rank charts read it.

Ingest (``controller/store/ingest.py``), the model's columns (``controller/store/models.py``),
retention's bucket query (``controller/store/retention.py``) and the read API's per-rank column
list (``controller/store/read/ranks.py``) are all built from ``STEP_METRICS``. A new step metric
is: its collector in the agent, its field in ``core/payloads.py`` ``StepData``, one row here, and
a migration adding the column.

The loss itself is not in the table: it carries the bucket's finite min/max and the non-finite
kind beside it, which retention and the loss-curve read handle on their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import BigInteger, Boolean, Float, Integer
from sqlalchemy.types import TypeEngine


class Fold(StrEnum):
    """How a bucket row summarises the rows it replaces."""

    MEAN = "mean"  # mean weighted by each row's resolution
    MEAN_FINITE = "mean_finite"  # the same over rows whose loss was finite (a NaN step's values are noise)
    MIN = "min"  # e.g. lr_scale: the lowest scale in force shows a rollback happened
    MAX = "max"  # e.g. memory: the peak is what runs out
    MAX_FINITE = "max_finite"  # the peak over rows whose loss was finite
    SUM = "sum"  # counts, e.g. tokens
    ANY = "any"  # booleans: true if any row was


@dataclass(frozen=True, slots=True)
class StepMetricSpec:
    name: str
    """The ``step`` payload field and the column (same name)."""
    sql_type: type[TypeEngine]
    fold: Fold
    per_rank: bool
    """Read by the per-rank charts (``read.rank_metrics``)."""
    default: bool | int | float | None = None
    """A column with a default is NOT NULL (events always carry it)."""


STEP_METRICS: tuple[StepMetricSpec, ...] = (
    StepMetricSpec(name="loss_local", sql_type=Float, fold=Fold.MEAN_FINITE, per_rank=True),
    StepMetricSpec(name="lr", sql_type=Float, fold=Fold.MEAN, per_rank=True),
    StepMetricSpec(name="lr_scale", sql_type=Float, fold=Fold.MIN, per_rank=True),
    StepMetricSpec(name="grad_norm", sql_type=Float, fold=Fold.MAX_FINITE, per_rank=True),
    StepMetricSpec(name="tokens", sql_type=Integer, fold=Fold.SUM, per_rank=False),
    StepMetricSpec(name="tokens_per_s", sql_type=Float, fold=Fold.MEAN, per_rank=True),
    StepMetricSpec(name="mfu", sql_type=Float, fold=Fold.MEAN, per_rank=True),
    StepMetricSpec(name="step_time_s", sql_type=Float, fold=Fold.MEAN, per_rank=True),
    StepMetricSpec(name="data_wait_s", sql_type=Float, fold=Fold.MEAN, per_rank=True),
    StepMetricSpec(name="comm_exposed_s", sql_type=Float, fold=Fold.MEAN, per_rank=True),
    StepMetricSpec(name="compute_s", sql_type=Float, fold=Fold.MEAN, per_rank=True),
    StepMetricSpec(name="mem_allocated", sql_type=BigInteger, fold=Fold.MAX, per_rank=True),
    StepMetricSpec(name="mem_reserved", sql_type=BigInteger, fold=Fold.MAX, per_rank=True),
    StepMetricSpec(name="loss_scale", sql_type=Float, fold=Fold.MIN, per_rank=True),
    StepMetricSpec(name="skipped", sql_type=Boolean, fold=Fold.ANY, per_rank=False, default=False),
    StepMetricSpec(name="clipped_layers", sql_type=Integer, fold=Fold.MAX, per_rank=False),
)

PER_RANK_METRICS: tuple[str, ...] = tuple(m.name for m in STEP_METRICS if m.per_rank)
