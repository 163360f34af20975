"""The data watch's windows: ``data_stats``, one row per ``data.stats`` event (issue 30).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "data_stats",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("event_id", sa.String(length=32), nullable=True),
        sa.Column("run_id", sa.String(length=128), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("first_step", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("batches", sa.Integer(), nullable=False),
        sa.Column("sequences", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.Column("pad_share", sa.Float(), nullable=True),
        sa.Column("dup_share", sa.Float(), nullable=True),
        sa.Column("dup_in_batch", sa.Float(), nullable=True),
        sa.Column("garbled", sa.Float(), nullable=True),
        sa.Column("ppl", sa.Float(), nullable=True),
        sa.Column("dropped", sa.Integer(), nullable=False),
        sa.Column("per_step", sa.JSON(), nullable=False),
        sa.Column("len_counts", sa.JSON(), nullable=False),
        sa.Column("sketch", sa.JSON(), nullable=False),
        sa.Column("outliers", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_data_stats_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_data_stats")),
        sa.UniqueConstraint("event_id", name=op.f("uq_data_stats_event_id")),
    )
    with op.batch_alter_table("data_stats", schema=None) as batch_op:
        batch_op.create_index("ix_data_stats_run_step", ["run_id", "step"], unique=False)


def downgrade() -> None:
    op.drop_table("data_stats")
