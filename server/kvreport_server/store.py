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
from collections.abc import Callable

from sqlalchemy import case, delete, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kvreport_server import analysis
from kvreport_server.db import Database
from kvreport_server.errors import ApiError
from kvreport_server.models import Bundle, Cluster, ClusterDay, ClusterFacet, utcnow


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


def _count_facets_and_day(session: Session, cluster_id: int, t: dt.datetime,
                          bundle_facets: set[tuple[str, str]]) -> None:
    """Add one bundle's facet values, distinct machine and day to a cluster."""
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


def _count_out(session: Session, cluster_id: int, row: Bundle, bundle_facets: set[tuple[str, str]]) -> None:
    """Remove one bundle from a cluster's counters; call after the row left the cluster."""
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
    dtab = ClusterDay.__table__
    day = as_utc(row.received_at).date()
    session.execute(update(dtab).where(dtab.c.cluster_id == cluster_id, dtab.c.day == day)
                    .values(count=dtab.c.count - 1))
    session.execute(delete(dtab).where(dtab.c.cluster_id == cluster_id, dtab.c.day == day, dtab.c.count <= 0))
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
        machines=c.machines - gone_machines, updated_at=utcnow()))


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
    facts = analysis.bundle_facts(bundle, diagnosis)
    bundle_facets = analysis.facets(bundle, diagnosis)
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
                index_elements=["scheme", "key"], set_=_counter_updates(t, build, version, first["verdict"])).returning(*ct.c)
            crow = session.execute(stmt).one()
            cluster = Cluster(**dict(crow._mapping))
            # 2. the bundle (a duplicate id raises IntegrityError and rolls everything back)
            session.execute(insert(Bundle.__table__).values(
                id=bundle["id"], cluster_id=cluster.id, content_hash=digest, data=bundle, diagnosis=diagnosis,
                analyzer_version=str(diagnosis.get("analyzer_version") or analysis.analyzer_version())[:40],
                created_at=str(bundle.get("created_at"))[:40], received_at=t,
                size_bytes=min(int(size_bytes), 2**31 - 1), token_id=token_id,
                flagged_secrets=list(flagged)[:100] if flagged else None, **facts))
            # 3. facets, distinct machines, per-day count
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
        bundle_facets = analysis.facets(row.data, row.diagnosis)
        cluster_id = row.cluster_id
        session.delete(row)
        session.flush()
        _count_out(session, cluster_id, row, bundle_facets)
    return True


def reanalyze(db: Database, *, batch_size: int = 200, max_batches: int | None = None,
              progress: Callable[[dict], None] | None = None) -> dict:
    """Re-run the analyzer over bundles whose ``analyzer_version`` differs from the current one.

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
                select(Bundle).where(Bundle.analyzer_version != current, Bundle.id > last_id)
                .order_by(Bundle.id).limit(batch_size).with_for_update()).scalars().all()
            if not rows:
                break
            for row in rows:
                last_id = row.id
                old_facets = analysis.facets(row.data, row.diagnosis)
                old_cluster = row.cluster_id
                diagnosis = analysis.diagnose(row.data)
                sig = analysis.signature_of(diagnosis)
                new_cluster = ensure_cluster(session, sig, diagnosis)
                session.execute(update(Cluster.__table__).where(Cluster.__table__.c.id == new_cluster,
                                                                Cluster.__table__.c.title != sig["title"])
                                .values(title=sig["title"]))
                row.diagnosis = diagnosis
                row.analyzer_version = current[:40]
                for k, v in analysis.bundle_facts(row.data, diagnosis).items():
                    setattr(row, k, v)
                row.cluster_id = new_cluster
                session.flush()
                _count_out(session, old_cluster, row, old_facets)
                _count_in(session, new_cluster, row, analysis.facets(row.data, diagnosis))
                stats["seen"] += 1
                stats["moved"] += int(new_cluster != old_cluster)
            stats["batches"] += 1
        if progress:
            progress(dict(stats))
    with db.Session() as session:
        stats["remaining"] = session.execute(
            select(func.count()).select_from(Bundle).where(Bundle.analyzer_version != current)).scalar_one()
    return stats
