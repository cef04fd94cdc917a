"""Ollama: ``ollama --version``, the server's ``/api/version`` and ``/api/ps`` when it answers on a
local address, and which of the usual server log files exist.

``ollama --version`` prints ``ollama version is 0.5.7`` and, when client and server differ or the
server is down, ``Warning: client version is …`` / ``Warning: could not connect to a running Ollama
instance`` (ollama ``cmd/cmd.go``). ``/api/ps`` lists loaded models with ``size`` and ``size_vram``
in bytes (and ``context_length`` in recent versions). The server is only contacted on a loopback
or unspecified ``OLLAMA_HOST`` (default ``127.0.0.1:11434``), with a short timeout. Log locations:
``~/.ollama/logs/server.log`` (macOS), ``%LOCALAPPDATA%\\Ollama\\server.log`` (Windows); on Linux
the service logs to the journal (``journalctl -u ollama``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

from kvreport.probes._util import Absent, ProbeFailed, run_named, to_mib

_VERSION = re.compile(r"(?:ollama version is|version is|client version is)\s+v?(\S+)", re.I)
_LOCAL = {"127.0.0.1", "localhost", "0.0.0.0", "::1", "::", ""}


def parse_version(text: str) -> str | None:
    """The first version in ``ollama --version`` output ("0.5.7"), or None."""
    m = _VERSION.search(text)
    return m.group(1) if m else None


def base_url(env: dict[str, str] | None = None) -> str | None:
    """``http://host:port`` of the local Ollama server per ``OLLAMA_HOST``; None when not local."""
    raw = (env if env is not None else os.environ).get("OLLAMA_HOST", "") or "127.0.0.1:11434"
    if "://" not in raw:
        raw = "http://" + raw
    parts = urlsplit(raw)
    host = parts.hostname or ""
    if host not in _LOCAL:
        return None
    if host in ("0.0.0.0", "", "::"):
        host = "127.0.0.1"
    port = parts.port or 11434
    return f"{parts.scheme or 'http'}://{'[' + host + ']' if ':' in host else host}:{port}"


def _port_open(url: str, timeout: float) -> bool:
    """Whether something accepts a TCP connection at ``url``'s host and port: the cheap test that
    spares importing :mod:`urllib.request` (tens of ms) when no server runs, the common case."""
    import socket

    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port or 80), timeout=timeout):
            return True
    except OSError:
        return False


def _get_json(url: str, timeout: float):
    from urllib.request import Request, urlopen

    req = Request(url, headers={"User-Agent": "kvreport-probe"})
    with urlopen(req, timeout=timeout) as resp:  # noqa: S310 - a local http URL we built
        return json.loads(resp.read(1 << 20).decode("utf-8", "replace"))


def parse_ps(data: dict) -> list[dict]:
    """Loaded models from ``/api/ps``: name, size and size_vram in MiB, context_length."""
    models = []
    items = data.get("models") if isinstance(data, dict) else None
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        models.append({"name": item.get("name") or item.get("model"),
                       "size_mib": to_mib(item.get("size")), "size_vram_mib": to_mib(item.get("size_vram")),
                       "context_length": item.get("context_length")})
    return models


def log_locations() -> list[str]:
    """Existing Ollama server log files in their usual places."""
    candidates = [Path.home() / ".ollama" / "logs" / "server.log"]
    local = os.environ.get("LOCALAPPDATA")
    if local:
        candidates.append(Path(local) / "Ollama" / "server.log")
    return [str(p) for p in candidates if p.is_file()]


def probe(timeout: float = 3.0, env: dict[str, str] | None = None) -> dict:
    """``{"ollama": {...}}``; :class:`Absent` when neither the CLI nor a local server exists."""
    facts: dict = {"name": "ollama"}
    have_cli = True
    try:
        out = run_named("ollama", ["--version"], timeout)
        text = (out.stdout + "\n" + out.stderr).strip()
        facts["version_output"] = text[:1000]
        facts["version"] = parse_version(text)
        facts["server_running"] = "could not connect" not in text.lower()
    except Absent:
        have_cli = False
    url = base_url(env)
    if url and (not have_cli or facts.get("server_running", True)):
        http_timeout = min(0.5, timeout)
        try:
            if not _port_open(url, http_timeout):
                raise ConnectionRefusedError(url)
            facts["server_version"] = (_get_json(url + "/api/version", http_timeout) or {}).get("version")
            facts["loaded_models"] = parse_ps(_get_json(url + "/api/ps", http_timeout))
            facts["server_running"] = True
        except Exception:  # noqa: BLE001 - no server, or not Ollama
            if not have_cli:
                raise Absent("ollama") from None
    elif not have_cli:
        raise Absent("ollama")
    if facts.get("version") is None and facts.get("server_version"):
        facts["version"] = facts["server_version"]
    if have_cli and facts.get("version") is None and not facts.get("server_version"):
        raise ProbeFailed(f"ollama --version: {facts.get('version_output', '')[:100]}")
    facts["logs"] = log_locations()
    return {"ollama": facts}
