"""Apply the Alembic migrations from Python.

``kvreport serve`` calls :func:`upgrade` on start; tests call :func:`upgrade` / :func:`downgrade`.
The migrations live in the repository's top-level ``migrations/`` folder, which the package
installs as ``kvreport_server/migrations`` (pyproject.toml), so a source checkout, an editable
install and a wheel install all find them; ``KVREPORT_MIGRATIONS`` (a folder holding
``migrations/env.py``, or that folder itself) overrides both. ``alembic.ini`` at the repository
root serves the ``alembic`` command line; from Python no ini file is needed.
"""

from __future__ import annotations

import os
from pathlib import Path

from alembic import command
from alembic.config import Config

_HERE = Path(__file__).resolve().parent


def script_location() -> Path:
    """The folder holding ``env.py`` and ``versions/`` (raises ``FileNotFoundError`` naming the places tried)."""
    candidates = []
    env = os.environ.get("KVREPORT_MIGRATIONS")
    if env:
        candidates += [Path(env) / "migrations", Path(env)]
    candidates += [_HERE.parents[1] / "migrations", _HERE / "migrations"]
    for cand in candidates:
        if (cand / "env.py").is_file() and (cand / "versions").is_dir():
            return cand
    raise FileNotFoundError("the kvreport migrations were not found (tried " + ", ".join(map(str, candidates))
                            + "); set KVREPORT_MIGRATIONS to the kvreport source folder")


def alembic_config(url: str) -> Config:
    """An Alembic ``Config`` for the database at ``url`` (no logging set-up, no ini file needed)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location()))
    cfg.set_main_option("path_separator", "os")
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["configure_logging"] = False
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` to ``revision`` (default: the newest)."""
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)


def current_heads(url: str) -> set[str]:
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return set(MigrationContext.configure(conn).get_current_heads())
    finally:
        engine.dispose()
