"""The goodput ledger: ``goodput`` (one row per run) and ``goodput_costs`` (one per incident,
restart or scale change of a run).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02

Runs stored before it have no row until their next event; their earlier time is not booked.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "goodput",
        sa.Column("run_id", sa.String(length=128), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("booked_until", sa.Float(), nullable=True),
        sa.Column("ended", sa.Boolean(), nullable=False),
        sa.Column("wall_s", sa.Float(), nullable=False),
        sa.Column("ettr", sa.Float(), nullable=True),
        sa.Column("ettr_gpu", sa.Float(), nullable=True),
        sa.Column("window_ettr", sa.Float(), nullable=True),
        sa.Column("steps_lost", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.JSON(), nullable=False),
        sa.Column("gpu_seconds", sa.JSON(), nullable=False),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.Column("timeline", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_goodput_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_goodput")),
    )
    op.create_table(
        "goodput_costs",
        sa.Column("run_id", sa.String(length=128), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("steps_lost", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("gpu_seconds", sa.Float(), nullable=False),
        sa.Column("buckets", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_goodput_costs_run_id_runs"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "key", name=op.f("pk_goodput_costs")),
    )
    with op.batch_alter_table("goodput_costs", schema=None) as batch_op:
        batch_op.create_index("ix_goodput_costs_ts", ["ts"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("goodput_costs", schema=None) as batch_op:
        batch_op.drop_index("ix_goodput_costs_ts")
    op.drop_table("goodput_costs")
    op.drop_table("goodput")
