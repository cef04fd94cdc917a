"""The clusters page's trend order and search read indexes (issue 15, item 5).

* ``clusters.trend``: the cluster's bundles of the last 7 UTC days minus the 7 before (its
  ``cluster_days`` rows), which holds from ``trend_day`` through ``trend_until`` (NULL: for good, no day
  row will change it); kept by the writers and brought to a new day by one UPDATE of the rows whose
  trend changes that day (``kvreport_server.counts``). Filled here as of today.
* ``ix_clusters_trend`` (trend DESC, count DESC, id): ``sort=trend`` reads the first page in index
  order; ``ix_clusters_trend_until`` finds the rows whose trend a new day changes.
* PostgreSQL: pg_trgm GIN indexes on ``lower(title)``, ``lower(key)`` and, for the facet kinds the
  search matches (model, error, gpu), ``lower(cluster_facets.value)``, so that ``q`` (LIKE '%…%') is an
  index scan. ``CREATE EXTENSION IF NOT EXISTS pg_trgm`` first; where it cannot be created (not
  installed, no right to), the indexes are left out and search scans as before, with the same results.
  The downgrade drops the indexes and leaves the extension (other databases' objects may use it).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-16
"""

from __future__ import annotations

import datetime as dt
import logging

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

log = logging.getLogger("alembic.runtime.migration")

TRGM = {  # name: (table, indexed expression, partial index predicate)
    "ix_clusters_title_trgm": ("clusters", "lower(title)", None),
    "ix_clusters_key_trgm": ("clusters", "lower(key)", None),
    "ix_cluster_facets_value_trgm": ("cluster_facets", "lower(value)", "kind IN ('model', 'error', 'gpu')"),
}

def _fill_trend(dialect: str) -> sa.TextClause:
    """Every cluster's trend as of ``:today``, and the last day it holds: the day before the first day on
    which one of its day rows crosses a week boundary (NULL when none ever does)."""
    def plus(n: int) -> str:
        return f"d.day + {n}" if dialect == "postgresql" else f"date(d.day, '{n:+d} days')"

    return sa.text(
        "UPDATE clusters SET "
        "trend = (SELECT coalesce(sum(CASE WHEN d.day > :week THEN d.count ELSE -d.count END), 0) "
        "FROM cluster_days d WHERE d.cluster_id = clusters.id AND d.day > :fortnight AND d.day <= :today), "
        f"trend_until = (SELECT min(CASE WHEN d.day > :today THEN {plus(-1)} WHEN d.day > :week THEN {plus(6)} "
        f"ELSE {plus(13)} END) FROM cluster_days d WHERE d.cluster_id = clusters.id AND d.day > :fortnight), "
        "trend_day = :today"
    ).bindparams(sa.bindparam("today", type_=sa.Date), sa.bindparam("week", type_=sa.Date),
                 sa.bindparam("fortnight", type_=sa.Date))


def upgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        batch.add_column(sa.Column("trend", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("trend_day", sa.Date, nullable=True))
        batch.add_column(sa.Column("trend_until", sa.Date, nullable=True))
    op.create_index("ix_clusters_trend", "clusters", [sa.text("trend DESC"), sa.text("count DESC"), "id"])
    op.create_index("ix_clusters_trend_until", "clusters", ["trend_until"])
    conn = op.get_bind()
    today = dt.datetime.now(dt.timezone.utc).date()
    conn.execute(_fill_trend(conn.dialect.name), {"today": today, "week": today - dt.timedelta(days=7),
                                                  "fortnight": today - dt.timedelta(days=14)})
    if conn.dialect.name == "postgresql":
        _trigram_indexes()


def _trigram_indexes() -> None:
    conn = op.get_bind()
    try:
        with conn.begin_nested():  # a savepoint: a refusal leaves the migration's transaction usable
            conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    except sa.exc.DBAPIError as exc:
        log.warning("pg_trgm is not available (%s); search works without its indexes",
                    str(exc.orig).strip().splitlines()[0] if exc.orig else exc)
        return
    schema = conn.exec_driver_sql("SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
                                  "WHERE e.extname = 'pg_trgm'").scalar_one()
    ops = f'"{schema}".gin_trgm_ops'  # wherever it was installed
    for name, (table, expr, where) in TRGM.items():
        conn.exec_driver_sql(f"CREATE INDEX {name} ON {table} USING gin (({expr}) {ops})"
                             + (f" WHERE {where}" if where else ""))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for name in TRGM:
            op.execute(f"DROP INDEX IF EXISTS {name}")
    op.drop_index("ix_clusters_trend_until", table_name="clusters")
    op.drop_index("ix_clusters_trend", table_name="clusters")
    with op.batch_alter_table("clusters") as batch:
        batch.drop_column("trend_until")
        batch.drop_column("trend_day")
        batch.drop_column("trend")
