"""Bad input at every door: JSON 4xx naming the problem, nothing half-written."""

from __future__ import annotations

import gzip
import json

import pytest
from server_helpers import minimal_bundle
from sqlalchemy import func, select

from kvreport_server.models import Bundle, Cluster


def post_raw(client, body: bytes, headers: dict):
    return client.post("/api/v1/bundles", data=body, headers={"Content-Type": "application/json", **headers})


def counts(db):
    with db.Session() as s:
        return (s.execute(select(func.count()).select_from(Bundle)).scalar_one(),
                s.execute(select(func.count()).select_from(Cluster)).scalar_one())


@pytest.mark.parametrize("header", [None, "Bearer nope", "Bearer kvr_00000000_wrong", "Basic abc", "Bearer "])
def test_upload_without_valid_token_is_401(client, db, header):
    headers = {"Authorization": header} if header else {}
    r = post_raw(client, json.dumps(minimal_bundle()).encode(), headers)
    assert r.status_code == 401
    assert r.json["error"]["code"] == "unauthorized"
    assert "WWW-Authenticate" in r.headers
    assert counts(db) == (0, 0)


def test_revoked_token_is_401(client, db, make_token):
    from kvreport_server import auth

    token = make_token("upload", name="gone")
    with db.Session() as s, s.begin():
        assert auth.revoke_tokens(s, "gone") == 1
    r = post_raw(client, json.dumps(minimal_bundle()).encode(), {"Authorization": f"Bearer {token}"})
    assert r.status_code == 401


def test_tokens_are_stored_hashed(db, upload_token):
    from kvreport_server.models import ApiToken

    with db.Session() as s:
        row = s.execute(select(ApiToken)).scalar_one()
    assert upload_token not in (row.digest, row.prefix) and len(row.digest) == 64


CASES = [
    (b"not json", 400, "not_json", None),
    (b"[1, 2]", 422, "invalid", None),
    (json.dumps({k: v for k, v in minimal_bundle().items() if k != "id"}).encode(), 422, "invalid", "id"),
    (json.dumps(minimal_bundle(schema="kvreport/bundle@9")).encode(), 422, "unsupported_schema", "schema"),
    (json.dumps(minimal_bundle(id="not-a-ulid")).encode(), 422, "invalid", "id"),
    (json.dumps(minimal_bundle(devices="x")).encode(), 422, "invalid", "devices"),
    (json.dumps(minimal_bundle(extra=1)).encode(), 422, "invalid", "extra"),
    (b'{"schema": "kvreport/bundle@1", "host": {"ram_total_mib": NaN}}', 422, "invalid", None),
    (b'{"a": ' + b"1" * 40 + b"}", 422, "invalid", None),
    (b"[" * 5000 + b"]" * 5000, 413, "too_deep", None),
]


@pytest.mark.parametrize("body,status,code,field", CASES)
def test_bad_bodies(client, db, auth_header, body, status, code, field):
    r = post_raw(client, body, auth_header)
    assert r.status_code == status, r.json
    assert r.json["error"]["code"] == code
    if field:
        assert r.json["error"]["field"] == field
    assert counts(db) == (0, 0)


def test_unknown_schema_lists_accepted_versions(client, auth_header):
    r = post_raw(client, json.dumps(minimal_bundle(schema="kvreport/bundle@2")).encode(), auth_header)
    assert r.json["error"]["accepted"] == ["kvreport/bundle@1"]


def test_too_large_and_gzip_bomb(make_app, auth_header, upload_token):
    app = make_app(MAX_BODY_BYTES=10_000, MAX_JSON_BYTES=50_000)
    client = app.test_client()
    with app.extensions["kvreport_db"].Session() as s, s.begin():
        from kvreport_server import auth

        token = auth.new_token(s, "small", "upload")
    h = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    big = json.dumps(minimal_bundle(host={"os": "x" * 20_000})).encode()
    r = client.post("/api/v1/bundles", data=big, headers=h)
    assert r.status_code == 413 and r.json["error"]["limit"] == 10_000
    bomb = gzip.compress(b"{" + b" " * 5_000_000 + b"}")
    assert len(bomb) < 10_000
    r = client.post("/api/v1/bundles", data=bomb, headers={**h, "Content-Encoding": "gzip"})
    assert r.status_code == 413 and r.json["error"]["limit"] == 50_000
    r = client.post("/api/v1/bundles", data=b"\x1f\x8bnot gzip", headers={**h, "Content-Encoding": "gzip"})
    assert r.status_code == 400 and r.json["error"]["code"] == "bad_encoding"
    r = client.post("/api/v1/bundles", data=b"{}", headers={**h, "Content-Encoding": "br"})
    assert r.status_code == 415


def test_wrong_content_type(client, auth_header):
    r = client.post("/api/v1/bundles", data=b"a=b", headers={**auth_header,
                                                              "Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415


def test_nul_bytes_and_invalid_utf8_are_stored_safely(client, db, auth_header):
    bundle = minimal_bundle()
    bundle["log"]["lines"].append([3, "bad\x00byte and \ud800 lone surrogate"])
    bundle["log"]["line_count"] = 3
    body = json.dumps(bundle).encode()
    r = post_raw(client, body, auth_header)
    assert r.status_code == 201, r.json
    stored = client.get(f"/api/v1/bundles/{bundle['id']}").json["bundle"]["log"]["lines"][-1][1]
    assert "\x00" not in stored and "\ufffd" in stored
    b2 = minimal_bundle()
    raw = json.dumps(b2).encode().replace(b"failed to allocate", b"failed \xff\xfe to allocate")
    r = post_raw(client, raw, auth_header)
    assert r.status_code == 201, r.json
    assert client.get(f"/bundles/{b2['id']}").status_code == 200


def test_method_not_allowed_is_json(client):
    r = client.put("/api/v1/bundles")
    assert r.status_code == 405 and r.json["error"]["code"] == "method_not_allowed"
