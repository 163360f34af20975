"""The commands a run declared it can apply, and the LR scale its trainer applied.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

Nullable columns only: a run stored before this revision has NULL capabilities (read as every
command, which is what its agent could apply); its applied scale is filled from its newest rank-0
step row, which is what its trainer reported applying.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("lr_scale_applied", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("lr_scale_applied_at", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("capabilities", sa.JSON(), nullable=True))
    newest = ("(SELECT {col} FROM step_metrics AS s WHERE s.run_id = runs.id AND s.rank = 0 "
              "ORDER BY s.ts DESC LIMIT 1)")
    op.execute(f"UPDATE runs SET lr_scale_applied = {newest.format(col='s.lr_scale')}, "
               f"lr_scale_applied_at = {newest.format(col='s.ts')}")


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("capabilities")
        batch_op.drop_column("lr_scale_applied_at")
        batch_op.drop_column("lr_scale_applied")
