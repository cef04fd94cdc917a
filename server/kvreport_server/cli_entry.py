"""What `kvreport serve` and `kvreport admin …` run (collector/kvreport/cli.py declares the options).

Each function returns the process exit status: 0 done, 2 bad input or unusable database (one
line on stderr, never a traceback).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from kvreport_server.config import resolve_database_url


def _err(message: str) -> int:
    print(f"kvreport: error: {message}", file=sys.stderr)
    return 2


def _note(message: str) -> None:
    print(message, file=sys.stderr)


def _migrated(database_url: str | None) -> str:
    """Resolve the URL and apply the migrations (raises ``RuntimeError`` with one line)."""
    from kvreport_server import migrate

    url = resolve_database_url(database_url)
    _check_url(url)
    try:
        migrate.upgrade(url)
    except FileNotFoundError as exc:
        raise RuntimeError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - a database that cannot be reached or migrated
        raise RuntimeError(f"cannot prepare the database {_safe_url(url)}: {type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    return url


def _check_url(url: str) -> None:
    """Refuse, in one line, a URL that is not SQLite or PostgreSQL, or a SQLite file whose folder
    is missing or not writable (raises ``RuntimeError``)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise RuntimeError(f"{url!r} is not a database URL (use sqlite:///PATH or "
                           "postgresql://USER@HOST:PORT/DB)") from None
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise RuntimeError(f"unsupported database {backend!r} in {_safe_url(url)} (use sqlite:///PATH or "
                           "postgresql://USER@HOST:PORT/DB)")
    if backend == "sqlite" and (not parsed.database or parsed.database == ":memory:"):
        raise RuntimeError("an in-memory SQLite database is lost between connections; "
                           "give a file: sqlite:///PATH")
    if backend == "sqlite" and not parsed.database.startswith("file:"):
        path = Path(parsed.database).expanduser()
        folder = path.parent if str(path.parent) else Path(".")
        if not folder.is_dir():
            raise RuntimeError(f"cannot create the SQLite database {path}: folder {folder} does not exist")
        target = path if path.exists() else folder
        if not os.access(target, os.W_OK):
            raise RuntimeError(f"cannot write the SQLite database {path}: {target} is not writable")


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001
        return "<database>"


def examples_dir() -> Path:
    import kvreport

    return Path(kvreport.__file__).resolve().parent / "examples"


def load_examples(db, folder: Path | None = None) -> tuple[int, int]:
    """Store every example bundle (``collector/kvreport/examples/*.json``); returns (stored, skipped)."""
    from kvreport.bundle import BundleError, validate_bundle
    from kvreport_server import store
    from kvreport_server.errors import ApiError

    folder = folder or examples_dir()
    stored = skipped = 0
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            bundle = validate_bundle(json.loads(path.read_text(encoding="utf-8")))
            result = store.ingest(db, bundle, size_bytes=path.stat().st_size)
        except (OSError, ValueError, BundleError, ApiError) as exc:
            _note(f"kvreport: demo: skipped {path.name}: {str(exc).splitlines()[0][:200]}")
            skipped += 1
            continue
        stored += result.status == 201
    return stored, skipped


def _local_secret_key() -> str | None:
    """A secret key kept in the user data directory (mode 0600), so that `kvreport serve` keeps
    sign-ins across restarts without configuration; None when it cannot be written."""
    from platformdirs import user_data_dir

    from kvreport_server.config import random_secret

    path = Path(user_data_dir("kvreport", appauthor=False)) / "secret_key"
    try:
        if path.is_file():
            return path.read_text().strip() or None
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            key = random_secret()
            fh.write(key)
        return key
    except OSError:
        return None


def demo_database_url() -> str:
    """The demo's own SQLite file (``demo.sqlite3`` in the user data directory), never the default
    database of real uploads."""
    from platformdirs import user_data_dir

    folder = Path(user_data_dir("kvreport", appauthor=False))
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'demo.sqlite3'}"


def load_demo(db) -> str:
    """Store the examples and their marked demo history; a one-line summary."""
    from kvreport_server import demo as demo_data

    added = demo_data.load_demo(db, examples_dir())
    stored, skipped = load_examples(db)  # any example without a history entry
    return (f"{added['examples'] + stored} example bundle(s) and {added['history']} demo history bundle(s) stored"
            + (f", {skipped} skipped" if skipped else "") + f" from {examples_dir()}")


def serve(host: str, port: int, database_url: str | None, demo: bool = False, threads: int = 8) -> int:
    """Apply the migrations, then serve the app with waitress on ``host:port`` until interrupted.

    With ``demo`` and no database URL the demo gets its own SQLite file (``demo_database_url``): the
    demo never mixes with real uploads. With a URL the demo goes there, and
    ``kvreport admin remove-demo`` takes it out again."""
    if demo and not database_url:
        try:
            database_url = demo_database_url()
        except OSError as exc:
            return _err(f"cannot create the demo database: {exc.strerror or exc}")
    try:
        url = _migrated(database_url)
    except RuntimeError as exc:
        return _err(str(exc))
    from kvreport_server import create_app

    overrides = {"DATABASE_URL": url}
    if not os.environ.get("KVREPORT_SECRET_KEY"):
        overrides["SECRET_KEY"] = _local_secret_key()
    try:
        app = create_app(overrides)
    except ValueError as exc:
        return _err(str(exc))
    if demo:
        _note(f"kvreport: demo: {load_demo(app.extensions['kvreport_db'])}")
        _note(f"kvreport: demo: database {_safe_url(url)}; remove the demo bundles with: "
              f"kvreport admin remove-demo --database-url {_safe_url(url)}")
    from kvreport_server.waitress_server import create_server

    try:
        server = create_server(app, host=host, port=port, threads=threads)
    except OSError as exc:
        return _err(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    except ValueError:
        return _err(f"cannot listen on {host}:{port}: {host!r} is not a host name or IP address "
                    "this machine can resolve (try --host 127.0.0.1 or --host 0.0.0.0)")
    real_port = server.effective_port
    _note(f"kvreport: serving on http://{host}:{real_port}/ (database {_safe_url(url)}); Ctrl+C stops")
    sys.stderr.flush()
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


def _session_for(database_url: str | None):
    from kvreport_server.db import Database

    url = _migrated(database_url)
    return Database(url)


def create_token(name: str, scope: str, database_url: str | None) -> int:
    """Create a token; print it alone on one stdout line (notes on stderr)."""
    from kvreport_server import auth

    try:
        db = _session_for(database_url)
    except RuntimeError as exc:
        return _err(str(exc))
    try:
        with db.Session() as session, session.begin():
            token = auth.new_token(session, name, scope)
    except ValueError as exc:
        return _err(str(exc))
    finally:
        db.dispose()
    _note(f"kvreport: token {name!r} with scope {scope} created; it is shown only once:")
    print(token, flush=True)
    return 0


def revoke_token(name: str, database_url: str | None) -> int:
    """Revoke every active token called ``name``; exit 2 when there is none."""
    from kvreport_server import auth

    try:
        db = _session_for(database_url)
    except RuntimeError as exc:
        return _err(str(exc))
    try:
        with db.Session() as session, session.begin():
            n = auth.revoke_tokens(session, name)
    finally:
        db.dispose()
    if n == 0:
        return _err(f"no active token named {name!r}")
    _note(f"kvreport: revoked {n} token(s) named {name!r}")
    return 0


def create_user(username: str, password: str | None, database_url: str | None) -> int:
    """Create a maintainer account (password from the argument, else KVREPORT_PASSWORD, else a prompt)."""
    import getpass
    import os

    from kvreport_server import auth

    password = password or os.environ.get("KVREPORT_PASSWORD")
    if not password:
        if not sys.stdin.isatty():
            return _err("no password: pass --password, set KVREPORT_PASSWORD or run in a terminal")
        password = getpass.getpass("Password: ")
        if getpass.getpass("Again: ") != password:
            return _err("the passwords differ")
    try:
        db = _session_for(database_url)
    except RuntimeError as exc:
        return _err(str(exc))
    try:
        with db.Session() as session, session.begin():
            auth.create_user(session, username, password)
    except ValueError as exc:
        return _err(str(exc))
    finally:
        db.dispose()
    _note(f"kvreport: maintainer {username!r} created")
    return 0


def reanalyze(database_url: str | None, batch_size: int = 50, max_batches: int | None = None,
              nice: int = 10) -> int:
    """Re-run the analyzer over bundles of an older ``analyzer_version`` (resumable). The process runs
    ``nice`` steps below normal CPU priority, so that uploads sharing the cores go first."""
    from kvreport_server import analysis, store

    try:
        db = _session_for(database_url)
    except RuntimeError as exc:
        return _err(str(exc))
    if nice and hasattr(os, "nice"):
        os.nice(nice)
    try:
        stats = store.reanalyze(db, batch_size=batch_size, max_batches=max_batches,
                                progress=lambda s: _note(f"kvreport: reanalyze: {s['seen']} bundles, "
                                                         f"{s['moved']} moved"))
    finally:
        db.dispose()
    _note(f"kvreport: reanalyze: analyzer {analysis.analyzer_version()}: {stats['seen']} bundles re-analyzed, "
          f"{stats['moved']} moved to another cluster, {stats['remaining']} remaining; longest write "
          f"transaction {stats['longest_write_ms']:.0f} ms, counter rows held at most {stats['longest_hold_ms']:.0f} ms")
    return 0


def remove_demo(database_url: str | None) -> int:
    """Remove the demo bundles (shipped examples and demo history) and the clusters only they made."""
    from kvreport_server import store

    try:
        db = _session_for(database_url)
    except RuntimeError as exc:
        return _err(str(exc))
    try:
        stats = store.remove_demo(db)
    finally:
        db.dispose()
    _note(f"kvreport: remove-demo: {stats['bundles']} demo bundle(s) and {stats['clusters']} cluster(s) removed "
          f"from {_safe_url(db.url)}")
    return 0
