"""Issue 13: one small upload must not stall the server, every input a 4xx, rate limits that cannot be
dodged, sessions that sign-out ends, authentication before validation, a private mode that leaks
nothing."""

from __future__ import annotations

import gzip
import json
import time

import pytest
from server_helpers import minimal_bundle
from sqlalchemy import func, select

from kvreport_server import limits
from kvreport_server.errors import ApiError
from kvreport_server.models import Bundle


def post_raw(client, body: bytes, headers: dict, **extra):
    return client.post("/api/v1/bundles", data=body, headers={"Content-Type": "application/json", **headers},
                       **extra)


def stored(db) -> int:
    with db.Session() as s:
        return s.execute(select(func.count()).select_from(Bundle)).scalar_one()


# --- item 2: one budget for an upload's shape, checked while parsing --------------------------------

SHAPES = [
    # (what, body, limit name in the message)
    ("nodes", lambda: minimal_bundle(host={f"k{i}": ["x"] * 900 for i in range(6)}),
     "KVREPORT_MAX_JSON_NODES"),
    ("array", lambda: minimal_bundle(command={"argv": ["x"] * 1001}), "KVREPORT_MAX_JSON_ITEMS"),
    ("object", lambda: minimal_bundle(probes={f"k{i}": "v" for i in range(1001)}), "KVREPORT_MAX_JSON_ITEMS"),
    ("depth", lambda: minimal_bundle(host={"x": json.loads("[" * 20 + "]" * 20)}), "KVREPORT_MAX_JSON_DEPTH"),
    ("string", lambda: minimal_bundle(command={"argv": ["a" * 501]}), "KVREPORT_MAX_STRING_CHARS"),
]


@pytest.mark.parametrize("what,make,name", SHAPES, ids=[s[0] for s in SHAPES])
def test_shape_budget_is_a_413_naming_the_limit(make_app, what, make, name):
    from kvreport_server import auth

    app = make_app(MAX_JSON_NODES=5000, MAX_JSON_ITEMS=1000, MAX_LOG_LINES=100, MAX_JSON_DEPTH=10,
                   MAX_STRING_CHARS=500)
    db = app.extensions["kvreport_db"]
    with db.Session() as s, s.begin():
        token = auth.new_token(s, "shape", "upload")
    r = post_raw(app.test_client(), json.dumps(make()).encode(), {"Authorization": f"Bearer {token}"})
    assert r.status_code == 413, r.json
    assert name in r.json["error"]["message"] and r.json["error"]["limit"] > 0
    assert stored(db) == 0


def test_shape_is_checked_before_the_body_is_parsed(monkeypatch):
    """The budget stops a huge array before json builds a single object."""
    calls = []
    monkeypatch.setattr(limits.json, "loads", lambda *a, **k: calls.append(1))
    text = ('{"command": {"argv": [' + ",".join(['"a"'] * 300_000) + "]}}").encode()
    t0 = time.perf_counter()
    with pytest.raises(ApiError) as e:
        limits.parse_json(text, max_nodes=10**9, max_depth=32, max_items=20000, max_string=65536)
    assert e.value.status == 413 and "KVREPORT_MAX_JSON_ITEMS" in e.value.message
    assert not calls and time.perf_counter() - t0 < 2


def test_shape_counts_decoded_string_length():
    ok = '"' + "\\u0041" * 100 + '"'  # 600 characters of JSON, 100 once decoded
    limits.parse_json(ok.encode(), max_nodes=10, max_depth=4, max_items=10, max_string=100)
    with pytest.raises(ApiError):
        limits.parse_json(('"' + "a" * 101 + '"').encode(), max_nodes=10, max_depth=4, max_items=10, max_string=100)


def test_default_budget_accepts_a_full_log(client, auth_header):
    lines = [[i, f"line {i} " + "x" * 50] for i in range(1, 20001)]
    b = minimal_bundle(log={"line_count": 20000, "truncated": False, "source": "t", "lines": lines})
    r = post_raw(client, json.dumps(b).encode(), auth_header)
    assert r.status_code == 201, r.json


# --- item 3: no infinity or NaN anywhere -----------------------------------------------------------

@pytest.mark.parametrize("raw", [b"1e400", b"-1e400", b"NaN", b"Infinity", b"-Infinity", b"1E999"])
def test_open_section_refuses_infinity(client, db, auth_header, raw):
    body = json.dumps(minimal_bundle(host={"os": "Linux", "extra": "@"})).encode().replace(b'"@"', raw)
    r = post_raw(client, body, auth_header)
    assert r.status_code in (400, 422), r.json
    assert stored(db) == 0


# --- small ones ------------------------------------------------------------------------------------

def test_json_error_message_says_at_once():
    with pytest.raises(ApiError) as e:
        limits.parse_json(b'{"a": "x\x01y"}')
    assert " at at " not in e.value.message and "at line 1" in e.value.message
    with pytest.raises(ApiError) as e:
        limits.parse_json(b'{"a": "xy')
    assert " at at " not in e.value.message


def test_trailing_bytes_after_gzip_are_refused(client, db, auth_header):
    body = gzip.compress(json.dumps(minimal_bundle()).encode())
    for tail in (b"junk", gzip.compress(b"{}")):
        r = post_raw(client, body + tail, {**auth_header, "Content-Encoding": "gzip"})
        assert r.status_code == 400 and r.json["error"]["code"] == "bad_encoding", r.json
    assert stored(db) == 0
    assert post_raw(client, body, {**auth_header, "Content-Encoding": "gzip"}).status_code == 201


@pytest.mark.parametrize("field", ["wsl", "truncated"])
@pytest.mark.parametrize("value", ["yes", "true", 1, "on"])
def test_booleans_are_strict(client, db, auth_header, field, value):
    b = minimal_bundle()
    if field == "wsl":
        b["host"]["wsl"] = value
    else:
        b["log"]["truncated"] = value
    r = post_raw(client, json.dumps(b).encode(), auth_header)
    assert r.status_code == 422, r.json
    assert stored(db) == 0


def test_431_has_its_own_code(app):
    from werkzeug.exceptions import RequestHeaderFieldsTooLarge

    with app.test_request_context("/api/v1/clusters"):
        resp = app.handle_user_exception(RequestHeaderFieldsTooLarge())
    assert resp.status_code == 431 and resp.json["error"]["code"] == "headers_too_large"
    from kvreport_server.errors import _CODES
    from kvreport_server.waitress_server import _error_task_class

    assert _CODES[431] == "headers_too_large" and _error_task_class(1)


def test_negative_model_size_is_not_shown_as_minus_zero(client, auth_header):
    b = minimal_bundle(model={"file_name": "m.gguf", "size_bytes": -5})
    r = post_raw(client, json.dumps(b).encode(), auth_header)
    if r.status_code == 201:
        page = client.get(f"/bundles/{b['id']}").get_data(as_text=True)
        assert "-0 MiB" not in page
    else:
        assert r.status_code == 422


# --- item 4: integers are ASCII digits only --------------------------------------------------------

@pytest.mark.parametrize("raw", ["%C2%B3", "%E2%91%A1", "%D9%A3", "1%C2%B3", "-1", "%EF%BC%91"])
def test_non_ascii_digits_in_paths_are_404(client, auth_header, raw):
    b = minimal_bundle()
    assert post_raw(client, json.dumps(b).encode(), auth_header).status_code == 201
    for path in (f"/api/v1/clusters/{raw}", f"/clusters/{raw}"):
        r = client.get(path)
        assert r.status_code == 404, (path, r.status_code)
    assert client.get("/api/v1/clusters/1").status_code == 200 and client.get("/clusters/1").status_code == 200


@pytest.mark.parametrize("raw", ["%C2%B3", "%D9%A3", "%E2%91%A1"])
def test_non_ascii_digits_in_queries_are_4xx(client, raw):
    assert client.get(f"/api/v1/clusters?page={raw}").status_code == 422
    assert client.get(f"/api/v1/clusters?per_page={raw}").status_code == 422
    assert client.get(f"/?page={raw}").status_code == 400


@pytest.mark.parametrize("n_ctx", ["²", "③", "٣٣", "１２"])
def test_non_ascii_digits_in_the_body_are_not_numbers(client, auth_header, n_ctx):
    b = minimal_bundle(command={"line": "llama-server -c x", "flags": {"-c": n_ctx, "n_ctx": n_ctx}})
    r = post_raw(client, json.dumps(b).encode(), auth_header)
    assert r.status_code == 201, r.json
    cid = r.json["cluster"]["id"]
    assert client.get(f"/api/v1/clusters/{cid}").status_code == 200
    assert client.get(f"/clusters/{cid}").status_code == 200
    assert client.get(f"/bundles/{b['id']}").status_code == 200


# --- web helpers -----------------------------------------------------------------------------------

def csrf_of(html: str) -> str:
    import re

    m = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', html) or \
        re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert m, "no CSRF token in the form"
    return m.group(1)


def make_user(db, name="maint", password="correct horse battery"):
    from kvreport_server import auth

    with db.Session() as s, s.begin():
        auth.create_user(s, name, password)
    return name, password


def sign_in(client, name, password, **kw):
    page = client.get("/login").get_data(as_text=True)
    return client.post("/login", data={"username": name, "password": password, "csrf_token": csrf_of(page)}, **kw)


# --- item 5: `next` is a same-site path or `/` -----------------------------------------------------

NEXT_TARGETS = ["/%09/evil.example", "/\t/evil.example", "/\n/evil.example", "/\r\nSet-Cookie: x=1",
                "//evil.example", "/%2F/evil.example", "/\\evil.example", "/%5Cevil.example",
                "https://evil.example", "javascript:alert(1)", "\x00/x", "/x\x00", " //evil.example",
                "%2F%2Fevil.example", "/\x0b/evil.example"]


@pytest.mark.parametrize("target", NEXT_TARGETS)
def test_next_is_only_a_same_site_path(client, db, target):
    name, pw = make_user(db)
    r = sign_in(client, name, pw, query_string={"next": target})
    assert r.status_code == 302, r.status_code
    assert r.headers["Location"] in ("/", "http://localhost/"), r.headers["Location"]


def test_next_keeps_a_real_path(client, db):
    name, pw = make_user(db)
    r = sign_in(client, name, pw, query_string={"next": "/clusters/1?x=1"})
    assert r.status_code == 302 and r.headers["Location"].endswith("/clusters/1?x=1")


# --- item 6: rate limits keyed by the verified token; failed authentication throttled ---------------

def test_made_up_tokens_do_not_escape_the_read_limit(make_app):
    app = make_app(RATE_LIMIT_READ="3/minute")
    client = app.test_client()
    codes = [client.get("/api/v1/clusters", headers={"Authorization": f"Bearer kvr_{i:08d}_x"}).status_code
             for i in range(6)]
    assert 429 in codes, codes
    assert client.get("/api/v1/clusters").status_code == 429  # the same address, anonymous


def test_a_known_prefix_cannot_spend_a_tokens_quota(make_app):
    from kvreport_server import auth

    app = make_app(RATE_LIMIT_UPLOAD="2/minute", RATE_LIMIT_AUTH_FAILURES="")
    with app.extensions["kvreport_db"].Session() as s, s.begin():
        token = auth.new_token(s, "victim", "upload")
    prefix = token.split("_")[1]
    attacker = app.test_client()
    for _ in range(5):
        r = post_raw(attacker, b"{}", {"Authorization": f"Bearer kvr_{prefix}_guessed"},
                     environ_base={"REMOTE_ADDR": "10.9.9.9"})
        assert r.status_code in (401, 429)
    r = post_raw(app.test_client(), json.dumps(minimal_bundle()).encode(), {"Authorization": f"Bearer {token}"})
    assert r.status_code == 201, r.json


def test_failed_authentication_is_throttled_per_address(make_app):
    from kvreport_server import auth

    app = make_app(RATE_LIMIT_AUTH_FAILURES="5/minute")
    with app.extensions["kvreport_db"].Session() as s, s.begin():
        token = auth.new_token(s, "good", "upload")
    client = app.test_client()
    codes = [client.get("/api/v1/clusters", headers={"Authorization": f"Bearer kvr_{i:08x}_guess"},
                        environ_base={"REMOTE_ADDR": "10.1.1.1"}).status_code for i in range(8)]
    assert codes[:5] == [401] * 5 and set(codes[5:]) == {429}, codes
    # even a right token is not checked from that address now; other addresses are not affected
    r = client.get("/api/v1/clusters", headers={"Authorization": f"Bearer {token}"},
                   environ_base={"REMOTE_ADDR": "10.1.1.1"})
    assert r.status_code == 429 and r.json["error"]["code"] == "rate_limited"
    r = client.get("/api/v1/clusters", headers={"Authorization": f"Bearer {token}"},
                   environ_base={"REMOTE_ADDR": "10.2.2.2"})
    assert r.status_code == 200


def test_failed_sign_ins_count_too(make_app):
    app = make_app(RATE_LIMIT_AUTH_FAILURES="3/minute", RATE_LIMIT_LOGIN="")
    db = app.extensions["kvreport_db"]
    name, pw = make_user(db)
    client = app.test_client()
    codes = [sign_in(client, name, "wrong").status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    assert sign_in(client, name, pw).status_code == 429


# --- item 7: sign-out ends the session server-side; idle expiry -----------------------------------

def _cookie(client) -> str:
    return client.get_cookie("session").value


def test_replayed_cookie_after_sign_out_is_dead(client, db, auth_header):
    cid = post_raw(client, json.dumps(minimal_bundle()).encode(), auth_header).json["cluster"]["id"]
    name, pw = make_user(db)
    assert sign_in(client, name, pw).status_code == 302
    stolen = _cookie(client)
    page = client.get(f"/clusters/{cid}").get_data(as_text=True)
    assert 'id="cluster-form"' in page
    csrf = csrf_of(page)  # the stolen cookie's own CSRF token
    assert client.post("/logout", data={"csrf_token": csrf}).status_code == 302
    client.set_cookie("session", stolen)
    page = client.get(f"/clusters/{cid}").get_data(as_text=True)
    assert 'id="cluster-form"' not in page
    r = client.post(f"/clusters/{cid}", data={"known_fix": "replayed", "issue_url": "", "status": "known_fix",
                                              "csrf_token": csrf})
    assert r.status_code == 403
    assert client.get(f"/api/v1/clusters/{cid}").json["known_fix"] is None


def test_idle_session_expires(make_app, monkeypatch):
    from kvreport_server import auth

    app = make_app(SESSION_IDLE_SECONDS=600)
    db = app.extensions["kvreport_db"]
    name, pw = make_user(db)
    client = app.test_client()
    assert sign_in(client, name, pw).status_code == 302
    assert _signed_in(client)
    now = time.time()
    monkeypatch.setattr(auth.time, "time", lambda: now + 599)
    assert _signed_in(client)
    monkeypatch.setattr(auth.time, "time", lambda: now + 599 + 601)
    assert not _signed_in(client)


def _signed_in(client) -> bool:
    from flask_login import current_user

    with client:
        client.get("/")
        return bool(current_user.is_authenticated)


# --- item 10: authentication before validation; private mode leaks nothing -------------------------

def test_patch_without_token_is_401_not_422(client, auth_header, make_token):
    cid = post_raw(client, json.dumps(minimal_bundle()).encode(), auth_header).json["cluster"]["id"]
    for body in (b"not json", b'{"bogus": 1}', b'{"status": "nope"}'):
        r = client.patch(f"/api/v1/clusters/{cid}", data=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 401, (body, r.json)
        r = client.patch(f"/api/v1/clusters/{cid}", data=body,
                         headers={"Content-Type": "application/json", **auth_header})  # upload scope: too weak
        assert r.status_code == 403, (body, r.json)
    assert client.delete("/api/v1/bundles/x").status_code == 401
    assert post_raw(client, b"not json", {}).status_code == 401


def test_private_mode_authenticates_before_validating(make_app):
    app = make_app(PRIVATE=True)
    client = app.test_client()
    for path in ("/api/v1/clusters?page=abc", "/api/v1/clusters?per_page=0&sort=x", "/api/v1/openapi.json",
                 "/api/v1/clusters/%C2%B3", "/api/v1/nothing-here"):
        r = client.get(path)
        assert r.status_code == 401 and r.json["error"]["code"] == "unauthorized", path
    r = client.get("/?page=abc")
    assert r.status_code == 302 and "/login" in r.headers["Location"]


def test_private_md_answers_401_as_json(make_app):
    app = make_app(PRIVATE=True)
    r = app.test_client().get("/bundles/01JDQZ0000000000000000000A.md")
    assert r.status_code == 401
    assert not r.mimetype.startswith("text/html") and "<html" not in r.get_data(as_text=True).lower()


def test_private_healthz_says_status_only(make_app):
    app = make_app(PRIVATE=True)
    r = app.test_client().get("/healthz")
    assert r.status_code == 200 and r.json == {"status": "ok"}
    assert app.test_client().get("/login").status_code == 200


# --- item 11: the OpenAPI document states the limits ------------------------------------------------

def test_openapi_states_the_limits(client):
    spec = client.get("/api/v1/openapi.json").json
    params = {p["name"]: p["schema"] for p in spec["paths"]["/api/v1/clusters"]["get"]["parameters"]}
    assert params["q"]["pattern"] == "^[^\\u0000]*$" and params["q"]["maxLength"] == 200
    assert params["page"]["minimum"] == 1 and params["page"]["maximum"] == 100000
    patch = spec["components"]["schemas"]["ClusterPatch"]["properties"]
    assert patch["issue_url"]["pattern"].startswith("^(https?://")
    schemas = spec["components"]["schemas"]
    assert schemas["Engine"]["properties"]["build_number"]["maximum"] == 2**63 - 1
    assert "anyOf" not in schemas["Bundle"]["properties"]["log"]  # not "any object"
    post = spec["paths"]["/api/v1/bundles"]["post"]["responses"]
    assert "413" in post and "415" in post and "422" in post


def test_big_integers_in_open_sections_are_numbers_not_errors(client, auth_header):
    body = json.dumps(minimal_bundle(host={"os": "Linux", "big": "@"})).encode().replace(b'"@"', b"1" * 40)
    r = post_raw(client, body, auth_header)
    assert r.status_code == 201, r.json
    b = minimal_bundle(engine={"name": "llama.cpp", "build_number": "@"})
    r = post_raw(client, json.dumps(b).encode().replace(b'"@"', b"1" * 40), auth_header)
    assert r.status_code == 422 and r.json["error"]["field"] == "engine.build_number"
