"""Server configuration: every setting comes from an environment variable (docs/server.md).

``load_config(overrides)`` returns a plain dict; ``create_app(config)`` merges a caller's dict over
it (tests pass ``{"DATABASE_URL": ..., ...}``). Sizes are bytes, times are seconds.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

DEFAULTS: dict[str, object] = {
    "DATABASE_URL": None,            # KVREPORT_DATABASE_URL; None = SQLite in the user data dir
    "PRIVATE": False,                # KVREPORT_PRIVATE=1: every read needs a signed-in user or a token
    "SECRET_KEY": None,              # KVREPORT_SECRET_KEY; random per process when unset (sessions then die on restart)
    "PUBLIC_URL": None,              # KVREPORT_PUBLIC_URL: base of permalinks (else the request's host URL)
    "ISSUE_REPO": None,              # KVREPORT_ISSUE_REPO: "owner/name" for the "Open an issue" link
    "MAX_BODY_BYTES": 5 * 2**20,     # KVREPORT_MAX_BODY_BYTES: request body as sent (compressed)
    "MAX_JSON_BYTES": 20 * 2**20,    # KVREPORT_MAX_JSON_BYTES: after gzip decompression
    "MAX_JSON_DEPTH": 32,            # KVREPORT_MAX_JSON_DEPTH: nesting of objects/arrays
    "MAX_STRING_CHARS": 65536,       # KVREPORT_MAX_STRING_CHARS: any single string
    "MAX_JSON_NODES": 200000,        # KVREPORT_MAX_JSON_NODES: values and keys of an upload, all together
    "MAX_JSON_ITEMS": 20000,         # KVREPORT_MAX_JSON_ITEMS: entries of any one array or object
    "MAX_LOG_LINES": 20000,          # KVREPORT_MAX_LOG_LINES: entries of log.lines
    "MAX_DEVICES": 64,               # KVREPORT_MAX_DEVICES: entries of devices
    "SECRETS_POLICY": "refuse",      # KVREPORT_SECRETS_POLICY: refuse | flag (server's second redaction pass)
    "RATE_LIMIT_UPLOAD": None,       # KVREPORT_RATE_LIMIT_UPLOAD, e.g. "120/minute" per token (off when unset)
    "RATE_LIMIT_READ": None,         # KVREPORT_RATE_LIMIT_READ, e.g. "600/minute" per client (off when unset)
    "RATE_LIMIT_LOGIN": "20/minute",  # KVREPORT_RATE_LIMIT_LOGIN: sign-in attempts per client address ("" = off)
    "RATE_LIMIT_AUTH_FAILURES": "20/minute",  # KVREPORT_RATE_LIMIT_AUTH_FAILURES: failed token/sign-in checks
                                     # per client address; over it: 429 before any check ("" = off)
    "SESSION_IDLE_SECONDS": 8 * 3600,  # KVREPORT_SESSION_IDLE_SECONDS: a sign-in idle this long ends
    "RATE_LIMIT_STORAGE": "memory://",  # KVREPORT_RATE_LIMIT_STORAGE (Flask-Limiter storage URI)
    "SECURE_COOKIES": None,          # KVREPORT_SECURE_COOKIES=1 behind TLS (default: on when PUBLIC_URL is https)
    "TRUST_PROXY": 0,                # KVREPORT_TRUST_PROXY: number of proxies in front (X-Forwarded-*)
    "PAGE_SIZE": 50,                 # KVREPORT_PAGE_SIZE: default clusters per page
    "LOG_REQUESTS": True,            # KVREPORT_LOG_REQUESTS=0 turns the JSON request log off
}

_INT_KEYS = {"MAX_BODY_BYTES", "MAX_JSON_BYTES", "MAX_JSON_DEPTH", "MAX_STRING_CHARS", "MAX_JSON_NODES",
             "MAX_JSON_ITEMS", "MAX_LOG_LINES", "MAX_DEVICES", "TRUST_PROXY", "PAGE_SIZE", "SESSION_IDLE_SECONDS"}
_BOOL_KEYS = {"PRIVATE", "SECURE_COOKIES", "LOG_REQUESTS"}


def _parse_bool(text: str) -> bool:
    return text.strip().lower() in {"1", "true", "yes", "on"}


def load_config(environ: dict | None = None) -> dict:
    """The defaults overlaid with every ``KVREPORT_<KEY>`` variable found in ``environ``.

    Raises ``ValueError`` with one line naming the variable when a number cannot be parsed.
    """
    env = os.environ if environ is None else environ
    cfg = dict(DEFAULTS)
    for key in DEFAULTS:
        raw = env.get(f"KVREPORT_{key}")
        if raw is None or (raw == "" and (key in _INT_KEYS or key in _BOOL_KEYS)):
            continue
        if raw == "":
            cfg[key] = None  # an empty text setting means "unset" (e.g. a rate limit turned off)
        elif key in _INT_KEYS:
            try:
                cfg[key] = int(raw)
            except ValueError:
                raise ValueError(f"KVREPORT_{key} must be an integer, not {raw!r}") from None
            low = 0 if key == "TRUST_PROXY" else 1
            if cfg[key] < low:
                raise ValueError(f"KVREPORT_{key} must be at least {low}, not {raw!r}")
        elif key in _BOOL_KEYS:
            cfg[key] = _parse_bool(raw)
        else:
            cfg[key] = raw
    _check_choices(cfg)
    return cfg


def _check_choices(cfg: dict) -> None:
    """One-line ``ValueError`` for a secrets policy or rate limit that cannot work."""
    if cfg.get("SECRETS_POLICY") not in (None, "refuse", "flag"):
        raise ValueError(f"KVREPORT_SECRETS_POLICY must be refuse or flag, not {cfg['SECRETS_POLICY']!r}")
    from limits import parse_many

    for key in ("RATE_LIMIT_UPLOAD", "RATE_LIMIT_READ", "RATE_LIMIT_LOGIN", "RATE_LIMIT_AUTH_FAILURES"):
        if cfg.get(key):
            try:
                parse_many(str(cfg[key]))
            except ValueError:
                raise ValueError(f"KVREPORT_{key} must be a rate like 120/minute, not {cfg[key]!r}") from None


def default_database_url() -> str:
    """SQLite file ``kvreport.sqlite3`` in the user data directory (platformdirs), created if needed."""
    from platformdirs import user_data_dir

    folder = Path(user_data_dir("kvreport", appauthor=False))
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'kvreport.sqlite3'}"


def resolve_database_url(url: str | None) -> str:
    """``url``, else ``KVREPORT_DATABASE_URL``, else the SQLite default; ``postgres://`` and
    ``postgresql://`` are mapped to the psycopg 3 driver."""
    url = url or os.environ.get("KVREPORT_DATABASE_URL") or default_database_url()
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            url = "postgresql+psycopg://" + url[len(prefix):]
    return url


def random_secret() -> str:
    return secrets.token_urlsafe(32)
