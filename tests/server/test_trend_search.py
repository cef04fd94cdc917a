"""The clusters list's trend order and search through indexes (issue 15 item 5, migration 0007).

The stored trend (``clusters.trend``, from ``trend_day`` through ``trend_until``) equals the sum over
the cluster's bundles per day after uploads, deletes, re-analysis moves, merges and new days (``server_helpers.scan`` checks
it for every test that calls ``assert_consistent``); ``sort=trend`` orders exactly as the sum over
``cluster_days`` did; ``q`` finds exactly the clusters the LIKE/EXISTS match found.
"""

from __future__ import annotations

import datetime as dt
import threading
import traceback

import pytest
from server_helpers import FAILURE_CASES, assert_consistent, bundle_from_case, minimal_bundle
from sqlalchemy import exists, func, or_, select, text

from kvreport_server import analysis, counts, store
from kvreport_server.models import Cluster, ClusterFacet
from kvreport_server.queries import _like, list_clusters, sparklines


@pytest.fixture
def today(monkeypatch):
    """A settable today (``counts.utc_today``, which the writers, the refresh and the pages read):
    ``today[0]``, starting at the real UTC date (fixed, so a test run across midnight changes nothing)."""
    day = [dt.datetime.now(dt.timezone.utc).date()]
    monkeypatch.setattr(counts, "utc_today", lambda: day[0])
    return day


DISTINCT = [FAILURE_CASES[i] for i in (0, 3, 5, 7)]  # cases of four different signatures


def at(day: dt.date, hour: int = 12) -> dt.datetime:
    return dt.datetime(day.year, day.month, day.day, hour, tzinfo=dt.timezone.utc)


def check_trend_order(db, session=None):
    """``sort=trend`` (which first brings stale rows to today) lists every cluster ordered by its trend
    computed from ``cluster_days`` (the value each item shows), then count, then id; and every stored
    trend is exact (``assert_consistent``)."""
    with db.Session() as s:
        items, total = list_clusters(s, sort="trend", per_page=1000, db=db)
        assert not counts.stale_trends(s)
        ids = [c.id for c in s.execute(select(Cluster).where(Cluster.count > 0)).scalars()]
        spark = sparklines(s, ids, counts.utc_today())
        shown = {cid: sum(v[-7:]) - sum(v[-14:-7]) for cid, v in spark.items()}
        count = dict(s.execute(select(Cluster.id, Cluster.count)).all())
    assert total == len(ids)
    assert [i["id"] for i in items] == sorted(ids, key=lambda cid: (-shown[cid], -count[cid], cid))
    assert {i["id"]: i["trend"] for i in items} == shown
    assert_consistent(db)
    return shown


def test_stored_trend_after_uploads_deletes_and_new_days(db, today):
    t0 = today[0]
    spread = {  # case -> days before today of its bundles
        DISTINCT[0]: [0, 0, 1, 2, 3, 10, 13],
        DISTINCT[1]: [6, 7, 8, 8, 9],
        DISTINCT[2]: [13, 14, 15],
        DISTINCT[3]: [20, 30],
    }
    ids = {}
    for case, back in spread.items():
        for k in back:
            b = bundle_from_case(case)
            store.ingest(db, b, received_at=at(t0 - dt.timedelta(days=k)))
            ids.setdefault(case, []).append(b["id"])
    shown = check_trend_order(db)
    assert sorted(shown.values()) != [0] * len(shown)
    for bid in (ids[DISTINCT[0]][0], ids[DISTINCT[1]][1], ids[DISTINCT[0]][5]):
        assert store.delete_bundle(db, bid)
    check_trend_order(db)
    for shift in (1, 2, 6, 7, 8, 13, 14, 15, 21, 40):  # the days move on: the first sort=trend refreshes
        today[0] = t0 + dt.timedelta(days=shift)
        check_trend_order(db)
        if shift == 8:  # uploads and a delete on rows as of an older day, and as of today
            store.ingest(db, bundle_from_case(DISTINCT[3]), received_at=at(today[0]))
            today[0] += dt.timedelta(days=1)
            store.ingest(db, bundle_from_case(DISTINCT[2]), received_at=at(today[0]))
            store.ingest(db, bundle_from_case(DISTINCT[2]), received_at=at(today[0] - dt.timedelta(days=9)))
            assert store.delete_bundle(db, ids[DISTINCT[1]][0])
            assert_consistent(db)
            check_trend_order(db)
    with db.Session() as s:  # 40 days on: no bundle in the window, every trend 0 for good
        assert set(s.execute(select(Cluster.trend, Cluster.trend_until)).all()) == {(0, None)}


def test_stored_trend_after_reanalysis_moves_and_merges(db, today, monkeypatch):
    t0 = today[0]
    for i in range(12):
        store.ingest(db, minimal_bundle(engine={"name": "llama.cpp", "version": f"b{6000 + i}", "build_number": 6000 + i}),
                     received_at=at(t0 - dt.timedelta(days=2 * i)))
    store.ingest(db, bundle_from_case(DISTINCT[1]), received_at=at(t0 - dt.timedelta(days=3)))
    check_trend_order(db)
    real = analysis.diagnose_with_devices

    def diagnose_v2(bundle):  # odd builds get a signature of their own
        d, devices = real(bundle)
        if (bundle.get("engine") or {}).get("build_number", 0) % 2:
            d = {**d, "signature": {**d["signature"], "key": "llama.cpp/kv_cache/cpu/odd-build", "title": "odd builds",
                                    "id": "odd"}}
        return {**d, "analyzer_version": "test-v2"}, devices

    monkeypatch.setattr(analysis, "diagnose_with_devices", diagnose_v2)
    monkeypatch.setattr(analysis, "analyzer_version", lambda: "test-v2")
    today[0] = t0 + dt.timedelta(days=2)  # the rows are as of an older day when re-analysis moves bundles
    assert store.reanalyze(db, batch_size=5)["moved"] == 6
    assert_consistent(db)
    check_trend_order(db)
    with db.Session() as s:
        odd = s.execute(select(Cluster.id).where(Cluster.key == "llama.cpp/kv_cache/cpu/odd-build")).scalar_one()
        even = s.execute(select(Cluster.id).where(Cluster.count == 6, Cluster.id != odd)).scalar_one()
    today[0] = t0 + dt.timedelta(days=3)
    store.merge_clusters(db, odd, even)
    assert_consistent(db)
    check_trend_order(db)
    store.unmerge_cluster(db, odd)
    today[0] = t0 + dt.timedelta(days=5)
    check_trend_order(db)


def test_refresh_runs_once_a_day_and_in_its_own_transaction(db, today):
    store.ingest(db, bundle_from_case(DISTINCT[0]), received_at=at(today[0] - dt.timedelta(days=6)))
    today[0] += dt.timedelta(days=1)
    with db.Session() as s:
        assert counts.stale_trends(s)
        list_clusters(s, sort="trend", db=db)
        s.rollback()  # the page's own session: the refresh was committed apart from it
    with db.Session() as s:
        assert not counts.stale_trends(s)
        assert counts.refresh_trends(s) == 0  # nothing left for the day
        assert s.execute(select(Cluster.trend, Cluster.trend_day, Cluster.trend_until)).one() == (
            -1, today[0], today[0] + dt.timedelta(days=6))  # the bundle of 7 days ago leaves last week in 7 days


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_uploads_beside_day_refreshes_keep_trends_exact(db, today):
    """PostgreSQL, real row locks: 4 threads upload bundles received over the last 20 days while
    another moves the day on and refreshes the trends as the first sort=trend request of a day does,
    so writers meet rows as of an older day, as of today and just refreshed, and writers of two
    different days meet on one row. No upload fails, and every stored trend is exact as of its day."""
    t0 = today[0]
    errors: list[BaseException] = []
    done = threading.Event()

    def uploader(k):
        try:
            for i, case in enumerate((FAILURE_CASES * 3)[k::4]):
                back = (i * 7 + k * 3) % 20
                assert store.ingest(db, bundle_from_case(case), received_at=at(today[0] - dt.timedelta(days=back))
                                    ).status == 201
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def days_go_by():
        try:
            while not done.is_set():
                today[0] += dt.timedelta(days=1)
                with db.write_lock(), db.Session() as s, s.begin():
                    counts.refresh_trends(s)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    ups = [threading.Thread(target=uploader, args=(k,)) for k in range(4)]
    clock = threading.Thread(target=days_go_by)
    for t in [clock, *ups]:
        t.start()
    for t in ups:
        t.join(120)
    done.set()
    clock.join(60)
    assert not errors, ["".join(traceback.format_exception(e)) for e in errors]
    assert today[0] > t0
    assert_consistent(db)
    check_trend_order(db)


# -- search --------------------------------------------------------------------------------------

QUERIES = ["cuda", "CUDA", "Cuda0", "kv", "kv cache", "%", "_", "\\", "%_", "a", "ab", "b6", "llama.cpp", "rtx",
           "rtx 3090", "geforce rtx 3060", "gguf", "ü", "Ü", "é", "q4_k", "weird_%", "100%", "back\\slash",
           "insufficient", "failed to allocate", "out of memory", "zzz-none", "metal", "vulkan", " ", "a_b"]


def _old_search(q: str):
    """The match of ``q`` before migration 0007 (a LIKE over every cluster's title and key, and an
    EXISTS over its facets of three kinds): the reference the new one must equal."""
    f = ClusterFacet
    return or_(func.lower(Cluster.title).like(_like(q), escape="\\"), func.lower(Cluster.key).like(_like(q), escape="\\"),
               exists().where(f.cluster_id == Cluster.id, f.kind.in_(("model", "error", "gpu")),
                              func.lower(f.value).like(_like(q), escape="\\")))


def _searchable(db):
    for case in FAILURE_CASES:
        store.ingest(db, bundle_from_case(case))
    odd_names = ["Weird_%Model-Q4_K_M.gguf", "back\\slash-ÜBER-café.gguf", "a_b 100% sure.gguf", "plain.gguf"]
    for i, name in enumerate(odd_names):
        store.ingest(db, minimal_bundle(
            model={"file_name": name},
            devices=[{"backend": "cuda", "index": 0, "name": ["NVIDIA GeForce RTX 3090", "Émigré GPU"][i % 2],
                      "total_mib": 24576.0, "free_mib": 1000.0, "source": "test"}],
            engine={"name": "llama.cpp", "version": f"b{6000 + i}", "build_number": 6000 + i}))


def test_search_finds_exactly_what_the_like_match_found(db):
    _searchable(db)
    with db.Session() as s:
        found_any = 0
        for q in QUERIES:
            for filters in ({}, {"engine": "llama.cpp"}, {"sort": "trend"}):
                items, total = list_clusters(s, q=q, per_page=1000, db=db, **filters)
                order = {"trend": [Cluster.trend.desc(), Cluster.count.desc()]}.get(
                    filters.get("sort"), [Cluster.count.desc(), Cluster.last_seen.desc()])
                conds = [Cluster.count > 0, _old_search(q)] + (
                    [Cluster.engine == filters["engine"]] if "engine" in filters else [])
                want = list(s.execute(select(Cluster.id).where(*conds).order_by(*order, Cluster.id)).scalars())
                assert [i["id"] for i in items] == want, (q, filters)
                assert total == len(want), (q, filters)
                found_any += bool(want)
                for page in (2, 3):  # a later page, and one past the last: the same number of matches
                    items, total = list_clusters(s, q=q, per_page=2, page=page, db=db, **filters)
                    assert ([i["id"] for i in items], total) == (want[2 * page - 2:2 * page], len(want)), (q, page)
    assert found_any > len(QUERIES)  # the queries do find clusters


def test_filter_choices_in_one_scan_equal_the_four_queries(db):
    from kvreport_server.queries import filter_choices

    _searchable(db)
    with db.Session() as s:
        old = {name: list(s.execute(select(col).where(Cluster.count > 0, col.is_not(None)).distinct().order_by(col))
                          .scalars())
               for name, col in (("engine", Cluster.engine), ("backend", Cluster.backend), ("phase", Cluster.phase),
                                 ("verdict", Cluster.verdict))}
        assert filter_choices(s) == old
        assert sum(map(len, old.values())) > 5


def _plan(s, stmt) -> str:
    compiled = stmt.compile(dialect=s.get_bind().dialect, compile_kwargs={"literal_binds": True})
    prefix = "EXPLAIN " if s.get_bind().dialect.name == "postgresql" else "EXPLAIN QUERY PLAN "
    return "\n".join(" ".join(map(str, r)) for r in s.execute(text(prefix + str(compiled).replace("%%", "%"))))


def test_trend_order_and_search_read_indexes(db):
    """The page queries can read the indexes of migration 0007 (planner costs on a tiny table prefer a
    scan, so PostgreSQL is told to avoid scans and sorts where it can): sort=trend walks
    ix_clusters_trend without a sort; on PostgreSQL each branch of q can be a trigram index scan (the
    facet kinds written inline prove the partial index's predicate)."""
    from kvreport_server.queries import _search

    _searchable(db)
    with db.Session() as s:
        pg = s.get_bind().dialect.name == "postgresql"
        if pg:
            s.execute(text("SET LOCAL enable_seqscan = off"))
            s.execute(text("SET LOCAL enable_sort = off"))
        by_trend = _plan(s, select(Cluster).where(Cluster.count > 0)
                         .order_by(Cluster.trend.desc(), Cluster.count.desc(), Cluster.id).limit(50))
        assert "ix_clusters_trend" in by_trend and "TEMP B-TREE" not in by_trend and "Sort" not in by_trend, by_trend
        if pg:  # (without the facets' other indexes, which a tiny table's estimates favour; rolled back)
            s.execute(text("DROP INDEX ix_cluster_facets_kind_value"))
            s.execute(text("ALTER TABLE cluster_facets DROP CONSTRAINT cluster_facets_pkey"))
            search = _plan(s, select(Cluster.id).where(_search("cuda", "postgresql")))
            for name in ("ix_clusters_title_trgm", "ix_clusters_key_trgm", "ix_cluster_facets_value_trgm"):
                assert name in search, search


def test_a_write_on_a_trend_that_no_longer_holds_sums_it_again(db, today):
    """No sort=trend request on the new day: the upload finds the stored trend past its last day (the
    bundle of 6 days ago moved to last week) and sums the cluster's days again, in the same transaction."""
    t0 = today[0]
    store.ingest(db, bundle_from_case(DISTINCT[0]), received_at=at(t0 - dt.timedelta(days=6)))
    with db.Session() as s:
        assert s.execute(select(Cluster.trend, Cluster.trend_day, Cluster.trend_until)).one() == (1, t0, t0)
    today[0] = t0 + dt.timedelta(days=1)
    store.ingest(db, bundle_from_case(DISTINCT[0]), received_at=at(today[0]))
    with db.Session() as s:  # -1 (last week) + 1 (today), holding until the older bundle leaves, 7 days on
        assert s.execute(select(Cluster.trend, Cluster.trend_day, Cluster.trend_until)).one() == (
            0, today[0], today[0] + dt.timedelta(days=6))
    assert_consistent(db)
