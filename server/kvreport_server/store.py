"""Storage of bundles: the one transaction that inserts a bundle and updates its cluster.

:func:`ingest` inserts the bundle row and, in the same transaction, creates or finds the cluster
of its signature and bumps the cluster's counters, first/last seen, build range, facet counts and
per-day count. A bundle acknowledged by the API is committed; a failure rolls back everything.
:func:`delete_bundle` and :func:`reanalyze` undo and redo those counts the same way, so counters
always equal what a full scan of ``bundles`` would give (``tests/server/test_store.py`` checks).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from collections.abc import Callable

from sqlalchemy import case, delete, func, insert, or_, select, tuple_, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kvreport_server import analysis
from kvreport_server.db import Database
from kvreport_server.errors import ApiError
from kvreport_server.models import Bundle, Cluster, ClusterDay, ClusterFacet, FacetTotal, utcnow


@dataclasses.dataclass
class IngestResult:
    status: int          # 201 stored now, 200 already stored with the same content
    bundle_id: str
    cluster: Cluster
    diagnosis: dict


def _insert(session: Session):
    return pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert


def as_utc(value: dt.datetime | None) -> dt.datetime | None:
    """SQLite gives naive datetimes back: they are UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=dt.timezone.utc)
    return value


def ensure_cluster(session: Session, sig: dict, diagnosis: dict) -> int:
    """The id of the cluster for ``sig`` (``analysis.signature_of``), created if needed (race-safe)."""
    failure = diagnosis.get("failure") or {}
    values = {
        "scheme": sig["scheme"], "key": sig["key"], "signature_id": sig["id"], "title": sig["title"],
        "engine": analysis._cut(diagnosis.get("engine"), 40), "phase": analysis._cut(failure.get("phase"), 40),
        "backend": analysis._cut(failure.get("backend"), 40), "verdict": analysis._cut(failure.get("verdict"), 40),
        "count": 0, "machines": 0, "status": "new",
    }
    stmt = _insert(session)(Cluster.__table__).values(**values).on_conflict_do_nothing(
        index_elements=["scheme", "key"])
    session.execute(stmt)
    return session.execute(
        select(Cluster.id).where(Cluster.scheme == sig["scheme"], Cluster.key == sig["key"])).scalar_one()


def _upsert_count(session: Session, table, keys: dict, delta: int) -> int:
    stmt = _insert(session)(table).values(**keys, count=delta)
    stmt = stmt.on_conflict_do_update(index_elements=list(keys), set_={"count": table.c.count + delta})
    return session.execute(stmt.returning(table.c.count)).scalar_one()


def _counter_updates(t: dt.datetime, build: int | None, version: str | None, verdict: str | None = None) -> dict:
    """SET clauses that add one bundle received at ``t`` (engine build ``build``) to a cluster row."""
    c = Cluster.__table__.c
    return dict(
        count=c.count + 1,
        first_seen=case((c.first_seen.is_(None), t), (c.first_seen > t, t), else_=c.first_seen),
        last_seen=case((c.last_seen.is_(None), t), (c.last_seen < t, t), else_=c.last_seen),
        min_build=case((c.min_build.is_(None), build), (c.min_build > build, build), else_=c.min_build)
        if build is not None else c.min_build,
        max_build=case((c.max_build.is_(None), build), (c.max_build < build, build), else_=c.max_build)
        if build is not None else c.max_build,
        first_version=case((c.min_build.is_(None), version), (c.min_build > build, version),
                           else_=c.first_version) if build is not None
        else case((c.first_version.is_(None), version), else_=c.first_version),
        # the verdict is not part of the key (scheme 2): the cluster shows a known one once a bundle has it
        verdict=case(((c.verdict.is_(None)) | (c.verdict == "unknown"), verdict), else_=c.verdict)
        if verdict and verdict != "unknown" else c.verdict,
        updated_at=utcnow(),
    )


def _version_of(build: int | None, engine_version: str | None) -> str | None:
    return f"b{build}" if build is not None else engine_version


def counted_facets(row: Bundle) -> set[tuple[str, str]]:
    """The facet values ``row`` added to the counters: its ``facet_keys``, or for a bundle stored
    before migration 0004 (``facet_keys`` NULL) the original kinds, which were all that was counted."""
    if row.facet_keys is not None:
        return {(str(k), str(v)) for k, v in row.facet_keys}
    return {(k, v) for k, v in analysis.facets(row.data, row.diagnosis) if k in analysis.LEGACY_FACET_KINDS}


def facet_keys_of(bundle_facets: set[tuple[str, str]]) -> list[list[str]]:
    return [[k, v] for k, v in sorted(bundle_facets)]


def _add_totals(session: Session, counts: Counter) -> None:
    """Add ``{(kind, value): n}`` to the over-all-bundles counters (rows at 0 are removed)."""
    tt = FacetTotal.__table__
    ups = [{"kind": k, "value": v, "count": n} for (k, v), n in sorted(counts.items()) if n > 0]
    if ups:
        # one multi-row upsert in a fixed order (no lock-order deadlocks between uploads)
        stmt = _insert(session)(tt).values(ups)
        session.execute(stmt.on_conflict_do_update(index_elements=["kind", "value"],
                                                   set_={"count": tt.c.count + stmt.excluded.count}))
    downs = [((k, v), n) for (k, v), n in sorted(counts.items()) if n < 0]
    for (kind, value), n in downs:
        session.execute(update(tt).where(tt.c.kind == kind, tt.c.value == value).values(count=tt.c.count + n))
    if downs:
        session.execute(delete(tt).where(tt.c.count <= 0, tuple_(tt.c.kind, tt.c.value).in_([kv for kv, _n in downs])))


def _count_facets_and_day(session: Session, cluster_id: int, t: dt.datetime,
                          bundle_facets: set[tuple[str, str]], totals: bool = True) -> None:
    """Add one bundle's facet values, distinct machine and day to a cluster (and, with ``totals``,
    its facet values to the counters over all bundles)."""
    c = Cluster.__table__.c
    new_machines = 0
    if bundle_facets:
        # one multi-row upsert, rows in a fixed order (no lock-order deadlocks between uploads)
        ft = ClusterFacet.__table__
        rows = [{"cluster_id": cluster_id, "kind": k, "value": v, "count": 1} for k, v in sorted(bundle_facets)]
        stmt = _insert(session)(ft).values(rows)
        stmt = stmt.on_conflict_do_update(index_elements=["cluster_id", "kind", "value"],
                                          set_={"count": ft.c.count + 1}).returning(ft.c.kind, ft.c.count)
        new_machines = sum(1 for kind, n in session.execute(stmt) if kind == "machine" and n == 1)
        if totals:
            _add_totals(session, Counter(bundle_facets))
    if new_machines:
        session.execute(update(Cluster.__table__).where(c.id == cluster_id)
                        .values(machines=c.machines + new_machines))
    _upsert_count(session, ClusterDay.__table__, {"cluster_id": cluster_id, "day": t.date()}, 1)


def _count_in(session: Session, cluster_id: int, row: Bundle, bundle_facets: set[tuple[str, str]]) -> None:
    """Add one bundle to an existing cluster's counters (the caller holds the transaction)."""
    t = as_utc(row.received_at)
    updates = _counter_updates(t, row.build_number, _version_of(row.build_number, row.engine_version), row.verdict)
    session.execute(update(Cluster.__table__).where(Cluster.__table__.c.id == cluster_id).values(**updates))
    _count_facets_and_day(session, cluster_id, t, bundle_facets)


def _recount_range(session: Session, cluster_id: int, machines_delta: int = 0) -> None:
    """First/last seen, build range and first version of a cluster from its bundles (after some left)."""
    c = Cluster.__table__.c
    b = Bundle.__table__.c
    first, last, lo, hi = session.execute(
        select(func.min(b.received_at), func.max(b.received_at), func.min(b.build_number), func.max(b.build_number))
        .where(b.cluster_id == cluster_id)).one()
    first_version = None
    if lo is not None:
        first_version = f"b{lo}"
    elif first is not None:
        first_version = session.execute(
            select(b.engine_version).where(b.cluster_id == cluster_id).order_by(b.received_at).limit(1)).scalar()
    session.execute(update(Cluster.__table__).where(c.id == cluster_id).values(
        first_seen=first, last_seen=last, min_build=lo, max_build=hi, first_version=first_version,
        machines=c.machines + machines_delta, updated_at=utcnow()))


def _count_out(session: Session, cluster_id: int, row: Bundle, bundle_facets: set[tuple[str, str]]) -> None:
    """Remove one bundle from a cluster's counters and the totals; call after the row left the cluster."""
    c = Cluster.__table__.c
    session.execute(update(Cluster.__table__).where(c.id == cluster_id).values(count=c.count - 1))
    gone_machines = 0
    ft = ClusterFacet.__table__
    for kind, value in sorted(bundle_facets):
        n = session.execute(
            update(ft).where(ft.c.cluster_id == cluster_id, ft.c.kind == kind, ft.c.value == value)
            .values(count=ft.c.count - 1).returning(ft.c.count)).scalar_one_or_none()
        if n is not None and n <= 0:
            session.execute(delete(ft).where(ft.c.cluster_id == cluster_id, ft.c.kind == kind, ft.c.value == value))
            if kind == "machine":
                gone_machines += 1
    _add_totals(session, Counter({kv: -1 for kv in bundle_facets}))
    dtab = ClusterDay.__table__
    day = as_utc(row.received_at).date()
    session.execute(update(dtab).where(dtab.c.cluster_id == cluster_id, dtab.c.day == day)
                    .values(count=dtab.c.count - 1))
    session.execute(delete(dtab).where(dtab.c.cluster_id == cluster_id, dtab.c.day == day, dtab.c.count <= 0))
    _recount_range(session, cluster_id, -gone_machines)


def root_cluster(session: Session, cluster_id: int, *, lock: bool = False) -> int:
    """The cluster that holds the bundles of ``cluster_id``: itself, or the end of its merged_into chain."""
    seen = set()
    cid = cluster_id
    while cid not in seen and len(seen) < 1000:
        seen.add(cid)
        stmt = select(Cluster.merged_into).where(Cluster.id == cid)
        nxt = session.execute(stmt.with_for_update() if lock else stmt).scalar()
        if nxt is None:
            return cid
        cid = nxt
    raise ApiError(409, f"cluster {cluster_id} is in a merge cycle", code="conflict")


def ingest(db: Database, bundle: dict, *, size_bytes: int = 0, token_id: int | None = None,
           received_at: dt.datetime | None = None, flagged: list[str] | None = None) -> IngestResult:
    """Store a validated bundle; 201 when new, 200 when the same id holds the same content.

    Raises :class:`ApiError` 409 when the id is stored with different content. Safe under
    concurrent uploads of the same id (the loser of the insert race re-reads and answers 200/409).
    """
    digest = analysis.content_hash(bundle)
    existing = _existing(db, bundle["id"], digest)
    if existing is not None:
        return existing
    diagnosis = analysis.diagnose(bundle)
    sig = analysis.signature_of(diagnosis)
    facts, bundle_facets = analysis.facts_and_facets(bundle, diagnosis)
    t = as_utc(received_at or utcnow())
    build = facts["build_number"]
    version = _version_of(build, facts["engine_version"])
    failure = diagnosis.get("failure") or {}
    first = {
        "scheme": sig["scheme"], "key": sig["key"], "signature_id": sig["id"], "title": sig["title"],
        "engine": analysis._cut(diagnosis.get("engine"), 40), "phase": analysis._cut(failure.get("phase"), 40),
        "backend": analysis._cut(failure.get("backend"), 40), "verdict": analysis._cut(failure.get("verdict"), 40),
        "count": 1, "machines": 0, "status": "new", "first_seen": t, "last_seen": t, "min_build": build,
        "max_build": build, "first_version": version, "updated_at": utcnow(),
    }
    try:
        with db.write_lock(), db.Session() as session, session.begin():
            # 1. the cluster row, created or counted in one upsert (this also takes its row lock first,
            #    so concurrent uploads to one cluster queue here and never deadlock)
            ct = Cluster.__table__
            stmt = _insert(session)(ct).values(**first).on_conflict_do_update(
                index_elements=["scheme", "key"], set_=_counter_updates(t, build, version, first["verdict"]),
                where=ct.c.merged_into.is_(None)).returning(*ct.c)
            crow = session.execute(stmt).one_or_none()
            if crow is None:
                # the signature's cluster was merged into another: the bundle counts in the survivor
                home = session.execute(select(ct.c.id).where(ct.c.scheme == sig["scheme"], ct.c.key == sig["key"])
                                       .with_for_update()).scalar_one()
                target = root_cluster(session, home, lock=True)
                crow = session.execute(update(ct).where(ct.c.id == target).values(
                    **_counter_updates(t, build, version, first["verdict"])).returning(*ct.c)).one()
            else:
                home = crow.id
            cluster = Cluster(**dict(crow._mapping))
            # 2. the bundle (a duplicate id raises IntegrityError and rolls everything back)
            session.execute(insert(Bundle.__table__).values(
                id=bundle["id"], cluster_id=cluster.id, content_hash=digest, data=bundle, diagnosis=diagnosis,
                analyzer_version=str(diagnosis.get("analyzer_version") or analysis.analyzer_version())[:40],
                created_at=str(bundle.get("created_at"))[:40], received_at=t,
                size_bytes=min(int(size_bytes), 2**31 - 1), token_id=token_id,
                flagged_secrets=list(flagged)[:100] if flagged else None, home_cluster_id=home,
                facet_keys=facet_keys_of(bundle_facets), **facts))
            # 3. facets (of the cluster and over all bundles), distinct machines, per-day count
            _count_facets_and_day(session, cluster.id, t, bundle_facets)
        return IngestResult(201, bundle["id"], cluster, diagnosis)
    except IntegrityError:
        existing = _existing(db, bundle["id"], digest)
        if existing is None:
            raise
        return existing


def _existing(db: Database, bundle_id: str, digest: str) -> IngestResult | None:
    with db.Session() as session:
        row = session.get(Bundle, bundle_id)
        if row is None:
            return None
        if row.content_hash != digest:
            raise ApiError(409, f"bundle {bundle_id} is already stored with different content",
                           code="conflict", field="id")
        cluster = session.get(Cluster, row.cluster_id)
        return IngestResult(200, row.id, cluster, row.diagnosis)


def delete_bundle(db: Database, bundle_id: str) -> bool:
    """Purge a bundle; its cluster's counters follow (an emptied cluster stays, with count 0)."""
    with db.write_lock(), db.Session() as session, session.begin():
        row = session.get(Bundle, bundle_id, with_for_update=True)
        if row is None:
            return False
        bundle_facets = counted_facets(row)
        cluster_id = row.cluster_id
        session.delete(row)
        session.flush()
        _count_out(session, cluster_id, row, bundle_facets)
    return True


def reanalyze(db: Database, *, batch_size: int = 200, max_batches: int | None = None,
              progress: Callable[[dict], None] | None = None) -> dict:
    """Re-run the analyzer over bundles whose ``analyzer_version`` differs from the current one, and
    over those stored before migration 0004 (their facet values of the new kinds are counted then).

    Works in batches, each one transaction (bundle rows and counters move together), so it can be
    stopped at any point and run again without double counting. Returns ``{"seen", "moved",
    "batches", "remaining"}``.
    """
    current = analysis.analyzer_version()
    stats = {"seen": 0, "moved": 0, "batches": 0, "remaining": 0}
    last_id = ""
    while max_batches is None or stats["batches"] < max_batches:
        with db.write_lock(), db.Session() as session, session.begin():
            rows = session.execute(
                select(Bundle).where(or_(Bundle.analyzer_version != current, Bundle.facet_keys.is_(None)),
                                     Bundle.id > last_id)
                .order_by(Bundle.id).limit(batch_size).with_for_update()).scalars().all()
            if not rows:
                break
            for row in rows:
                last_id = row.id
                old_facets = counted_facets(row)
                old_cluster = row.cluster_id
                diagnosis = analysis.diagnose(row.data)
                sig = analysis.signature_of(diagnosis)
                home = ensure_cluster(session, sig, diagnosis)
                new_cluster = root_cluster(session, home)
                session.execute(update(Cluster.__table__).where(Cluster.__table__.c.id == home,
                                                                Cluster.__table__.c.title != sig["title"])
                                .values(title=sig["title"]))
                row.diagnosis = diagnosis
                row.analyzer_version = current[:40]
                facts, new_facets = analysis.facts_and_facets(row.data, diagnosis)
                for k, v in facts.items():
                    setattr(row, k, v)
                row.cluster_id = new_cluster
                row.home_cluster_id = home
                row.facet_keys = facet_keys_of(new_facets)
                session.flush()
                _count_out(session, old_cluster, row, old_facets)
                _count_in(session, new_cluster, row, new_facets)
                stats["seen"] += 1
                stats["moved"] += int(new_cluster != old_cluster)
            stats["batches"] += 1
        if progress:
            progress(dict(stats))
    with db.Session() as session:
        stats["remaining"] = session.execute(
            select(func.count()).select_from(Bundle).where(
                or_(Bundle.analyzer_version != current, Bundle.facet_keys.is_(None)))).scalar_one()
    return stats


# -- merges ---------------------------------------------------------------------------------------

def _lock_clusters(session: Session, ids) -> dict[int, Cluster]:
    """Row-lock clusters in id order (two maintainers merging crosswise cannot deadlock)."""
    rows = session.execute(select(Cluster).where(Cluster.id.in_(sorted(set(ids)))).order_by(Cluster.id)
                           .with_for_update()).scalars().all()
    return {c.id: c for c in rows}


def _move_bundles(session: Session, rows: list[Bundle], src: int, dst: int) -> None:
    """Move bundles (all in cluster ``src``) to cluster ``dst``; both clusters' counters follow.
    The totals over all bundles do not change (the same bundles, in another cluster)."""
    if not rows:
        return
    facet_counts: Counter = Counter()
    days: Counter = Counter()
    for row in rows:
        facet_counts.update(counted_facets(row))
        days[as_utc(row.received_at).date()] += 1
        row.cluster_id = dst
    session.flush()
    c = Cluster.__table__.c
    ft, dtab = ClusterFacet.__table__, ClusterDay.__table__
    n = len(rows)
    session.execute(update(Cluster.__table__).where(c.id == src).values(count=c.count - n))
    for (kind, value), k in sorted(facet_counts.items()):
        session.execute(update(ft).where(ft.c.cluster_id == src, ft.c.kind == kind, ft.c.value == value)
                        .values(count=ft.c.count - k))
    session.execute(delete(ft).where(ft.c.cluster_id == src, ft.c.count <= 0))
    for day, k in sorted(days.items()):
        session.execute(update(dtab).where(dtab.c.cluster_id == src, dtab.c.day == day).values(count=dtab.c.count - k))
    session.execute(delete(dtab).where(dtab.c.cluster_id == src, dtab.c.count <= 0))
    for (kind, value), k in sorted(facet_counts.items()):
        _upsert_count(session, ft, {"cluster_id": dst, "kind": kind, "value": value}, k)
    for day, k in sorted(days.items()):
        _upsert_count(session, dtab, {"cluster_id": dst, "day": day}, k)
    session.execute(update(Cluster.__table__).where(c.id == dst).values(count=c.count + n))
    for cid in (src, dst):
        machines = session.execute(select(func.count()).select_from(ft).where(
            ft.c.cluster_id == cid, ft.c.kind == "machine", ft.c.count > 0)).scalar_one()
        session.execute(update(Cluster.__table__).where(c.id == cid).values(machines=machines))
        _recount_range(session, cid)
    verdicts = {r.verdict for r in rows if r.verdict and r.verdict != "unknown"}
    if verdicts:
        session.execute(update(Cluster.__table__).where(c.id == dst, (c.verdict.is_(None)) | (c.verdict == "unknown"))
                        .values(verdict=sorted(verdicts)[0]))


def merge_clusters(db: Database, source_id: int, into_id: int) -> dict:
    """Merge cluster ``source_id`` into ``into_id`` (or the cluster that one was merged into): its
    bundles move there with their counts, and later uploads of its signature count there too.
    Returns ``{"merged", "into", "moved"}``; ApiError 404 / 409 when it cannot be done."""
    if source_id == into_id:
        raise ApiError(409, "a cluster cannot be merged into itself", code="conflict", field="into")
    with db.write_lock(), db.Session() as session, session.begin():
        for cid, field in ((source_id, None), (into_id, "into")):
            if session.get(Cluster, cid) is None:
                raise ApiError(404, f"no cluster {cid}", code="not_found", field=field)
        target = root_cluster(session, into_id)
        locked = _lock_clusters(session, (source_id, target))
        src = locked[source_id]
        if src.merged_into is not None:
            raise ApiError(409, f"cluster {source_id} is already merged into cluster {src.merged_into}; "
                                "unmerge it first", code="conflict")
        if target == source_id:
            raise ApiError(409, f"cluster {into_id} is merged into cluster {source_id}: merging back would "
                                "make a loop", code="conflict", field="into")
        src.merged_into = target
        src.merged_at = utcnow()
        rows = session.execute(select(Bundle).where(Bundle.cluster_id == source_id).order_by(Bundle.id)
                               .with_for_update()).scalars().all()
        _move_bundles(session, list(rows), source_id, target)
        return {"merged": source_id, "into": target, "moved": len(rows)}


def _merged_under(session: Session, cluster_id: int) -> set[int]:
    """``cluster_id`` and every cluster merged into it, directly or through others."""
    parent = dict(session.execute(select(Cluster.id, Cluster.merged_into).where(Cluster.merged_into.is_not(None))).all())
    out = {cluster_id}
    changed = True
    while changed:
        changed = False
        for child, par in parent.items():
            if par in out and child not in out:
                out.add(child)
                changed = True
    return out


def unmerge_cluster(db: Database, cluster_id: int) -> dict:
    """Undo a merge: the bundles of ``cluster_id``'s signature (and of the clusters merged into it)
    go back with their counts. Returns ``{"unmerged", "from", "moved"}``."""
    with db.write_lock(), db.Session() as session, session.begin():
        c = session.get(Cluster, cluster_id)
        if c is None:
            raise ApiError(404, f"no cluster {cluster_id}", code="not_found")
        if c.merged_into is None:
            raise ApiError(409, f"cluster {cluster_id} is not merged into another", code="conflict")
        root = root_cluster(session, cluster_id)
        locked = _lock_clusters(session, (cluster_id, root))
        locked[cluster_id].merged_into = None
        locked[cluster_id].merged_at = None
        session.flush()
        homes = _merged_under(session, cluster_id)
        rows = session.execute(select(Bundle).where(
            Bundle.cluster_id == root, func.coalesce(Bundle.home_cluster_id, Bundle.cluster_id).in_(sorted(homes)))
            .order_by(Bundle.id).with_for_update()).scalars().all()
        _move_bundles(session, list(rows), root, cluster_id)
        return {"unmerged": cluster_id, "from": root, "moved": len(rows)}


# -- demo data ------------------------------------------------------------------------------------

def is_demo(bundle: dict) -> bool:
    """A bundle of ``kvreport serve --demo``: an example shipped with kvreport (``collector.example_of``)
    or demo history made from one (``collector.demo``)."""
    collector = bundle.get("collector") if isinstance(bundle, dict) else None
    return isinstance(collector, dict) and bool(collector.get("example_of") or collector.get("demo"))


def remove_demo(db: Database, batch_size: int = 200) -> dict:
    """Purge the demo bundles (``is_demo``) with their counts, then drop the clusters left with no
    bundle, no merged cluster and no bundle whose signature they are. Returns
    ``{"bundles", "clusters"}`` removed."""
    removed = 0
    touched: set[int] = set()
    last_id = ""
    while True:
        with db.Session() as session:
            rows = session.execute(select(Bundle.id, Bundle.data, Bundle.cluster_id, Bundle.home_cluster_id)
                                   .where(Bundle.id > last_id).order_by(Bundle.id).limit(batch_size)).all()
        if not rows:
            break
        last_id = rows[-1][0]
        for bundle_id, data, cid, home in rows:
            if is_demo(data) and delete_bundle(db, bundle_id):
                removed += 1
                touched.update(x for x in (cid, home) if x is not None)
    clusters = 0
    with db.write_lock(), db.Session() as session, session.begin():
        while True:  # a cluster is free once the clusters merged into it are gone
            gone = {cid for cid in sorted(touched) if _drop_if_unused(session, cid)}
            if not gone:
                break
            clusters += len(gone)
            touched -= gone
    return {"bundles": removed, "clusters": clusters}


def _drop_if_unused(session: Session, cid: int) -> bool:
    """Delete an empty cluster that no bundle and no merged cluster refers to; True when deleted."""
    b = Bundle.__table__.c
    c = session.get(Cluster, cid)
    if c is None or c.count > 0:
        return False
    used = session.execute(select(func.count()).select_from(Bundle.__table__).where(
        (b.cluster_id == cid) | (b.home_cluster_id == cid))).scalar_one()
    merged = session.execute(select(func.count()).select_from(Cluster).where(Cluster.merged_into == cid)).scalar_one()
    if used or merged:
        return False
    session.execute(delete(ClusterFacet.__table__).where(ClusterFacet.__table__.c.cluster_id == cid))
    session.execute(delete(ClusterDay.__table__).where(ClusterDay.__table__.c.cluster_id == cid))
    session.delete(c)
    session.flush()
    return True
