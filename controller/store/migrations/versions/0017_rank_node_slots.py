"""A rank's device slot on its node is stored with its node: ``rank_nodes.slot`` and ``.node_ranks``.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05

A device-level eviction right after a controller restart, before the node beat again, left the
whole node out: the slots were kept in memory only. Two nullable columns (NULL: unknown, every row
before this), so the upgrade is instant.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("rank_nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("slot", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("node_ranks", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rank_nodes", schema=None) as batch_op:
        batch_op.drop_column("node_ranks")
        batch_op.drop_column("slot")
