"""Server scale bench (issue 7): load N bundles (default 200,000) over S signatures (default 2,000)
into a fresh PostgreSQL database, then time the clusters page and cluster pages over HTTP.

    .venv/bin/python bench/bench_server_load.py [--bundles 200000] [--signatures 2000] [--requests 200] [--sqlite]

Bundles are made from the shared real cases (their log excerpts, commands, devices) and diagnosed
once per case with the real analyzer; each generated bundle gets its own id, machine, GPU, model,
engine build, n_ctx and received time, and a signature drawn Zipf-like from S keys (the real keys
of the cases, fanned out with a variant suffix to reach S). Rows, counters, facets and per-day
counts are bulk-loaded with the same functions the upload path uses (analysis.bundle_facts /
facets); tests/server/test_store.py checks that the upload path's counters equal a full scan.
The stored trends (migration 0007) are then filled by the day's trend refresh with every cluster
stale, its worst case (``trend_refresh_all_ms``; ``trend_refresh_next_day_ms``: the refresh of the next
day, rolled back), and checked against a sum over ``cluster_days``
(``trend_mismatches``); the bench's searches through ``list_clusters`` are checked against the
LIKE/EXISTS match they replaced (``search_mismatches``). Pages are served by waitress in this process
on 127.0.0.1 and fetched with requests, one at a time. Writes bench/out/server_load_<database>_<bundles>.json. Loopback only; the database is dropped at the end
(--keep to keep it).
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import random
import secrets
import statistics
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "server"), str(ROOT)]

import psycopg  # noqa: E402
import requests  # noqa: E402
from sqlalchemy import create_engine, insert, text  # noqa: E402

from kvreport_server import analysis, create_app, migrate  # noqa: E402
from kvreport_server.db import Database  # noqa: E402
from kvreport_server.models import Bundle, Cluster, ClusterDay, ClusterFacet  # noqa: E402

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
GPUS = ["NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 3060", "NVIDIA A100-SXM4-80GB",
        "NVIDIA H100 80GB HBM3", "NVIDIA L40S", "AMD Radeon RX 7900 XTX", "AMD Radeon RX 6800 XT",
        "Intel Arc A770", "Apple M2 Max", "NVIDIA GeForce RTX 2060", "NVIDIA RTX A6000"]
MODELS = ["Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", "Qwen2.5-32B-Instruct-Q5_K_M.gguf", "gemma-2-27b-it-Q6_K.gguf",
          "DeepSeek-V2-Lite-Chat.Q8_0.gguf", "Mistral-Nemo-Instruct-2407-Q8_0.gguf", "gpt-oss-120b-mxfp4.gguf",
          "GLM-4.5-Air-Q4_K_M.gguf", "Llama-3.3-70B-Instruct-IQ4_XS.gguf"]
CTX = [2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144]
LOG_KEEP = 40  # lines of each case's excerpt kept around the failure (keeps the table a realistic size)


def templates() -> list[tuple[dict, dict]]:
    from server_helpers import CASE_DIR as SHARED_CASES
    from server_helpers import bundle_from_case

    out = []
    for case in sorted(p.name for p in SHARED_CASES.iterdir() if (p / "log.txt").is_file()):
        b = bundle_from_case(case)
        diag = analysis.diagnose(b)
        lines = b["log"]["lines"]
        b["log"]["lines"] = lines[-LOG_KEEP:]
        out.append((b, diag))
    return out


def make_keys(tmpls, n: int) -> list[tuple[int, str, str]]:
    """n signature keys: (template index, key, title)."""
    keys = []
    base = [(i, d["signature"]["key"], d["signature"]["title"]) for i, (_b, d) in enumerate(tmpls)]
    j = 0
    while len(keys) < n:
        i, key, title = base[j % len(base)]
        variant = j // len(base)
        keys.append((i, key if variant == 0 and key not in {k for _i, k, _t in keys} else f"{key}/v{variant:04d}-{i}",
                     title if variant == 0 else f"{title} (variant {variant})"))
        j += 1
    return keys


def generate(tmpls, keys, n_bundles: int, rng: random.Random, now: dt.datetime):
    from kvreport.bundle import new_bundle_id

    weights = [1.0 / (k + 1) ** 0.9 for k in range(len(keys))]
    picks = rng.choices(range(len(keys)), weights=weights, k=n_bundles)
    machines = [secrets.token_hex(8) for _ in range(max(50, n_bundles // 20))]
    for pick in picks:
        ti, key, title = keys[pick]
        b, d = tmpls[ti]
        b = copy.copy(b)
        build = rng.randint(5000, 7000)
        b["id"] = new_bundle_id()
        b["engine"] = {**(b.get("engine") or {}), "version": f"b{build}", "build_number": build}
        gpu = GPUS[(pick + rng.randint(0, 2)) % len(GPUS)]
        b["devices"] = [{"backend": d["failure"].get("backend") or "cuda", "index": 0, "name": gpu,
                         "total_mib": 24576.0, "free_mib": float(rng.randint(1000, 24000)), "source": "bench"}]
        b["host"] = {**b["host"], "cpu_model": rng.choice(machines)}
        b["model"] = {"file_name": MODELS[(pick + rng.randint(0, 1)) % len(MODELS)]}
        b["command"] = {**(b.get("command") or {}), "flags": {"n_ctx": rng.choice(CTX)}}
        diag = {**d, "signature": {**d["signature"], "key": key, "title": title}}
        received = now - dt.timedelta(seconds=rng.randint(0, 60 * 86400))
        yield b, diag, received


def bulk_load(db: Database, tmpls, keys, n_bundles: int, seed: int = 7) -> dict:
    rng = random.Random(seed)
    now = dt.datetime.now(dt.timezone.utc)
    t0 = time.perf_counter()
    cluster_ids = {}
    with db.engine.begin() as conn:
        for n, (ti, key, title) in enumerate(keys, start=1):
            d = tmpls[ti][1]
            f = d["failure"]
            conn.execute(insert(Cluster.__table__).values(
                id=n, scheme=1, key=key, signature_id=f"bench{n}", title=title, engine=d.get("engine"),
                phase=f.get("phase"), backend=f.get("backend"), verdict=f.get("verdict"), count=0, machines=0,
                status="new"))
            cluster_ids[key] = n
    agg = defaultdict(lambda: {"count": 0, "first": None, "last": None, "lo": None, "hi": None})
    facets: Counter = Counter()
    days: Counter = Counter()
    machines = defaultdict(set)
    batch = []
    loaded = 0
    for b, diag, received in generate(tmpls, keys, n_bundles, rng, now):
        cid = cluster_ids[diag["signature"]["key"]]
        facts = analysis.bundle_facts(b, diag)
        batch.append(dict(id=b["id"], cluster_id=cid, content_hash=analysis.content_hash(b), data=b, diagnosis=diag,
                          analyzer_version=str(diag.get("analyzer_version")), created_at=b["created_at"],
                          received_at=received, size_bytes=0, token_id=None, **facts))
        a = agg[cid]
        a["count"] += 1
        a["first"] = min(a["first"] or received, received)
        a["last"] = max(a["last"] or received, received)
        bn = facts["build_number"]
        a["lo"] = bn if a["lo"] is None else min(a["lo"], bn)
        a["hi"] = bn if a["hi"] is None else max(a["hi"], bn)
        for kind, value in analysis.facets(b, diag):
            facets[(cid, kind, value)] += 1
            if kind == "machine":
                machines[cid].add(value)
        days[(cid, received.date())] += 1
        if len(batch) >= 2000:
            with db.engine.begin() as conn:
                conn.execute(insert(Bundle.__table__), batch)
            loaded += len(batch)
            batch = []
            print(f"\rloaded {loaded}/{n_bundles}", end="", file=sys.stderr, flush=True)
    if batch:
        with db.engine.begin() as conn:
            conn.execute(insert(Bundle.__table__), batch)
    from sqlalchemy import update

    with db.engine.begin() as conn:
        for cid, a in agg.items():
            conn.execute(update(Cluster.__table__).where(Cluster.__table__.c.id == cid).values(
                count=a["count"], first_seen=a["first"], last_seen=a["last"], min_build=a["lo"], max_build=a["hi"],
                first_version=f"b{a['lo']}", machines=len(machines[cid])))
        rows = [{"cluster_id": c, "kind": k, "value": v, "count": n} for (c, k, v), n in facets.items()]
        for i in range(0, len(rows), 5000):
            conn.execute(insert(ClusterFacet.__table__), rows[i:i + 5000])
        drows = [{"cluster_id": c, "day": d, "count": n} for (c, d), n in days.items()]
        for i in range(0, len(drows), 5000):
            conn.execute(insert(ClusterDay.__table__), drows[i:i + 5000])
        # the counters over all bundles, as migrations 0004 and 0006 fill them
        conn.exec_driver_sql("INSERT INTO facet_totals (kind, value, count) "
                             "SELECT kind, value, SUM(count) FROM cluster_facets GROUP BY kind, value")
        conn.exec_driver_sql("INSERT INTO engine_builds (engine, build_number, count) "
                             "SELECT engine_name, build_number, count(*) FROM bundles WHERE engine_name IS NOT NULL "
                             "AND build_number IS NOT NULL GROUP BY engine_name, build_number")
        if conn.dialect.name == "postgresql":  # (SQLite's INTEGER PRIMARY KEY follows max(id) by itself)
            conn.exec_driver_sql(f"SELECT setval('clusters_id_seq', {len(keys)})")
        conn.exec_driver_sql("ANALYZE")
    print(file=sys.stderr)
    return {"load_s": round(time.perf_counter() - t0, 1), "clusters_used": len(agg), "facet_rows": len(facets),
            "day_rows": len(days)}


def fill_trends(db: Database) -> dict:
    """The stored trends (migration 0007) of the bulk-loaded clusters, filled by the refresh that the first
    ``sort=trend`` request of a day runs, with every cluster stale (``trend_refresh_all_ms``: its worst
    case), then the refresh a next day would run, timed and rolled back (``trend_refresh_next_day_ms``,
    ``_rows``: only the clusters whose trend changes that day). Checks the stored trends against the sum
    over ``cluster_days`` that ``/?sort=trend`` ordered by before (``trend_mismatches``: 0 expected), and
    vacuums ``clusters`` on PostgreSQL as autovacuum would after those updates."""
    from sqlalchemy import case, func, select

    from kvreport_server import counts

    with db.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE clusters SET trend_until = '2000-01-01'")
        conn.exec_driver_sql("ANALYZE clusters")
    t0 = time.perf_counter()
    with db.Session() as s, s.begin():
        rows = counts.refresh_trends(s)
    out = {"trend_refresh_all_ms": round((time.perf_counter() - t0) * 1000, 1), "trend_refresh_all_rows": rows}
    today = counts.utc_today()
    d = ClusterDay
    summed = (select(d.cluster_id.label("cid"),
                     func.sum(case((d.day > today - dt.timedelta(days=7), d.count), else_=-d.count)).label("trend"))
              .where(d.day > today - dt.timedelta(days=14), d.day <= today).group_by(d.cluster_id).subquery())
    with db.engine.connect() as conn:
        out["trend_mismatches"] = conn.execute(
            select(func.count()).select_from(Cluster).outerjoin(summed, summed.c.cid == Cluster.id)
            .where(Cluster.trend != func.coalesce(summed.c.trend, 0))).scalar_one()
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE clusters" if db.engine.dialect.name == "postgresql" else "ANALYZE")
    with db.Session() as s:
        t0 = time.perf_counter()
        out["trend_refresh_next_day_rows"] = counts.refresh_trends(s, today + dt.timedelta(days=1))
        out["trend_refresh_next_day_ms"] = round((time.perf_counter() - t0) * 1000, 1)
        s.rollback()
    return out


SEARCHES = ["cuda", "gemma", "insufficient", "rtx 3090"]


def search_check(db: Database) -> int:
    """The clusters each search of the bench finds through ``list_clusters`` (trigram indexes on
    PostgreSQL) against the LIKE/EXISTS match it used before: the number of searches that differ (0 expected)."""
    from sqlalchemy import exists, func, or_, select

    from kvreport_server.queries import _like, list_clusters

    bad = 0
    with db.Session() as s:
        for q in SEARCHES:
            f = ClusterFacet
            old = select(Cluster.id).where(Cluster.count > 0, or_(
                func.lower(Cluster.title).like(_like(q), escape="\\"), func.lower(Cluster.key).like(_like(q), escape="\\"),
                exists().where(f.cluster_id == Cluster.id, f.kind.in_(("model", "error", "gpu")),
                               func.lower(f.value).like(_like(q), escape="\\")))).order_by(
                Cluster.count.desc(), Cluster.last_seen.desc(), Cluster.id)
            want = list(s.execute(old).scalars())
            items, total = list_clusters(s, q=q, per_page=50)
            bad += (total != len(want) or [i["id"] for i in items] != want[:50])
    return bad


def timed(session: requests.Session, url: str) -> float:
    t = time.perf_counter()
    r = session.get(url, timeout=60)
    elapsed = (time.perf_counter() - t) * 1000
    if r.status_code != 200:
        raise SystemExit(f"{url}: HTTP {r.status_code}")
    return elapsed


def stats(ms: list[float]) -> dict:
    s = sorted(ms)
    return {"n": len(s), "median_ms": round(statistics.median(s), 1),
            "p95_ms": round(s[min(len(s) - 1, int(0.95 * len(s)))], 1), "max_ms": round(s[-1], 1)}


def regression_costs(url: str, n: int) -> dict:
    """The regression view's "bundles from earlier builds" for the 10 clusters whose first build is the
    newest (its worst case): the sum over ``engine_builds`` the page reads, and, as the baseline in the
    same run, the count over ``bundles`` it read before migration 0006. Milliseconds per query."""
    engine = create_engine(url)
    with engine.connect() as conn:
        newest = conn.execute(text("SELECT engine, min_build FROM clusters WHERE min_build IS NOT NULL "
                                   "ORDER BY min_build DESC LIMIT 10")).fetchall()
        out = {}
        for label, sql in (("regression_engine_builds", "SELECT coalesce(sum(count), 0) FROM engine_builds "
                                                        "WHERE engine = :e AND build_number < :b"),
                           ("regression_count_bundles", "SELECT count(*) FROM bundles "
                                                        "WHERE engine_name = :e AND build_number < :b")):
            ms = []
            q = text(sql)
            for i in range(n):
                e, b = newest[i % len(newest)]
                t0 = time.perf_counter()
                conn.execute(q, {"e": e, "b": b}).fetchone()
                ms.append((time.perf_counter() - t0) * 1000)
            out[label] = stats(ms)
    engine.dispose()
    return out


def db_size_mib(url: str, sqlite_path: Path | None) -> float:
    if sqlite_path is not None:
        return round(sqlite_path.stat().st_size / 2**20, 1)
    with psycopg.connect(url.replace("+psycopg", "")) as conn:
        return round(conn.execute("SELECT pg_database_size(current_database())").fetchone()[0] / 2**20, 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundles", type=int, default=200_000)
    ap.add_argument("--signatures", type=int, default=2_000)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--keep", action="store_true", help="keep the database")
    ap.add_argument("--reuse", metavar="NAME", help="time the pages of a database kept by an earlier --keep run")
    ap.add_argument("--sqlite", action="store_true", help="a SQLite file under bench/out instead of PostgreSQL")
    args = ap.parse_args(argv)

    name = args.reuse or f"kvr_bench_{secrets.token_hex(4)}"
    sqlite_path = (ROOT / "bench" / "out" / f"{name}.sqlite3") if args.sqlite else None
    if sqlite_path is not None:
        sqlite_path.parent.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{sqlite_path}"
    else:
        if not args.reuse:
            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
        url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    result = {"bundles": args.bundles, "signatures": args.signatures,
              "database": "sqlite" if sqlite_path is not None else "postgresql"}
    if args.keep or args.reuse:
        print(f"database {name} is kept", file=sys.stderr)
    try:
        if not args.reuse:
            migrate.upgrade(url)
            db = Database(url)
            tmpls = templates()
            keys = make_keys(tmpls, args.signatures)
            result.update(bulk_load(db, tmpls, keys, args.bundles))
            result.update(fill_trends(db))
            db.dispose()
        db = Database(url)
        result["search_mismatches"] = search_check(db)
        db.dispose()
        result["db_size_mib"] = db_size_mib(url, sqlite_path)
        app = create_app({"DATABASE_URL": url, "LOG_REQUESTS": False, "SECRET_KEY": "bench"})
        from waitress import create_server

        server = create_server(app, host="127.0.0.1", port=0, threads=4)
        threading.Thread(target=server.run, daemon=True).start()
        base = f"http://127.0.0.1:{server.effective_port}"
        s = requests.Session()
        rng = random.Random(11)
        eng = create_engine(url)
        with eng.connect() as conn:  # the regression view's worst case
            newest = [r[0] for r in conn.execute(text("SELECT id FROM clusters WHERE min_build IS NOT NULL "
                                                      "ORDER BY min_build DESC LIMIT 10"))]
        eng.dispose()
        for _ in range(10):  # warm-up
            timed(s, base + "/")
            timed(s, f"{base}/clusters/{rng.randint(1, args.signatures)}")
        pages = {
            "clusters_page": lambda i: f"{base}/?page={1 + i % 5}",
            "clusters_page_trend": lambda i: f"{base}/?sort=trend",
            "clusters_page_search": lambda i: f"{base}/?q={SEARCHES[i % 4]}",
            "clusters_api": lambda i: f"{base}/api/v1/clusters?per_page=50&page={1 + i % 5}",
            "cluster_page": lambda i: f"{base}/clusters/{rng.randint(1, args.signatures)}",
            "cluster_page_biggest": lambda i: f"{base}/clusters/{1 + i % 10}",
            "cluster_page_newest_build": lambda i: f"{base}/clusters/{newest[i % len(newest)]}",
        }
        for label, make_url in pages.items():
            result[label] = stats([timed(s, make_url(i)) for i in range(args.requests)])
            print(f"{label:24s} {result[label]}", file=sys.stderr)
        s.close()  # (the keep-alive connection first: closing the server under it makes waitress log a traceback)
        server.close()
        app.extensions["kvreport_db"].dispose()
        for label, figures in regression_costs(url, args.requests).items():
            result[label] = figures
            print(f"{label:24s} {figures}", file=sys.stderr)
        result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        if args.keep or args.reuse:
            pass
        elif sqlite_path is not None:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{sqlite_path}{suffix}").unlink(missing_ok=True)
        else:
            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"server_load_{result['database']}_{args.bundles}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
