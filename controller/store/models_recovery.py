"""SQLAlchemy models of what the controller decided about a run: incidents, transitions, commands
and operator requests, checkpoints, validations and evidence (``controller/store/models.py`` names every table)."""

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
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from cliffguard.controller.store.models_base import Base


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
