"""Bundles whose engine version and devices were read from the log (`kvreport collect --log` on a
machine whose probes find nothing: ``"version_source": "log"``, devices with ``"source": "log"``, no
host section) feed the versions and GPU facets, the machine count and the regression view."""

from __future__ import annotations

import re

from server_helpers import assert_consistent, bundle_from_case

from kvreport_server import store

SIG_A = "loc-17-fail-huge-ctx-verbose"
SIG_B = "loc-23-fail-ulimit-compute-after-kv-800000"
SIG_C = "loc-41-neg-ulimit-weights-buffer-no-mmap-150000"  # model_weights: a key of its own (scheme 2 has no verdict)
GPU = "NVIDIA GeForce RTX 4090"


def log_bundle(case: str, build: int | None, gpu: str | None = GPU) -> dict:
    """A bundle as `collect --log` writes it where probes found nothing: version/devices from the log."""
    engine = {"name": "llama.cpp"}
    if build is not None:
        engine.update(version=f"b{build}", build_number=build, commit=f"{build:x}abc", version_source="log")
    devices = [{"backend": "CUDA", "index": 0, "name": gpu, "total_mib": 24080.0, "source": "log"}] if gpu else []
    return bundle_from_case(case, host={}, engine=engine, devices=devices)


def regression_text(client, cid: int) -> str:
    html = client.get(f"/clusters/{cid}").get_data(as_text=True)
    m = re.search(r'<p id="regression-text">(.*?)</p>', html, re.S)
    assert m, html
    return " ".join(re.sub(r"<[^>]+>", "", m.group(1)).split())


def test_log_versions_feed_facets_and_the_regression_view(client, db):
    ids = {}
    for case, builds in [(SIG_A, (6000, 4000, 5000, None)), (SIG_B, (3000, 3500))]:
        for build in builds:
            ids[case] = store.ingest(db, log_bundle(case, build)).cluster.id
    ids[SIG_C] = store.ingest(db, log_bundle(SIG_C, None, gpu=None)).cluster.id
    assert len(set(ids.values())) == 3
    assert_consistent(db)

    a = client.get(f"/api/v1/clusters/{ids[SIG_A]}").get_json()
    assert a["min_build"] == 4000 and a["max_build"] == 6000
    assert {f["value"] for f in a["facets"]["engine_version"]} == {"b4000", "b5000", "b6000"}
    assert [f["value"] for f in a["facets"]["gpu"]] == [GPU]
    assert a["regression"] == {"first_build": 4000, "last_build": 6000, "first_version": "b4000",
                               "earlier_bundles": 2, "unversioned_bundles": 1, "bundles": 4}
    assert a["machines"] == 1  # the same log-reported GPU: one machine shape, no host section
    assert regression_text(client, ids[SIG_A]) == (
        "First seen in b4000 and up to b6000; 0 of 2 bundles of llama.cpp from earlier builds on this "
        "server have it. 1 of 4 bundles of this cluster report no engine version.")

    b = client.get(f"/api/v1/clusters/{ids[SIG_B]}").get_json()
    assert b["regression"]["first_build"] == 3000 and b["regression"]["earlier_bundles"] == 0
    assert regression_text(client, ids[SIG_B]) == (
        "First seen in b3000 and up to b3500; no bundle of llama.cpp from an earlier build is on this "
        "server to compare with.")

    c = client.get(f"/api/v1/clusters/{ids[SIG_C]}").get_json()
    assert c["regression"]["first_build"] is None and c["machines"] == 0
    assert regression_text(client, ids[SIG_C]) == (
        "The one bundle of this cluster reports no engine version, so builds cannot be compared.")

    listing = client.get("/api/v1/clusters?gpu=4090").get_json()
    assert {i["id"] for i in listing["items"]} == {ids[SIG_A], ids[SIG_B]}
    assert GPU in listing["items"][0]["gpus"]
    page = client.get("/").get_data(as_text=True)
    row_c = re.search(rf'data-cluster-id="{ids[SIG_C]}".*?</tr>', page, re.S).group(0)
    assert re.search(r'class="num machines"><span class="unknown"[^>]*>—</span>', row_c)
    row_a = re.search(rf'data-cluster-id="{ids[SIG_A]}".*?</tr>', page, re.S).group(0)
    assert 'class="num machines">1<' in row_a and "b4000–b6000" in row_a


def test_version_without_build_number_and_cpu_entries():
    from kvreport_server import analysis

    assert analysis.build_number_of({"version": "b6895"}) == 6895
    assert analysis.build_number_of({"version": "0.6.3.post1"}) is None
    assert analysis.build_number_of({"version": "b6895", "build_number": 6890}) == 6890
    assert not analysis.is_gpu({"backend": "CPU", "name": "AMD EPYC 7763"})
    assert not analysis.is_gpu({"backend": None, "name": "CPU"})
    assert analysis.is_gpu({"backend": "ROCm", "name": "Radeon RX 7900 XTX", "source": "log"})
