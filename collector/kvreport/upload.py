"""Sending a bundle to the team server (the command, ``kvreport upload``, is :mod:`kvreport.commands.upload`) (requests with urllib3 ``Retry``).

The body is the bundle JSON, gzip-compressed (``Content-Encoding: gzip``), posted to
``<server>/api/v1/bundles`` with ``Authorization: Bearer <token>``. Uploading is idempotent on the
bundle ``id`` (the server answers 200 for a bundle it already holds), so connection errors and
5xx answers are retried with exponential back-off, POST included.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from kvreport.bundle import BundleError, validate_bundle
from kvreport.config import resolve_server, server_origin, where_to_set_server
from kvreport.errors import InputError, UploadError

RETRY_TOTAL = 4
RETRY_BACKOFF = 0.5  # seconds: 0.5, 1, 2, 4 between tries
TIMEOUT = (5.0, 30.0)  # connect, read (seconds)


def _session():
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    retry = Retry(
        total=RETRY_TOTAL,
        connect=RETRY_TOTAL,
        read=RETRY_TOTAL,
        status=RETRY_TOTAL,
        backoff_factor=RETRY_BACKOFF,
        status_forcelist=(500, 502, 503, 504),
        allowed_methods=frozenset({"POST", "GET"}),
        respect_retry_after_header=True,
        raise_on_status=False,
    )
    session = requests.Session()
    adapter = HTTPAdapter(max_retries=retry)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.headers["User-Agent"] = "kvreport-upload"
    return session


def upload_bundle(bundle: dict, server: str | None, token: str | None) -> dict:
    """Post ``bundle`` (a validated bundle dict) and return the server's JSON answer.

    The answer has ``id``, ``url``, ``cluster`` ({id, key, title, count, known_fix, issue_url})
    and ``diagnosis``; ``status`` (201 new / 200 already stored) is added.
    Raises :class:`UploadError` when no server or token is configured, the server cannot be
    reached after the retries, or it refuses the bundle (its error message is quoted).
    """
    import requests

    origin = server_origin(server)
    server, token = resolve_server(server, token)
    if not server:
        raise UploadError("no server configured", hint=where_to_set_server())
    if not token:
        raise UploadError("no API token configured",
                          hint="pass --token T, set KVREPORT_TOKEN, or write token = T under [server] in the config file")
    body = gzip.compress(json.dumps(bundle, ensure_ascii=False).encode("utf-8"))
    headers = {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "Content-Encoding": "gzip",
        "Accept": "application/json",
    }
    url = f"{server}/api/v1/bundles"
    try:
        resp = _session().post(url, data=body, headers=headers, timeout=TIMEOUT)
    except requests.RequestException as exc:
        raise UploadError(f"{request_problem(exc, server)} (the server URL comes from {origin})") from None
    return _answer(resp, "the bundle")


def request_problem(exc: Exception, server: str) -> str:
    """What went wrong with a request, in words (never a Python class name)."""
    import requests

    if isinstance(exc, requests.exceptions.InvalidSchema | requests.exceptions.MissingSchema):
        return f"{server!r} is not a server URL: it must start with http:// or https://"
    if isinstance(exc, requests.exceptions.InvalidURL | requests.exceptions.URLRequired):
        return f"{server!r} is not a valid server URL"
    if isinstance(exc, requests.exceptions.SSLError):
        return f"could not reach {server}: the TLS (https) handshake failed (certificate or protocol)"
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return f"could not reach {server}: the connection timed out after {TIMEOUT[0]:.0f} s (wrong address or a firewall?)"
    if isinstance(exc, requests.exceptions.ProxyError):
        return f"could not reach {server}: the proxy refused the connection (check HTTPS_PROXY / HTTP_PROXY)"
    if isinstance(exc, requests.exceptions.ConnectionError):
        return (f"could not reach {server}: nothing answered after {RETRY_TOTAL + 1} tries "
                "(is the server running, and are the host name and port right?)")
    if isinstance(exc, requests.exceptions.Timeout):
        return f"could not reach {server}: no answer within {TIMEOUT[1]:.0f} s"
    if isinstance(exc, requests.exceptions.TooManyRedirects):
        return f"could not reach {server}: too many redirects"
    return f"could not reach {server}: the request failed"


def read_bundle_file(path: str) -> dict:
    """Read and validate a bundle file ('-' for stdin). Raises :class:`InputError` when it is not one."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InputError(f"{path} is not a bundle: not JSON ({exc.msg} at line {exc.lineno})") from None
    try:
        return validate_bundle(data)
    except BundleError as exc:
        raise InputError(f"{path}: {exc}") from None


def describe_answer(answer: dict) -> str:
    """A few lines for the terminal: where the bundle lives, its cluster, known fix and issue."""
    cluster = answer.get("cluster") or {}
    state = "stored" if answer.get("status") == 201 else "already stored"
    lines = [f"Bundle {state}: {answer.get('url')}"]
    if cluster:
        count = cluster.get("count")
        lines.append(f"Cluster: {cluster.get('title') or cluster.get('key')} "
                     f"({count} report{'s' if count != 1 else ''})")
    if cluster.get("known_fix"):
        lines.append("Known fix:")
        lines.extend("  " + line for line in str(cluster["known_fix"]).splitlines())
    if cluster.get("issue_url"):
        lines.append(f"Tracked in: {cluster['issue_url']}")
    worked = [w for w in cluster.get("what_worked") or [] if isinstance(w, dict) and w.get("text")]
    if worked:
        lines.append("What worked for others:")
        lines.extend(f"  {w['text']}" for w in worked[:5])
    return "\n".join(lines)


def send_outcome(body: dict, bundle_id: str, server: str | None, token: str | None) -> dict:
    """Post an outcome (:mod:`kvreport.confirm`) to ``<server>/api/v1/bundles/<bundle_id>/outcomes``.

    Idempotent on the outcome ``id`` (retried like an upload). Returns the server's answer with
    ``status``; raises :class:`UploadError` with the server's message otherwise."""
    import requests

    server, token = resolve_server(server, token)
    if not server or not token:
        raise UploadError("no server or token configured",
                          hint="pass --server and --token, or set KVREPORT_SERVER and KVREPORT_TOKEN")
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Accept": "application/json"}
    url = f"{server}/api/v1/bundles/{bundle_id}/outcomes"
    try:
        resp = _session().post(url, data=json.dumps(body).encode("utf-8"), headers=headers, timeout=TIMEOUT)
    except requests.RequestException as exc:
        raise UploadError(request_problem(exc, server)) from None
    return _answer(resp, "the outcome")


def _answer(resp, what: str) -> dict:
    """The server's JSON answer (with its HTTP ``status``) for a 200/201, else an UploadError with its message."""
    try:
        answer = resp.json()
    except ValueError:
        answer = None
    if resp.status_code in (200, 201) and isinstance(answer, dict):
        answer["status"] = resp.status_code
        return answer
    message = None
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        message = answer["error"].get("message")
    message = message or (resp.text or "").strip()[:200] or resp.reason
    raise UploadError(f"the server refused {what} (HTTP {resp.status_code}): {message}")
