"""Every error as ``{"error": {"code", "message", "field"?}}`` (design.md, HTTP API); never a 500 for bad input.

API routes, ``.json`` views and ``/healthz`` answer JSON; HTML pages answer a small HTML page with
the same message. Unexpected exceptions are logged with their traceback and answered 500 without
details.
"""

from __future__ import annotations

import logging

from flask import Flask, jsonify, render_template, request
from werkzeug.exceptions import HTTPException

log = logging.getLogger("kvreport_server")

_CODES = {
    400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
    405: "method_not_allowed", 406: "not_acceptable", 409: "conflict", 413: "too_large",
    415: "unsupported_media_type", 422: "invalid", 429: "rate_limited", 431: "headers_too_large", 500: "internal",
    503: "unavailable",
}


class ApiError(Exception):
    """An error answered as JSON with ``status``; ``field`` names the offending field path."""

    def __init__(self, status: int, message: str, *, code: str | None = None, field: str | None = None,
                 extra: dict | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code or _CODES.get(status, "error")
        self.field = field
        self.extra = extra or {}
        self.headers = headers or {}


def error_body(code: str, message: str, field: str | None = None, **extra) -> dict:
    err = {"code": code, "message": message}
    if field:
        err["field"] = field
    err.update(extra)
    return {"error": err}


def wants_json() -> bool:
    path = request.path
    if path.startswith("/api/") or path.endswith((".json", ".md")) or path == "/healthz":
        return True
    best = request.accept_mimetypes.best_match(["text/html", "application/json"])
    return best == "application/json" and not request.accept_mimetypes.accept_html


def _respond(status: int, body: dict, headers: dict | None = None):
    if wants_json():
        resp = jsonify(body)
    else:
        err = body["error"]
        resp = render_template("error.html", status=status, error=err)
    resp = resp if not isinstance(resp, str) else _html(resp)
    resp.status_code = status
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    return resp


def _html(text: str):
    from flask import make_response

    return make_response(text)


def _webargs_messages(exc: HTTPException) -> tuple[str, str | None, dict]:
    data = getattr(exc, "data", None) or {}
    messages = data.get("messages") or {}
    paths: list[str] = []

    def walk(obj, prefix=""):
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        elif isinstance(obj, list) and obj and all(isinstance(m, str) for m in obj):
            paths.append(f"{prefix}: {obj[0]}")
        elif isinstance(obj, list):
            for m in obj:
                walk(m, prefix)

    # webargs nests by location ("query", "json"); drop that level from the field path
    for _loc, msgs in messages.items() if isinstance(messages, dict) else []:
        walk(msgs)
    field = paths[0].split(":", 1)[0] if paths else None
    return ("; ".join(paths) or exc.description or "invalid input"), field, messages


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(ApiError)
    def _api_error(exc: ApiError):
        return _respond(exc.status, error_body(exc.code, exc.message, exc.field, **exc.extra), exc.headers)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        status = exc.code or 500
        if status == 422:
            message, field, _ = _webargs_messages(exc)
            return _respond(422, error_body("invalid", message, field))
        headers = {}
        if status == 429:
            retry = None
            limit = getattr(exc, "limit", None)
            if exc.response is not None:
                retry = exc.response.headers.get("Retry-After")
            headers["Retry-After"] = retry or "60"
            message = f"rate limit exceeded ({limit.limit if limit else exc.description})"
        elif status == 413:
            from flask import current_app

            limit = int(current_app.config.get("MAX_BODY_BYTES") or 0)
            message = f"request body exceeds the limit of {limit} bytes (KVREPORT_MAX_BODY_BYTES)"
            return _respond(413, error_body("too_large", message, limit=limit))
        else:
            message = exc.description or exc.name
        valid = getattr(exc, "valid_methods", None)
        if status == 405 and valid:
            headers["Allow"] = ", ".join(valid)
        return _respond(status, error_body(_CODES.get(status, "error"), message), headers)

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.path)
        return _respond(500, error_body("internal", "internal server error"))
