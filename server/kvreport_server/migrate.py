"""Apply the Alembic migrations (repository root ``migrations/`` + ``alembic.ini``) from Python.

``kvreport serve`` calls :func:`upgrade` on start; tests call :func:`upgrade` / :func:`downgrade`.
The migrations folder is found next to the source tree (editable or source install), or through
``KVREPORT_MIGRATIONS`` (a folder holding ``alembic.ini`` and ``migrations/``).
"""

from __future__ import annotations

import os
from pathlib import Path

from alembic import command
from alembic.config import Config


def project_root() -> Path:
    """The folder holding ``alembic.ini`` (raises ``FileNotFoundError`` with the places tried)."""
    tried = []
    env = os.environ.get("KVREPORT_MIGRATIONS")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[2])
    candidates.append(Path.cwd())
    for cand in candidates:
        tried.append(str(cand))
        if (cand / "alembic.ini").is_file() and (cand / "migrations" / "env.py").is_file():
            return cand
    raise FileNotFoundError("alembic.ini and migrations/ not found (tried " + ", ".join(tried)
                            + "); set KVREPORT_MIGRATIONS to the kvreport source folder")


def alembic_config(url: str) -> Config:
    root = project_root()
    cfg = Config(str(root / "alembic.ini"))
    cfg.set_main_option("script_location", str(root / "migrations"))
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
