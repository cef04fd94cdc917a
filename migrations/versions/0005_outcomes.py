"""Outcomes: a later run that worked, linked to the failed bundle, and the suggestion ids it confirms (issue 14).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-14
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "outcomes",
        sa.Column("id", sa.String(26), primary_key=True),
        sa.Column("bundle_id", sa.String(26), sa.ForeignKey("bundles.id", ondelete="CASCADE"), nullable=False),
        sa.Column("machine", sa.String(64), nullable=False),
        sa.Column("worked", sa.Boolean(), nullable=False),
        sa.Column("change", JSONType, nullable=False),
        sa.Column("suggestion_ids", JSONType, nullable=False),
        sa.Column("engine", sa.String(40)),
        sa.Column("created_at", sa.String(40), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("token_id", sa.Integer(), sa.ForeignKey("api_tokens.id", ondelete="SET NULL")),
    )
    op.create_index("ix_outcomes_bundle_id", "outcomes", ["bundle_id"])
    op.create_table(
        "outcome_suggestions",
        sa.Column("outcome_id", sa.String(26), sa.ForeignKey("outcomes.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("suggestion_id", sa.String(60), primary_key=True),
        sa.Column("bundle_id", sa.String(26), sa.ForeignKey("bundles.id", ondelete="CASCADE"), nullable=False),
    )
    op.create_index("ix_outcome_suggestions_bundle", "outcome_suggestions", ["bundle_id"])


def downgrade() -> None:
    op.drop_index("ix_outcome_suggestions_bundle", table_name="outcome_suggestions")
    op.drop_table("outcome_suggestions")
    op.drop_index("ix_outcomes_bundle_id", table_name="outcomes")
    op.drop_table("outcomes")
