"""Counters kept on upload equal a full scan; concurrent same-id uploads end as one row; re-analysis
moves bundles between clusters in resumable batches without double counting."""

from __future__ import annotations

import json
import threading
import traceback

import pytest
from server_helpers import FAILURE_CASES, assert_consistent, bundle_from_case, minimal_bundle
from sqlalchemy import func, select, update

from kvreport_server import analysis, store
from kvreport_server.models import Bundle, Cluster


def test_counters_equal_full_scan_after_uploads_and_deletes(db):
    ids = []
    for i, case in enumerate(FAILURE_CASES * 2):
        b = bundle_from_case(case)
        if i % 3 == 0:
            b["host"]["cpu_model"] = "shared machine"
        assert store.ingest(db, b).status == 201
        ids.append(b["id"])
    assert_consistent(db)
    for bid in ids[::4]:
        assert store.delete_bundle(db, bid)
    assert_consistent(db)
    assert not store.delete_bundle(db, ids[0])


def test_same_id_uploaded_concurrently_is_one_row(app, db, upload_token):
    bundle = bundle_from_case("loc-17-fail-huge-ctx-verbose")
    body = json.dumps(bundle)
    codes = []
    barrier = threading.Barrier(8)

    def worker():
        client = app.test_client()
        barrier.wait()
        r = client.post("/api/v1/bundles", data=body, headers={"Authorization": f"Bearer {upload_token}",
                                                                "Content-Type": "application/json"})
        codes.append(r.status_code)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes) == [200] * 7 + [201]
    with db.Session() as s:
        assert s.execute(select(func.count()).select_from(Bundle)).scalar_one() == 1
        assert s.execute(select(func.sum(Cluster.count))).scalar_one() == 1
    assert_consistent(db)


def test_distinct_bundles_concurrently_all_counted(app, db, upload_token):
    bodies = [json.dumps(bundle_from_case("loc-21-fail-ulimit-kv-600000")) for _ in range(12)]
    codes = []

    def worker(chunk):
        client = app.test_client()
        for body in chunk:
            r = client.post("/api/v1/bundles", data=body, headers={"Authorization": f"Bearer {upload_token}",
                                                                    "Content-Type": "application/json"})
            codes.append(r.status_code)

    threads = [threading.Thread(target=worker, args=(bodies[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes == [201] * 12
    with db.Session() as s:
        assert s.execute(select(func.sum(Cluster.count))).scalar_one() == 12
    assert_consistent(db)


def test_reanalyze_moves_bundles_resumably(db, monkeypatch):
    bundles = [minimal_bundle(engine={"name": "llama.cpp", "version": f"b{6000 + i}", "build_number": 6000 + i})
               for i in range(10)]
    for b in bundles:
        store.ingest(db, b)
    with db.Session() as s:
        before = s.execute(select(Cluster.id, Cluster.count).where(Cluster.count > 0)).all()
    assert len(before) == 1 and before[0].count == 10

    real = analysis.diagnose_with_devices

    def diagnose_v2(bundle):
        d, devices = real(bundle)
        if (bundle.get("engine") or {}).get("build_number", 0) % 2:
            d = {**d, "signature": {**d["signature"], "key": "llama.cpp/kv_cache/cpu/odd-build",
                                    "title": "odd builds", "id": "odd"}}
        return {**d, "analyzer_version": "test-v2"}, devices

    monkeypatch.setattr(analysis, "diagnose_with_devices", diagnose_v2)
    monkeypatch.setattr(analysis, "analyzer_version", lambda: "test-v2")
    first = store.reanalyze(db, batch_size=3, max_batches=1)  # stopped after one batch
    assert first["seen"] == 3 and first["remaining"] == 7
    assert_consistent(db)
    rest = store.reanalyze(db, batch_size=3)
    assert rest["seen"] == 7 and rest["remaining"] == 0
    assert_consistent(db)
    assert store.reanalyze(db)["seen"] == 0
    with db.Session() as s:
        counts = sorted(s.execute(select(Cluster.count).where(Cluster.count > 0)).scalars())
        odd = s.execute(select(Cluster).where(Cluster.key == "llama.cpp/kv_cache/cpu/odd-build")).scalar_one()
    assert counts == [5, 5]
    assert odd.min_build == 6001 and odd.max_build == 6009 and odd.first_version == "b6001"


def test_regression_view(client, db):
    from kvreport_server.queries import cluster_detail

    for build in (6100, 6101, 6102):
        store.ingest(db, minimal_bundle(engine={"name": "llama.cpp", "version": f"b{build}", "build_number": build}))
    other = minimal_bundle(engine={"name": "llama.cpp", "version": "b7000", "build_number": 7000},
                           log={"line_count": 1, "truncated": False, "lines": [[1, "main: server is listening"]]})
    cid_other = store.ingest(db, other).cluster.id
    with db.Session() as s:
        d = cluster_detail(s, cid_other)
    assert d["regression"] == {"first_build": 7000, "last_build": 7000, "first_version": "b7000", "earlier_bundles": 3,
                               "unversioned_bundles": 0, "bundles": 1}


def test_sort_by_trend_and_sparkline(db):
    import datetime as dt

    from kvreport_server.queries import list_clusters

    now = dt.datetime.now(dt.timezone.utc)
    for _ in range(3):
        store.ingest(db, bundle_from_case("loc-17-fail-huge-ctx-verbose"), received_at=now - dt.timedelta(days=10))
    store.ingest(db, bundle_from_case("loc-23-fail-ulimit-compute-after-kv-800000"), received_at=now)
    with db.Session() as s:
        by_count, total = list_clusters(s, sort="count")
        by_trend, _ = list_clusters(s, sort="trend")
    assert total == 2
    assert by_count[0]["count"] == 3 and by_trend[0]["count"] == 1
    assert [c["trend"] for c in by_trend] == [1, -3]
    assert by_count[0]["sparkline"][-11] == 3 and by_trend[0]["sparkline"][-1] == 1


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_uploads_beside_reanalysis_and_merges_neither_deadlock_nor_miscount(db, monkeypatch):
    """PostgreSQL, real row locks: 4 threads upload bundles of the failure cases while re-analysis
    moves 48 stored bundles between clusters in batches of 4 and a maintainer merges and unmerges
    two of those clusters. Every upload is stored (a deadlock or lock error would fail it), the
    re-analysis sees every old bundle, and the counters equal a full scan."""
    import hashlib

    real = analysis.diagnose_with_devices

    def diagnose_v2(bundle):  # odd ids of the first three cases get a signature of their own
        d, devices = real(bundle)
        if int(hashlib.sha256(bundle["id"].encode()).hexdigest(), 16) % 2 and d["signature"]["key"] in moving:
            d = {**d, "signature": {**d["signature"], "key": d["signature"]["key"] + "/v2", "title": "v2"}}
        return {**d, "analyzer_version": "test-v2"}, devices

    old = [bundle_from_case(case) for case in FAILURE_CASES * 6]
    results = [store.ingest(db, b) for b in old]
    moving = {r.diagnosis["signature"]["key"] for r in results[:3]}
    with db.Session() as s, s.begin():
        s.execute(update(Bundle).values(analyzer_version="test-v1"))
    monkeypatch.setattr(analysis, "diagnose_with_devices", diagnose_v2)
    monkeypatch.setattr(analysis, "analyzer_version", lambda: "test-v2")
    a, b = sorted({r.cluster.id for r in results})[:2]

    errors: list[BaseException] = []
    uploading = threading.Event()
    overlap = []

    def guarded(fn):
        def run():
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                errors.append(exc)
        return run

    def uploader(k):
        for case in (FAILURE_CASES * 4)[k::4]:
            assert store.ingest(db, bundle_from_case(case)).status == 201

    def reanalysis():
        uploading.wait(30)
        stats = store.reanalyze(db, batch_size=4, progress=lambda s: overlap.append(any(t.is_alive() for t in ups)))
        assert stats["seen"] == len(old) and stats["remaining"] == 0, stats

    def maintainer():
        uploading.wait(30)
        for _ in range(3):
            store.merge_clusters(db, a, b)
            store.unmerge_cluster(db, a)

    ups = [threading.Thread(target=guarded(lambda k=k: uploader(k))) for k in range(4)]
    others = [threading.Thread(target=guarded(reanalysis)), threading.Thread(target=guarded(maintainer))]
    for t in others + ups:
        t.start()
    uploading.set()
    for t in ups + others:
        t.join(300)
        assert not t.is_alive(), "a writer hung"
    assert not errors, ["".join(traceback.format_exception(e)) for e in errors]
    assert any(overlap), "re-analysis finished no batch while uploads ran"
    with db.Session() as s:
        assert s.execute(select(func.count()).select_from(Bundle)).scalar_one() == len(old) + 4 * len(FAILURE_CASES)
        assert s.execute(select(func.sum(Cluster.count))).scalar_one() == len(old) + 4 * len(FAILURE_CASES)
        assert s.execute(select(func.count()).select_from(Bundle).where(Bundle.analyzer_version != "test-v2")
                         ).scalar_one() == 0
    assert_consistent(db)
