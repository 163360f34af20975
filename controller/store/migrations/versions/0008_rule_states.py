"""Rule states apart from the run row: ``rule_states`` (one row per run and rule, JSON text).

Revision ID: 0008
Revises: 0002
Create Date: 2026-12-01

A new table only. Runs stored before it keep every rule's state inside ``runs.controller_state``;
the controller reads that layout too and moves the states here on its first save.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "rule_states",
        sa.Column("run_id", sa.String(length=128), nullable=False),
        sa.Column("rule", sa.String(length=64), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_rule_states_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "rule", name=op.f("pk_rule_states")),
    )


def downgrade() -> None:
    op.drop_table("rule_states")
