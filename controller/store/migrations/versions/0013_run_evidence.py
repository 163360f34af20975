"""The run's evidence: one row per ``hang.evidence`` (a rank's Flight Recorder sequence numbers and
its stacks) and ``node.check`` event.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02

A new table only, so the upgrade is instant on any store size.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "run_evidence",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("event_id", sa.String(length=32), nullable=False),
        sa.Column("run_id", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("life", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(length=32), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_run_evidence_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_evidence")),
        sa.UniqueConstraint("event_id", name=op.f("uq_run_evidence_event_id")),
    )
    with op.batch_alter_table("run_evidence", schema=None) as batch_op:
        batch_op.create_index("ix_run_evidence_run", ["run_id", "ts"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("run_evidence", schema=None) as batch_op:
        batch_op.drop_index("ix_run_evidence_run")
    op.drop_table("run_evidence")
