"""Elastic scale changes: one row per ``elastic.scaled_down`` / ``elastic.scaled_up`` event.

Revision ID: 0005
Revises: 0002
Create Date: 2026-12-01

A new table only (no existing table changes), so the upgrade is instant on any store size.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "elastic_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("event_id", sa.String(length=32), nullable=True),
        sa.Column("run_id", sa.String(length=128), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("direction", sa.String(length=8), nullable=False),
        sa.Column("from_world", sa.Integer(), nullable=False),
        sa.Column("to_world", sa.Integer(), nullable=False),
        sa.Column("from_global_batch", sa.Integer(), nullable=False),
        sa.Column("global_batch", sa.Integer(), nullable=False),
        sa.Column("grad_accum", sa.Integer(), nullable=False),
        sa.Column("lr", sa.Float(), nullable=False),
        sa.Column("lr_factor", sa.Float(), nullable=False),
        sa.Column("steps_lost", sa.Integer(), nullable=False),
        sa.Column("seconds_lost", sa.Float(), nullable=False),
        sa.Column("backoff_s", sa.Float(), nullable=False),
        sa.Column("policy", sa.String(length=16), nullable=False),
        sa.Column("lr_rule", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_elastic_events_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_elastic_events")),
        sa.UniqueConstraint("event_id", name=op.f("uq_elastic_events_event_id")),
    )
    with op.batch_alter_table("elastic_events", schema=None) as batch_op:
        batch_op.create_index("ix_elastic_events_run", ["run_id", "ts"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("elastic_events", schema=None) as batch_op:
        batch_op.drop_index("ix_elastic_events_run")
    op.drop_table("elastic_events")
