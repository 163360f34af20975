"""Dead letters per run: ``dlq_runs`` (run id from the message key, reason, count, first and last
time, newest detail); and ``runs.summary``, what ``run.finished`` says beyond steps and loss (the
recovery kit's validation cost).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02

Dead letters counted before it are in ``dlq_counts`` only (per topic and reason).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "dlq_runs",
        sa.Column("run_id", sa.String(length=128), nullable=False),
        sa.Column("reason", sa.String(length=64), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("first_ts", sa.Float(), nullable=False),
        sa.Column("last_ts", sa.Float(), nullable=False),
        sa.Column("last_detail", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("run_id", "reason", name=op.f("pk_dlq_runs")),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("summary", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("summary")
    op.drop_table("dlq_runs")
