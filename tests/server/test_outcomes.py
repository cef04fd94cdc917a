"""Outcomes (issue 14 item 1) on SQLite and PostgreSQL: POST /api/v1/bundles/<id>/outcomes, "what worked here"
per cluster (counts of distinct machines, JSON and page), the upload reply, and the client end to end."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import requests
from server_helpers import bundle_from_case
from test_e2e_serve import run, server  # noqa: F401 - the real `kvreport serve` fixture

from kvreport.bundle import new_bundle_id

ROOT = Path(__file__).resolve().parents[2]
CASE = "loc-17-fail-huge-ctx-verbose"


def machine(n: int) -> str:
    return hashlib.sha256(f"machine {n}".encode()).hexdigest()


def outcome(n: int, change=None, ids=("reduce-ctx",), **extra) -> dict:
    body = {"id": new_bundle_id(), "machine": machine(n), "worked": True,
            "change": {"-c": [131072, 4096]} if change is None else change, "suggestion_ids": list(ids),
            "engine": "llama.cpp", "created_at": "2026-12-14T10:00:00Z"}
    body.update(extra)
    return body


def upload(client, headers, n: int) -> dict:
    bundle = bundle_from_case(CASE, host={"os": "Linux", "cpu_model": f"cpu of machine {n}", "ram_total_mib": 64000.0})
    r = client.post("/api/v1/bundles", data=json.dumps(bundle), headers={"Content-Type": "application/json", **headers})
    assert r.status_code == 201, r.json
    return r.json


def send(client, headers, bundle_id: str, body) -> object:
    return client.post(f"/api/v1/bundles/{bundle_id}/outcomes", data=json.dumps(body),
                       headers={"Content-Type": "application/json", **headers})


def test_what_worked_counts_machines_and_ranks_fixes(client, auth_header):
    uploads = [upload(client, auth_header, n) for n in range(9)]
    cid = uploads[0]["cluster"]["id"]
    assert {u["cluster"]["id"] for u in uploads} == {cid}
    assert uploads[0]["cluster"]["what_worked"] == []
    detail = client.get(f"/api/v1/clusters/{cid}").json
    assert detail["machines"] == 9 and detail["what_worked"] == []

    # machines 0..6 confirm reduce-ctx; machine 7 quantized the cache; machine 0 confirms once more on a second bundle
    for n in range(7):
        r = send(client, auth_header, uploads[n]["id"], outcome(n))
        assert r.status_code == 201, r.json
    r = send(client, auth_header, uploads[7]["id"], outcome(7, change={"-ctk": ["f16", "q8_0"]},
                                                            ids=["quantize-kv-cache"]))
    assert r.status_code == 201
    again = outcome(0, change={"-c": [131072, 8192]})
    assert send(client, auth_header, uploads[8]["id"], again).status_code == 201
    # idempotent on the outcome id: the same body again is 200 and counts nothing
    r = send(client, auth_header, uploads[8]["id"], again)
    assert r.status_code == 200
    assert send(client, auth_header, uploads[8]["id"], {**again, "worked": False}).status_code == 409

    worked = r.json["cluster"]["what_worked"]
    assert [(w["id"], w["machines"], w["of"], w["outcomes"]) for w in worked] == [
        ("reduce-ctx", 7, 9, 8), ("quantize-kv-cache", 1, 9, 1)]
    assert worked[0]["text"] == "reduce-ctx: confirmed on 7 of 9 machines"
    assert worked[0]["examples"] == ["-c 131072 -> 8192", "-c 131072 -> 4096"]

    detail = client.get(f"/api/v1/clusters/{cid}").json
    assert detail["what_worked"] == worked
    ranked = [f["value"] for f in detail["facets"]["suggestion"]]
    assert ranked[:2] == ["reduce-ctx", "quantize-kv-cache"]  # confirmations first
    assert detail["facets"]["suggestion"][0]["confirmed"] == 7

    page = client.get(f"/clusters/{cid}").get_data(as_text=True)
    assert "What worked here" in page
    assert "<strong>reduce-ctx</strong>: confirmed on 7 of 9 machines (8 runs)" in page

    # a new bundle of the cluster hears what worked for others
    tenth = upload(client, auth_header, 9)
    assert tenth["cluster"]["what_worked"][0]["text"] == "reduce-ctx: confirmed on 7 of 10 machines"
    read = client.get(f"/api/v1/bundles/{tenth['id']}").json
    assert read["cluster"]["what_worked"][0]["machines"] == 7


def test_outcomes_follow_a_purged_bundle(client, auth_header, make_token):
    a, b = upload(client, auth_header, 1), upload(client, auth_header, 2)
    assert send(client, auth_header, a["id"], outcome(1)).status_code == 201
    assert send(client, auth_header, b["id"], outcome(2)).status_code == 201
    admin = {"Authorization": f"Bearer {make_token('admin')}"}
    assert client.delete(f"/api/v1/bundles/{a['id']}", headers=admin).status_code == 200
    worked = client.get(f"/api/v1/clusters/{b['cluster']['id']}").json["what_worked"]
    assert [(w["id"], w["machines"], w["of"]) for w in worked] == [("reduce-ctx", 1, 1)]


def test_outcome_bad_input(client, auth_header, make_token):
    bundle_id = upload(client, auth_header, 1)["id"]
    assert send(client, {}, bundle_id, outcome(1)).status_code == 401
    assert send(client, auth_header, new_bundle_id(), outcome(1)).json["error"]["code"] == "not_found"
    assert send(client, auth_header, "not-an-id", outcome(1)).status_code == 404
    cases = [
        ({**outcome(1), "diagnosis": {}}, "diagnosis"),
        (outcome(1, machine="Test CPU, 64 GB"), "machine"),
        (outcome(1, id="x"), "id"),
        (outcome(1, worked="yes"), "worked"),
        (outcome(1, ids=["reduce-ctx", "rm-rf"]), "suggestion_ids"),
        (outcome(1, change={"-c": [1, 2, 3]}), "change"),
        (outcome(1, change={"-c": [{"nested": 1}, 2]}), "change"),
        (outcome(1, created_at="yesterday"), "created_at"),
        ({k: v for k, v in outcome(1).items() if k != "machine"}, "machine"),
    ]
    for body, field in cases:
        r = send(client, auth_header, bundle_id, body)
        assert r.status_code == 422, (body, r.json)
        assert (r.json["error"].get("field") or "").split(".")[0] == field, r.json
    assert send(client, auth_header, bundle_id, [1, 2]).status_code == 422
    r = client.post(f"/api/v1/bundles/{bundle_id}/outcomes", data="{not json", headers={
        "Content-Type": "application/json", **auth_header})
    assert r.status_code == 400 and "error" in r.json
    r = client.post(f"/api/v1/bundles/{bundle_id}/outcomes", data="x", headers={"Content-Type": "text/plain",
                                                                               **auth_header})
    assert r.status_code == 415
    # a secret that slipped into the change is refused, like in a bundle
    r = send(client, auth_header, bundle_id, outcome(1, change={"--hf-token": ["hf_abcdefghijklmnopqrstuvwxyzABCDEFGH",
                                                                               None]}, ids=[]))
    assert r.status_code == 422 and r.json["error"]["code"] == "secrets_found", r.json
    # every answer above was JSON and nothing was stored
    cid = client.get(f"/api/v1/bundles/{bundle_id}").json["cluster"]["id"]
    assert client.get(f"/api/v1/clusters/{cid}").json["what_worked"] == []


def test_openapi_documents_the_outcome_route(client):
    spec = client.get("/api/v1/openapi.json").json
    post = spec["paths"]["/api/v1/bundles/{bundle_id}/outcomes"]["post"]
    assert post["security"] == [{"bearerAuth": []}]
    assert set(spec["components"]["schemas"]["Outcome"]["required"]) >= {"id", "machine", "worked", "change",
                                                                         "suggestion_ids", "created_at"}


def test_client_run_fails_then_works_and_the_server_shows_it(server, tmp_path):  # noqa: F811
    """`kvreport run` of a llama-server that fails at -c 131072 (uploaded), then comes up at -c 4096: the outcome
    reaches the real `kvreport serve` and its cluster says what worked."""
    base, env = server
    token = run(["admin", "create-token", "outcomes", "--database-url", env["KVREPORT_DATABASE_URL"]], env).stdout.strip()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool = bindir / "llama-server"
    tool.write_text(f'#!/bin/sh\nexec sh "{ROOT / "tests" / "fakebin" / "llama-server-run"}" "$@"\n')
    tool.chmod(0o755)
    env = {**env, "PATH": f"{bindir}{os.pathsep}{env['PATH']}", "KVREPORT_SERVER": base, "KVREPORT_TOKEN": token,
           "KVREPORT_DATA_DIR": str(tmp_path / "data"), "KVREPORT_CONFIG_DIR": str(tmp_path / "config")}
    failed = run(["run", "--probe-timeout", "0.5", "--upload", "--yes", "-o", str(tmp_path / "failed.json"), "--",
                  "llama-server", "-m", "/models/tiny.gguf", "-c", "131072"], env, cwd=tmp_path)
    assert failed.returncode == 1, failed.stderr[-3000:]
    bundle_id = json.loads((tmp_path / "failed.json").read_text())["id"]
    assert f"Bundle stored: {base}/bundles/{bundle_id}" in failed.stdout
    worked = run(["run", "--probe-timeout", "0.5", "--", "llama-server", "-m", "/models/tiny.gguf", "-c", "4096"], env,
                 cwd=tmp_path)
    assert worked.returncode == 0, worked.stderr[-3000:]
    assert "kvreport: this worked: -c 131072 -> 4096 (reduce-ctx)" in worked.stderr
    assert f"kvreport: sent to {base}/bundles/{bundle_id}" in worked.stderr
    cluster = requests.get(f"{base}/api/v1/bundles/{bundle_id}", timeout=10).json()["cluster"]
    assert [w["text"] for w in cluster["what_worked"]] == ["reduce-ctx: confirmed on 1 of 1 machine"]
    page = requests.get(f"{base}/clusters/{cluster['id']}", timeout=10).text
    assert "<strong>reduce-ctx</strong>: confirmed on 1 of 1 machine" in page
    # the next upload into that cluster says what worked for others
    again = run(["run", "--probe-timeout", "0.5", "--upload", "--yes", "-o", str(tmp_path / "again.json"), "--",
                 "llama-server", "-m", "/models/tiny.gguf", "-c", "131072"], env, cwd=tmp_path)
    assert "What worked for others:\n  reduce-ctx: confirmed on 1 of 1 machine" in again.stdout
