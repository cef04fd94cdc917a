"""End to end: the real `kvreport serve` process, a token from `kvreport admin create-token`,
bundles made from the shared cases uploaded with `kvreport upload`, counts read back through the
API and the HTML (on SQLite and on PostgreSQL)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import requests
from server_helpers import CASE_DIR, FAILURE_CASES, bundle_from_case, post_big

KVREPORT = [sys.executable, "-m", "kvreport.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args, env, **kw):
    return subprocess.run(KVREPORT + args, env=env, capture_output=True, text=True, timeout=120, **kw)


def make_bundle_file(case: str, out: Path, env: dict) -> Path:
    """`kvreport collect` when the collector is there, else a bundle built from the case log."""
    folder = CASE_DIR / case
    path = out / f"{case}.json"
    try:
        import kvreport.collect  # noqa: F401

        have_collect = True
    except ImportError:
        have_collect = False
    if have_collect:
        args = ["collect", "--log", str(folder / "log.txt"), "-o", str(path), "--yes", "--probe-timeout", "1"]
        if (folder / "command.txt").is_file():
            args += ["--command", (folder / "command.txt").read_text().strip()]
        r = run(args, env)
        if r.returncode in (0, 1) and path.is_file():
            return path
    path.write_text(json.dumps(bundle_from_case(case)))
    return path


@pytest.fixture
def server(db_url, tmp_path):
    port = free_port()
    env = {**os.environ, "KVREPORT_DATABASE_URL": db_url, "KVREPORT_LOG_REQUESTS": "0",
           "KVREPORT_PUBLIC_URL": "", "HOME": str(tmp_path)}
    env.pop("KVREPORT_SERVER", None)
    env.pop("KVREPORT_TOKEN", None)
    proc = subprocess.Popen(KVREPORT + ["serve", "--port", str(port), "--database-url", db_url],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"kvreport serve exited {proc.returncode}: {proc.stderr.read()}")
            try:
                if requests.get(base + "/healthz", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.time() > deadline:
                pytest.fail("kvreport serve did not answer /healthz within 60 s")
            time.sleep(0.2)
        yield base, env
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_serve_upload_browse(server, tmp_path):
    base, env = server
    r = run(["admin", "create-token", "e2e", "--database-url", env["KVREPORT_DATABASE_URL"]], env)
    assert r.returncode == 0, r.stderr
    token_lines = r.stdout.strip().splitlines()
    assert len(token_lines) == 1 and token_lines[0].startswith("kvr_")
    token = token_lines[0]

    cases = FAILURE_CASES[:6]
    expected = Counter()
    for case in cases:
        path = make_bundle_file(case, tmp_path, env)
        up = run(["upload", str(path), "--server", base, "--token", token, "--json"], env)
        assert up.returncode == 0, (case, up.stdout, up.stderr)
        answer = json.loads(up.stdout)
        assert answer["url"].startswith(base + "/bundles/")
        expected[answer["cluster"]["id"]] += 1
        again = run(["upload", str(path), "--server", base, "--token", token, "--json"], env)
        assert again.returncode == 0 and json.loads(again.stdout)["status"] == 200

    bad = run(["upload", str(path), "--server", base, "--token", "kvr_00000000_nope"], env)
    assert bad.returncode == 2 and "401" in bad.stderr

    listing = requests.get(base + "/api/v1/clusters", timeout=10).json()
    got = {c["id"]: c["count"] for c in listing["items"]}
    assert got == dict(expected)
    assert listing["total"] == len(expected)
    html = requests.get(base + "/", timeout=10).text
    for cid, n in expected.items():
        row = re.search(rf'data-cluster-id="{cid}".*?class="num count">(\d+)<', html, re.S)
        assert row and int(row.group(1)) == n
        page = requests.get(f"{base}/clusters/{cid}", timeout=10)
        assert page.status_code == 200 and page.text.count('class="bundle-link"') == n


def test_chunked_upload_and_busy_port(server, tmp_path):
    """A body sent without Content-Length (chunked) is read; a port in use is one line, exit 2."""
    base, env = server
    r = run(["admin", "create-token", "chunked", "--database-url", env["KVREPORT_DATABASE_URL"]], env)
    token = r.stdout.strip()
    body = json.dumps(bundle_from_case("loc-21-fail-ulimit-kv-600000")).encode()
    chunks = (body[i:i + 4096] for i in range(0, len(body), 4096))
    up = requests.post(base + "/api/v1/bundles", data=chunks, timeout=30,
                       headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    assert up.status_code == 201, up.text
    port = int(base.rsplit(":", 1)[1])
    busy = run(["serve", "--port", str(port), "--database-url", env["KVREPORT_DATABASE_URL"]], env)
    assert busy.returncode == 2
    assert busy.stderr.strip().splitlines()[-1].startswith("kvreport: error: cannot listen")


def test_known_fix_reaches_the_cli(server, tmp_path):
    """A write token from the CLI sets a known fix; the next `kvreport upload` of that signature prints it."""
    base, env = server
    db = env["KVREPORT_DATABASE_URL"]
    upload_token = run(["admin", "create-token", "up", "--database-url", db], env).stdout.strip()
    write_token = run(["admin", "create-token", "maint", "--scope", "write", "--database-url", db], env).stdout.strip()
    first = make_bundle_file("loc-17-fail-huge-ctx-verbose", tmp_path, env)
    answer = json.loads(run(["upload", str(first), "--server", base, "--token", upload_token, "--json"], env).stdout)
    cid = answer["cluster"]["id"]
    fix = "Lower -c to 48128 or quantize the KV cache (-ctk q8_0 -ctv q8_0 -fa on)."
    r = requests.patch(f"{base}/api/v1/clusters/{cid}", timeout=10,
                       json={"known_fix": fix, "issue_url": "https://github.com/ggml-org/llama.cpp/issues/1"},
                       headers={"Authorization": f"Bearer {write_token}"})
    assert r.status_code == 200, r.text
    second = tmp_path / "second"
    second.mkdir()
    path = make_bundle_file("loc-17-fail-huge-ctx-verbose", second, env)
    up = run(["upload", str(path), "--server", base, "--token", upload_token], env)
    assert up.returncode == 0, up.stderr
    assert fix in up.stdout and "issues/1" in up.stdout


LIMIT = 5 * 2**20  # KVREPORT_MAX_BODY_BYTES default


def _assert_json_413(answer):
    status, ctype, body = answer
    assert status == 413 and ctype.startswith("application/json"), answer[:2]
    assert isinstance(body, dict), body
    err = body["error"]
    assert err["code"] == "too_large" and err["limit"] == LIMIT and str(LIMIT) in err["message"]


def test_oversize_bodies_get_the_json_413(server):
    """60 MB over waitress's hard cap, 7 MB under it (the app answers), chunked or not: JSON 413."""
    base, env = server
    token = run(["admin", "create-token", "big", "--database-url", env["KVREPORT_DATABASE_URL"]], env).stdout.strip()
    for size, chunked in [(60_000_000, False), (60_000_000, True), (7_000_000, False), (7_000_000, True)]:
        _assert_json_413(post_big(base, size, token, chunked=chunked))
    assert requests.get(base + "/healthz", timeout=5).status_code == 200


def test_oversize_body_under_gunicorn(tmp_path):
    """gunicorn has no body cap of its own: the app's streaming limit answers the JSON 413."""
    url = f"sqlite:///{tmp_path}/g.sqlite3"
    env = {**os.environ, "KVREPORT_DATABASE_URL": url, "KVREPORT_LOG_REQUESTS": "0", "KVREPORT_SECRET_KEY": "g",
           "HOME": str(tmp_path)}
    token = run(["admin", "create-token", "g"], env).stdout.strip()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "--workers", "1", "--threads", "2",
                             "--bind", f"127.0.0.1:{port}", "kvreport_server:create_app()"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                if requests.get(base + "/healthz", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass  # not listening yet, or the worker is still importing the app (a loaded machine)
            assert proc.poll() is None and time.time() < deadline, "gunicorn did not start"
            time.sleep(0.2)
        for size, chunked in [(60_000_000, False), (60_000_000, True), (7_000_000, False)]:
            _assert_json_413(post_big(base, size, token, chunked=chunked))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_log_versions_reach_the_regression_view(server, tmp_path):
    """`kvreport collect --log` reads the build line and the devices from the log; uploaded through
    `kvreport upload`, they make the regression view of the real server: one signature in b4000,
    b5000 and b6000, another only in earlier builds."""
    base, env = server
    token = run(["admin", "create-token", "builds", "--database-url", env["KVREPORT_DATABASE_URL"]], env).stdout.strip()
    cids = {}
    for case, builds in [("pub-012-llamacpp-rocm-2x7900xtx-weights-on-gpu0-only", (6000, 4000, 5000)),
                         ("loc-17-fail-huge-ctx-verbose", (3000, 3500))]:
        for build in builds:
            log = tmp_path / f"{build}.log"
            log.write_text(f"build: {build} ({build:x}0abc) with cc (GCC) 15.2.1 for x86_64-pc-linux-gnu\n"
                           + (CASE_DIR / case / "log.txt").read_text(encoding="utf-8", errors="replace"))
            out = tmp_path / f"{build}.json"
            r = run(["collect", "--log", str(log), "-o", str(out), "--yes", "--probe-timeout", "1"], env)
            assert out.is_file(), r.stderr
            engine = json.loads(out.read_text())["engine"]
            assert engine["build_number"] == build and engine["version_source"] == "log"
            up = run(["upload", str(out), "--server", base, "--token", token, "--json"], env)
            assert up.returncode == 0, up.stderr
            cids[case] = json.loads(up.stdout)["cluster"]["id"]
    a, b = cids.values()
    detail = requests.get(f"{base}/api/v1/clusters/{a}", timeout=10).json()
    assert detail["regression"]["first_build"] == 4000 and detail["regression"]["earlier_bundles"] == 2
    assert [f["value"] for f in detail["facets"]["gpu"]] == ["Radeon RX 7900 XTX"]
    html = requests.get(f"{base}/clusters/{a}", timeout=10).text
    text = " ".join(re.sub(r"<[^>]+>", "", re.search(r'id="regression-text">(.*?)</p>', html, re.S).group(1)).split())
    assert text == ("First seen in b4000 and up to b6000; 0 of 2 bundles of llama.cpp from earlier builds on "
                    "this server have it.")
    html = requests.get(f"{base}/clusters/{b}", timeout=10).text
    assert "no bundle of llama.cpp from an earlier build" in html
    listing = requests.get(f"{base}/api/v1/clusters?gpu=7900", timeout=10).json()
    assert [i["id"] for i in listing["items"]] == [a]
