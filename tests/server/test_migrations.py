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

    from kvreport_server.models import Base

    migrate.upgrade(empty_url)
    engine = create_engine(empty_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
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
