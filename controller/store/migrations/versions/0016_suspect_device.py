"""A suspect record may name one device of its node (a device-level eviction): ``suspect_nodes.device``.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05

One nullable column (NULL: the whole node, every record before this), so the upgrade is instant.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("suspect_nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("device", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("suspect_nodes", schema=None) as batch_op:
        batch_op.drop_column("device")
