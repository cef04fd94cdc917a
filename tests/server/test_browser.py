"""Browser tests in Debian's headless chromium driven by Playwright (no browser downloads).

A real waitress server runs in a thread on a free port; screenshots of each page are saved under
tests/artifacts/ (git-ignored) for a reviewer."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest
import requests
from server_helpers import bundle_from_case

from kvreport_server import auth

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
CASES = ["loc-17-fail-huge-ctx-verbose", "loc-15-fail-huge-ctx-fit-default", "loc-21-fail-ulimit-kv-600000",
         "loc-23-fail-ulimit-compute-after-kv-800000", "pub-016-llamacpppython-cuda-5gpu-compute-buffer-small-gpu",
         "pub-001-llamacpp-cpu-1m-ctx-kv-128gib"]


@pytest.fixture(params=["sqlite"])
def db_url(request, tmp_path, sqlite_template):
    path = tmp_path / "kvreport.sqlite3"
    shutil.copy(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture
def live(app, db):
    from waitress import create_server

    server = create_server(app, host="127.0.0.1", port=0, threads=4)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.effective_port}"
    with db.Session() as s, s.begin():
        upload = auth.new_token(s, "browser", "upload")
        auth.create_user(s, "maint", "correct horse battery")
    headers = {"Authorization": f"Bearer {upload}", "Content-Type": "application/json"}
    ids = []
    for case in CASES:
        b = bundle_from_case(case)
        r = requests.post(base + "/api/v1/bundles", data=json.dumps(b), headers=headers, timeout=30)
        assert r.status_code == 201, r.text
        ids.append((case, b["id"], r.json()["cluster"]["id"]))
    yield base, headers, ids
    server.close()


@pytest.fixture
def page(live):
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is not installed (apt-get install -y chromium)", pytrace=False)
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live[0])
        pg = context.new_page()
        errors = []
        pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        yield pg
        assert not [e for e in errors if "Content Security Policy" in e], errors
        browser.close()


def test_browse_filter_open_bundle(live, page):
    base, _headers, ids = live
    page.goto(base + "/")
    rows = page.locator("tr.cluster-row")
    n_clusters = len({cid for _c, _b, cid in ids})
    assert rows.count() == n_clusters
    total = sum(int(t) for t in page.locator("tr.cluster-row td.count").all_inner_texts())
    assert total == len(ids)
    page.screenshot(path=str(ARTIFACTS / "clusters.png"), full_page=True)

    page.select_option("select[name=backend]", "cuda")
    page.click("#filters button[type=submit]")
    page.wait_for_url("**/?*backend=cuda*")
    assert page.locator("tr.cluster-row").count() == 1
    page.select_option("select[name=backend]", "")
    page.fill("input[name=q]", "compute")
    page.click("#filters button[type=submit]")
    assert page.locator("tr.cluster-row").count() == 2
    page.screenshot(path=str(ARTIFACTS / "clusters-filtered.png"), full_page=True)

    page.goto(base + "/")
    page.locator("tr.cluster-row a.cluster-title").first.click()
    page.wait_for_url("**/clusters/*")
    assert page.locator("h1.cluster-title").is_visible()
    page.screenshot(path=str(ARTIFACTS / "cluster.png"), full_page=True)
    page.locator("a.bundle-link").first.click()
    page.wait_for_url("**/bundles/*")
    assert page.locator(".log .line.hit").count() >= 1
    assert page.locator("section.diagnosis .verdict").inner_text().strip() != ""
    page.screenshot(path=str(ARTIFACTS / "bundle.png"), full_page=True)


def test_copy_issue_markdown(live, page):
    base, _headers, ids = live
    _case, bundle_id, _cid = ids[0]
    page.goto(f"{base}/bundles/{bundle_id}")
    page.click("#copy-issue")
    page.wait_for_function("document.getElementById('copy-status').textContent.length > 0")
    copied = page.evaluate("navigator.clipboard.readText()")
    expected = requests.get(f"{base}/bundles/{bundle_id}.md", timeout=10).text
    assert copied == expected and bundle_id in copied


def test_maintainer_known_fix_reaches_next_upload(live, page):
    base, headers, ids = live
    case, _bundle_id, cid = ids[0]
    page.goto(base + "/login")
    page.screenshot(path=str(ARTIFACTS / "login.png"))
    page.fill("input[name=username]", "maint")
    page.fill("input[name=password]", "correct horse battery")
    page.click("#login-form button[type=submit]")
    page.goto(f"{base}/clusters/{cid}")
    page.click("details.edit summary")
    fix = "Lower the context: `-c 8192` fits; see the **KV** size line."
    page.fill("textarea[name=known_fix]", fix)
    page.fill("input[name=issue_url]", "https://github.com/ggml-org/llama.cpp/issues/12345")
    page.select_option("select[name=status]", "known_fix")
    page.click("#cluster-form button[type=submit]")
    page.wait_for_selector("#known-fix")
    assert "fits" in page.inner_text("#known-fix")
    assert page.locator("#known-fix strong").inner_text() == "KV"
    page.screenshot(path=str(ARTIFACTS / "cluster-known-fix.png"), full_page=True)
    r = requests.post(base + "/api/v1/bundles", data=json.dumps(bundle_from_case(case)), headers=headers, timeout=30)
    assert r.status_code == 201
    assert r.json()["cluster"]["known_fix"] == fix
    assert r.json()["cluster"]["issue_url"] == "https://github.com/ggml-org/llama.cpp/issues/12345"


def test_demo_pages_in_the_browser(app, db):
    """`kvreport serve --demo` data: every cluster and bundle page loads without a console error or a
    failed resource; clusters without a machine identity show "—"; the list fits a narrow screen."""
    from kvreport_server.cli_entry import load_examples
    from kvreport_server.waitress_server import create_server

    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is not installed (apt-get install -y chromium)", pytrace=False)
    stored, _skipped = load_examples(db)
    assert stored > 0
    server = create_server(app, host="127.0.0.1", port=0, threads=4)
    threading.Thread(target=server.run, daemon=True).start()
    base = f"http://127.0.0.1:{server.effective_port}"
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            pg = browser.new_page(viewport={"width": 1280, "height": 900})
            pg.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            pg.on("response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None)
            pg.goto(base + "/")
            pg.screenshot(path=str(ARTIFACTS / "demo-clusters.png"), full_page=True)
            clusters = requests.get(base + "/api/v1/clusters?per_page=100", timeout=10).json()["items"]
            for c in clusters:
                cell = pg.locator(f'tr[data-cluster-id="{c["id"]}"] td.machines').inner_text().strip()
                assert cell == (str(c["machines"]) if c["machines"] else "—")
            for c in clusters:
                pg.goto(f"{base}/clusters/{c['id']}")
                assert pg.locator("#regression-text").inner_text().strip()
                pg.screenshot(path=str(ARTIFACTS / f"demo-cluster-{c['id']}.png"), full_page=True)
                pg.locator("a.bundle-link").first.click()
                pg.wait_for_url("**/bundles/*")
                pg.screenshot(path=str(ARTIFACTS / f"demo-bundle-of-cluster-{c['id']}.png"), full_page=True)
            pg.set_viewport_size({"width": 420, "height": 900})
            pg.goto(base + "/")
            overflow = pg.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
            pg.screenshot(path=str(ARTIFACTS / "demo-clusters-narrow.png"), full_page=True)
            browser.close()
    finally:
        server.close()
    assert not problems, problems
    assert overflow <= 0, f"the clusters page is {overflow} px wider than a 420 px screen"


def test_bundle_page_draws_the_memory_of_each_device(live, page):
    """Issue 14, item 4: the bundle page of a real multi-GPU case draws one stacked bar per device; a CPU case
    draws the failed request past the device's size. Screenshots: artifacts/bundle-memory-*.png."""
    base, headers, ids = live
    two_gpus = bundle_from_case("pub-021-koboldcpp-cuda-2gpu-150k-ctx-compute-buffer")
    r = requests.post(base + "/api/v1/bundles", data=json.dumps(two_gpus), headers=headers, timeout=30)
    assert r.status_code == 201, r.text
    page.goto(f"{base}/bundles/{two_gpus['id']}")
    section = page.locator("#memory")
    assert section.is_visible()
    bars = page.locator("figure.mem-device svg.mem-bar")
    assert bars.count() == 2
    cuda0, cuda1 = (page.locator(f'figure[data-device="{d}"]') for d in ("CUDA0", "CUDA1"))
    kv0 = cuda0.locator("rect.seg-kv").bounding_box()
    req0 = cuda0.locator("rect.seg-request").bounding_box()
    kv1 = cuda1.locator("rect.seg-kv").bounding_box()
    assert kv0["width"] > 40 and req0["width"] > 40 and kv1["width"] > 40
    assert abs(req0["x"] - (kv0["x"] + kv0["width"])) < 2  # the request is stacked right after the KV cache
    # one scale for both GPUs: 13,501 MiB of KV is wider than 9,979 and narrower than 9,979 + 12,710
    assert kv0["width"] < kv1["width"] < kv0["width"] + req0["width"]
    assert "KV cache 9,979 MiB" in cuda0.inner_text() and "failed: compute buffer 12,710 MiB" in cuda0.inner_text()
    assert page.locator("#memory table.visually-hidden tr").count() == 3
    section.screenshot(path=str(ARTIFACTS / "bundle-memory-pub-021.png"))

    cpu_case = next(b for c, b, _cid in ids if c == "loc-17-fail-huge-ctx-verbose")
    page.goto(f"{base}/bundles/{cpu_case}")
    fig = page.locator('figure[data-device="CPU"]')
    cap = fig.locator("line.cap").bounding_box()
    req = fig.locator("rect.seg-request").bounding_box()
    over = fig.locator("rect.over-zone").bounding_box()
    assert req["x"] < cap["x"] < req["x"] + req["width"]  # the request runs past the size line
    assert abs(over["x"] - (cap["x"] + cap["width"] / 2)) < 2 and over["width"] > 100
    assert "41,465 MiB more than was left" in fig.inner_text()
    section = page.locator("#memory")
    section.screenshot(path=str(ARTIFACTS / "bundle-memory-loc-17.png"))
    page.screenshot(path=str(ARTIFACTS / "bundle-memory-page.png"), full_page=True)


def test_cluster_correlations_and_merge_in_the_browser(app, db):
    """The demo's Ollama Vulkan cluster shows what its bundles have in common (its OS) as a table
    with bars; a maintainer merges another cluster into it with the page's form and unmerges it."""
    from kvreport_server.cli_entry import load_demo
    from kvreport_server.waitress_server import create_server

    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is not installed (apt-get install -y chromium)", pytrace=False)
    load_demo(db)
    with db.Session() as s, s.begin():
        auth.create_user(s, "maint", "correct horse battery")
    server = create_server(app, host="127.0.0.1", port=0, threads=4)
    threading.Thread(target=server.run, daemon=True).start()
    base = f"http://127.0.0.1:{server.effective_port}"
    items = requests.get(base + "/.json?per_page=100", timeout=10).json()["items"]
    target = next(c for c in items if c["engine"] == "ollama")
    other = next(c for c in items if c["id"] != target["id"] and c["engine"] == "llama.cpp")
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            pg = browser.new_page(viewport={"width": 1280, "height": 900})
            pg.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            pg.on("response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None)
            pg.goto(f"{base}/clusters/{target['id']}")
            table = pg.locator("table.correlations")
            assert table.is_visible()
            rows = table.locator("tbody tr")
            texts = rows.all_inner_texts()
            assert any("Windows" in t for t in texts), texts
            assert pg.locator("table.correlations svg.bar").count() >= 2
            pg.locator("#correlations").screenshot(path=str(ARTIFACTS / "cluster-correlations.png"))
            pg.screenshot(path=str(ARTIFACTS / "cluster-correlations-page.png"), full_page=True)
            # a correlation value is a link to the filtered list
            rows.filter(has_text="Windows").locator("a").first.click()
            pg.wait_for_url("**/?facet=os*")
            assert pg.locator("tr.cluster-row").count() >= 1
            assert pg.locator("#facet-filter").is_visible()
            # sign in, merge `other` into the target with the form, then unmerge
            pg.goto(base + "/login")
            pg.fill("input[name=username]", "maint")
            pg.fill("input[name=password]", "correct horse battery")
            pg.click("#login-form button[type=submit]")
            pg.goto(f"{base}/clusters/{other['id']}")
            pg.click("details.merge summary")
            pg.fill("#merge-form input[name=into]", str(target["id"]))
            pg.click("#merge-form button[type=submit]")
            pg.wait_for_url(f"**/clusters/{target['id']}")
            assert pg.locator("#merged-from").is_visible()
            merged = requests.get(f"{base}/clusters/{target['id']}.json", timeout=10).json()
            assert merged["count"] == target["count"] + other["count"]
            pg.screenshot(path=str(ARTIFACTS / "cluster-merged.png"), full_page=True)
            pg.locator("#merged-from button[type=submit]").first.click()
            pg.wait_for_load_state()
            back = requests.get(f"{base}/clusters/{other['id']}.json", timeout=10).json()
            assert back["count"] == other["count"] and back["merged_into"] is None
            browser.close()
    finally:
        server.close()
    assert not problems, problems
