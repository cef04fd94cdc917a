"""Pages: lists, filters, bundle views, private mode, sign-in, CSRF, XSS, security headers."""

from __future__ import annotations

import json
import re

import pytest
from server_helpers import bundle_from_case, minimal_bundle

from kvreport_server import auth

XSS = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def upload(client, headers, bundle):
    r = client.post("/api/v1/bundles", data=json.dumps(bundle), headers={**headers, "Content-Type": "application/json"})
    assert r.status_code in (200, 201), r.json
    return r.json


def make_user(db, name="maint", password="correct horse battery"):
    with db.Session() as s, s.begin():
        auth.create_user(s, name, password)
    return name, password


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', html) or \
        re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert m, "no CSRF token in the form"
    return m.group(1)


def login(client, name, password):
    page = client.get("/login").get_data(as_text=True)
    return client.post("/login", data={"username": name, "password": password, "csrf_token": csrf_of(page)})


def test_index_filters_and_pages(client, auth_header):
    for case in ("loc-17-fail-huge-ctx-verbose", "loc-23-fail-ulimit-compute-after-kv-800000",
                 "pub-016-llamacpppython-cuda-5gpu-compute-buffer-small-gpu"):
        upload(client, auth_header, bundle_from_case(case))
    html = client.get("/").get_data(as_text=True)
    assert html.count('class="cluster-row"') == 3
    assert "<svg" in html  # sparklines
    only_cuda = client.get("/?backend=cuda").get_data(as_text=True)
    assert only_cuda.count('class="cluster-row"') == 1
    assert client.get("/?phase=compute_buffer").get_data(as_text=True).count('class="cluster-row"') == 2
    assert client.get("/?q=compute").get_data(as_text=True).count('class="cluster-row"') == 2
    assert client.get("/?q=nothing-like-this").get_data(as_text=True).count('class="cluster-row"') == 0
    paged = client.get("/?per_page=1&page=2").get_data(as_text=True)
    assert paged.count('class="cluster-row"') == 1 and "page 2 of 3" in paged
    assert client.get("/?sort=bogus").status_code == 400
    api = client.get("/api/v1/clusters?backend=cuda").json
    assert api["total"] == 1 and api["items"][0]["backend"] == "cuda"


def test_bundle_page_highlights_allocator_line(client, auth_header):
    b = bundle_from_case("loc-17-fail-huge-ctx-verbose")
    answer = upload(client, auth_header, b)
    alloc = answer["diagnosis"]["failure"]["allocator_error"]
    html = client.get(f"/bundles/{b['id']}").get_data(as_text=True)
    assert 'class="line hit"' in html
    hit = re.search(r'class="line hit" data-line="\d+"><span class="ln">\d+</span>([^<]*)<', html)
    assert hit and hit.group(1).strip() == alloc.strip().replace("&", "&amp;")
    assert "<details>" in html  # the rest of the log is folded
    assert 'id="copy-issue"' in html and 'id="issue-md"' in html


def test_xss_payloads_are_text(make_app, make_token):
    app = make_app(ISSUE_REPO="ggml-org/llama.cpp")
    client = app.test_client()
    with app.extensions["kvreport_db"].Session() as s, s.begin():
        token = auth.new_token(s, "x", "write")
    h = {"Authorization": f"Bearer {token}"}
    b = minimal_bundle(devices=[{"backend": "cuda", "index": 0, "name": XSS, "total_mib": 100.0}],
                       model={"file_name": XSS + ".gguf"})
    b["log"]["lines"].append([3, XSS])
    b["log"]["line_count"] = 3
    cid = upload(client, h, b)["cluster"]["id"]
    fix = f"Try `-c 4096`. {XSS} [click](javascript:alert(1)) <a href=\"javascript:alert(2)\">x</a>"
    assert client.patch(f"/api/v1/clusters/{cid}", json={"known_fix": fix}, headers=h).status_code == 200
    for path in ("/", f"/clusters/{cid}", f"/bundles/{b['id']}"):
        html = client.get(path).get_data(as_text=True)
        assert "<script>alert" not in html and "<img src=x" not in html
        assert re.search(r"<a[^>]*href=.javascript", html) is None
        assert re.search(r"<[a-z]+[^>]* onerror=", html) is None
    cluster_html = client.get(f"/clusters/{cid}").get_data(as_text=True)
    assert "&lt;script&gt;" in cluster_html  # shown as text
    assert re.search(r"<a[^>]*href=.javascript", cluster_html) is None


def test_security_headers_and_cookies(make_app):
    app = make_app(PUBLIC_URL="https://kv.example.org")
    client = app.test_client()
    r = client.get("/")
    csp = r.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert r.headers["X-Frame-Options"] == "DENY"
    assert "Strict-Transport-Security" in r.headers
    r = client.get("/login")
    cookie = next(c for c in r.headers.getlist("Set-Cookie") if c.startswith("session="))
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Secure" in cookie


def test_maintainer_sets_known_fix_with_csrf(client, db, auth_header):
    cid = upload(client, auth_header, bundle_from_case("loc-17-fail-huge-ctx-verbose"))["cluster"]["id"]
    assert 'id="cluster-form"' not in client.get(f"/clusters/{cid}").get_data(as_text=True)
    assert client.post(f"/clusters/{cid}", data={"known_fix": "x", "status": "known_fix"}).status_code in (400, 403)
    name, pw = make_user(db)
    assert login(client, name, "wrong password").status_code == 200  # form again, no session
    assert 'id="cluster-form"' not in client.get(f"/clusters/{cid}").get_data(as_text=True)
    assert login(client, name, pw).status_code == 302
    page = client.get(f"/clusters/{cid}").get_data(as_text=True)
    assert 'id="cluster-form"' in page
    # without the CSRF token: refused
    r = client.post(f"/clusters/{cid}", data={"known_fix": "no csrf", "issue_url": "", "status": "known_fix"})
    assert r.status_code == 400
    r = client.post(f"/clusters/{cid}", data={"known_fix": "Use **-c 8192**", "status": "known_fix",
                                              "issue_url": "https://github.com/ggml-org/llama.cpp/issues/9",
                                              "csrf_token": csrf_of(page)})
    assert r.status_code == 302
    html = client.get(f"/clusters/{cid}").get_data(as_text=True)
    assert "<strong>-c 8192</strong>" in html
    again = upload(client, auth_header, bundle_from_case("loc-17-fail-huge-ctx-verbose"))
    assert again["cluster"]["known_fix"] == "Use **-c 8192**" and again["cluster"]["status"] == "known_fix"


@pytest.fixture
def private_app(make_app):
    return make_app(PRIVATE=True)


def test_private_mode_hides_everything(private_app):
    app = private_app
    client = app.test_client()
    db = app.extensions["kvreport_db"]
    with db.Session() as s, s.begin():
        token = auth.new_token(s, "p", "upload")
    h = {"Authorization": f"Bearer {token}"}
    b = bundle_from_case("loc-17-fail-huge-ctx-verbose")
    cid = upload(client, h, b)["cluster"]["id"]
    for path in ("/", f"/clusters/{cid}", f"/bundles/{b['id']}"):
        r = client.get(path)
        assert r.status_code == 302 and "/login" in r.headers["Location"]
    for path in (f"/bundles/{b['id']}.json", f"/bundles/{b['id']}.md", "/api/v1/clusters",
                 f"/api/v1/clusters/{cid}", f"/api/v1/bundles/{b['id']}"):
        r = client.get(path)
        assert r.status_code == 401, path
        assert b["id"] not in r.get_data(as_text=True)
    assert client.get("/healthz").status_code == 200
    assert client.get("/api/v1/clusters", headers=h).status_code == 200
    name, pw = make_user(db)
    login(client, name, pw)
    assert client.get(f"/bundles/{b['id']}.md").status_code == 200
    assert client.get("/").status_code == 200


def test_open_issue_link_stays_under_github_limit(make_app, make_token):
    from kvreport_server.web.render import GITHUB_URL_LIMIT

    app = make_app(ISSUE_REPO="ggml-org/llama.cpp")
    client = app.test_client()
    with app.extensions["kvreport_db"].Session() as s, s.begin():
        token = auth.new_token(s, "i", "upload")
    b = bundle_from_case("loc-17-fail-huge-ctx-verbose")
    upload(client, {"Authorization": f"Bearer {token}"}, b)
    html = client.get(f"/bundles/{b['id']}").get_data(as_text=True)
    m = re.search(r'id="open-issue" href="([^"]+)"', html)
    assert m and m.group(1).startswith("https://github.com/ggml-org/llama.cpp/issues/new?title=")
    assert len(m.group(1).replace("&amp;", "&")) <= GITHUB_URL_LIMIT


def test_rate_limit_answers_429_with_retry_after(make_app):
    app = make_app(RATE_LIMIT_UPLOAD="2/minute")
    client = app.test_client()
    with app.extensions["kvreport_db"].Session() as s, s.begin():
        token = auth.new_token(s, "r", "upload")
    h = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    codes = [client.post("/api/v1/bundles", data=json.dumps(minimal_bundle()), headers=h).status_code
             for _ in range(3)]
    assert codes[:2] == [201, 201] and codes[2] == 429
    r = client.post("/api/v1/bundles", data=json.dumps(minimal_bundle()), headers=h)
    assert r.status_code == 429 and r.json["error"]["code"] == "rate_limited"
    assert int(r.headers["Retry-After"]) > 0
    assert client.get("/api/v1/clusters").status_code == 200  # reads are not limited by the upload limit


def test_hostile_form_and_path_input_never_500(client, db, auth_header):
    cid = upload(client, auth_header, bundle_from_case("loc-17-fail-huge-ctx-verbose"))["cluster"]["id"]
    page = client.get("/login").get_data(as_text=True)
    r = client.post("/login", data={"username": "a\x00b", "password": "x\x00", "csrf_token": csrf_of(page)})
    assert r.status_code == 200
    assert client.get("/clusters/99999999999999").status_code == 404
    assert client.get("/?q=a%00b").status_code == 400
    name, pw = make_user(db)
    login(client, name, pw)
    page = client.get(f"/clusters/{cid}").get_data(as_text=True)
    r = client.post(f"/clusters/{cid}", data={"known_fix": "nul\x00here", "issue_url": "", "status": "known_fix",
                                              "csrf_token": csrf_of(page)})
    assert r.status_code == 302
    assert "nul\ufffdhere" == client.get(f"/api/v1/clusters/{cid}").json["known_fix"]


def test_login_next_is_never_an_open_redirect(client, db):
    name, pw = make_user(db)
    for target in ("https://evil.example", "//evil.example", "/\\evil.example", "javascript:alert(1)"):
        page = client.get("/login").get_data(as_text=True)
        r = client.post("/login", query_string={"next": target},
                        data={"username": name, "password": pw, "csrf_token": csrf_of(page)})
        assert r.status_code == 302 and r.headers["Location"] in ("/", "http://localhost/"), target
        client.post("/logout", data={"csrf_token": csrf_of(client.get("/").get_data(as_text=True))})


def test_sign_in_attempts_are_rate_limited(make_app):
    app = make_app(RATE_LIMIT_LOGIN="3/minute")
    client = app.test_client()
    codes = []
    for _ in range(4):
        page = client.get("/login").get_data(as_text=True)
        codes.append(client.post("/login", data={"username": "x", "password": "y",
                                                 "csrf_token": csrf_of(page)}).status_code)
    assert codes == [200, 200, 200, 429]
    assert client.get("/login").status_code == 200  # only POSTs count


def test_every_shared_case_renders(client, auth_header):
    """Every real case, as a bundle, uploads and renders its bundle, cluster, .json and .md views."""
    from server_helpers import CASE_DIR

    cases = sorted(p.name for p in CASE_DIR.iterdir() if (p / "log.txt").is_file())
    assert len(cases) >= 20
    clusters = set()
    for case in cases:
        b = bundle_from_case(case)
        answer = upload(client, auth_header, b)
        clusters.add(answer["cluster"]["id"])
        for suffix in ("", ".json", ".md"):
            r = client.get(f"/bundles/{b['id']}{suffix}")
            assert r.status_code == 200, (case, suffix)
            if suffix == "":  # the collapsed explanation: every fact with its rule
                html = r.get_data(as_text=True)
                assert "<summary>Why kvreport says this</summary>" in html and "failure.phase" in html, case
    for cid in clusters:
        assert client.get(f"/clusters/{cid}").status_code == 200
    listing = client.get("/api/v1/clusters?per_page=200").json
    assert sum(c["count"] for c in listing["items"]) == len(cases)


def test_bidi_override_in_a_log_line_is_shown_as_a_marker(client, auth_header):
    b = bundle_from_case("loc-17-fail-huge-ctx-verbose")
    b["log"]["lines"].append([999999, "note: \u202efdp.exe"])
    upload(client, auth_header, b)
    html = client.get(f"/bundles/{b['id']}").get_data(as_text=True)
    md = client.get(f"/bundles/{b['id']}.md").get_data(as_text=True)
    assert "\u202e" not in html and "&lt;U+202E&gt;" in html
    assert "\u202e" not in md
