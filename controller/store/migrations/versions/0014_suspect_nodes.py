"""The suspect-node store: ``suspect_nodes``, one row per node the controller evicted (issue 22).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06

A new table only, so the upgrade is instant on any store size.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "suspect_nodes",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("cause", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("run_id", sa.String(length=128), nullable=False),
        sa.Column("incident_id", sa.String(length=32), nullable=True),
        sa.Column("since", sa.Float(), nullable=False),
        sa.Column("recheck_at", sa.Float(), nullable=True),
        sa.Column("cleared_at", sa.Float(), nullable=True),
        sa.Column("cleared_by", sa.String(length=128), nullable=True),
        sa.Column("clear_reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_suspect_nodes")),
    )
    with op.batch_alter_table("suspect_nodes", schema=None) as batch_op:
        batch_op.create_index("ix_suspect_nodes_node", ["node", "cleared_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("suspect_nodes", schema=None) as batch_op:
        batch_op.drop_index("ix_suspect_nodes_node")
    op.drop_table("suspect_nodes")
