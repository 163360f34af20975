"""Node heartbeats in one row per node: ``heartbeats`` gains ``ranks``, ``steps``, ``seen_ts``
and ``collectives`` (JSON arrays, NULL for a rank that beats for itself).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01

Rows stored before it are per-rank rows (arrays NULL), which the new layout reads as they are.
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


def downgrade() -> None:
    with op.batch_alter_table("heartbeats", schema=None) as batch_op:
        for name in reversed(_COLUMNS):
            batch_op.drop_column(name)
