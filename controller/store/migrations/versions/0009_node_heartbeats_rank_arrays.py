"""Node heartbeats in one row per node: ``heartbeats`` gains ``ranks``, ``steps``, ``seen_ts``
and ``collectives`` (JSON arrays, NULL for a rank that beats for itself); ``ranks`` events in one
row per event: ``rank_arrays``.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01

Rows stored before it are per-rank rows (heartbeat arrays NULL; a ``ranks`` event's per-rank
``step_metrics`` rows), which the readers read as they are.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None

_COLUMNS = ("ranks", "steps", "seen_ts", "collectives")


def upgrade() -> None:
    with op.batch_alter_table("heartbeats", schema=None) as batch_op:
        for name in _COLUMNS:
            batch_op.add_column(sa.Column(name, sa.JSON(), nullable=True))
    op.create_table(
        "rank_arrays",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("event_id", sa.String(length=32), nullable=False),
        sa.Column("run_id", sa.String(length=128), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("first_rank", sa.Integer(), nullable=False),
        sa.Column("arrays", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_rank_arrays_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rank_arrays")),
        sa.UniqueConstraint("event_id", name=op.f("uq_rank_arrays_event_id")),
    )
    with op.batch_alter_table("rank_arrays", schema=None) as batch_op:
        batch_op.create_index("ix_rank_arrays_run_step", ["run_id", "step"], unique=False)


def downgrade() -> None:
    op.drop_table("rank_arrays")
    with op.batch_alter_table("heartbeats", schema=None) as batch_op:
        for name in reversed(_COLUMNS):
            batch_op.drop_column(name)
