"""Server fixtures: every app/client test runs on SQLite and on PostgreSQL.

PostgreSQL is the server on 127.0.0.1:5432 (trust auth, user postgres). Each test session creates
its own database with a random name and drops it at the end; if PostgreSQL cannot be reached the
tests FAIL (they never skip). Between tests the tables are emptied (TRUNCATE … RESTART IDENTITY).
"""

from __future__ import annotations

import secrets
import shutil

import pytest
from server_helpers import create_pg_database, drop_pg_database

TABLES = ("outcome_suggestions, outcomes, bundles, cluster_facets, cluster_days, facet_totals, engine_builds, clusters, "
          "api_tokens, users")


@pytest.fixture(scope="session")
def pg_url():
    from kvreport_server import migrate

    url = create_pg_database()
    try:
        migrate.upgrade(url)
        yield url
    finally:
        drop_pg_database(url)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory):
    from kvreport_server import migrate

    path = tmp_path_factory.mktemp("sqlite") / "template.sqlite3"
    migrate.upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path, sqlite_template):
    """A migrated, empty database: a fresh SQLite file, or the session's PostgreSQL database emptied."""
    if request.param == "sqlite":
        path = tmp_path / "kvreport.sqlite3"
        shutil.copy(sqlite_template, path)
        yield f"sqlite:///{path}"
        return
    url = request.getfixturevalue("pg_url")
    _truncate(url)
    yield url


def _truncate(url: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE"))
    finally:
        engine.dispose()


@pytest.fixture
def app_config(db_url):
    return {"DATABASE_URL": db_url, "SECRET_KEY": "test-secret", "LOG_REQUESTS": False, "PUBLIC_URL": None}


@pytest.fixture
def make_app(app_config):
    """Build apps with extra configuration; engines are disposed at the end."""
    from kvreport_server import create_app

    apps = []

    def make(**extra):
        app = create_app({**app_config, **extra})
        app.config["TESTING"] = True
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.extensions["kvreport_db"].dispose()


@pytest.fixture
def app(make_app):
    return make_app()


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def db(app):
    return app.extensions["kvreport_db"]


@pytest.fixture
def make_token(db):
    """``make_token(scope="upload", name=None) -> token text``."""
    from kvreport_server import auth

    def make(scope: str = "upload", name: str | None = None) -> str:
        with db.Session() as session, session.begin():
            return auth.new_token(session, name or f"test-{scope}-{secrets.token_hex(3)}", scope)

    return make


@pytest.fixture
def upload_token(make_token):
    return make_token("upload")


@pytest.fixture
def auth_header(upload_token):
    return {"Authorization": f"Bearer {upload_token}"}
