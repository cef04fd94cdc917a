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
from kvreport_server.models import Bundle, Cluster, ClusterDay, ClusterFacet, EngineBuild, utcnow


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
    """The id of the cluster for ``sig`` (``analysis.signature_of``), created if needed (race-safe).

    A plain indexed read when the cluster exists (it takes no lock); an insert that does nothing on
    conflict when it does not. Counters start at 0: :func:`_apply` adds the bundles."""
    ct = Cluster.__table__
    found = session.execute(select(ct.c.id).where(ct.c.scheme == sig["scheme"], ct.c.key == sig["key"])).scalar()
    if found is not None:
        return found
    failure = diagnosis.get("failure") or {}
    values = {
        "scheme": sig["scheme"], "key": sig["key"], "signature_id": sig["id"], "title": sig["title"],
        "engine": analysis._cut(diagnosis.get("engine"), 40), "phase": analysis._cut(failure.get("phase"), 40),
        "backend": analysis._cut(failure.get("backend"), 40), "verdict": analysis._cut(failure.get("verdict"), 40),
        "count": 0, "machines": 0, "status": "new",
    }
    session.execute(_insert(session)(ct).values(**values).on_conflict_do_nothing(index_elements=["scheme", "key"]))
    return session.execute(select(ct.c.id).where(ct.c.scheme == sig["scheme"], ct.c.key == sig["key"])).scalar_one()


def _version_of(build: int | None, engine_version: str | None) -> str | None:
    return f"b{build}" if build is not None else engine_version


@dataclasses.dataclass
class _Arrival:
    """One bundle counted into a cluster: when it came, its engine build and version, its verdict."""

    t: dt.datetime
    build: int | None
    version: str | None
    verdict: str | None


@dataclasses.dataclass
class Counts:
    """Counter changes of one transaction, applied by :func:`_apply` at its end in one lock order.

    Every writer (upload, delete, re-analysis) collects its changes here first and applies them last,
    in the same global order — facet rows by (cluster, kind, value), then day rows by (cluster, day),
    then cluster rows by id, then (engine, build) rows — so the shared counter rows of a popular
    signature are held only for the few statements before the commit, and two writers never wait on
    each other in a cycle.
    """

    facets: dict[tuple[int, str, str], int] = dataclasses.field(default_factory=dict)
    days: dict[tuple[int, dt.date], int] = dataclasses.field(default_factory=dict)
    count: dict[int, int] = dataclasses.field(default_factory=dict)
    arrivals: dict[int, list[_Arrival]] = dataclasses.field(default_factory=dict)
    lost: set[int] = dataclasses.field(default_factory=set)
    titles: dict[int, str] = dataclasses.field(default_factory=dict)
    builds: dict[tuple[str, int], int] = dataclasses.field(default_factory=dict)

    def _bump(self, cid: int, t: dt.datetime, facets: set[tuple[str, str]], delta: int,
              engine: str | None, build: int | None) -> None:
        self.count[cid] = self.count.get(cid, 0) + delta
        if engine is not None and build is not None:
            self.builds[(engine, build)] = self.builds.get((engine, build), 0) + delta
        for kind, value in facets:
            k = (cid, kind, value)
            self.facets[k] = self.facets.get(k, 0) + delta
        d = (cid, t.date())
        self.days[d] = self.days.get(d, 0) + delta

    def add(self, cid: int, t: dt.datetime, facts: dict, facets: set[tuple[str, str]]) -> None:
        """Count in a bundle received at ``t`` with these ``analysis.bundle_facts`` and facets."""
        t = as_utc(t)
        build = facts["build_number"]
        self._bump(cid, t, facets, 1, facts["engine_name"], build)
        self.arrivals.setdefault(cid, []).append(
            _Arrival(t, build, _version_of(build, facts["engine_version"]), facts["verdict"]))

    def remove(self, cid: int, t: dt.datetime, facets: set[tuple[str, str]], engine: str | None,
               build: int | None) -> None:
        """Count out a bundle (its stored ``engine_name`` and ``build_number``)."""
        self._bump(cid, as_utc(t), facets, -1, engine, build)
        self.lost.add(cid)


def _merge_updates(arrivals: list[_Arrival]) -> dict:
    """SET clauses that merge new bundles into a cluster's first/last seen, build range, first version, verdict."""
    c = Cluster.__table__.c
    t_first = min(a.t for a in arrivals)
    t_last = max(a.t for a in arrivals)
    built = [a for a in arrivals if a.build is not None]
    out = dict(first_seen=case((c.first_seen.is_(None), t_first), (c.first_seen > t_first, t_first), else_=c.first_seen),
               last_seen=case((c.last_seen.is_(None), t_last), (c.last_seen < t_last, t_last), else_=c.last_seen))
    if built:
        lo = min(built, key=lambda a: a.build)
        hi = max(a.build for a in built)
        out.update(
            min_build=case((c.min_build.is_(None), lo.build), (c.min_build > lo.build, lo.build), else_=c.min_build),
            max_build=case((c.max_build.is_(None), hi), (c.max_build < hi, hi), else_=c.max_build),
            first_version=case((c.min_build.is_(None), lo.version), (c.min_build > lo.build, lo.version),
                               else_=c.first_version))
    else:
        version = min(arrivals, key=lambda a: a.t).version
        out["first_version"] = case((c.first_version.is_(None), version), else_=c.first_version)
    # the verdict is not part of the key (scheme 2): the cluster shows a known one once a bundle has it
    verdict = next((a.verdict for a in arrivals if a.verdict and a.verdict != "unknown"), None)
    if verdict:
        out["verdict"] = case(((c.verdict.is_(None)) | (c.verdict == "unknown"), verdict), else_=c.verdict)
    return out


def _apply_rows(session: Session, table, key_cols: tuple[str, ...], deltas: dict) -> list:
    """Add ``deltas`` ({key tuple: delta}) to the ``count`` of ``table``'s rows in key order, in one
    upsert; delete the rows that reach 0. Returns (key tuple, new count, delta) per row."""
    items = sorted((k, d) for k, d in deltas.items() if d)
    if not items:
        return []
    rows = [{**dict(zip(key_cols, k, strict=True)), "count": d} for k, d in items]
    # one statement of a fixed shape (cached compiled); SQLAlchemy sends the rows as one multi-row
    # INSERT in this order ("insertmanyvalues"), so the row locks are taken in key order
    stmt = _insert(session)(table)
    stmt = stmt.on_conflict_do_update(index_elements=list(key_cols), set_={"count": table.c.count + stmt.excluded.count})
    stmt = stmt.returning(*(table.c[k] for k in key_cols), table.c.count, sort_by_parameter_order=True)
    got = {tuple(r[:-1]): r[-1] for r in session.execute(stmt, rows)}
    out = [(k, got[k], d) for k, d in items]
    gone = [k for k, n, _d in out if n <= 0]
    for k in gone:
        session.execute(delete(table).where(*(table.c[col] == v for col, v in zip(key_cols, k, strict=True)),
                                            table.c.count <= 0))
    return out


def _recompute(session: Session, cid: int) -> dict:
    """First/last seen, build range and first version of a cluster that lost bundles, from its rows."""
    b = Bundle.__table__.c
    first, last, lo, hi = session.execute(
        select(func.min(b.received_at), func.max(b.received_at), func.min(b.build_number), func.max(b.build_number))
        .where(b.cluster_id == cid)).one()
    first_version = None
    if lo is not None:
        first_version = f"b{lo}"
    elif first is not None:
        first_version = session.execute(
            select(b.engine_version).where(b.cluster_id == cid).order_by(b.received_at).limit(1)).scalar()
    return dict(first_seen=first, last_seen=last, min_build=lo, max_build=hi, first_version=first_version)


def _apply(session: Session, counts: Counts) -> dict[int, Cluster]:
    """Apply ``counts`` in the global lock order (see :class:`Counts`); the updated clusters by id."""
    machines: dict[int, int] = {}
    for (cid, kind, _v), n, d in _apply_rows(session, ClusterFacet.__table__, ("cluster_id", "kind", "value"),
                                             counts.facets):
        if kind == "machine":
            machines[cid] = machines.get(cid, 0) + (n > 0) - (n - d > 0)
    _apply_rows(session, ClusterDay.__table__, ("cluster_id", "day"), counts.days)
    ct = Cluster.__table__
    c = ct.c
    out: dict[int, Cluster] = {}
    for cid in sorted(set(counts.count) | set(counts.arrivals) | counts.lost | set(counts.titles)):
        values: dict = {"count": c.count + counts.count.get(cid, 0),
                        "machines": c.machines + machines.get(cid, 0), "updated_at": utcnow()}
        if cid not in counts.lost and counts.arrivals.get(cid):
            values.update(_merge_updates(counts.arrivals[cid]))
        if cid in counts.titles:
            values["title"] = counts.titles[cid]
        row = session.execute(update(ct).where(c.id == cid).values(**values).returning(*ct.c)).one_or_none()
        if row is not None and cid in counts.lost:  # the row is locked now: its bundles are settled
            row = session.execute(update(ct).where(c.id == cid).values(**_recompute(session, cid))
                                  .returning(*ct.c)).one()
        if row is not None:
            out[cid] = Cluster(**dict(row._mapping))
    _apply_rows(session, EngineBuild.__table__, ("engine", "build_number"), counts.builds)
    return out


def ingest(db: Database, bundle: dict, *, size_bytes: int = 0, token_id: int | None = None,
           received_at: dt.datetime | None = None, flagged: list[str] | None = None) -> IngestResult:
    """Store a validated bundle; 201 when new, 200 when the same id holds the same content.

    Raises :class:`ApiError` 409 when the id is stored with different content. Safe under
    concurrent uploads of the same id (the loser of the insert race re-reads and answers 200/409).

    The transaction inserts the bundle first (no shared row is locked by that) and updates the
    counters last (:func:`_apply`), so uploads of one signature hold its counter rows only for the
    statements before the commit, not for the whole transaction.
    """
    digest = analysis.content_hash(bundle)
    diagnosis, devices = analysis.diagnose_with_devices(bundle)
    sig = analysis.signature_of(diagnosis)
    facts, bundle_facets = analysis.facts_and_facets(bundle, diagnosis, devices)
    t = as_utc(received_at or utcnow())
    try:
        with db.write_lock(), db.Session() as session, session.begin():
            cluster_id = ensure_cluster(session, sig, diagnosis)
            session.execute(insert(Bundle.__table__).values(
                id=bundle["id"], cluster_id=cluster_id, content_hash=digest, data=bundle, diagnosis=diagnosis,
                analyzer_version=str(diagnosis.get("analyzer_version") or analysis.analyzer_version())[:40],
                created_at=str(bundle.get("created_at"))[:40], received_at=t,
                size_bytes=min(int(size_bytes), 2**31 - 1), token_id=token_id,
                flagged_secrets=list(flagged)[:100] if flagged else None, **facts))
            counts = Counts()
            counts.add(cluster_id, t, facts, bundle_facets)
            cluster = _apply(session, counts)[cluster_id]
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
        counts = Counts()
        counts.remove(row.cluster_id, row.received_at, analysis.facets(row.data, row.diagnosis), row.engine_name,
                      row.build_number)
        session.delete(row)
        session.flush()
        _apply(session, counts)
    return True


def _reanalysis_of(row) -> dict:
    """The new diagnosis, signature, facts and facets of a stored bundle, and its old facets (no database)."""
    diagnosis = analysis.diagnose(row.data)
    facts, new_facets = analysis.facts_and_facets(row.data, diagnosis)
    return {"diagnosis": diagnosis, "sig": analysis.signature_of(diagnosis), "facts": facts, "facets": new_facets,
            "old_facets": analysis.facets(row.data, row.diagnosis)}


def _reanalyze_batch(db: Database, current: str, last_id: str, batch_size: int) -> tuple[int, int, str] | None:
    """One batch: read rows (no lock), analyze them (no transaction), then one short write transaction.

    Returns (seen, moved, last id) or None when no bundle is left after ``last_id``. A row changed by
    someone else meanwhile (deleted, re-analyzed) is skipped; counters move with the rows in the
    write transaction (:class:`Counts`), so the run can stop anywhere and resume without double counting.
    """
    b = Bundle.__table__.c
    with db.Session() as session:
        rows = session.execute(
            select(b.id, b.cluster_id, b.data, b.diagnosis, b.received_at, b.engine_name, b.build_number)
            .where(b.analyzer_version != current, b.id > last_id)
            .order_by(b.id).limit(batch_size)).all()
    if not rows:
        return None
    work = {row.id: (row, _reanalysis_of(row)) for row in rows}
    seen = moved = 0
    with db.write_lock(), db.Session() as session, session.begin():
        new_ids = {}
        for rid in sorted(work, key=lambda r: (work[r][1]["sig"]["scheme"], work[r][1]["sig"]["key"])):
            new = work[rid][1]
            new_ids[rid] = ensure_cluster(session, new["sig"], new["diagnosis"])
        locked = {r.id: r for r in session.execute(
            select(b.id, b.cluster_id, b.analyzer_version).where(b.id.in_(list(work))).order_by(b.id).with_for_update())}
        counts = Counts()
        for rid, (old, new) in work.items():
            now = locked.get(rid)
            if now is None or now.analyzer_version == current or now.cluster_id != old.cluster_id:
                continue
            cid = new_ids[rid]
            facts = new["facts"]
            session.execute(update(Bundle.__table__).where(b.id == rid).values(
                diagnosis=new["diagnosis"], analyzer_version=current[:40], cluster_id=cid, **facts))
            counts.remove(old.cluster_id, old.received_at, new["old_facets"], old.engine_name, old.build_number)
            counts.add(cid, old.received_at, facts, new["facets"])
            counts.titles[cid] = new["sig"]["title"]
            seen += 1
            moved += int(cid != old.cluster_id)
        _apply(session, counts)
    return seen, moved, rows[-1].id


def reanalyze(db: Database, *, batch_size: int = 50, max_batches: int | None = None,
              progress: Callable[[dict], None] | None = None) -> dict:
    """Re-run the analyzer over bundles whose ``analyzer_version`` differs from the current one.

    Works in small batches (:func:`_reanalyze_batch`): the analysis runs outside any transaction and
    each batch commits in one short transaction that takes the counter rows last, in the uploads'
    lock order, so re-analysis beside uploads neither holds a cluster row for long nor deadlocks with
    them. It can be stopped at any point and run again without double counting. Returns ``{"seen",
    "moved", "batches", "remaining"}``.
    """
    current = analysis.analyzer_version()
    stats = {"seen": 0, "moved": 0, "batches": 0, "remaining": 0}
    last_id = ""
    while max_batches is None or stats["batches"] < max_batches:
        done = _reanalyze_batch(db, current, last_id, batch_size)
        if done is None:
            break
        seen, moved, last_id = done
        stats["seen"] += seen
        stats["moved"] += moved
        stats["batches"] += 1
        if progress:
            progress(dict(stats))
    with db.Session() as session:
        stats["remaining"] = session.execute(
            select(func.count()).select_from(Bundle).where(Bundle.analyzer_version != current)).scalar_one()
    return stats
