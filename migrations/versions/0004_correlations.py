"""Correlations and merges: per-facet-value totals over all bundles, merged clusters, and what each
bundle counted (issue 14, items 3 and 5).

* ``facet_totals(kind, value, count)``: filled here from ``cluster_facets`` (the sum over clusters
  is the count over all bundles), then kept by the upload transaction.
* ``clusters.merged_into`` / ``merged_at``: a merged cluster points at the one that absorbed it.
* ``bundles.home_cluster_id``: the cluster of the bundle's own signature (set to ``cluster_id``).
* ``bundles.facet_keys``: the facet values a bundle added; NULL for the bundles stored before this
  revision (they counted the original kinds only; ``kvreport admin reanalyze`` counts the new
  kinds for them).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-14
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "facet_totals",
        sa.Column("kind", sa.String(20), primary_key=True),
        sa.Column("value", sa.String(200), primary_key=True),
        sa.Column("count", sa.Integer, nullable=False),
    )
    op.execute("INSERT INTO facet_totals (kind, value, count) "
               "SELECT kind, value, SUM(count) FROM cluster_facets GROUP BY kind, value HAVING SUM(count) > 0")
    with op.batch_alter_table("clusters") as batch:
        batch.add_column(sa.Column("merged_into", sa.Integer, nullable=True))
        batch.add_column(sa.Column("merged_at", TS, nullable=True))
        batch.create_foreign_key("fk_clusters_merged_into", "clusters", ["merged_into"], ["id"])
    with op.batch_alter_table("bundles") as batch:
        batch.add_column(sa.Column("home_cluster_id", sa.Integer, nullable=True))
        batch.add_column(sa.Column("facet_keys", JSONType, nullable=True))
        batch.create_foreign_key("fk_bundles_home_cluster", "clusters", ["home_cluster_id"], ["id"])
        batch.create_index("ix_bundles_home_cluster_id", ["home_cluster_id"])
    op.execute("UPDATE bundles SET home_cluster_id = cluster_id")


def downgrade() -> None:
    # merged bundles stay where they are (with their counters): a merge done before the downgrade
    # can no longer be undone, and later uploads of a merged signature count in its own cluster again
    with op.batch_alter_table("bundles") as batch:
        batch.drop_index("ix_bundles_home_cluster_id")
        batch.drop_constraint("fk_bundles_home_cluster", type_="foreignkey")
        batch.drop_column("facet_keys")
        batch.drop_column("home_cluster_id")
    with op.batch_alter_table("clusters") as batch:
        batch.drop_constraint("fk_clusters_merged_into", type_="foreignkey")
        batch.drop_column("merged_at")
        batch.drop_column("merged_into")
    op.drop_table("facet_totals")
