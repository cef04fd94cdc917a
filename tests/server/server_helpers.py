"""Bundles for the server tests, made from the real shared cases (log + command + case facts)."""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from kvreport.bundle import SCHEMA_ID, new_bundle_id, validate_bundle
from kvreport.excerpt import Excerpt

PG_ADMIN = os.environ.get("KVREPORT_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _psycopg_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


def create_pg_database(prefix: str = "kvr_test") -> str:
    """Create a database with a random name; return its SQLAlchemy URL (fails the test if PG is down)."""
    import psycopg

    name = f"{prefix}_{secrets.token_hex(6)}"
    try:
        with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL at {PG_ADMIN} cannot be reached: {exc}", pytrace=False)
    return _psycopg_url(PG_ADMIN.rsplit("/", 1)[0] + "/" + name)


def drop_pg_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


ROOT = Path(__file__).resolve().parents[2]
from tests.paths import CASE_DIR  # noqa: E402


def case_path(name: str) -> Path:
    return CASE_DIR / name


def bundle_from_case(name: str, **overrides) -> dict:
    """A minimal valid bundle from a shared case: its log excerpt, command line and device facts."""
    case = case_path(name)
    facts = json.loads((case / "case.json").read_text()) if (case / "case.json").is_file() else {}
    excerpt = Excerpt()
    with open(case / "log.txt", encoding="utf-8", errors="replace") as fh:
        excerpt.feed_all(fh)
    command = (case / "command.txt").read_text().strip() if (case / "command.txt").is_file() else None
    devices = []
    for i, d in enumerate(facts.get("devices") or []):
        if isinstance(d, dict):
            devices.append({"backend": facts.get("backend"), "index": i, "name": d.get("name"),
                            "total_mib": d.get("total_mib"), "free_mib": d.get("free_mib"), "source": "case"})
    bundle = {
        "schema": SCHEMA_ID,
        "id": new_bundle_id(),
        "created_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "collector": {"name": "kvreport", "version": "test"},
        "host": {"os": "Linux", "cpu_model": f"test cpu for {name}", "ram_total_mib": 64000.0},
        "devices": devices,
        "engine": {"name": facts.get("engine")},
        "command": {"line": command} if command else {},
        "model": {"file_name": (facts.get("model") or {}).get("file")} if isinstance(facts.get("model"), dict) else None,
        "log": excerpt.to_log("log.txt"),
        "redactions": {},
    }
    bundle.update(overrides)
    return validate_bundle(bundle)


def minimal_bundle(**overrides) -> dict:
    bundle = {
        "schema": SCHEMA_ID,
        "id": new_bundle_id(),
        "created_at": "2026-11-30T01:02:03Z",
        "host": {"os": "Linux"},
        "engine": {"name": "llama.cpp", "version": "b6000", "build_number": 6000},
        "log": {"line_count": 2, "truncated": False, "source": "test",
                "lines": [[1, "llama_kv_cache: failed to allocate buffer for kv cache"],
                          [2, "llama_init_from_model: failed to initialize the context"]]},
    }
    bundle.update(overrides)
    return bundle


FAILURE_CASES = [
    "loc-15-fail-huge-ctx-fit-default",
    "loc-17-fail-huge-ctx-verbose",
    "loc-21-fail-ulimit-kv-600000",
    "loc-23-fail-ulimit-compute-after-kv-800000",
    "loc-29-fail-np256-no-kv-unified-c4096",
    "loc-41-neg-ulimit-weights-buffer-no-mmap-150000",
    "pub-001-llamacpp-cpu-1m-ctx-kv-128gib",
    "pub-016-llamacpppython-cuda-5gpu-compute-buffer-small-gpu",
]


def scan(db) -> dict:
    """True when every cluster's counters (count, machines, facets, days, first/last seen, build range,
    first version, the stored trend as of its day), the facet totals and the bundles per engine build
    equal what a full scan of the bundles table gives (else the two views, for the assertion message)."""
    from sqlalchemy import select

    from kvreport_server import analysis, store
    from kvreport_server.models import Bundle, Cluster, ClusterDay, ClusterFacet, EngineBuild, FacetTotal

    with db.Session() as s:
        rows = s.execute(select(Bundle)).scalars().all()
        totals = Counter()
        for b in rows:
            totals.update(store.counted_facets(b))
            assert b.facet_keys is None or set(map(tuple, b.facet_keys)) == analysis.facets(b.data, b.diagnosis)
        got_totals = Counter({(t.kind, t.value): t.count for t in s.execute(select(FacetTotal)).scalars()})
        if +totals != got_totals:
            return {"facet_totals": (got_totals, totals)}
        builds = Counter((b.engine_name, b.build_number) for b in rows
                         if b.engine_name is not None and b.build_number is not None)
        got_builds = Counter({(e.engine, e.build_number): e.count for e in s.execute(select(EngineBuild)).scalars()})
        if builds != got_builds:
            return {"engine_builds": (got_builds, builds)}
        expect = defaultdict(lambda: {"count": 0, "machines": set(), "facets": Counter(), "days": Counter(),
                                      "first": None, "last": None, "builds": set(), "first_rows": []})
        for b in rows:
            e = expect[b.cluster_id]
            e["count"] += 1
            if b.machine:
                e["machines"].add(b.machine)
            e["facets"].update(store.counted_facets(b))
            t = store.as_utc(b.received_at)
            e["days"][t.date()] += 1
            e["first"] = min(e["first"] or t, t)
            e["last"] = max(e["last"] or t, t)
            if b.build_number is not None:
                e["builds"].add(b.build_number)
        for b in rows:  # the engine versions of a cluster's earliest bundles (ties: any of them)
            e = expect[b.cluster_id]
            if store.as_utc(b.received_at) == e["first"]:
                e["first_rows"].append(b.engine_version)
        got = {}
        for c in s.execute(select(Cluster)).scalars():
            facets = Counter({(f.kind, f.value): f.count for f in
                              s.execute(select(ClusterFacet).where(ClusterFacet.cluster_id == c.id)).scalars()})
            days = Counter({d.day: d.count for d in
                            s.execute(select(ClusterDay).where(ClusterDay.cluster_id == c.id)).scalars()})
            e = expect.get(c.id)
            # first version: b<lowest build>, else the engine version of the earliest bundle
            version_ok = e is None or (c.first_version == f"b{min(e['builds'])}" if e["builds"]
                                       else c.first_version in e["first_rows"])
            got[c.id] = (c.count, c.machines, facets, days, store.as_utc(c.first_seen), store.as_utc(c.last_seen),
                         c.min_build, c.max_build, version_ok)
    want = {cid: (e["count"], len(e["machines"]), e["facets"], e["days"], e["first"], e["last"],
                  min(e["builds"], default=None), max(e["builds"], default=None), True)
            for cid, e in expect.items()}
    for cid, val in got.items():
        if cid not in want:
            assert val[0] == 0 and not val[2] and not val[3], f"empty cluster {cid} keeps counts"
    if {cid: v for cid, v in got.items() if v[0]} != want:
        return (got, want)
    bad_trends = trend_errors(db, {cid: e["days"] for cid, e in expect.items()})
    return {"trend": bad_trends} if bad_trends else True


def trend_of(days: Counter, as_of: dt.date) -> int:
    """A cluster's trend as of ``as_of`` from its bundles per day: the last 7 days minus the 7 before."""
    return (sum(n for d, n in days.items() if as_of - dt.timedelta(days=7) < d <= as_of)
            - sum(n for d, n in days.items() if as_of - dt.timedelta(days=14) < d <= as_of - dt.timedelta(days=7)))


def trend_errors(db, days: dict[int, Counter]) -> dict:
    """Clusters whose stored trend (migration 0007) is not, on some day from its ``trend_day`` through its
    ``trend_until`` (40 days on when that is NULL: for good), their trend on that day computed from
    ``days`` (their bundles per day); or, with no ``trend_day`` (never counted), not 0 with no bundle:
    ``{id: (stored trend, day, expected)}``."""
    from sqlalchemy import select

    from kvreport_server.models import Cluster

    bad = {}
    with db.Session() as s:
        for cid, trend, since, until in s.execute(select(Cluster.id, Cluster.trend, Cluster.trend_day,
                                                         Cluster.trend_until)):
            mine = days.get(cid, Counter())
            if since is None:
                if trend != 0 or until is not None or +mine:
                    bad[cid] = (trend, None, sorted(mine.items()))
                continue
            last = until if until is not None else since + dt.timedelta(days=40)
            for n in range((last - since).days + 1):
                day = since + dt.timedelta(days=n)
                if trend != trend_of(mine, day):
                    bad[cid] = (trend, day, trend_of(mine, day))
                    break
    return bad


def assert_consistent(db):
    result = scan(db)
    assert result is True, result


def post_big(base: str, size: int, token: str, chunked: bool = False, path: str = "/api/v1/bundles"):
    """POST ``size`` bytes of filler to ``base + path`` (Content-Length, or chunked), going on
    after the server has answered; returns (status, Content-Type, parsed JSON body or text)."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(base)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=60)
    try:
        conn.putrequest("POST", path)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Authorization", f"Bearer {token}")
        conn.putheader("Transfer-Encoding" if chunked else "Content-Length", "chunked" if chunked else str(size))
        conn.endheaders()
        block = b"x" * 2**20
        sent = 0
        try:
            while sent < size:
                n = min(len(block), size - sent)
                conn.send(b"%x\r\n%s\r\n" % (n, block[:n]) if chunked else block[:n])
                sent += n
            if chunked:
                conn.send(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before the whole body was sent
        resp = conn.getresponse()
        text = resp.read().decode("utf-8", "replace")
        try:
            body = json.loads(text)
        except ValueError:
            body = text
        return resp.status, resp.getheader("Content-Type"), body
    finally:
        conn.close()
