"""Access: API tokens (scopes upload ⊂ write ⊂ admin) and maintainers' accounts (Flask-Login).

Tokens look like ``kvr_<prefix>_<secret>``: the 8-character prefix finds the row, the SHA-256 of
the whole token is compared in constant time (``hmac.compare_digest``); only the digest is stored,
so a database leak does not leak usable tokens (tokens carry 256 random bits, so a fast hash is
enough). Passwords are hashed with Werkzeug's scrypt KDF.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

from flask import current_app, g, request
from flask_login import LoginManager, current_user
from sqlalchemy import select, update
from sqlalchemy.orm import Session
from werkzeug.security import check_password_hash, generate_password_hash

from kvreport_server.db import get_db, get_session
from kvreport_server.errors import ApiError
from kvreport_server.models import SCOPES, ApiToken, User, utcnow

SCOPE_RANK = {s: i for i, s in enumerate(SCOPES)}
login_manager = LoginManager()
login_manager.login_view = "web.login"
login_manager.session_protection = "strong"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()


def new_token(session: Session, name: str, scope: str = "upload") -> str:
    """Create a token row and return the token text (shown once; only its digest is stored).

    Names are unique among active tokens (``revoke-token NAME`` revokes exactly one): a name that
    an active token already has raises ``ValueError``; a revoked token's name can be reused.
    """
    if scope not in SCOPE_RANK:
        raise ValueError(f"unknown scope {scope!r} (upload, write or admin)")
    name = name.strip()
    if not name or len(name) > 100:
        raise ValueError("a token name is 1 to 100 characters")
    active = select(ApiToken.id).where(ApiToken.name == name, ApiToken.revoked_at.is_(None))
    if session.execute(active).first() is not None:
        raise ValueError(f"an active token named {name!r} exists; revoke it first "
                         f"(kvreport admin revoke-token {name}) or choose another name")
    while True:
        prefix = secrets.token_hex(4)
        if session.execute(select(ApiToken.id).where(ApiToken.prefix == prefix)).first() is None:
            break
    token = f"kvr_{prefix}_{secrets.token_urlsafe(32)}"
    session.add(ApiToken(name=name, prefix=prefix, digest=_digest(token), scope=scope, created_at=utcnow()))
    return token


def revoke_tokens(session: Session, name: str) -> int:
    """Revoke every active token called ``name``; returns how many."""
    result = session.execute(update(ApiToken).where(ApiToken.name == name, ApiToken.revoked_at.is_(None))
                             .values(revoked_at=utcnow()))
    return result.rowcount or 0


def lookup_token(session: Session, token: str) -> ApiToken | None:
    """The active token row for ``token``, or None (constant-time digest comparison)."""
    parts = token.split("_")
    if len(parts) < 3 or parts[0] != "kvr" or len(parts[1]) != 8:
        return None
    row = session.execute(select(ApiToken).where(ApiToken.prefix == parts[1])).scalar_one_or_none()
    expected = row.digest if row is not None else "0" * 64
    ok = hmac.compare_digest(expected, _digest(token))
    if row is None or not ok or row.revoked_at is not None:
        return None
    return row


def client_address() -> str:
    return request.remote_addr or "?"


def _auth_failures():
    """(moving-window limiter, rate) counting failed authentications per client address, or None."""
    return current_app.extensions.get("kvreport_auth_failures")


def auth_throttled() -> bool:
    """True when this client address has used up its failed authentications (a 429 follows)."""
    fails = _auth_failures()
    if fails is None:
        return False
    limiter, rate = fails
    return not limiter.test(rate, "authfail", client_address())


def count_auth_failure() -> None:
    fails = _auth_failures()
    if fails is not None:
        limiter, rate = fails
        limiter.hit(rate, "authfail", client_address())


def _throttled_error() -> ApiError:
    return ApiError(429, "too many failed authentications from this address; wait and try again",
                    code="rate_limited", headers={"Retry-After": "60"})


def resolve_token() -> tuple[ApiToken | None, str | None]:
    """The request's verified token and what went wrong, without raising; cached per request.

    ``(row, None)`` for a valid token, ``(None, None)`` without an Authorization header, else
    ``(None, "malformed" | "invalid" | "throttled")``. A wrong token counts as a failed
    authentication of the client address; an address over its failures is not checked at all.
    """
    if "token_check" in g:
        return g.token_check
    header = request.headers.get("Authorization", "")
    result: tuple[ApiToken | None, str | None] = (None, None)
    if header:
        kind, _, value = header.partition(" ")
        if auth_throttled():
            result = (None, "throttled")
        elif kind.lower() != "bearer" or not value.strip():
            count_auth_failure()
            result = (None, "malformed")
        else:
            row = lookup_token(get_session(), value.strip())
            if row is None:
                count_auth_failure()
            result = (row, None if row is not None else "invalid")
    g.token_check = result
    return result


def bearer_token() -> ApiToken | None:
    """The request's token (cached in ``g``); raises 401 when a token is given but invalid, 429 when
    the client address has failed too often."""
    row, problem = resolve_token()
    if problem == "throttled":
        raise _throttled_error()
    if problem == "malformed":
        raise ApiError(401, "Authorization must be 'Bearer <token>'", code="unauthorized",
                       headers={"WWW-Authenticate": 'Bearer realm="kvreport"'})
    if problem == "invalid":
        raise ApiError(401, "invalid or revoked token", code="unauthorized",
                       headers={"WWW-Authenticate": 'Bearer realm="kvreport", error="invalid_token"'})
    g.api_token = row
    return row


def require_scope(scope: str) -> ApiToken:
    """The request's token when it has at least ``scope``; 401 without a token, 403 when too weak."""
    row = bearer_token()
    if row is None:
        raise ApiError(401, f"this needs a token with the {scope} scope (Authorization: Bearer <token>)",
                       code="unauthorized", headers={"WWW-Authenticate": 'Bearer realm="kvreport"'})
    if SCOPE_RANK.get(row.scope, -1) < SCOPE_RANK[scope]:
        raise ApiError(403, f"token {row.name!r} has scope {row.scope}; this needs {scope}", code="forbidden")
    _touch(row)
    return row


def _touch(row: ApiToken) -> None:
    now = utcnow()
    last = row.last_used_at
    if last is not None and last.tzinfo is None:
        last = last.replace(tzinfo=now.tzinfo)
    if last is None or (now - last).total_seconds() > 60:
        db = get_db()
        with db.write_lock(), db.Session() as s, s.begin():
            s.execute(update(ApiToken).where(ApiToken.id == row.id).values(last_used_at=now))


def can_read() -> bool:
    """Public servers: everyone; private servers (KVREPORT_PRIVATE=1): signed-in users or any token."""
    if not current_app.config.get("PRIVATE"):
        return True
    if current_user.is_authenticated:
        return True
    return bearer_token() is not None


def can_read_quietly() -> bool:
    """``can_read`` that never raises (a wrong token is simply no token)."""
    if not current_app.config.get("PRIVATE") or current_user.is_authenticated:
        return True
    return resolve_token()[0] is not None


def require_read() -> None:
    if not can_read():
        raise ApiError(401, "this server is private: sign in or send a token", code="unauthorized",
                       headers={"WWW-Authenticate": 'Bearer realm="kvreport"'})


def is_maintainer() -> bool:
    return bool(current_user.is_authenticated and getattr(current_user, "is_maintainer", False))


def create_user(session: Session, username: str, password: str, maintainer: bool = True) -> User:
    username = username.strip()
    if not username or len(username) > 100:
        raise ValueError("a user name is 1 to 100 characters")
    if len(password) < 8:
        raise ValueError("a password has at least 8 characters")
    if session.execute(select(User.id).where(User.username == username)).first() is not None:
        raise ValueError(f"user {username!r} already exists")
    user = User(username=username, password_hash=generate_password_hash(password, method="scrypt"),
                is_maintainer=maintainer, created_at=utcnow(), disabled=False)
    session.add(user)
    return user


_DUMMY_HASH = None


def check_login(session: Session, username: str, password: str) -> User | None:
    """The user when the password matches (the KDF runs even for unknown names, against timing)."""
    global _DUMMY_HASH
    if "\x00" in username or len(username) > 100:
        username = ""
    user = session.execute(select(User).where(User.username == username.strip())).scalar_one_or_none()
    if user is None or user.disabled:
        if _DUMMY_HASH is None:
            _DUMMY_HASH = generate_password_hash(secrets.token_hex(8), method="scrypt")
        check_password_hash(_DUMMY_HASH, password)
        return None
    return user if check_password_hash(user.password_hash, password) else None


def start_session(user: User) -> None:
    """Sign ``user`` in: the session cookie carries the user's session version and its last use."""
    from flask import session
    from flask_login import login_user

    login_user(user)
    session["sv"] = int(user.session_version or 0)
    session["seen"] = int(time.time())


def end_session() -> None:
    """Sign out everywhere: the user's session version moves on, so every cookie issued before
    (a copied or replayed one included) stops working."""
    from flask import session
    from flask_login import logout_user

    uid = getattr(current_user, "id", None) if current_user.is_authenticated else None
    if uid is not None:
        db = get_db()
        with db.write_lock(), db.Session() as s, s.begin():
            s.execute(update(User).where(User.id == uid).values(session_version=User.session_version + 1))
    logout_user()
    session.clear()


@login_manager.user_loader
def _load_user(user_id: str):
    from flask import session

    try:
        uid = int(user_id)
    except (TypeError, ValueError):
        return None
    user = get_session().get(User, uid)
    if user is None or user.disabled or session.get("sv") != int(user.session_version or 0):
        return None
    now = int(time.time())
    seen = session.get("seen")
    idle = int(current_app.config.get("SESSION_IDLE_SECONDS") or 0)
    if not isinstance(seen, int) or (idle and now - seen > idle):
        return None  # idle too long: sign in again
    if now - seen >= 60:
        session["seen"] = now
    return user


@login_manager.unauthorized_handler
def _unauthorized():
    from flask import redirect, url_for

    if request.path.startswith("/api/") or request.path.endswith(".json"):
        raise ApiError(401, "sign in first", code="unauthorized")
    return redirect(url_for("web.login", next=request.full_path if request.query_string else request.path))
