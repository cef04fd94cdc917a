"""Application factory: configuration, database, API and web blueprints, auth, CSRF, rate limits,
security headers and structured request logs."""

from __future__ import annotations

import json
import logging
import sys
import time

from flask import Flask, current_app, g, request
from flask_limiter import Limiter
from flask_limiter.util import get_remote_address
from flask_wtf.csrf import CSRFProtect

from kvreport_server import auth
from kvreport_server import config as config_mod
from kvreport_server.db import Database, close_session
from kvreport_server.errors import register_error_handlers

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
req_log = logging.getLogger("kvreport_server.request")


def create_app(config: dict | None = None) -> Flask:
    """Build the app. ``config`` keys override the environment (``DATABASE_URL``, ``PRIVATE``...)."""
    app = Flask(__name__)
    cfg = config_mod.load_config()
    cfg.update(config or {})
    cfg["DATABASE_URL"] = config_mod.resolve_database_url(cfg.get("DATABASE_URL"))
    cfg["SECRET_KEY"] = cfg.get("SECRET_KEY") or config_mod.random_secret()
    app.config.update(cfg)
    app.config["MAX_CONTENT_LENGTH"] = int(cfg["MAX_BODY_BYTES"]) + 65536
    public = str(cfg.get("PUBLIC_URL") or "")
    secure = cfg.get("SECURE_COOKIES")
    secure = public.startswith("https://") if secure is None else bool(secure)
    app.config.update(SESSION_COOKIE_HTTPONLY=True, SESSION_COOKIE_SAMESITE="Lax", SESSION_COOKIE_SECURE=secure,
                      REMEMBER_COOKIE_HTTPONLY=True, REMEMBER_COOKIE_SAMESITE="Lax",
                      REMEMBER_COOKIE_SECURE=secure, WTF_CSRF_TIME_LIMIT=None, JSON_SORT_KEYS=False)
    if int(cfg.get("TRUST_PROXY") or 0) > 0:
        from werkzeug.middleware.proxy_fix import ProxyFix

        n = int(cfg["TRUST_PROXY"])
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=n, x_proto=n, x_host=n, x_prefix=n)

    db = Database(cfg["DATABASE_URL"])
    app.extensions["kvreport_db"] = db
    app.teardown_appcontext(close_session)

    from kvreport_server.api import bundles as api_bundles
    from kvreport_server.api import clusters as api_clusters
    from kvreport_server.api import init_api
    from kvreport_server.api import known as api_known
    from kvreport_server.web import bp as web_bp

    init_api(app)
    app.register_blueprint(web_bp)
    auth.login_manager.init_app(app)
    csrf = CSRFProtect(app)
    csrf.exempt(api_bundles.blp)
    csrf.exempt(api_clusters.blp)
    csrf.exempt(api_known.blp)
    _init_limiter(app, cfg, (api_bundles.blp, api_clusters.blp, api_known.blp), web_bp)
    app.before_request(_access_gate)
    register_error_handlers(app)
    _init_logging(app, bool(cfg.get("LOG_REQUESTS", True)))

    @app.after_request
    def _security_headers(resp):
        h = resp.headers
        h.setdefault("Content-Security-Policy", CSP)
        h.setdefault("X-Content-Type-Options", "nosniff")
        h.setdefault("X-Frame-Options", "DENY")
        h.setdefault("Referrer-Policy", "same-origin")
        h.setdefault("Cross-Origin-Opener-Policy", "same-origin")
        h.setdefault("Permissions-Policy", "clipboard-write=(self), camera=(), microphone=(), geolocation=()")
        if secure:
            h.setdefault("Strict-Transport-Security", "max-age=31536000")
        if app.config.get("PRIVATE"):
            h.setdefault("Cache-Control", "private, no-store")
        return resp

    return app


def _token_key() -> str:
    """Rate-limit key: the VERIFIED token when one is sent and valid, else the client address (so a
    made-up token neither escapes the anonymous limit nor spends a real token's quota)."""
    row, _problem = auth.resolve_token()
    if row is not None:
        return f"token:{row.id}"
    return "addr:" + (get_remote_address() or "?")


# API writes and the scope each needs: checked before the body or query is read (issue 13, item 10)
WRITE_SCOPES = {
    ("bundles.Bundles", "POST"): "upload",
    ("bundles.BundleItem", "DELETE"): "admin",
    ("clusters.ClusterItem", "PATCH"): "write",
    ("clusters.ClusterMerge", "POST"): "write",
    ("clusters.ClusterUnmerge", "POST"): "write",
}
OPEN_ENDPOINTS = ("web.login", "web.logout", "web.healthz", "static")


def _access_gate():
    """Authentication before validation: API writes need their token first, and a private server
    lets an anonymous caller reach nothing but /healthz (status only) and the sign-in page."""
    endpoint = request.endpoint or ""
    if endpoint in OPEN_ENDPOINTS:
        return None
    if "Authorization" in request.headers:
        auth.bearer_token()  # a token that is sent is checked (401, or 429 after too many failures)
    scope = WRITE_SCOPES.get((endpoint, request.method))
    if scope is not None:
        auth.require_scope(scope)
        return None
    if not current_app.config.get("PRIVATE"):
        return None
    if auth.can_read():
        return None
    path = request.path
    if path.startswith("/api/") or path.endswith((".json", ".md")) or endpoint.startswith("api-docs"):
        auth.require_read()  # raises the JSON 401
    from flask import redirect, url_for

    return redirect(url_for("web.login", next=request.path if request.method == "GET" else None))


def _init_limiter(app: Flask, cfg: dict, api_blps, web_bp) -> None:
    upload = cfg.get("RATE_LIMIT_UPLOAD")
    read = cfg.get("RATE_LIMIT_READ")
    login = cfg.get("RATE_LIMIT_LOGIN")
    limiter = Limiter(_token_key, app=app, storage_uri=cfg.get("RATE_LIMIT_STORAGE") or "memory://",
                      headers_enabled=True, enabled=bool(upload or read or login), key_prefix=f"kvr{id(app)}",
                      strategy="moving-window")
    app.extensions["kvreport_limiter"] = limiter
    fails = cfg.get("RATE_LIMIT_AUTH_FAILURES")
    if fails:
        from limits import parse
        from limits.storage import storage_from_string
        from limits.strategies import MovingWindowRateLimiter

        storage = storage_from_string(cfg.get("RATE_LIMIT_STORAGE") or "memory://")
        app.extensions["kvreport_auth_failures"] = (MovingWindowRateLimiter(storage), parse(str(fails)))
    for blp in api_blps:
        if upload:
            limiter.limit(upload, methods=["POST", "PATCH", "DELETE"], key_func=_token_key)(blp)
        if read:
            limiter.limit(read, methods=["GET"], key_func=_token_key)(blp)
    if read:
        limiter.limit(read, methods=["GET"], key_func=_token_key,
                      exempt_when=lambda: request.endpoint in ("web.healthz", "static"))(web_bp)
    if login:
        limiter.limit(login, methods=["POST"], key_func=lambda: "login:" + (get_remote_address() or "?"),
                      exempt_when=lambda: request.endpoint != "web.login")(web_bp)


def _init_logging(app: Flask, enabled: bool) -> None:
    if not enabled:
        return
    if not req_log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        req_log.addHandler(handler)
        req_log.setLevel(logging.INFO)
        req_log.propagate = False

    @app.before_request
    def _start_timer():
        g.t0 = time.perf_counter()

    @app.after_request
    def _log_request(resp):
        t0 = g.get("t0")
        token = g.get("api_token")
        req_log.info(json.dumps({
            "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "method": request.method,
            "path": request.path, "status": resp.status_code,
            "ms": round((time.perf_counter() - t0) * 1000, 1) if t0 else None,
            "bytes_in": request.content_length, "token": token.name if token is not None else None,
            "remote": request.remote_addr,
        }))
        return resp
