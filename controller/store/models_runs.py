"""SQLAlchemy models of what a run reports: the run, its steps, gradients, heartbeats, rank arrays,
rule state and data checks (``controller/store/models.py`` names every table)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column

from cliffguard.controller.store.models_base import Base, _now
from cliffguard.controller.store.step_metrics import STEP_METRICS


class RunRow(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=_now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=_now(), onupdate=_now())
    status: Mapped[str] = mapped_column(String(16), default="running")  # running | finished | failed | preempted
    recovery_state: Mapped[str] = mapped_column(String(32), default="running")
    world_size: Mapped[int] = mapped_column(Integer, default=1)
    last_step: Mapped[int] = mapped_column(Integer, default=0)
    last_event_ts: Mapped[float | None] = mapped_column(Float)
    lr_scale: Mapped[float] = mapped_column(Float, default=1.0)  # what the recovery machine asked for
    # What the trainer applied: the newest rank-0 step's lr_scale or applied rollback/set_lr_scale ack
    # (``lr_scale_applied_at``: that event's ts); NULL until the trainer said.
    lr_scale_applied: Mapped[float | None] = mapped_column(Float)
    lr_scale_applied_at: Mapped[float | None] = mapped_column(Float)
    # The commands the run declared in run.started (``core/capabilities.py``); NULL: none declared,
    # read as every command.
    capabilities: Mapped[list[str] | None] = mapped_column(JSON)
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # run.started payload
    started_at: Mapped[float | None] = mapped_column(Float)  # ts of the newest run.started
    ended_at: Mapped[float | None] = mapped_column(Float)  # ts of run.finished / run.failed
    error: Mapped[str | None] = mapped_column(Text)  # run.failed's error
    # run.finished's summaries beyond steps and loss (the kit's ``validation`` cost); NULL before one
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Steps below this are summarised in buckets by store.retention; ingest ignores per-step rows
    # below it (a re-delivery of an event already folded into a bucket must change nothing).
    downsampled_below: Mapped[int] = mapped_column(Integer, default=0)
    # Serialized controller-side state for this run (detectors' and the recovery machine's
    # state_dicts), written in the same transaction as the offsets, so a run whose partition
    # moves to another instance resumes exactly where the previous one stopped.
    controller_state: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # The loss-spike rule the controller judged this run with ({"window", "k_warn", "k_crit", ...}),
    # so the dashboard draws the bands of the rule that decided, from step_metrics.rule_* below.
    spike_rule: Mapped[dict[str, Any] | None] = mapped_column(JSON)


def _step_metric_columns() -> type:
    """A mixin with one nullable column per row of ``STEP_METRICS`` (``controller/store/step_metrics.py``)."""
    columns = {m.name: mapped_column(m.sql_type(), nullable=m.default is None, default=m.default)
               for m in STEP_METRICS}
    return type("StepMetricColumns", (), columns)


class StepMetricRow(_step_metric_columns(), Base):  # type: ignore[misc]
    """One row per (run, step, rank) at full resolution; older ranges are downsampled
    (``resolution`` > 1 = one row summarising that many steps; see store.retention)."""

    __tablename__ = "step_metrics"
    __table_args__ = (
        Index("ix_step_metrics_run_step", "run_id", "step"),
        Index("ix_step_metrics_run_rank_step", "run_id", "rank", "step"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    event_id: Mapped[str | None] = mapped_column(String(32), unique=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer, default=0)
    ts: Mapped[float] = mapped_column(Float)
    resolution: Mapped[int] = mapped_column(Integer, default=1)
    loss: Mapped[float | None] = mapped_column(Float)
    # Buckets (resolution > 1): the smallest and largest finite loss in the bucket, so spikes stay
    # visible after downsampling; NULL on full-resolution rows (there loss is the value).
    loss_min: Mapped[float | None] = mapped_column(Float)
    loss_max: Mapped[float | None] = mapped_column(Float)
    nonfinite: Mapped[str | None] = mapped_column(String(8))
    guard: Mapped[str | None] = mapped_column(String(8))
    layer_grad_norms: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # What the controller's loss-spike rule knew when it judged this row's loss (only on the rows of
    # the rank that feeds the rule; NULL elsewhere, in buckets and before the rule was recorded):
    # the healthy window's median and robust sigma just before this point, and its verdict level.
    rule_median: Mapped[float | None] = mapped_column(Float)
    rule_sigma: Mapped[float | None] = mapped_column(Float)
    rule_level: Mapped[str | None] = mapped_column(String(8))


class GradHistRow(Base):
    __tablename__ = "grad_hists"
    __table_args__ = (Index("ix_grad_hists_run_step", "run_id", "step"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    event_id: Mapped[str | None] = mapped_column(String(32), unique=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer, default=0)
    ts: Mapped[float] = mapped_column(Float)
    edges: Mapped[list[float]] = mapped_column(JSON)
    layers: Mapped[dict[str, Any]] = mapped_column(JSON)  # name -> {counts, zeros, nonfinite, p50, ...}


class HeartbeatRow(Base):
    """The newest heartbeat of each beating rank: a node's local rank 0 (its node heartbeat, with
    its ranks' last steps in the array columns: one row per node, not per rank) or a rank that
    beats for itself (arrays NULL). ``controller/store/heartbeats.py`` writes and expands them."""

    __tablename__ = "heartbeats"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[float] = mapped_column(Float)
    step: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[str] = mapped_column(String(16), default="running")
    ranks: Mapped[list[int] | None] = mapped_column(JSON)
    """The node's ranks; NULL: the row speaks for ``rank`` alone."""
    steps: Mapped[list[int] | None] = mapped_column(JSON)
    """Each of ``ranks``' last step."""
    seen_ts: Mapped[list[float] | None] = mapped_column(JSON)
    """When each of ``ranks`` was last alive (the beat's ts less the rank's age)."""
    collectives: Mapped[list[str] | None] = mapped_column(JSON)
    """The collective each of ``ranks`` is inside ("" for none)."""


class RankArrayRow(Base):
    """One ``ranks`` event: its chunk's per-rank arrays as they came (``core.rank_arrays.RANKS_ARRAYS``),
    one row per event, not one per rank: a 16k-rank run's 16 events every ``ranks_every`` steps
    are 16 rows, not 16k. ``controller/store/rank_arrays.py`` writes and expands them."""

    __tablename__ = "rank_arrays"
    __table_args__ = (Index("ix_rank_arrays_run_step", "run_id", "step"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(String(32), unique=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    ts: Mapped[float] = mapped_column(Float)
    first_rank: Mapped[int] = mapped_column(Integer)
    arrays: Mapped[dict[str, Any]] = mapped_column(JSON)
    """Array name -> one value per rank from ``first_rank`` on (non-finite floats as core.floats writes them)."""


class RuleStateRow(Base):
    """One rule's state of one run (``RunDetector.state_dict()[rule]``) as JSON text, written only
    when the rule saw something since the last save: a 16k-rank run's per-rank windows are ~10^6
    numbers that change every ``ranks_every`` steps, while ``runs.controller_state`` (the small
    rest) is written every batch. Same transaction as the offsets (controller/runstate.py)."""

    __tablename__ = "rule_states"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    rule: Mapped[str] = mapped_column(String(64), primary_key=True)
    state: Mapped[str] = mapped_column(Text)


class DataFlagRow(Base):
    __tablename__ = "data_flags"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    event_id: Mapped[str | None] = mapped_column(String(32), unique=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    ts: Mapped[float] = mapped_column(Float)
    rule: Mapped[str] = mapped_column(String(64))
    score: Mapped[float | None] = mapped_column(Float)
    sample_ids: Mapped[list[int]] = mapped_column(JSON, default=list)


class DataStatsRow(Base):
    """One ``data.stats`` event: a watching rank's batch statistics over a window of steps
    (agent/data_watch/), what the data rules judged and a loss incident shows beside the baseline.
    The per-step arrays are one JSON object (``steps``, ``dup``, ``pad``, ``garbled``, ``ppl``)."""

    __tablename__ = "data_stats"
    __table_args__ = (Index("ix_data_stats_run_step", "run_id", "step"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    event_id: Mapped[str | None] = mapped_column(String(32), unique=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer, default=0)
    first_step: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)  # the window's last step
    ts: Mapped[float] = mapped_column(Float)
    batches: Mapped[int] = mapped_column(Integer)
    sequences: Mapped[int] = mapped_column(Integer)
    tokens: Mapped[int] = mapped_column(BigInteger)
    pad_share: Mapped[float | None] = mapped_column(Float)
    dup_share: Mapped[float | None] = mapped_column(Float)
    dup_in_batch: Mapped[float | None] = mapped_column(Float)
    garbled: Mapped[float | None] = mapped_column(Float)  # NULL: no garbled-text scorer
    ppl: Mapped[float | None] = mapped_column(Float)  # the window's mean batch log-perplexity; NULL: no reference model
    dropped: Mapped[int] = mapped_column(Integer, default=0)
    per_step: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    len_counts: Mapped[list[int]] = mapped_column(JSON, default=list)
    sketch: Mapped[list[int]] = mapped_column(JSON, default=list)
    outliers: Mapped[list[Any]] = mapped_column(JSON, default=list)  # [step, sample id, reason, score], worst first per reason
