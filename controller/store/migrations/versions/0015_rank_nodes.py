"""The rank -> node map of each run: ``rank_nodes`` (controller/rank_nodes.py), so that an SDC verdict
right after a controller restart can still name the rank's node.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05

A new table only, so the upgrade is instant on any store size.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "rank_nodes",
        sa.Column("run_id", sa.String(length=128), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("life", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_rank_nodes_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "rank", name=op.f("pk_rank_nodes")),
    )


def downgrade() -> None:
    op.drop_table("rank_nodes")
