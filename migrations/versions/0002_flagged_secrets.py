"""Bundles remember what the server's second redaction pass flagged (paths and kinds, never values).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("bundles") as batch:
        batch.add_column(sa.Column("flagged_secrets", JSONType, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("bundles") as batch:
        batch.drop_column("flagged_secrets")
