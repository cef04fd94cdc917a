"""API routes on both databases: upload, idempotency, read, list, patch, delete, health."""

from __future__ import annotations

import gzip
import json

from server_helpers import bundle_from_case, minimal_bundle


def post(client, bundle, headers, gz=False, **kw):
    body = json.dumps(bundle).encode()
    h = {"Content-Type": "application/json", **headers}
    if gz:
        body = gzip.compress(body)
        h["Content-Encoding"] = "gzip"
    return client.post("/api/v1/bundles", data=body, headers=h, **kw)


def test_healthz(client):
    r = client.get("/healthz")
    assert r.status_code == 200
    assert r.json["status"] == "ok"


def test_upload_then_idempotent_then_conflict(client, auth_header):
    bundle = bundle_from_case("loc-17-fail-huge-ctx-verbose")
    r = post(client, bundle, auth_header, gz=True)
    assert r.status_code == 201, r.json
    body = r.json
    assert body["id"] == bundle["id"]
    assert body["url"].endswith(f"/bundles/{bundle['id']}")
    assert set(body["cluster"]) >= {"id", "key", "title", "count", "known_fix", "issue_url"}
    assert body["cluster"]["count"] == 1
    assert "signature" in body["diagnosis"]
    # same content again: 200, nothing counted twice
    r2 = post(client, bundle, auth_header)
    assert r2.status_code == 200
    assert r2.json["cluster"]["count"] == 1
    # different content, same id: 409
    changed = dict(bundle, created_at="2020-01-01T00:00:00Z")
    r3 = post(client, changed, auth_header)
    assert r3.status_code == 409
    assert r3.json["error"]["code"] == "conflict"


def test_client_diagnosis_is_never_trusted(client, auth_header):
    bundle = minimal_bundle()
    bundle["diagnosis"] = {"signature": {"key": "evil/evil"}}
    r = post(client, bundle, auth_header)
    assert r.status_code == 422
    assert r.json["error"]["field"] == "diagnosis"


def test_get_bundle_and_views(client, auth_header):
    bundle = bundle_from_case("loc-21-fail-ulimit-kv-600000")
    assert post(client, bundle, auth_header).status_code == 201
    r = client.get(f"/api/v1/bundles/{bundle['id']}")
    assert r.status_code == 200
    assert r.json["bundle"]["id"] == bundle["id"]
    assert r.json["diagnosis"]["signature"]["key"] == r.json["cluster"]["key"]
    assert client.get(f"/bundles/{bundle['id']}").status_code == 200
    j = client.get(f"/bundles/{bundle['id']}.json")
    assert j.status_code == 200 and j.json["bundle"]["id"] == bundle["id"]
    md = client.get(f"/bundles/{bundle['id']}.md")
    assert md.status_code == 200 and md.mimetype == "text/markdown"
    assert client.get("/api/v1/bundles/01ARZ3NDEKTSV4RRFFQ69G5FAV").status_code == 404
    assert client.get("/bundles/nope").status_code == 404
    assert client.get("/api/v1/bundles/nope").json["error"]["code"] == "not_found"


def test_cluster_list_and_detail(client, auth_header):
    ids = []
    for name in ("loc-15-fail-huge-ctx-fit-default", "loc-17-fail-huge-ctx-verbose", "loc-21-fail-ulimit-kv-600000"):
        r = post(client, bundle_from_case(name), auth_header)
        assert r.status_code == 201
        ids.append(r.json["cluster"]["id"])
    r = client.get("/api/v1/clusters")
    assert r.status_code == 200
    assert set(r.json) == {"items", "page", "per_page", "total"}
    assert sum(c["count"] for c in r.json["items"]) == 3
    for c in r.json["items"]:
        assert {"id", "key", "title", "count", "first_seen", "last_seen", "status", "known_fix", "issue_url"} <= set(c)
        assert len(c["sparkline"]) == 30 and sum(c["sparkline"]) == c["count"]
    d = client.get(f"/api/v1/clusters/{ids[0]}")
    assert d.status_code == 200
    assert d.json["count"] == len(d.json["bundles"])
    assert "facets" in d.json and "regression" in d.json
    assert client.get("/api/v1/clusters/999999").status_code == 404
    assert client.get("/api/v1/clusters/abc").status_code == 404
    assert client.get("/api/v1/clusters?per_page=1").json["per_page"] == 1
    assert client.get("/api/v1/clusters?per_page=0").status_code == 422
    assert client.get("/api/v1/clusters?sort=bogus").json["error"]["field"] == "sort"


def test_patch_cluster_needs_write_scope(client, auth_header, make_token):
    r = post(client, bundle_from_case("loc-17-fail-huge-ctx-verbose"), auth_header)
    cid = r.json["cluster"]["id"]
    change = {"known_fix": "Use `-c 8192`.", "issue_url": "https://github.com/ggml-org/llama.cpp/issues/1"}
    assert client.patch(f"/api/v1/clusters/{cid}", json=change).status_code == 401
    assert client.patch(f"/api/v1/clusters/{cid}", json=change, headers=auth_header).status_code == 403
    write = {"Authorization": f"Bearer {make_token('write')}"}
    r = client.patch(f"/api/v1/clusters/{cid}", json=change, headers=write)
    assert r.status_code == 200, r.json
    assert r.json["known_fix"] == change["known_fix"] and r.json["status"] == "known_fix"
    bad = client.patch(f"/api/v1/clusters/{cid}", json={"issue_url": "javascript:alert(1)"}, headers=write)
    assert bad.status_code == 422 and bad.json["error"]["field"] == "issue_url"
    assert client.patch(f"/api/v1/clusters/{cid}", json={"status": "weird"}, headers=write).status_code == 422
    assert client.patch("/api/v1/clusters/424242", json={"status": "ignored"}, headers=write).status_code == 404
    # the next upload of that signature gets the known fix back
    again = post(client, bundle_from_case("loc-17-fail-huge-ctx-verbose"), auth_header)
    assert again.json["cluster"]["known_fix"] == change["known_fix"]
    assert again.json["cluster"]["issue_url"] == change["issue_url"]


def test_delete_needs_admin_and_counters_follow(client, auth_header, make_token):
    b1 = bundle_from_case("loc-17-fail-huge-ctx-verbose")
    b2 = bundle_from_case("loc-17-fail-huge-ctx-verbose")
    cid = post(client, b1, auth_header).json["cluster"]["id"]
    assert post(client, b2, auth_header).json["cluster"]["count"] == 2
    assert client.delete(f"/api/v1/bundles/{b1['id']}", headers=auth_header).status_code == 403
    admin = {"Authorization": f"Bearer {make_token('admin')}"}
    r = client.delete(f"/api/v1/bundles/{b1['id']}", headers=admin)
    assert r.status_code == 200 and r.json == {"id": b1["id"], "deleted": True}
    assert client.get(f"/api/v1/clusters/{cid}").json["count"] == 1
    assert client.delete(f"/api/v1/bundles/{b1['id']}", headers=admin).status_code == 404
    assert client.get(f"/api/v1/bundles/{b1['id']}").status_code == 404


def test_openapi_document(client):
    r = client.get("/api/v1/openapi.json")
    assert r.status_code == 200
    paths = r.json["paths"]
    assert {"/api/v1/bundles", "/api/v1/bundles/{bundle_id}", "/api/v1/clusters", "/api/v1/clusters/{cluster_id}"} <= set(paths)


def test_cluster_list_never_reads_bundles(client, db, auth_header):
    from sqlalchemy import event

    for case in ("loc-17-fail-huge-ctx-verbose", "loc-21-fail-ulimit-kv-600000"):
        assert post(client, bundle_from_case(case), auth_header).status_code == 201
    seen: list[str] = []

    def record(conn, cursor, statement, *args):
        seen.append(statement.lower())

    event.listen(db.engine, "before_cursor_execute", record)
    try:
        for path in ("/api/v1/clusters", "/api/v1/clusters?sort=trend&q=cpu", "/?sort=last_seen"):
            assert client.get(path).status_code == 200
    finally:
        event.remove(db.engine, "before_cursor_execute", record)
    assert seen and not [s for s in seen if "from bundles" in s or "join bundles" in s]
