"""`kvreport admin …` and the demo loader, on both databases."""

from __future__ import annotations

import json

from click.testing import CliRunner
from server_helpers import bundle_from_case
from sqlalchemy import func, select

from kvreport.cli import main
from kvreport_server import auth, cli_entry
from kvreport_server.db import Database
from kvreport_server.models import ApiToken, Bundle, User


def invoke(*args, env=None):
    return CliRunner().invoke(main, list(args), env=env or {}, catch_exceptions=False)


def test_create_and_revoke_token(db_url):
    r = invoke("admin", "create-token", "ci", "--scope", "write", "--database-url", db_url)
    assert r.exit_code == 0, r.output
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvr_")
    db = Database(db_url)
    try:
        with db.Session() as s:
            row = auth.lookup_token(s, lines[0])
            assert row is not None and row.scope == "write"
        assert invoke("admin", "revoke-token", "ci", "--database-url", db_url).exit_code == 0
        with db.Session() as s:
            assert auth.lookup_token(s, lines[0]) is None
            assert s.execute(select(func.count()).select_from(ApiToken)).scalar_one() == 1
        again = invoke("admin", "revoke-token", "ci", "--database-url", db_url)
        assert again.exit_code == 2 and "no active token" in again.stderr
    finally:
        db.dispose()


def test_a_name_belongs_to_one_active_token(db_url):
    first = invoke("admin", "create-token", "qa1", "--database-url", db_url)
    assert first.exit_code == 0
    dup = invoke("admin", "create-token", "qa1", "--scope", "admin", "--database-url", db_url)
    assert dup.exit_code == 2 and dup.stdout == ""
    assert dup.stderr.count("\n") == 1 and "active token named 'qa1'" in dup.stderr
    revoked = invoke("admin", "revoke-token", "qa1", "--database-url", db_url)
    assert revoked.exit_code == 0 and "revoked 1 token(s)" in revoked.stderr
    again = invoke("admin", "create-token", "qa1", "--database-url", db_url)
    assert again.exit_code == 0 and again.stdout.strip() != first.stdout.strip()
    db = Database(db_url)
    try:
        with db.Session() as s:
            assert auth.lookup_token(s, first.stdout.strip()) is None
            assert auth.lookup_token(s, again.stdout.strip()).name == "qa1"
    finally:
        db.dispose()


def test_bad_database_urls_are_one_line(tmp_path):
    for url, words in [("mysql://u@h/db", "unsupported database 'mysql'"),
                       ("not a url", "is not a database URL"),
                       ("sqlite://", "in-memory"),
                       (f"sqlite:///{tmp_path}/missing/k.sqlite3", "does not exist")]:
        for args in (["admin", "create-token", "x"], ["serve", "--port", "0"]):
            r = invoke(*args, "--database-url", url)
            assert r.exit_code == 2, (url, r.output)
            assert r.stderr.count("\n") == 1 and words in r.stderr, (url, r.stderr)


def test_bad_host_is_one_line(tmp_path):
    url = f"sqlite:///{tmp_path}/k.sqlite3"
    for host in ("999.1.1.1", "no-such-host.invalid"):
        r = invoke("serve", "--host", host, "--port", "0", "--database-url", url)
        assert r.exit_code == 2, r.output
        assert r.stderr.count("\n") == 1 and f"'{host}'" in r.stderr and "internal" not in r.stderr


def test_bad_inputs_are_one_line(db_url):
    r = invoke("admin", "create-token", "", "--database-url", db_url)
    assert r.exit_code == 2 and r.stderr.startswith("kvreport: error:") and "Traceback" not in r.output
    r = invoke("admin", "create-token", "x", "--database-url", "postgresql+psycopg://nobody@127.0.0.1:1/x")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1


def test_create_user(db_url):
    r = invoke("admin", "create-user", "alice", "--database-url", db_url, env={"KVREPORT_PASSWORD": "long enough pw"})
    assert r.exit_code == 0, r.output
    db = Database(db_url)
    try:
        with db.Session() as s:
            user = s.execute(select(User)).scalar_one()
            assert user.password_hash.startswith("scrypt:") and "long enough" not in user.password_hash
            assert auth.check_login(s, "alice", "long enough pw") is not None
            assert auth.check_login(s, "alice", "wrong") is None
    finally:
        db.dispose()
    r = invoke("admin", "create-user", "alice", "--password", "another pw!", "--database-url", db_url)
    assert r.exit_code == 2 and "already exists" in r.stderr
    r = invoke("admin", "create-user", "bob", "--password", "short", "--database-url", db_url)
    assert r.exit_code == 2


def test_reanalyze_command(db_url, monkeypatch):
    import os

    from kvreport_server import store

    niced = []
    monkeypatch.setattr(os, "nice", niced.append)  # not the test process's own priority

    db = Database(db_url)
    try:
        store.ingest(db, bundle_from_case("loc-17-fail-huge-ctx-verbose"))
        with db.Session() as s, s.begin():
            s.execute(Bundle.__table__.update().values(analyzer_version="old"))
    finally:
        db.dispose()
    r = invoke("admin", "reanalyze", "--batch-size", "10", "--database-url", db_url)
    assert r.exit_code == 0, r.output
    assert "1 bundles re-analyzed" in r.stderr and "0 remaining" in r.stderr and "longest write" in r.stderr
    assert niced == [10]  # below normal priority by default: uploads sharing the cores go first


def test_demo_loader(db_url, tmp_path):
    from kvreport_server import migrate

    migrate.upgrade(db_url)
    db = Database(db_url)
    try:
        assert cli_entry.load_examples(db, tmp_path / "missing") == (0, 0)
        (tmp_path / "a.json").write_text(json.dumps(bundle_from_case("loc-21-fail-ulimit-kv-600000")))
        (tmp_path / "b.json").write_text("{not json")
        assert cli_entry.load_examples(db, tmp_path) == (1, 1)
        assert cli_entry.load_examples(db, tmp_path) == (0, 1)  # idempotent
    finally:
        db.dispose()


def test_bundled_examples_all_load(db_url):
    """The example bundles `kvreport serve --demo` loads are valid and all stored (none skipped)."""
    from kvreport_server import migrate

    folder = cli_entry.examples_dir()
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    migrate.upgrade(db_url)
    db = Database(db_url)
    try:
        assert cli_entry.load_examples(db, folder) == (len(files), 0)
    finally:
        db.dispose()
