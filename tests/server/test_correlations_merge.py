"""Issue 14, items 3, 5 and 6 on the real server (SQLite and PostgreSQL), with bundles made from the
real shared cases: correlations from counters (a planted over-represented driver comes first),
merge and unmerge (counters move and come back; a merged signature's new uploads land in the
survivor), the .json twins and facet links, and the demo in its own database."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest
import requests
from server_helpers import FAILURE_CASES, assert_consistent, bundle_from_case
from sqlalchemy import select

from kvreport_server import store
from kvreport_server.models import FacetTotal

CASE_A = "loc-23-fail-ulimit-compute-after-kv-800000"
CASE_B = "loc-17-fail-huge-ctx-verbose"
OTHERS = ["loc-17-fail-huge-ctx-verbose", "loc-41-neg-ulimit-weights-buffer-no-mmap-150000",
          "pub-016-llamacpppython-cuda-5gpu-compute-buffer-small-gpu",
          "pub-043-ollama-vulkan-rx6750xt-compute-buffer-exceeds-buffer-limit",
          "pub-040-vllm-a6000-other-processes-free-31of47",
          "pub-054-llamacpp-vulkan-strix-halo-70k-ctx-compute-over-4gb", "loc-29-fail-np256-no-kv-unified-c4096"]
PLANTED = "999.12"
COMMON = "550.54.15"


def gpu_bundle(case: str, driver: str, machine: int) -> dict:
    """A bundle of a real case from a machine with one probed NVIDIA GPU and driver ``driver``."""
    b = bundle_from_case(case)
    b["host"] = {"os": "Linux", "os_release": "Ubuntu 24.04", "cpu_model": f"test cpu {machine}",
                 "ram_total_mib": 64000.0}
    b["devices"] = [{"backend": "cuda", "index": 0, "name": "NVIDIA GeForce RTX 4090", "total_mib": 24564.0,
                     "free_mib": 23000.0, "driver_version": driver, "source": "probe"}]
    return b


def post(client, headers, bundle) -> dict:
    r = client.post("/api/v1/bundles", data=json.dumps(bundle), headers={**headers, "Content-Type": "application/json"})
    assert r.status_code in (200, 201), r.json
    return r.json


def totals(db) -> dict:
    with db.Session() as s:
        return {(t.kind, t.value): t.count for t in s.execute(select(FacetTotal)).scalars()}


def test_planted_driver_is_the_first_correlation(client, db, auth_header):
    """Case A's cluster: 5 of 6 bundles on a driver no other bundle has; 14 other bundles of other
    cases on the common driver. The planted driver is the first item, with its shares and counts;
    a cluster under the minimum support shows none; deleting bundles keeps the totals right."""
    machine = 0
    cluster_a = None
    for i in range(6):
        machine += 1
        cluster_a = post(client, auth_header, gpu_bundle(CASE_A, PLANTED if i < 5 else COMMON, machine))["cluster"]["id"]
    others = []
    for case in OTHERS * 2:
        machine += 1
        others.append(post(client, auth_header, gpu_bundle(case, COMMON, machine)))
        assert others[-1]["cluster"]["id"] != cluster_a, case
    assert_consistent(db)
    assert totals(db)[("driver", f"cuda {PLANTED}")] == 5
    assert totals(db)[("driver", f"cuda {COMMON}")] == 15

    detail = client.get(f"/api/v1/clusters/{cluster_a}").json
    cor = detail["correlations"]
    assert cor["total_bundles"] == 20 and cor["cluster_bundles"] == 6 and cor["min_support"] == 3
    first = cor["items"][0]
    assert (first["kind"], first["value"]) == ("driver", f"cuda {PLANTED}"), cor["items"]
    assert first["cluster_count"] == 5 and first["overall_count"] == 5
    assert first["cluster_share"] == pytest.approx(5 / 6, abs=1e-3)
    assert first["overall_share"] == pytest.approx(5 / 20, abs=1e-3)
    assert first["rest_share"] == 0 and first["ratio"] is None
    assert first["url"].endswith("/?facet=driver%3Acuda+" + PLANTED)
    # the GPU model and OS are everywhere: not over-represented
    assert not [i for i in cor["items"] if i["kind"] in ("gpu", "os")]

    html = client.get(f"/clusters/{cluster_a}").get_data(as_text=True)
    rows = re.findall(r'<tr data-kind="([a-z_]+)">', html)
    assert rows and rows[0] == "driver"
    assert f"cuda {PLANTED}" in html and "83%" in html and "25%" in html
    # the value links to the clusters list filtered on it: only cluster A
    listing = client.get(first["url"].replace("http://localhost", "") + "&per_page=50")
    ids = re.findall(r'data-cluster-id="(\d+)"', listing.get_data(as_text=True))
    assert ids == [str(cluster_a)]

    # a small cluster: under the minimum support, nothing is claimed
    small = post(client, auth_header, gpu_bundle("pub-012-llamacpp-rocm-2x7900xtx-weights-on-gpu0-only", PLANTED, 99))
    small_cor = client.get(f"/api/v1/clusters/{small['cluster']['id']}").json["correlations"]
    assert small_cor["items"] == [] and small_cor["cluster_bundles"] < 3
    assert "Too few bundles" in client.get(f"/clusters/{small['cluster']['id']}").get_data(as_text=True)

    # deleting and re-analysing keep the totals equal to a scan
    for o in others[::3]:
        assert store.delete_bundle(db, o["id"])
    assert_consistent(db)
    stats = store.reanalyze(db)
    assert stats["remaining"] == 0
    assert_consistent(db)


def test_merge_moves_counters_and_unmerge_restores_them(client, db, auth_header, make_token):
    for i in range(3):
        a = post(client, auth_header, gpu_bundle(CASE_A, PLANTED, i))
    for i in range(2):
        b = post(client, auth_header, gpu_bundle(CASE_B, COMMON, 10 + i))
    ca, cb = a["cluster"]["id"], b["cluster"]["id"]
    assert ca != cb
    keep = ("count", "machines", "facets", "sparkline", "first_seen", "last_seen", "min_build", "max_build",
            "regression")
    before = {cid: {k: client.get(f"/api/v1/clusters/{cid}").json[k] for k in keep} for cid in (ca, cb)}
    totals_before = totals(db)

    write = {"Authorization": f"Bearer {make_token('write')}", "Content-Type": "application/json"}
    body = json.dumps({"into": cb})
    assert client.post(f"/api/v1/clusters/{ca}/merge", data=body,
                       headers={"Content-Type": "application/json"}).status_code == 401
    assert client.post(f"/api/v1/clusters/{ca}/merge", data=body,
                       headers={**auth_header, "Content-Type": "application/json"}).status_code == 403
    for bad, code in (({"into": ca}, 409), ({"into": 999999}, 404), ({"into": "x"}, 422), ({}, 422),
                      ({"into": cb, "extra": 1}, 422)):
        r = client.post(f"/api/v1/clusters/{ca}/merge", data=json.dumps(bad), headers=write)
        assert r.status_code == code, (bad, r.json)
        assert r.json["error"]["message"]
    r = client.post(f"/api/v1/clusters/{ca}/merge", data=body, headers=write)
    assert r.status_code == 200, r.json
    assert r.json["moved"] == 3 and r.json["into"] == cb
    merged = r.json["cluster"]
    assert merged["count"] == 5 and merged["machines"] == 5
    assert [m["id"] for m in merged["merged_from"]] == [ca]
    assert dict((f["value"], f["count"]) for f in merged["facets"]["gpu"]) == {"NVIDIA GeForce RTX 4090": 5}
    gone = client.get(f"/api/v1/clusters/{ca}").json
    assert gone["count"] == 0 and gone["merged_into"] == cb and gone["facets"]["gpu"] == []
    assert totals(db) == totals_before  # the same bundles, in another cluster
    assert_consistent(db)
    # merged clusters leave the list; merging it again or unmerging the survivor is refused
    assert [c["id"] for c in client.get("/api/v1/clusters").json["items"]] == [cb]
    assert client.post(f"/api/v1/clusters/{ca}/merge", data=body, headers=write).status_code == 409
    assert client.post(f"/api/v1/clusters/{cb}/unmerge", headers=write).status_code == 409
    html = client.get(f"/clusters/{ca}").get_data(as_text=True)
    assert 'id="merged-into"' in html and f"/clusters/{cb}" in html

    # unmerge: both clusters as they were, bundle for bundle
    r = client.post(f"/api/v1/clusters/{ca}/unmerge", headers=write)
    assert r.status_code == 200 and r.json["moved"] == 3 and r.json["from"] == cb
    after = {cid: {k: client.get(f"/api/v1/clusters/{cid}").json[k] for k in keep} for cid in (ca, cb)}
    assert after == before
    assert totals(db) == totals_before
    assert_consistent(db)

    # merged again, a new upload of A's signature lands in the survivor; the unmerge takes it home
    assert client.post(f"/api/v1/clusters/{ca}/merge", data=body, headers=write).status_code == 200
    late = post(client, auth_header, gpu_bundle(CASE_A, PLANTED, 50))
    assert late["cluster"]["id"] == cb and late["cluster"]["count"] == 6
    assert_consistent(db)
    r = client.post(f"/api/v1/clusters/{ca}/unmerge", headers=write)
    assert r.json["moved"] == 4
    assert client.get(f"/api/v1/clusters/{ca}").json["count"] == 4
    assert client.get(f"/api/v1/clusters/{cb}").json["count"] == 2
    assert_consistent(db)
    # deleting a bundle after all this still leaves counters equal to a scan
    assert store.delete_bundle(db, late["id"])
    assert_consistent(db)


def test_maintainer_merges_with_the_form(client, db, auth_header):
    from test_web import csrf_of, login, make_user

    ca = post(client, auth_header, gpu_bundle(CASE_A, PLANTED, 1))["cluster"]["id"]
    cb = post(client, auth_header, gpu_bundle(CASE_B, COMMON, 2))["cluster"]["id"]
    assert client.post(f"/clusters/{ca}/merge", data={"into": cb}).status_code in (400, 403)
    assert 'id="merge-form"' not in client.get(f"/clusters/{ca}").get_data(as_text=True)
    name, pw = make_user(db)
    assert login(client, name, pw).status_code == 302
    page = client.get(f"/clusters/{ca}").get_data(as_text=True)
    assert 'id="merge-form"' in page
    assert client.post(f"/clusters/{ca}/merge", data={"into": cb}).status_code == 400  # no CSRF token
    r = client.post(f"/clusters/{ca}/merge", data={"into": cb, "csrf_token": csrf_of(page)})
    assert r.status_code == 302 and r.headers["Location"].endswith(f"/clusters/{cb}")
    assert client.get(f"/api/v1/clusters/{cb}").json["count"] == 2
    page = client.get(f"/clusters/{ca}").get_data(as_text=True)
    assert 'id="unmerge-form"' in page
    r = client.post(f"/clusters/{ca}/unmerge", data={"csrf_token": csrf_of(page)})
    assert r.status_code == 302
    assert client.get(f"/api/v1/clusters/{ca}").json["count"] == 1
    # a bad target is a message on the page, not an error page
    page = client.get(f"/clusters/{ca}").get_data(as_text=True)
    r = client.post(f"/clusters/{ca}/merge", data={"into": 424242, "csrf_token": csrf_of(page)}, follow_redirects=True)
    assert r.status_code == 200 and "Not merged: no cluster 424242" in r.get_data(as_text=True)
    assert_consistent(db)


def test_json_twins_and_facet_links(client, auth_header):
    for case in FAILURE_CASES[:4]:
        post(client, auth_header, gpu_bundle(case, COMMON, 1))
    api = client.get("/api/v1/clusters?sort=count").json
    twin = client.get("/.json?sort=count")
    assert twin.status_code == 200 and twin.mimetype == "application/json"
    assert twin.json == api
    filtered = client.get("/.json?backend=cpu").json
    assert filtered == client.get("/api/v1/clusters?backend=cpu").json
    assert client.get("/.json?sort=nope").status_code == 400
    cid = api["items"][0]["id"]
    detail = client.get(f"/clusters/{cid}.json")
    assert detail.status_code == 200 and detail.json == client.get(f"/api/v1/clusters/{cid}").json
    for bad in (f"/clusters/{cid}.xml", f"/clusters/{cid}.json.x", "/clusters/99999.json"):
        assert client.get(bad).status_code == 404
    html = client.get(f"/clusters/{cid}").get_data(as_text=True)
    assert f'href="/clusters/{cid}.json"' in html
    gpu_link = re.search(r'href="(/\?gpu=[^"]+)"', html).group(1)
    assert "NVIDIA" in gpu_link
    assert client.get(gpu_link.replace("&amp;", "&")).status_code == 200
    # the list page: GPU and backend values are filter links, the page has its JSON twin
    index = client.get("/").get_data(as_text=True)
    assert 'href="/?backend=' in index and 'href="/?gpu=NVIDIA' in index and 'href="/.json' in index


def test_plain_words_on_the_pages(client, auth_header):
    b = post(client, auth_header, bundle_from_case(CASE_B))
    html = client.get(f"/bundles/{b['id']}").get_data(as_text=True)
    assert 'title="exceeds_free">request exceeded free memory' in html
    assert 'title="max_ctx_fit"' in html and "47,872 tokens with f16 KV cache" in html
    assert "47872<" not in html and ">?<" not in html
    assert re.search(r"<title>[^<]*(KV|context)[^<]*</title>", html), re.search(r"<title>.*</title>", html).group(0)
    assert re.search(r'aria-current="page">Bundle</span></p>', html)
    # the log does not open with a wall of per-layer lines: the run is folded under its shape
    assert re.search(r"\d+ more similar lines: [^<]*llama_kv_cache: layer N: dev = CPU", html)
    opened = re.findall(r'<span class="line[^"]*" data-line="\d+"><span class="ln">\d+</span>([^<]*)</span>', html)
    layer_lines = [t for t in opened[:40] if re.match(r"llama_kv_cache: layer +\d+: dev = CPU", t)]
    assert len(layer_lines) <= 1, layer_lines
    cluster = client.get(f"/clusters/{b['cluster']['id']}").get_data(as_text=True)
    assert "1 bundles" not in cluster and "1 machines" not in cluster and "None of the 1 " not in cluster
    assert 'aria-current="page">Cluster' in cluster


def test_demo_removal_keeps_real_bundles(db, client, auth_header):
    from kvreport_server.cli_entry import load_demo

    real = post(client, auth_header, bundle_from_case(CASE_B))
    summary = load_demo(db)
    assert "16 example bundle(s)" in summary and "demo history" in summary
    assert load_demo(db).startswith("0 example bundle(s) and 0 demo history")  # idempotent
    items = client.get("/api/v1/clusters?per_page=100").json["items"]
    statuses = {c["status"] for c in items}
    assert {"new", "known_fix", "linked_issue"} <= statuses
    assert any(c["issue_url"] and c["issue_url"].startswith("https://github.com/") for c in items)
    assert any(c["min_build"] for c in items)
    assert any(c["machines"] > 1 for c in items)
    windows = [c for c in items if any(i["value"] == "Windows" for i in
                                       client.get(f"/api/v1/clusters/{c['id']}").json["correlations"]["items"])]
    assert windows, "the demo shows one correlation (the OS of the Ollama Vulkan report)"
    seen = {c["first_seen"][:10] for c in items} | {c["last_seen"][:10] for c in items}
    assert len(seen) > 3
    assert_consistent(db)
    stats = store.remove_demo(db)
    assert stats["bundles"] >= 40
    assert_consistent(db)
    left = client.get("/api/v1/clusters?per_page=100").json["items"]
    assert [(c["id"], c["count"]) for c in left] == [(real["cluster"]["id"], 1)]
    assert client.get(f"/api/v1/bundles/{real['id']}").status_code == 200
    assert store.remove_demo(db) == {"bundles": 0, "clusters": 0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_serve_demo_uses_its_own_database(db_url, tmp_path):
    """`kvreport serve --demo` with no database URL writes demo.sqlite3 in the user data directory,
    never the default database; `kvreport admin remove-demo` empties it."""
    data_home = tmp_path / "data"
    env = {**os.environ, "XDG_DATA_HOME": str(data_home), "HOME": str(tmp_path), "KVREPORT_LOG_REQUESTS": "0"}
    env.pop("KVREPORT_DATABASE_URL", None)
    port = _free_port()
    cmd = [sys.executable, "-m", "kvreport.cli"]
    proc = subprocess.Popen(cmd + ["serve", "--demo", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if requests.get(base + "/healthz", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.time() < deadline, "kvreport serve --demo did not answer"
            time.sleep(0.3)
        total = requests.get(base + "/.json", timeout=10).json()["total"]
        assert total >= 5
    finally:
        proc.terminate()
        _out, err = proc.communicate(timeout=20)
    folder = data_home / "kvreport"
    assert (folder / "demo.sqlite3").is_file()
    assert not (folder / "kvreport.sqlite3").exists()
    assert "remove-demo" in err and "demo.sqlite3" in err
    url = f"sqlite:///{folder / 'demo.sqlite3'}"
    r = subprocess.run(cmd + ["admin", "remove-demo", "--database-url", url], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert re.search(r"remove-demo: \d{2,} demo bundle\(s\) and \d+ cluster\(s\) removed", r.stderr)
    from kvreport_server.db import Database
    from kvreport_server.models import Bundle

    demo_db = Database(url)
    try:
        with demo_db.Session() as s:
            assert s.execute(select(Bundle.id)).first() is None
    finally:
        demo_db.dispose()
