"""The bundle page's memory picture (issue 14, item 4): one inline SVG bar per device with its text equivalent,
on SQLite and PostgreSQL; hostile names from a log stay text."""

from __future__ import annotations

import json
import re

from server_helpers import bundle_from_case, minimal_bundle

XSS = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def upload(client, headers, bundle):
    r = client.post("/api/v1/bundles", data=json.dumps(bundle), headers={**headers, "Content-Type": "application/json"})
    assert r.status_code in (200, 201), r.json
    return r.json


def _section(html: str) -> str:
    m = re.search(r'<section class="memory".*?</section>', html, re.S)
    assert m, "no memory section on the bundle page"
    return m.group(0)


def test_multi_gpu_bundle_page_draws_one_bar_per_device(client, auth_header):
    b = bundle_from_case("pub-021-koboldcpp-cuda-2gpu-150k-ctx-compute-buffer")
    upload(client, auth_header, b)
    html = _section(client.get(f"/bundles/{b['id']}").get_data(as_text=True))
    assert "<script" not in html
    svgs = re.findall(r'<svg class="mem-bar"[^>]*role="img" aria-labelledby="mem-title-(\d) mem-desc-\1"', html)
    assert svgs == ["1", "2"]
    assert '<title id="mem-title-1">Memory of CUDA0</title>' in html
    assert ('<desc id="mem-desc-1">size not in the log; KV cache 9,979 MiB; failed: compute buffer 12,710 MiB</desc>'
            in html)
    assert html.count('class="seg seg-kv"') == 2 and html.count('class="seg seg-request"') == 1
    figures = re.findall(r'<figure class="mem-device( failing)?" data-device="(\w+)"', html)
    assert figures == [(" failing", "CUDA0"), ("", "CUDA1")]
    # the text equivalent: a visually hidden table with every number
    table = re.search(r'<table class="visually-hidden">.*?</table>', html, re.S).group(0)
    assert re.search(r"<th>CUDA0</th>.*?KV cache 9,979.*?compute buffer 12,710", table, re.S)
    assert re.search(r"<th>CUDA1</th>.*?KV cache 13,501.*?none", table, re.S)


def test_cpu_bundle_page_draws_the_request_past_the_device_size(client, auth_header):
    b = bundle_from_case("loc-17-fail-huge-ctx-verbose")
    upload(client, auth_header, b)
    html = _section(client.get(f"/bundles/{b['id']}").get_data(as_text=True))
    cap = float(re.search(r'<line class="cap" x1="([\d.]+)"', html).group(1))
    req = re.search(r'<rect class="seg seg-request" x="([\d.]+)" y="18" width="([\d.]+)"', html)
    start, width = float(req.group(1)), float(req.group(2))
    assert start < cap < start + width  # the failed request runs past the device's size line
    assert abs(cap - 24105 / (65536 + 34.42) * 640) < 0.1  # 24,105 MiB on a 640 px bar of 34.42 + 65,536 MiB
    assert 'class="over-zone"' in html and "41,465 MiB more than was left" in html
    assert "size 24,105 MiB" in html


def test_device_names_from_a_log_are_text_on_the_page(client, auth_header):
    log = (f'time=2025-10-01T10:00:01.000Z level=INFO source=device.go:223 msg="kv cache" device="{XSS}" '
           'size="4.0 GiB"\n'
           'time=2025-10-01T10:00:01.000Z level=ERROR source=server.go:1 msg="memory layout cannot be allocated"')
    lines = log.splitlines()
    b = minimal_bundle(log={"line_count": len(lines), "truncated": False, "source": "test",
                            "lines": [[i, t] for i, t in enumerate(lines, 1)]})
    upload(client, auth_header, b)
    page = client.get(f"/bundles/{b['id']}").get_data(as_text=True)
    html = _section(page)
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;" in html
