"""Initial schema: clusters, bundles, facets, per-day counts, API tokens, users.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "clusters",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("scheme", sa.Integer, nullable=False),
        sa.Column("key", sa.String(300), nullable=False),
        sa.Column("signature_id", sa.String(64)),
        sa.Column("title", sa.String(500), nullable=False),
        sa.Column("engine", sa.String(40)),
        sa.Column("phase", sa.String(40)),
        sa.Column("backend", sa.String(40)),
        sa.Column("verdict", sa.String(40)),
        sa.Column("count", sa.Integer, nullable=False),
        sa.Column("machines", sa.Integer, nullable=False),
        sa.Column("first_seen", TS),
        sa.Column("last_seen", TS),
        sa.Column("min_build", sa.Integer),
        sa.Column("max_build", sa.Integer),
        sa.Column("first_version", sa.String(100)),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("known_fix", sa.Text),
        sa.Column("issue_url", sa.String(500)),
        sa.Column("updated_at", TS),
        sa.UniqueConstraint("scheme", "key", name="uq_clusters_scheme_key"),
    )
    for col in ("engine", "phase", "backend", "verdict", "last_seen", "status"):
        op.create_index(f"ix_clusters_{col}", "clusters", [col])

    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False, unique=True),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("scope", sa.String(10), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("revoked_at", TS),
        sa.Column("last_used_at", TS),
    )
    op.create_index("ix_api_tokens_name", "api_tokens", ["name"])

    op.create_table(
        "bundles",
        sa.Column("id", sa.String(26), primary_key=True),
        sa.Column("cluster_id", sa.Integer, sa.ForeignKey("clusters.id"), nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("data", JSONType, nullable=False),
        sa.Column("diagnosis", JSONType, nullable=False),
        sa.Column("analyzer_version", sa.String(40), nullable=False),
        sa.Column("created_at", sa.String(40)),
        sa.Column("received_at", TS, nullable=False),
        sa.Column("engine_name", sa.String(40)),
        sa.Column("engine_version", sa.String(100)),
        sa.Column("build_number", sa.Integer),
        sa.Column("backend", sa.String(40)),
        sa.Column("gpu", sa.String(200)),
        sa.Column("model_name", sa.String(300)),
        sa.Column("n_ctx", sa.BigInteger),
        sa.Column("phase", sa.String(40)),
        sa.Column("verdict", sa.String(40)),
        sa.Column("machine", sa.String(32)),
        sa.Column("size_bytes", sa.Integer, nullable=False),
        sa.Column("suggestion_ids", JSONType),
        sa.Column("token_id", sa.Integer, sa.ForeignKey("api_tokens.id", ondelete="SET NULL")),
    )
    op.create_index("ix_bundles_cluster_received", "bundles", ["cluster_id", "received_at"])
    op.create_index("ix_bundles_engine_build", "bundles", ["engine_name", "build_number"])
    op.create_index("ix_bundles_analyzer_version", "bundles", ["analyzer_version"])

    op.create_table(
        "cluster_facets",
        sa.Column("cluster_id", sa.Integer, sa.ForeignKey("clusters.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("kind", sa.String(20), primary_key=True),
        sa.Column("value", sa.String(200), primary_key=True),
        sa.Column("count", sa.Integer, nullable=False),
    )
    op.create_index("ix_cluster_facets_kind_value", "cluster_facets", ["kind", "value"])

    op.create_table(
        "cluster_days",
        sa.Column("cluster_id", sa.Integer, sa.ForeignKey("clusters.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("day", sa.Date, primary_key=True),
        sa.Column("count", sa.Integer, nullable=False),
    )

    op.create_table(
        "users",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("username", sa.String(100), nullable=False, unique=True),
        sa.Column("password_hash", sa.String(300), nullable=False),
        sa.Column("is_maintainer", sa.Boolean, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("disabled", sa.Boolean, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("users")
    op.drop_table("cluster_days")
    op.drop_index("ix_cluster_facets_kind_value", table_name="cluster_facets")
    op.drop_table("cluster_facets")
    op.drop_index("ix_bundles_analyzer_version", table_name="bundles")
    op.drop_index("ix_bundles_engine_build", table_name="bundles")
    op.drop_index("ix_bundles_cluster_received", table_name="bundles")
    op.drop_table("bundles")
    op.drop_index("ix_api_tokens_name", table_name="api_tokens")
    op.drop_table("api_tokens")
    for col in ("engine", "phase", "backend", "verdict", "last_seen", "status"):
        op.drop_index(f"ix_clusters_{col}", table_name="clusters")
    op.drop_table("clusters")
