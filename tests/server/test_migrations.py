"""Each Alembic migration runs up and down on SQLite and PostgreSQL, and the result matches the models."""

from __future__ import annotations

import pytest
from server_helpers import create_pg_database, drop_pg_database
from sqlalchemy import create_engine, inspect

from kvreport_server import migrate

TABLES = {"clusters", "bundles", "cluster_facets", "cluster_days", "facet_totals", "engine_builds", "api_tokens", "users",
          "outcomes", "outcome_suggestions"}


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'm.sqlite3'}"
        return
    url = create_pg_database("kvr_mig")
    try:
        yield url
    finally:
        drop_pg_database(url)


def tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def revisions() -> list[str]:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(migrate.alembic_config("sqlite://"))
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def test_each_migration_up_and_down(empty_url):
    revs = revisions()
    assert revs[0] == "0001"
    for rev in revs:
        migrate.upgrade(empty_url, rev)
        assert migrate.current_heads(empty_url) == {rev}
    assert tables(empty_url) == TABLES
    for prev in reversed(["base", *revs[:-1]]):
        migrate.downgrade(empty_url, prev)
    assert tables(empty_url) == set()
    migrate.upgrade(empty_url)
    assert tables(empty_url) == TABLES


def test_models_match_migrations(empty_url):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from kvreport_server.models import Base, compared

    migrate.upgrade(empty_url)
    engine = create_engine(empty_url)
    try:
        with engine.connect() as conn:  # (the trigram indexes of 0007 exist only where pg_trgm does)
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True,
                                                                           "include_object": compared}),
                                    Base.metadata)
    finally:
        engine.dispose()
    assert diff == []


def test_jsonb_on_postgresql(pg_url):
    engine = create_engine(pg_url)
    try:
        cols = {c["name"]: c["type"] for c in inspect(engine).get_columns("bundles")}
    finally:
        engine.dispose()
    assert type(cols["data"]).__name__ == "JSONB"


def test_0006_fills_engine_builds_from_the_stored_bundles(empty_url):
    """Bundles stored, the schema taken back to 0005 (engine_builds gone) and up again: the table is
    filled from the bundles, equal to a full scan, and the regression view reads it."""
    from server_helpers import assert_consistent, minimal_bundle

    from kvreport_server import store
    from kvreport_server.db import Database
    from kvreport_server.queries import regression

    migrate.upgrade(empty_url)
    db = Database(empty_url)
    try:
        for build in (6100, 6100, 6101, 6102):
            store.ingest(db, minimal_bundle(engine={"name": "llama.cpp", "version": f"b{build}", "build_number": build}))
        last = store.ingest(db, minimal_bundle(engine={"name": "llama.cpp", "version": "b7000", "build_number": 7000},
                                               log={"line_count": 1, "truncated": False, "source": "test",
                                                    "lines": [[1, "main: server is listening"]]}))
        db.dispose()
        migrate.downgrade(empty_url, "0005")
        assert "engine_builds" not in tables(empty_url)
        migrate.upgrade(empty_url)
        assert_consistent(db)
        with db.Session() as s:
            assert regression(s, last.cluster)["earlier_bundles"] == 4
    finally:
        db.dispose()


TRGM_INDEXES = {"ix_clusters_title_trgm", "ix_clusters_key_trgm", "ix_cluster_facets_value_trgm"}


def _indexes(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        insp = inspect(engine)
        return {i["name"] for t in ("clusters", "cluster_facets") for i in insp.get_indexes(t)}
    finally:
        engine.dispose()


def _columns(url: str, table: str) -> set[str]:
    engine = create_engine(url)
    try:
        return {c["name"] for c in inspect(engine).get_columns(table)}
    finally:
        engine.dispose()


def test_0007_fills_trends_from_the_stored_days_and_goes_back(empty_url):
    """Bundles received over three weeks, the schema taken back to 0006 (no trend columns, no trigram
    indexes) and up again: every stored trend equals the one computed from the bundles as of today
    (NULL where no bundle is in the 14 days), the trend order and search answer, and the downgrade
    removes what 0007 added."""
    import datetime as dt

    from server_helpers import FAILURE_CASES, assert_consistent, bundle_from_case
    from sqlalchemy import select

    from kvreport_server import store
    from kvreport_server.db import Database
    from kvreport_server.models import Cluster
    from kvreport_server.queries import list_clusters

    pg = empty_url.startswith("postgresql")
    migrate.upgrade(empty_url)
    db = Database(empty_url)
    try:
        now = dt.datetime.now(dt.timezone.utc)
        distinct = [FAILURE_CASES[i] for i in (0, 3, 5, 7)]  # four signatures
        for case, back in zip(distinct, ([0, 1, 3], [5, 8, 9, 10], [12, 13, 20], [20, 25]), strict=True):
            for k in back:
                store.ingest(db, bundle_from_case(case), received_at=now - dt.timedelta(days=k))
        db.dispose()
        migrate.downgrade(empty_url, "0006")
        assert not {"trend", "trend_day", "trend_until"} & _columns(empty_url, "clusters")
        assert not (TRGM_INDEXES | {"ix_clusters_trend", "ix_clusters_trend_until"}) & _indexes(empty_url)
        migrate.upgrade(empty_url)
        assert_consistent(db)  # the stored trends too (server_helpers.trend_errors)
        with db.Session() as s:
            rows = s.execute(select(Cluster.trend, Cluster.trend_until).order_by(Cluster.id)).all()
            assert [t for t, _d in rows] == [3, -2, -2, 0]
            assert rows[-1].trend_until is None and rows[0].trend_until is not None
            items, _ = list_clusters(s, sort="trend", db=db)
            assert [i["trend"] for i in items] == [3, 0, -2, -2] and items[2]["count"] == 4
            assert list_clusters(s, q="cuda")[1] == list_clusters(s, q="CUDA")[1]
        assert {"ix_clusters_trend", "ix_clusters_trend_until"} <= _indexes(empty_url)
        if pg:  # pg_trgm is installed here
            assert TRGM_INDEXES <= _indexes(empty_url)
        db.dispose()
        migrate.downgrade(empty_url, "0006")
        assert not {"trend", "trend_day", "trend_until"} & _columns(empty_url, "clusters")
        assert not (TRGM_INDEXES | {"ix_clusters_trend", "ix_clusters_trend_until"}) & _indexes(empty_url)
    finally:
        db.dispose()


def test_0007_without_pg_trgm_leaves_the_trigram_indexes_out(pg_url):
    """A role that may create tables but not extensions (no CREATE on the database): the migration
    logs that pg_trgm is not available, adds everything else, and search gives the same answers."""
    import secrets

    import psycopg
    from server_helpers import PG_ADMIN

    name = f"kvr_noext_{secrets.token_hex(4)}"
    role = f"kvr_role_{secrets.token_hex(4)}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
        conn.execute(f'CREATE DATABASE "{name}"')
        conn.execute(f'REVOKE CREATE ON DATABASE "{name}" FROM PUBLIC')
    base = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        with psycopg.connect(PG_ADMIN.rsplit("/", 1)[0] + "/" + name, autocommit=True) as conn:
            conn.execute(f'GRANT CREATE, USAGE ON SCHEMA public TO "{role}"')
        url = base.replace("postgres@", f"{role}@", 1) + "/" + name
        migrate.upgrade(url)
        assert migrate.current_heads(url) == {"0007"}
        assert {"ix_clusters_trend", "ix_clusters_trend_until"} <= _indexes(url)
        assert not TRGM_INDEXES & _indexes(url)
        from server_helpers import bundle_from_case

        from kvreport_server import store
        from kvreport_server.db import Database
        from kvreport_server.queries import list_clusters

        db = Database(url)
        try:
            store.ingest(db, bundle_from_case("loc-17-fail-huge-ctx-verbose"))
            with db.Session() as s:
                assert list_clusters(s, q="KV")[1] == 1 and list_clusters(s, q="no such thing")[1] == 0
        finally:
            db.dispose()
        migrate.downgrade(url, "0006")
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')
