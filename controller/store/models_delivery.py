"""SQLAlchemy models of what leaves or enters the controller and must be neither lost nor repeated:
alerts, the command outbox, consumer offsets and dead-letter counts (``controller/store/models.py`` names every table)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column

from cliffguard.controller.store.models_base import Base


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
