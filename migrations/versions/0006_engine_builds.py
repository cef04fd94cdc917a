"""Bundles per engine build, and an index for a cluster's build range (issue 15).

* ``engine_builds(engine, build_number, count)``: the bundles of each (engine, build), kept by the
  writers with the other counters (``store.Counts``), so the regression view's "N bundles of
  <engine> from earlier builds" sums one row per build instead of counting bundles (a count that
  grows with the bundles). Filled here from the stored bundles.
* ``ix_bundles_cluster_build``: a cluster's build range, recounted after bundles left it (a delete,
  a re-analysis that moved them, a merge), reads two index entries, not the cluster's rows, while
  the cluster row is locked.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-15
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "engine_builds",
        sa.Column("engine", sa.String(40), primary_key=True),
        sa.Column("build_number", sa.Integer, primary_key=True),
        sa.Column("count", sa.Integer, nullable=False),
    )
    op.execute("INSERT INTO engine_builds (engine, build_number, count) "
               "SELECT engine_name, build_number, count(*) FROM bundles "
               "WHERE engine_name IS NOT NULL AND build_number IS NOT NULL GROUP BY engine_name, build_number")
    op.create_index("ix_bundles_cluster_build", "bundles", ["cluster_id", "build_number"])


def downgrade() -> None:
    op.drop_index("ix_bundles_cluster_build", table_name="bundles")
    op.drop_table("engine_builds")
