"""The client's local record of runs: which failures this machine had, and which later run fixed them.

One SQLite file, ``<user data dir>/kvreport/history.sqlite3`` (``KVREPORT_DATA_DIR`` moves it; set
``KVREPORT_HISTORY=0`` to keep no record). Three tables:

* ``meta``: the machine salt, 32 random bytes made once (hex). The machine is named by
  :func:`machine_id`: SHA-256 over the salt and a few stable facts (CPU model, RAM size, OS,
  architecture, device names and sizes). The facts and the salt never leave this file; only the
  salted hash is sent, so a server cannot link it to anything but this installation.
* ``failures``: one row per bundle of a memory failure (``kvreport run`` on failure, ``kvreport
  collect``): bundle id, machine, engine, model key, the parsed command (flags only), the context
  the engine tried (from the diagnosis), and ``fixed_at`` / ``outcome_id`` once a later run worked.
* ``outcomes``: what worked, as sent (or to be sent) to the server: id (a ULID, the server's
  idempotency key), the failed bundle, the JSON body, ``sent_at`` when the server took it.

Every function is best effort for the caller's sake: a read-only home or a locked file gives
``None`` / nothing, never an exception into ``kvreport run``.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sqlite3
from contextlib import closing
from datetime import datetime, timezone
from pathlib import Path

from kvreport.config import data_dir

FILE_NAME = "history.sqlite3"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS failures (
    bundle_id TEXT PRIMARY KEY, machine TEXT NOT NULL, engine TEXT, model TEXT, command TEXT NOT NULL,
    n_ctx INTEGER, phase TEXT, created_at TEXT NOT NULL, fixed_at TEXT, outcome_id TEXT);
CREATE INDEX IF NOT EXISTS ix_failures_match ON failures (machine, engine, model, created_at);
CREATE TABLE IF NOT EXISTS outcomes (
    id TEXT PRIMARY KEY, bundle_id TEXT NOT NULL, body TEXT NOT NULL, created_at TEXT NOT NULL,
    sent_at TEXT, server TEXT);
"""


def enabled() -> bool:
    return os.environ.get("KVREPORT_HISTORY", "1").strip().lower() not in ("0", "no", "off", "false")


def path() -> Path:
    return data_dir() / FILE_NAME


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def connect(create: bool = True) -> sqlite3.Connection | None:
    """The record, created when missing (``None`` when disabled, missing and not ``create``, or it
    cannot be opened)."""
    if not enabled():
        return None
    try:
        p = path()
        if not create and not p.is_file():
            return None
        p.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(p, timeout=10)
        conn.row_factory = sqlite3.Row
        conn.executescript(_SCHEMA)
        return conn
    except (OSError, sqlite3.Error):
        return None


def salt(conn: sqlite3.Connection) -> str:
    """This installation's random salt (made on first use, kept in ``meta``)."""
    row = conn.execute("SELECT value FROM meta WHERE key = 'machine_salt'").fetchone()
    if row:
        return row["value"]
    with conn:
        conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('machine_salt', ?)", (secrets.token_hex(32),))
    return conn.execute("SELECT value FROM meta WHERE key = 'machine_salt'").fetchone()["value"]


def machine_facts(host: dict | None, devices: list | None) -> list:
    """The stable facts that name a machine (never sent): CPU, RAM in GiB, OS, architecture, devices."""
    host = host or {}
    ram = host.get("ram_total_mib")
    facts: list = [host.get("cpu_model"), round(float(ram) / 1024) if isinstance(ram, int | float) else None,
                   host.get("os"), host.get("machine")]
    devs = []
    for d in devices or []:
        if isinstance(d, dict):
            total = d.get("total_mib")
            devs.append([str(d.get("name")), round(float(total) / 1024) if isinstance(total, int | float) else None])
    facts.append(sorted(devs))
    return facts


def machine_id(conn: sqlite3.Connection, host: dict | None, devices: list | None) -> str:
    """SHA-256 (hex) of this installation's salt and :func:`machine_facts`."""
    text = json.dumps([salt(conn), machine_facts(host, devices)], default=str, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def record_failure(conn: sqlite3.Connection, *, bundle_id: str, machine: str, engine: str | None,
                   model: str | None, command: dict, n_ctx: int | None, phase: str | None,
                   created_at: str | None = None) -> None:
    with conn:
        conn.execute("INSERT OR IGNORE INTO failures (bundle_id, machine, engine, model, command, n_ctx, phase, "
                     "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                     (bundle_id, machine, engine, model, json.dumps(command, default=str), n_ctx, phase,
                      created_at or _now()))


def latest_failure(conn: sqlite3.Connection, *, machine: str, engine: str | None, model: str | None) -> dict | None:
    """The newest failure of the same engine and model on this machine that no later run fixed yet."""
    row = conn.execute(
        "SELECT * FROM failures WHERE machine = ? AND engine IS ? AND model IS ? AND fixed_at IS NULL "
        "ORDER BY created_at DESC, rowid DESC LIMIT 1", (machine, engine, model)).fetchone()
    if row is None:
        return None
    out = dict(row)
    out["command"] = json.loads(out["command"])
    return out


def failure(conn: sqlite3.Connection, bundle_id: str) -> dict | None:
    row = conn.execute("SELECT * FROM failures WHERE bundle_id = ?", (bundle_id,)).fetchone()
    if row is None:
        return None
    out = dict(row)
    out["command"] = json.loads(out["command"])
    return out


def mark_fixed(conn: sqlite3.Connection, bundle_id: str, outcome_id: str, body: dict) -> None:
    """The earlier bundle is fixed: keep the outcome (to send now or later). Older unfixed failures of
    the same machine, engine and model are closed as ``superseded`` (a later run is not their fix)."""
    now = _now()
    with conn:
        row = conn.execute("SELECT machine, engine, model, created_at FROM failures WHERE bundle_id = ?",
                           (bundle_id,)).fetchone()
        conn.execute("UPDATE failures SET fixed_at = ?, outcome_id = ? WHERE bundle_id = ?", (now, outcome_id, bundle_id))
        if row is not None:
            conn.execute("UPDATE failures SET fixed_at = ?, outcome_id = 'superseded' WHERE fixed_at IS NULL "
                         "AND machine = ? AND engine IS ? AND model IS ? AND created_at <= ?",
                         (now, row["machine"], row["engine"], row["model"], row["created_at"]))
        conn.execute("INSERT OR IGNORE INTO outcomes (id, bundle_id, body, created_at) VALUES (?, ?, ?, ?)",
                     (outcome_id, bundle_id, json.dumps(body), now))


def mark_sent(conn: sqlite3.Connection, outcome_id: str, server: str) -> None:
    with conn:
        conn.execute("UPDATE outcomes SET sent_at = ?, server = ? WHERE id = ?", (_now(), server, outcome_id))


def pending_outcomes(conn: sqlite3.Connection, bundle_id: str | None = None) -> list[dict]:
    """Outcomes not sent yet (of one failed bundle, or all), oldest first."""
    sql = "SELECT * FROM outcomes WHERE sent_at IS NULL"
    args: tuple = ()
    if bundle_id is not None:
        sql += " AND bundle_id = ?"
        args = (bundle_id,)
    rows = conn.execute(sql + " ORDER BY created_at, rowid", args).fetchall()
    return [{**dict(r), "body": json.loads(r["body"])} for r in rows]


def open_record(create: bool = True):
    """``closing(connection)`` for a ``with`` block, or None when there is no record."""
    conn = connect(create)
    return closing(conn) if conn is not None else None
