"""``kvreport known [--update] [--server URL] [--token T] [--json]``: list the known-issues catalogs that
``analyze`` and ``collect`` match offline (:mod:`kvreport.known`); ``--update`` first fetches the team
server's known fixes (``GET <server>/api/v1/known-issues``) into the user data directory.

The server comes from ``--server``, else ``KVREPORT_SERVER``, else ``url`` under ``[server]`` in the config
file (:mod:`kvreport.config`); a token, when one is configured, is sent (a private server needs it). Errors
are one line (exit 2): no server configured, the server unreachable (after the retries of
:func:`kvreport.upload._session`), an HTTP error with the server's message, an answer that is not a catalog.
"""

from __future__ import annotations

import datetime as dt
import json

import click

from kvreport.errors import KvreportError

TIMEOUT = (5.0, 30.0)
MAX_BYTES = 16 << 20


def _reason(exc: Exception) -> str:
    """Plain words for a requests exception (never a class name)."""
    import requests

    if isinstance(exc, (requests.exceptions.InvalidSchema, requests.exceptions.MissingSchema,
                        requests.exceptions.InvalidURL)):
        return "it is not an http(s) URL"
    if isinstance(exc, requests.exceptions.SSLError):
        return "the TLS handshake failed (certificate not trusted?)"
    if isinstance(exc, requests.exceptions.Timeout):
        return "it did not answer in time"
    if isinstance(exc, requests.exceptions.ConnectionError):
        return "the connection was refused or the host is unreachable"
    return "the request failed"


def _where_from(flag: str | None) -> str:
    import os

    if flag:
        return "from --server"
    if os.environ.get("KVREPORT_SERVER"):
        return "from KVREPORT_SERVER"
    from kvreport.config import config_dir

    return f"from {config_dir() / 'config.ini'}"


def _server_message(resp) -> str:
    try:
        answer = resp.json()
    except ValueError:
        answer = None
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict) and answer["error"].get("message"):
        return str(answer["error"]["message"])[:200]
    return " ".join((resp.text or "").split())[:200] or str(resp.reason or "")


def fetch_catalog(server: str | None, token: str | None) -> tuple[str, dict]:
    """The server's known-issues catalog, validated: ``(server URL, document)``. Raises :class:`KvreportError`."""
    import requests

    from kvreport.config import config_dir, resolve_server
    from kvreport.known import CatalogError, validate_catalog
    from kvreport.upload import _session

    flag = server
    server, token = resolve_server(server, token)
    if not server:
        raise KvreportError("no server configured",
                            hint=f"pass --server URL, set KVREPORT_SERVER, or set url under [server] in "
                                 f"{config_dir() / 'config.ini'}")
    url = f"{server}/api/v1/known-issues"
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    session = _session()
    session.headers["User-Agent"] = "kvreport-known"
    try:
        resp = session.get(url, headers=headers, timeout=TIMEOUT)
    except requests.RequestException as exc:
        raise KvreportError(f"could not reach {server} ({_where_from(flag)}): {_reason(exc)}") from None
    if resp.status_code != 200:
        hint = "pass --token T or set KVREPORT_TOKEN" if resp.status_code == 401 else None
        raise KvreportError(f"{server} answered HTTP {resp.status_code}: {_server_message(resp)}", hint=hint)
    if len(resp.content) > MAX_BYTES:
        raise KvreportError(f"{server} sent more than {MAX_BYTES >> 20} MiB of known issues; not stored")
    try:
        doc = resp.json()
    except ValueError:
        raise KvreportError(f"{url} did not answer JSON (is {server} a kvreport server?)") from None
    try:
        validate_catalog(doc, curated=False, what=f"the answer of {url}")
    except CatalogError as exc:
        raise KvreportError(str(exc)) from None
    return server, doc


def update(server: str | None, token: str | None) -> tuple[str, int, str]:
    """Fetch and store the server's catalog; ``(server, number of entries, path)``."""
    from kvreport.fsutil import write_json_atomic
    from kvreport.known import SCHEMA, fetched_path

    server, doc = fetch_catalog(server, token)
    stored = {"schema": SCHEMA, "server": server,
              "fetched_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "generated_at": doc.get("generated_at"), "entries": doc["entries"]}
    path = fetched_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, stored)
    except OSError as exc:
        raise KvreportError(f"cannot write {path}: {exc.strerror or exc}") from None
    return server, len(doc["entries"]), str(path)


def _signature_text(entry: dict) -> str:
    sig = (entry.get("match") or {}).get("signature")
    return ", ".join(sig) if isinstance(sig, list) else str(sig)


def listing(entries: list[dict]) -> str:
    """The entries for a terminal: id, signature pattern, title, link and where the entry came from."""
    lines = []
    for e in entries:
        lines.append(f"{e['id']}  [{_signature_text(e)}]")
        lines.append(f"    {e.get('title')}")
        link = e.get("url") or e.get("cluster_url") or "(no link)"
        lines.append(f"    {link}  ({'shipped with kvreport' if e.get('source') == 'shipped' else 'from ' + str(e.get('source'))})")
    return "\n".join(lines) + ("\n" if lines else "")


def cli_known(update_first: bool = False, server: str | None = None, token: str | None = None,
              as_json: bool = False) -> int:
    """``kvreport known``: 0, or 2 with one line on stderr when the update failed."""
    from kvreport.known import load_entries, public

    if update_first:
        server, count, path = update(server, token)
        click.echo(f"fetched {count} known fix{'es' if count != 1 else ''} from {server} into {path}", err=True)
    entries, notes = load_entries()
    for note in notes:
        click.echo(f"kvreport: note: {note}", err=True)
    if as_json:
        click.echo(json.dumps([public(e) for e in entries], indent=1, ensure_ascii=False))
        return 0
    shipped = sum(1 for e in entries if e.get("source") == "shipped")
    click.echo(f"{len(entries)} known issues: {shipped} shipped with kvreport, {len(entries) - shipped} "
               f"from a server (kvreport known --update)")
    click.echo(listing(entries), nl=False)
    return 0
