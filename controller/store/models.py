"""SQLAlchemy 2.0 models: everything the controller decides, and what the dashboard reads.

Portable across SQLite and PostgreSQL: generic types only (JSON, not JSONB; String ids). Floats
that may be non-finite (a NaN loss is exactly what we must record) are stored as-is in REAL/
DOUBLE columns on PostgreSQL; SQLite turns NaN into NULL, so rows also carry ``nonfinite``
(a short text, "nan"/"inf"/"-inf" for the loss) to keep the fact. JSON columns never hold NaN
(encoders use ``core.events.to_json`` first) because PostgreSQL's JSON rejects it.

Schema changes go through Alembic migrations in ``controller/store/migrations``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from cliffguard.controller.store.step_metrics import STEP_METRICS

# Named constraints: Alembic's batch mode (SQLite) can only drop or alter constraints it can name.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _now() -> Any:
    return func.now()


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


class IncidentRow(Base):
    __tablename__ = "incidents"
    __table_args__ = (Index("ix_incidents_run", "run_id", "opened_at"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    opened_at: Mapped[float] = mapped_column(Float)
    closed_at: Mapped[float | None] = mapped_column(Float)
    rule: Mapped[str] = mapped_column(String(64))
    level: Mapped[str] = mapped_column(String(16))
    spike_step: Mapped[int] = mapped_column(Integer)
    onset_step: Mapped[int | None] = mapped_column(Integer)
    outcome: Mapped[str] = mapped_column(String(16), default="open")  # open | resumed | rolled_back | halted | abandoned | requeued | restarted | cured
    rollback_to: Mapped[int | None] = mapped_column(Integer)
    lr_scale: Mapped[float | None] = mapped_column(Float)
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class TransitionRow(Base):
    """One edge of a run's recovery state machine, with its reason and evidence."""

    __tablename__ = "transitions"
    __table_args__ = (Index("ix_transitions_run", "run_id", "ts"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    incident_id: Mapped[str | None] = mapped_column(ForeignKey("incidents.id", ondelete="CASCADE"))
    ts: Mapped[float] = mapped_column(Float)
    step: Mapped[int | None] = mapped_column(Integer)
    from_state: Mapped[str] = mapped_column(String(32))
    to_state: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(Text)
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class CommandRow(Base):
    """Every command issued (by the controller or an operator) and what became of it."""

    __tablename__ = "commands"
    __table_args__ = (Index("ix_commands_run", "run_id", "issued_at"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    incident_id: Mapped[str | None] = mapped_column(ForeignKey("incidents.id", ondelete="SET NULL"))
    type: Mapped[str] = mapped_column(String(32))
    args: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    issued_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(16), default="controller")  # controller | operator
    # pending (in the outbox) | sent | applied | rejected | failed | expired | duplicate | timeout | cancelled
    status: Mapped[str] = mapped_column(String(16), default="pending")
    ack_detail: Mapped[str | None] = mapped_column(Text)
    acked_at: Mapped[float | None] = mapped_column(Float)
    attempt: Mapped[int] = mapped_column(Integer, default=1)


class AuditRow(Base):
    """Who did what by hand (operator commands from the CLI or the dashboard)."""

    __tablename__ = "audit"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    ts: Mapped[float] = mapped_column(Float)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(64))
    run_id: Mapped[str | None] = mapped_column(String(128))
    command_id: Mapped[str | None] = mapped_column(String(32))
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class CommandRequestRow(Base):
    """An operator's unsigned request for a command (dashboard or CLI), and the controller's decision.

    Written by the requester alone (``controller.store.requests.submit_request``); the controller
    validates it, and either signs and queues the command (``accepted``, ``command_id`` set) or
    refuses it (``rejected``, ``detail`` says why). Kept as the audit trail of who asked for what.
    """

    __tablename__ = "command_requests"
    __table_args__ = (Index("ix_command_requests_pending", "status", "requested_at"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(128))  # no foreign key: a request for an unknown run is rejected
    type: Mapped[str] = mapped_column(String(32))
    args: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    requested_by: Mapped[str] = mapped_column(String(128))
    source: Mapped[str] = mapped_column(String(16))  # dashboard | cli
    reason: Mapped[str | None] = mapped_column(Text)
    requested_at: Mapped[float] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending | accepted | rejected
    decided_at: Mapped[float | None] = mapped_column(Float)
    detail: Mapped[str | None] = mapped_column(Text)
    command_id: Mapped[str | None] = mapped_column(String(32))


class CheckpointRow(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("run_id", "step", "kind", name="uq_checkpoint_run_step_kind"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))  # memory | incremental | full
    path: Mapped[str] = mapped_column(Text, default="")
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    sha256: Mapped[str] = mapped_column(String(64), default="")
    seconds: Mapped[float] = mapped_column(Float, default=0.0)
    verified: Mapped[bool] = mapped_column(Boolean, default=False)
    stable: Mapped[bool] = mapped_column(Boolean, default=False)
    stable_reason: Mapped[str | None] = mapped_column(Text)
    ts: Mapped[float] = mapped_column(Float)
    detail: Mapped[str | None] = mapped_column(Text)  # e.g. "corrupt newest, fell back to ..."


class ValidationRow(Base):
    __tablename__ = "validations"
    __table_args__ = (Index("ix_validations_run", "run_id", "step"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    event_id: Mapped[str | None] = mapped_column(String(32), unique=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    ts: Mapped[float] = mapped_column(Float)
    cmd: Mapped[str | None] = mapped_column(String(32))
    val_loss: Mapped[float | None] = mapped_column(Float)
    nonfinite: Mapped[str | None] = mapped_column(String(8))  # "nan"/"inf"/"-inf" val_loss (SQLite drops NaN)
    batches: Mapped[int] = mapped_column(Integer, default=0)


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


class EvidenceRow(Base):
    """The run's evidence (migration 0013): a rank's ``hang.evidence`` (its Flight Recorder's
    sequence numbers, in-flight collectives and every thread's stack, bounded) or a restarted
    group's ``node.check``, as the agent sent it (``data``)."""

    __tablename__ = "run_evidence"
    __table_args__ = (Index("ix_run_evidence_run", "run_id", "ts"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(String(32), unique=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(32))  # hang.evidence | node.check
    rank: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    ts: Mapped[float] = mapped_column(Float)
    life: Mapped[int] = mapped_column(Integer, default=0)
    reason: Mapped[str] = mapped_column(String(32))  # stalled | collective_error | resolved | ok | failed
    node: Mapped[str] = mapped_column(String(128), default="")
    data: Mapped[dict[str, Any]] = mapped_column(JSON)


class AlertRow(Base):
    __tablename__ = "alerts"
    __table_args__ = (Index("ix_alerts_run", "run_id", "ts"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    run_id: Mapped[str | None] = mapped_column(String(128))
    incident_id: Mapped[str | None] = mapped_column(String(32))
    ts: Mapped[float] = mapped_column(Float)
    level: Mapped[str] = mapped_column(String(16))  # info | warn | critical
    rule: Mapped[str] = mapped_column(String(64))
    title: Mapped[str] = mapped_column(Text)
    body: Mapped[str] = mapped_column(Text, default="")
    # open incidents trigger; a closed incident sends "resolve" (PagerDuty) with the same dedup key
    action: Mapped[str] = mapped_column(String(16), default="trigger")
    suppressed: Mapped[bool] = mapped_column(Boolean, default=False)
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class OutboxRow(Base):
    """Transactional outbox: written with the state that produced it, published after commit.

    kind="command": ``target`` is the Kafka topic, ``key`` the run id, ``payload`` the encoded
    command. kind="alert": ``target`` is the endpoint name, ``payload`` the alert id.
    Publishing is idempotent by ``id`` (command ids are checked by the trainer, webhook ids by
    receivers), so a re-send after a crash between send and mark is harmless.
    """

    __tablename__ = "outbox"
    __table_args__ = (Index("ix_outbox_pending", "status", "next_attempt_at"),)

    id: Mapped[str] = mapped_column(String(80), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # command | alert
    target: Mapped[str] = mapped_column(String(256))
    key: Mapped[str | None] = mapped_column(String(128))
    payload: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[float] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending | delivered | failed | disabled
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[float] = mapped_column(Float)
    delivered_at: Mapped[float | None] = mapped_column(Float)
    last_error: Mapped[str | None] = mapped_column(Text)


class AlertEndpointStateRow(Base):
    """Per-endpoint delivery state: an HTTP 410 Gone disables the endpoint until re-enabled."""

    __tablename__ = "alert_endpoints"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)
    disabled_reason: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[float] = mapped_column(Float)


class ConsumerOffsetRow(Base):
    """Next offset to read per (group, topic, partition), committed with the state it produced."""

    __tablename__ = "consumer_offsets"

    group_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    topic: Mapped[str] = mapped_column(String(256), primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    offset: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[float] = mapped_column(Float)


class DlqCountRow(Base):
    __tablename__ = "dlq_counts"

    topic: Mapped[str] = mapped_column(String(256), primary_key=True)
    reason: Mapped[str] = mapped_column(String(64), primary_key=True)  # e.g. invalid_json, unknown_version
    count: Mapped[int] = mapped_column(BigInteger, default=0)
    last_ts: Mapped[float] = mapped_column(Float)
    last_detail: Mapped[str | None] = mapped_column(Text)


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


class DlqRunRow(Base):
    """Dead letters per (run, reason), the run read off the message's Kafka key (the run id by the
    contract): a run whose events are all refused (unsigned, say) has no ``runs`` row, so this is
    where ``cliffguard status`` finds it."""

    __tablename__ = "dlq_runs"

    run_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    reason: Mapped[str] = mapped_column(String(64), primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger, default=0)
    first_ts: Mapped[float] = mapped_column(Float)
    last_ts: Mapped[float] = mapped_column(Float)
    last_detail: Mapped[str | None] = mapped_column(Text)


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
    updated_at: Mapped[float] = mapped_column(Float)
    """When the run's mapping was last written (the newest runs are loaded first)."""
