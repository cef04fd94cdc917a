"""GET /api/v1/known-issues publishes the maintainers' known fixes in the client's catalog format (both databases),
respects private mode, is in the OpenAPI document; and end to end: `kvreport known --update` against a live
`kvreport serve` stores them and a later `kvreport analyze` matches them offline."""

from __future__ import annotations

import json

import requests
from server_helpers import bundle_from_case
from test_e2e_serve import make_bundle_file, run, server  # noqa: F401 - the live-server fixture

from kvreport.known import SCHEMA, validate_catalog
from tests.paths import CASE_DIR

CASE = "pub-105-llamacpp-rocm-rx9060xt-kv-2gib"  # no shipped entry matches it: a match proves the server's


def _upload(client, bundle, header):
    r = client.post("/api/v1/bundles", data=json.dumps(bundle), headers={"Content-Type": "application/json", **header})
    assert r.status_code == 201, r.json
    return r.json["cluster"]


def test_known_issues_lists_clusters_with_a_known_fix(client, auth_header, make_token):
    write = {"Authorization": f"Bearer {make_token('write')}"}
    fixed = _upload(client, bundle_from_case(CASE), auth_header)
    other = _upload(client, bundle_from_case("loc-21-fail-ulimit-kv-600000"), auth_header)
    assert fixed["id"] != other["id"]
    empty = client.get("/api/v1/known-issues")
    assert empty.status_code == 200 and empty.json["entries"] == []
    change = {"known_fix": "Lower **-ngl** to 20 on RX 9060 XT", "issue_url": "https://github.com/ggml-org/llama.cpp/issues/1"}
    assert client.patch(f"/api/v1/clusters/{fixed['id']}", json=change, headers=write).status_code == 200
    r = client.get("/api/v1/known-issues")
    assert r.status_code == 200
    doc = r.json
    assert doc["schema"] == SCHEMA
    entries = validate_catalog(doc, curated=False)
    assert len(entries) == 1
    e = entries[0]
    assert e["id"] == f"cluster-{fixed['id']}"
    assert e["match"] == {"signature": fixed["key"]} and fixed["key"] == "llama.cpp/kv_cache/rocm"
    assert e["workaround"] == change["known_fix"] and e["url"] == change["issue_url"]
    assert e["cluster_url"].endswith(f"/clusters/{fixed['id']}") and e["status"] == "known_fix"
    # an issue link alone is published too (the maintainers' pointer, no workaround yet)
    assert client.patch(f"/api/v1/clusters/{other['id']}", json={"issue_url": "https://example.org/t/9"},
                        headers=write).status_code == 200
    ids = {x["id"]: x for x in client.get("/api/v1/known-issues").json["entries"]}
    assert ids[f"cluster-{other['id']}"]["workaround"] is None and len(ids) == 2


def test_known_issues_in_openapi_and_private_mode(make_app, make_token):
    app = make_app(PRIVATE=True)
    client = app.test_client()
    spec = client.get("/api/v1/openapi.json", headers={"Authorization": f"Bearer {make_token('upload')}"}).json
    assert "get" in spec["paths"]["/api/v1/known-issues"]
    assert "KnownCatalog" in spec["components"]["schemas"]
    r = client.get("/api/v1/known-issues")
    assert r.status_code == 401 and r.json["error"]["code"] == "unauthorized"
    r = client.get("/api/v1/known-issues", headers={"Authorization": f"Bearer {make_token('upload')}"})
    assert r.status_code == 200 and r.json["entries"] == []


def test_known_update_against_a_live_server_then_analyze_offline(server, tmp_path):  # noqa: F811
    base, env = server
    env = {**env, "KVREPORT_DATA_DIR": str(tmp_path / "data"), "KVREPORT_CONFIG_DIR": str(tmp_path / "cfg")}
    r = run(["admin", "create-token", "maint", "--scope", "write", "--database-url", env["KVREPORT_DATABASE_URL"]],
            env)
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    path = make_bundle_file(CASE, tmp_path, env)
    up = run(["upload", str(path), "--server", base, "--token", token, "--json"], env)
    assert up.returncode == 0, up.stderr
    cluster = json.loads(up.stdout)["cluster"]
    fix = "Lower -ngl until the KV cache fits; this card's driver refuses 2 GiB at once."
    r = requests.patch(f"{base}/api/v1/clusters/{cluster['id']}", json={"known_fix": fix},
                       headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert r.status_code == 200, r.text

    log = str(CASE_DIR / CASE / "log.txt")
    before = run(["analyze", log], env)
    assert "known: " not in before.stdout  # nothing shipped matches this case

    upd = run(["known", "--update", "--server", base], env)
    assert upd.returncode == 0, upd.stderr
    assert f"fetched 1 known fix from {base}" in upd.stderr
    stored = json.loads((tmp_path / "data" / "known_issues.json").read_text())
    assert stored["server"] == base and [e["id"] for e in stored["entries"]] == [f"cluster-{cluster['id']}"]

    # offline: the server's address now points nowhere, and the match still comes from the stored catalog
    after = run(["analyze", log], {**env, "KVREPORT_SERVER": "http://127.0.0.1:9"})
    assert after.returncode == 0, after.stderr
    line = next(x for x in after.stdout.splitlines() if x.startswith("known: "))
    assert f"{base}/clusters/{cluster['id']}" in line and "workaround: Lower -ngl until the KV cache fits" in line
    assert f"[from {base}]" in line
    listed = run(["known", "--json"], env)
    assert f"cluster-{cluster['id']}" in [e["id"] for e in json.loads(listed.stdout)]

    bad = run(["known", "--update", "--server", base, "--token", "kvr_00000000_nope"], env)
    assert bad.returncode == 2 and "HTTP 401" in bad.stderr and bad.stderr.count("\n") == 1
