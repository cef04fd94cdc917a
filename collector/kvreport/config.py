"""Client configuration: the team server's URL and token, and what was uploaded where.

Order of precedence (design.md): command-line flags, then the environment variables
``KVREPORT_SERVER`` / ``KVREPORT_TOKEN``, then the config file
``<user config dir>/kvreport/config.ini`` (``platformdirs.user_config_dir``; override the
directory with ``KVREPORT_CONFIG_DIR``)::

    [server]
    url = https://kvreport.example.org
    token = kvr_...

Uploaded bundles are remembered in ``<user data dir>/kvreport/uploads.json`` (bundle id -> URL)
so that ``kvreport issue`` can print the permalink of a bundle uploaded earlier.
"""

from __future__ import annotations

import configparser
import json
import os
from pathlib import Path


def config_dir() -> Path:
    """The directory of ``config.ini`` (``KVREPORT_CONFIG_DIR`` or the platform's user config dir)."""
    env = os.environ.get("KVREPORT_CONFIG_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_config_dir("kvreport", appauthor=False))


def data_dir() -> Path:
    """The client's data directory (``KVREPORT_DATA_DIR`` or the platform's user data dir)."""
    env = os.environ.get("KVREPORT_DATA_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_data_dir("kvreport", appauthor=False))


def _file_values() -> dict[str, str]:
    path = config_dir() / "config.ini"
    parser = configparser.ConfigParser()
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError):
        return {}
    if not parser.has_section("server"):
        return {}
    return {k: v for k, v in parser.items("server") if v}


def resolve_server(server: str | None = None, token: str | None = None) -> tuple[str | None, str | None]:
    """The server URL (without a trailing slash) and token: flags, then environment, then the file."""
    file_values = None
    if not server:
        server = os.environ.get("KVREPORT_SERVER")
    if not token:
        token = os.environ.get("KVREPORT_TOKEN")
    if not server or not token:
        file_values = _file_values()
        server = server or file_values.get("url")
        token = token or file_values.get("token")
    return (server.rstrip("/") if server else None), token


def server_origin(flag_server: str | None) -> str:
    """Where the server URL in use comes from, for error messages: the --server option, the
    KVREPORT_SERVER variable, or the config file (its path)."""
    env = os.environ.get("KVREPORT_SERVER")
    if flag_server and flag_server != env:
        return "the --server option"
    if flag_server or env:
        return "the KVREPORT_SERVER environment variable"
    return f"the config file {config_dir() / 'config.ini'}"


def where_to_set_server() -> str:
    return (f"pass --server URL, set KVREPORT_SERVER, or write url = URL under [server] in "
            f"{config_dir() / 'config.ini'}")


def _uploads_path() -> Path:
    return data_dir() / "uploads.json"


def remember_upload(bundle_id: str, url: str) -> None:
    """Record that bundle ``bundle_id`` lives at ``url`` (best effort: a read-only home is fine)."""
    from kvreport.fsutil import write_json_atomic

    path = _uploads_path()
    try:
        known = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        if not isinstance(known, dict):
            known = {}
        known[bundle_id] = url
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, known)
    except (OSError, ValueError):
        pass


def uploaded_url(bundle_id: str) -> str | None:
    """The permalink recorded for ``bundle_id`` by an earlier ``kvreport upload``, if any."""
    try:
        known = json.loads(_uploads_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return known.get(bundle_id) if isinstance(known, dict) else None
