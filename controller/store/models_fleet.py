"""SQLAlchemy models of the fleet under a run: elastic scale events, goodput and its costs, suspect
nodes and the node each rank ran on (``controller/store/models.py`` names every table)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column

from cliffguard.controller.store.models_base import Base


class ElasticEventRow(Base):
    """A scale change the run resumed from (``elastic.scaled_down`` / ``elastic.scaled_up``): the
    worlds, batches and LR on either side and its goodput cost (steps redone, seconds spent in
    rendezvous and reload, a flapping node's declared back-off)."""

    __tablename__ = "elastic_events"
    __table_args__ = (Index("ix_elastic_events_run", "run_id", "ts"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    event_id: Mapped[str | None] = mapped_column(String(32), unique=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    ts: Mapped[float] = mapped_column(Float)
    direction: Mapped[str] = mapped_column(String(8))  # down | up
    from_world: Mapped[int] = mapped_column(Integer)
    to_world: Mapped[int] = mapped_column(Integer)
    from_global_batch: Mapped[int] = mapped_column(Integer)
    global_batch: Mapped[int] = mapped_column(Integer)
    grad_accum: Mapped[int] = mapped_column(Integer, default=1)
    lr: Mapped[float] = mapped_column(Float)
    lr_factor: Mapped[float] = mapped_column(Float)
    steps_lost: Mapped[int] = mapped_column(Integer, default=0)
    seconds_lost: Mapped[float] = mapped_column(Float, default=0.0)
    backoff_s: Mapped[float] = mapped_column(Float, default=0.0)
    policy: Mapped[str] = mapped_column(String(16))
    lr_rule: Mapped[str] = mapped_column(String(16))


class GoodputRow(Base):
    """A run's goodput ledger (``controller/goodput``): where each second from its first start went
    and the figures readers show, as of ``booked_until`` (written at most ``[goodput] row_every_s``
    of booked time apart when nothing else changed)."""

    __tablename__ = "goodput"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    updated_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float)
    booked_until: Mapped[float | None] = mapped_column(Float)
    """Every second from ``started_at`` to here is in a bucket."""
    ended: Mapped[bool] = mapped_column(Boolean, default=False)
    wall_s: Mapped[float] = mapped_column(Float, default=0.0)
    ettr: Mapped[float | None] = mapped_column(Float)
    """Productive seconds / wall seconds."""
    ettr_gpu: Mapped[float | None] = mapped_column(Float)
    """Productive GPU-seconds / all GPU-seconds."""
    window_ettr: Mapped[float | None] = mapped_column(Float)
    """ETTR over the alert window (``[goodput] ettr_window_s``)."""
    steps_lost: Mapped[int] = mapped_column(Integer, default=0)
    seconds: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    """Bucket -> seconds."""
    gpu_seconds: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    """``controller.goodput.summary.summarize``: counts, checkpoints and their counterfactual."""
    timeline: Mapped[list[Any]] = mapped_column(JSON, default=list)
    """The stacked chart's points: [seconds since the first start, cumulative seconds per bucket...]
    (the ledger's own state, the rest, is saved with the run's: ``runs.controller_state``)."""


class GoodputCostRow(Base):
    """What one incident, restart or scale change of a run cost, by goodput bucket."""

    __tablename__ = "goodput_costs"
    __table_args__ = (Index("ix_goodput_costs_ts", "ts"),)

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    """The incident's id, or ``restart:<n>`` / ``unexplained:<n>``."""
    kind: Mapped[str] = mapped_column(String(16))  # incident | restart | elastic | unexplained
    ts: Mapped[float] = mapped_column(Float)
    """When it began costing."""
    steps_lost: Mapped[int] = mapped_column(Integer, default=0)
    seconds: Mapped[float] = mapped_column(Float, default=0.0)
    gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    buckets: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    """Bucket -> {"seconds", "gpu_seconds"}."""


class SuspectNodeRow(Base):
    """A node the controller evicted (issue 22): kept out of every run until cleared.

    One row per eviction, kept after it is cleared: a node with any row has a record and is evicted
    sooner (``[recovery] recorded_transient_budget``). Written by the controller's edge
    (``controller/suspects.py``); cleared by ``cliffguard nodes clear`` or by a node check that passes
    after ``cliffguard nodes recheck`` (both audited). No foreign key to ``runs``: a record outlives
    the run that made it (retention may delete the run; the node must stay out)."""

    __tablename__ = "suspect_nodes"
    __table_args__ = (Index("ix_suspect_nodes_node", "node", "cleared_at"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(128))
    device: Mapped[int | None] = mapped_column(Integer)
    """A device-level eviction's device slot on ``node`` (NULL: the whole node). A device record does not
    keep its node out: the node is admitted, the launch that evicted it runs without the device."""
    cause: Mapped[str] = mapped_column(String(32))  # bad_rank | transient | hang_again | node_check_failed
    reason: Mapped[str] = mapped_column(Text)
    run_id: Mapped[str] = mapped_column(String(128))
    incident_id: Mapped[str | None] = mapped_column(String(32))
    since: Mapped[float] = mapped_column(Float)
    recheck_at: Mapped[float | None] = mapped_column(Float)
    """When an operator asked to re-admit it on a passing node check (``cliffguard nodes recheck``)."""
    cleared_at: Mapped[float | None] = mapped_column(Float)
    cleared_by: Mapped[str | None] = mapped_column(String(128))
    clear_reason: Mapped[str | None] = mapped_column(Text)


class RankNodeRow(Base):
    """Which node each rank of a run was on, by the run's node heartbeats (``controller/rank_nodes.py``):
    kept so that an SDC verdict right after a controller restart can still name the rank's node.
    A run's rows are written when its mapping changes (a rank seen on another node or in another
    life of the worker group), never per beat, and loaded when the controller starts."""

    __tablename__ = "rank_nodes"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    node: Mapped[str] = mapped_column(String(128))
    life: Mapped[int | None] = mapped_column(Integer)
    """The worker group's life the node's beat named (NULL: the beat named none)."""
    slot: Mapped[int | None] = mapped_column(Integer)
    """The rank's device slot on its node, by the node's beat (NULL: unknown; a device-level eviction
    then leaves the whole node out)."""
    node_ranks: Mapped[int | None] = mapped_column(Integer)
    """How many ranks the node ran in that beat (NULL: unknown)."""
    updated_at: Mapped[float] = mapped_column(Float)
    """When the run's mapping was last written (the newest runs are loaded first)."""
