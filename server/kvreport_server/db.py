"""Database engine and sessions (plain SQLAlchemy 2.x; one ``Database`` per app).

SQLite is opened in WAL mode with a busy timeout, and its writes are serialized inside the process
(``write_lock``) because ``kvreport serve`` is one process with threads; PostgreSQL relies on its
own row locks.
"""

from __future__ import annotations

import contextlib
import threading

from flask import current_app, g
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker


class Database:
    """An engine, a session factory and, for SQLite, a process-wide write lock."""

    def __init__(self, url: str, **engine_kw):
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        if self.is_sqlite:
            engine_kw.setdefault("connect_args", {"timeout": 30, "check_same_thread": False})
        else:
            engine_kw.setdefault("pool_pre_ping", True)
            engine_kw.setdefault("pool_size", 10)
            engine_kw.setdefault("max_overflow", 20)
        self.engine: Engine = create_engine(url, **engine_kw)
        if self.is_sqlite:
            event.listen(self.engine, "connect", _sqlite_pragmas)
        self.Session = sessionmaker(self.engine, expire_on_commit=False)
        self._lock = threading.RLock()

    @contextlib.contextmanager
    def write_lock(self):
        """Serialize writers on SQLite (no-op on PostgreSQL)."""
        if self.is_sqlite:
            with self._lock:
                yield
        else:
            yield

    def dispose(self) -> None:
        self.engine.dispose()


def _sqlite_pragmas(dbapi_conn, _record):
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=FULL")  # an acknowledged upload survives a power cut too
    cur.close()


def get_db() -> Database:
    return current_app.extensions["kvreport_db"]


def get_session() -> Session:
    """The request's session (closed at the end of the request)."""
    if "db_session" not in g:
        g.db_session = get_db().Session()
    return g.db_session


def close_session(_exc=None) -> None:
    session = g.pop("db_session", None)
    if session is not None:
        session.close()
