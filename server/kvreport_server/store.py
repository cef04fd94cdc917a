"""Storage of bundles: uploads, deletes, re-analysis and merges, and the counters they keep.

A cluster is one failure signature. Its ``count``, distinct ``machines``, first/last seen, build
range and first version, its facet counts (``cluster_facets``) and per-day counts (``cluster_days``),
the facet counts over all bundles (``facet_totals``) and the bundles per engine build
(``engine_builds``) are counters that every writer keeps equal to what a full scan of ``bundles``
gives (``counts.py``; ``tests/server/server_helpers.scan`` checks). A bundle acknowledged by the API
is committed with its counts; a failure rolls back everything.

**Lock order** (PostgreSQL; SQLite runs one writer at a time, ``Database.write_lock``). Every writer
takes rows in one global order, skipping what it does not need and never going back:

1. the cluster rows it pins, by id: ``FOR KEY SHARE`` to read where a signature's bundles go (any
   number of uploads, deletes and re-analysis batches at once; only a merge waits for them) or
   ``FOR UPDATE`` for a merge or unmerge, which changes that (:func:`_pin`);
2. bundle rows: a new one inserted, or existing ones ``FOR UPDATE`` by id;
3. the counters, last, through :class:`~kvreport_server.counts.Counts`: ``cluster_facets``,
   ``cluster_days``, ``clusters``, ``engine_builds``, ``facet_totals``, each table in key order in
   one statement.

So an upload inserts its bundle first (which locks nothing another upload needs) and holds the shared
counter rows of its signature, and the totals every upload touches, only for the last statements and
the commit; and no two writers wait for each other in a cycle. Re-analysis analyses outside any
transaction and commits small batches the same way (:func:`reanalyze`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Callable, Iterable

from sqlalchemy import bindparam, delete, func, insert, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from kvreport_server import analysis
from kvreport_server.counts import Counts, as_utc
from kvreport_server.db import Database
from kvreport_server.errors import ApiError
from kvreport_server.models import Bundle, Cluster, ClusterDay, ClusterFacet, utcnow

CT, BT = Cluster.__table__, Bundle.__table__
RETRIES = 5


@dataclasses.dataclass
class IngestResult:
    status: int          # 201 stored now, 200 already stored with the same content
    bundle_id: str
    cluster: Cluster
    diagnosis: dict


class _Changed(Exception):
    """A cluster moved under a merge between reading and pinning it: roll back and start again."""

    def __init__(self, chain: list[int] | None = None):
        super().__init__("cluster changed")
        self.chain = chain


def _insert(session: Session):
    return pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert


def counted_facets(row) -> set[tuple[str, str]]:
    """The facet values ``row`` added to the counters: its ``facet_keys``, or for a bundle stored
    before migration 0004 (``facet_keys`` NULL) the original kinds, which were all that was counted."""
    if row.facet_keys is not None:
        return {(str(k), str(v)) for k, v in row.facet_keys}
    return {(k, v) for k, v in analysis.facets(row.data, row.diagnosis) if k in analysis.LEGACY_FACET_KINDS}


def facet_keys_of(bundle_facets: set[tuple[str, str]]) -> list[list[str]]:
    return [[k, v] for k, v in sorted(bundle_facets)]


# -- clusters: find, create, pin ------------------------------------------------------------------

def _new_cluster_values(sig: dict, diagnosis: dict) -> dict:
    failure = diagnosis.get("failure") or {}
    return {"scheme": sig["scheme"], "key": sig["key"], "signature_id": sig["id"], "title": sig["title"],
            "engine": analysis._cut(diagnosis.get("engine"), 40), "phase": analysis._cut(failure.get("phase"), 40),
            "backend": analysis._cut(failure.get("backend"), 40),
            "verdict": analysis._cut(failure.get("verdict"), 40), "count": 0, "machines": 0, "status": "new"}


def ensure_cluster(session: Session, sig: dict, diagnosis: dict) -> int:
    """The id of the cluster for ``sig`` (``analysis.signature_of``), created with no counts if needed
    (race-safe; a plain read when it exists)."""
    by_key = select(CT.c.id).where(CT.c.scheme == sig["scheme"], CT.c.key == sig["key"])
    found = session.execute(by_key).scalar()
    if found is not None:
        return found
    made = session.execute(_insert(session)(CT).values(**_new_cluster_values(sig, diagnosis))
                           .on_conflict_do_nothing(index_elements=["scheme", "key"]).returning(CT.c.id)).scalar()
    return made if made is not None else session.execute(by_key).scalar_one()


def root_cluster(session: Session, cluster_id: int) -> int:
    """The cluster that holds the bundles of ``cluster_id``: itself, or the end of its merged_into chain."""
    return _chain(session, cluster_id)[-1]


def _chain(session: Session, cluster_id: int) -> list[int]:
    """``cluster_id``, the cluster it is merged into, and so on to the one that is not merged (plain reads)."""
    out = [cluster_id]
    nxt = session.execute(select(CT.c.merged_into).where(CT.c.id == cluster_id)).scalar()
    while nxt is not None:
        if nxt in out or len(out) >= 1000:
            raise ApiError(409, f"cluster {cluster_id} is in a merge cycle", code="conflict")
        out.append(nxt)
        nxt = session.execute(select(CT.c.merged_into).where(CT.c.id == nxt)).scalar()
    return out


def _pin(session: Session, ids: Iterable[int], *, exclusive: bool = False) -> dict[int, int | None]:
    """Lock cluster rows in id order (lock order step 1): ``FOR KEY SHARE``, or ``FOR UPDATE`` when
    ``exclusive``. Returns ``{id: merged_into}`` of the rows as they are now (missing ids: deleted)."""
    stmt = select(CT.c.id, CT.c.merged_into).where(CT.c.id.in_(sorted(set(ids)))).order_by(CT.c.id)
    stmt = stmt.with_for_update() if exclusive else stmt.with_for_update(read=True, key_share=True)
    return dict(session.execute(stmt).all())


def _follow(home: int, pinned: dict[int, int | None]) -> list[int] | None:
    """The merged_into chain from ``home`` to its root through pinned rows (which no merge can change
    while they are pinned); None when it leaves them (then more must be pinned)."""
    out = [home]
    while out[-1] in pinned:
        nxt = pinned[out[-1]]
        if nxt is None:
            return out
        if nxt in out:
            raise ApiError(409, f"cluster {home} is in a merge cycle", code="conflict")
        out.append(nxt)
    return None


_PIN_BY_KEY = (select(CT.c.id, CT.c.merged_into)
               .where(CT.c.scheme == bindparam("p_scheme", type_=CT.c.scheme.type),
                      CT.c.key == bindparam("p_key", type_=CT.c.key.type)).with_for_update(read=True, key_share=True))


def _pin_signature(session: Session, sig: dict, diagnosis: dict, chain: list[int] | None) -> tuple[int, int]:
    """Pin the cluster of ``sig`` (creating it if needed) and, when it is merged, the clusters its
    bundles go to. Returns ``(home, root)``: the signature's own cluster and the one that counts its
    bundles. When the signature is merged this raises :class:`_Changed` with the clusters to pin; the
    next attempt (``chain`` given, its first id the home) pins them all in id order."""
    if chain is not None:
        found = _follow(chain[0], _pin(session, chain))
        if found is not None:
            return found[0], found[-1]
        raise _Changed([chain[0]] + sorted((set(chain) | set(_chain(session, chain[0]))) - {chain[0]}))
    key = {"p_scheme": sig["scheme"], "p_key": sig["key"]}
    row = session.execute(_PIN_BY_KEY, key).one_or_none()
    if row is None:
        made = session.execute(_insert(session)(CT).values(**_new_cluster_values(sig, diagnosis))
                               .on_conflict_do_nothing(index_elements=["scheme", "key"]).returning(CT.c.id)).scalar()
        if made is not None:
            return made, made
        row = session.execute(_PIN_BY_KEY, key).one()
    if row.merged_into is None:
        return row.id, row.id
    raise _Changed(_chain(session, row.id))


# -- uploads --------------------------------------------------------------------------------------

@dataclasses.dataclass
class Prepared:
    """What an upload computes before its transaction: the content hash, the diagnosis, its
    signature, the bundle's indexed facts and its facet values."""

    digest: str
    diagnosis: dict
    sig: dict
    facts: dict
    facets: set[tuple[str, str]]


def prepare(bundle: dict) -> Prepared:
    """Analyse a validated bundle (its log parsed once) for :func:`ingest`; no database."""
    diagnosis, devices = analysis.diagnose_with_devices(bundle)
    facts, bundle_facets = analysis.facts_and_facets(bundle, diagnosis, devices)
    return Prepared(analysis.content_hash(bundle), diagnosis, analysis.signature_of(diagnosis), facts, bundle_facets)


_INSERT_BUNDLE = insert(BT)


def ingest(db: Database, bundle: dict, *, size_bytes: int = 0, token_id: int | None = None,
           received_at: dt.datetime | None = None, flagged: list[str] | None = None,
           prepared: Prepared | None = None) -> IngestResult:
    """Store a validated bundle; 201 when new, 200 when the same id holds the same content.

    Raises :class:`ApiError` 409 when the id is stored with different content. Safe under
    concurrent uploads of the same id (the loser of the insert race re-reads and answers 200/409).
    The transaction pins the signature's cluster, inserts the bundle and adds its counts last
    (:class:`Counts`), so uploads of one signature wait for each other only over those last
    statements and the commit.
    """
    p = prepared or prepare(bundle)
    t = as_utc(received_at or utcnow())
    row = {
        "id": bundle["id"], "content_hash": p.digest, "data": bundle, "diagnosis": p.diagnosis,
        "analyzer_version": str(p.diagnosis.get("analyzer_version") or analysis.analyzer_version())[:40],
        "created_at": str(bundle.get("created_at"))[:40], "received_at": t,
        "size_bytes": min(int(size_bytes), 2**31 - 1), "token_id": token_id,
        "flagged_secrets": list(flagged)[:100] if flagged else None, "facet_keys": facet_keys_of(p.facets),
        **p.facts,
    }
    chain = None
    try:
        for _attempt in range(RETRIES):
            try:
                with db.write_lock(), db.Session() as session, session.begin():
                    home, root = _pin_signature(session, p.sig, p.diagnosis, chain)
                    session.execute(_INSERT_BUNDLE, {**row, "cluster_id": root, "home_cluster_id": home})
                    counts = Counts()
                    counts.add(root, t, p.facets, engine=p.facts["engine_name"], build=p.facts["build_number"],
                               engine_version=p.facts["engine_version"], verdict=p.facts["verdict"])
                    cluster = counts.apply(session)[root]
                return IngestResult(201, bundle["id"], cluster, p.diagnosis)
            except _Changed as changed:
                chain = changed.chain
        raise ApiError(409, "the bundle's cluster kept being merged; try again", code="conflict")
    except IntegrityError:
        existing = _existing(db, bundle["id"], p.digest)
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
    for _attempt in range(RETRIES):
        try:
            with db.write_lock(), db.Session() as session, session.begin():
                cid = session.execute(select(BT.c.cluster_id).where(BT.c.id == bundle_id)).scalar()
                if cid is None:
                    return False
                _pin(session, [cid])
                row = session.execute(select(Bundle).where(Bundle.id == bundle_id).with_for_update()).scalar()
                if row is None:
                    return False
                if row.cluster_id != cid:  # merged away meanwhile
                    raise _Changed()
                counts = Counts()
                counts.remove(cid, row.received_at, counted_facets(row), engine=row.engine_name, build=row.build_number)
                session.execute(delete(BT).where(BT.c.id == bundle_id))
                counts.apply(session)
            return True
        except _Changed:
            continue
    raise ApiError(409, f"bundle {bundle_id} kept moving between clusters; try again", code="conflict")


# -- re-analysis ----------------------------------------------------------------------------------

_TO_REDO = (BT.c.id, BT.c.cluster_id, BT.c.data, BT.c.diagnosis, BT.c.facet_keys, BT.c.analyzer_version,
            BT.c.received_at, BT.c.engine_name, BT.c.build_number, BT.c.engine_version)


def _reanalysis_of(row) -> dict:
    """A stored bundle analysed again, and the facet values it had counted (no database)."""
    diagnosis, devices = analysis.diagnose_with_devices(row.data)
    facts, new_facets = analysis.facts_and_facets(row.data, diagnosis, devices)
    return {"diagnosis": diagnosis, "sig": analysis.signature_of(diagnosis), "facts": facts, "facets": new_facets,
            "old_facets": counted_facets(row)}


def _pin_batch(session: Session, work: list[tuple], also: set[int]) -> tuple[dict, dict, set[int]]:
    """Lock order step 1 for a re-analysis batch: create the clusters of new signatures, pin the
    clusters the bundles are in and those their new signatures lead to. Returns ``{(scheme, key):
    home}`` and ``{home: chain to its root}``, read from the pinned rows (which no merge can change
    now). Raises :class:`_Changed` when a merge moved a chain beyond them, the clusters to pin added
    to ``also`` for the next attempt."""
    homes: dict[tuple, int] = {}
    for _row, new in sorted(work, key=lambda w: (w[1]["sig"]["scheme"], w[1]["sig"]["key"])):
        key = (new["sig"]["scheme"], new["sig"]["key"])
        if key not in homes:
            homes[key] = ensure_cluster(session, new["sig"], new["diagnosis"])
    want = also | {row.cluster_id for row, _new in work}
    for home in set(homes.values()):
        want.update(_chain(session, home))
    pinned = _pin(session, want)
    chains = {home: _follow(home, pinned) for home in set(homes.values())}
    if any(chain is None for chain in chains.values()):
        also.update(c for home in homes.values() for c in _chain(session, home))
        raise _Changed()
    return homes, chains, set(pinned)


def _write_batch(session: Session, current: str, work: list[tuple], also: set[int]) -> tuple[int, int, float]:
    """The one transaction of a re-analysis batch: pin the clusters (:func:`_pin_batch`), lock the
    bundle rows, skip those re-analysed or deleted since they were read, write the others and move
    their counts. Returns (seen, moved, when the counter rows were first taken). ``also``: more clusters
    to pin, learnt by an earlier attempt."""
    b = BT.c
    homes, chains, pinned = _pin_batch(session, work, also)
    locked = {r.id: r for r in session.execute(
        select(b.id, b.cluster_id, b.analyzer_version, b.facet_keys).where(b.id.in_([row.id for row, _n in work]))
        .order_by(b.id).with_for_update(key_share=True))}  # FOR NO KEY UPDATE: outcomes may still refer to them
    if any(r.cluster_id not in pinned for r in locked.values()):
        also.update(r.cluster_id for r in locked.values())  # merged away meanwhile: pin where they are now
        raise _Changed()
    counts, updates, moved = Counts(), [], 0
    for row, new in work:
        now = locked.get(row.id)
        if now is None or (now.analyzer_version, now.facet_keys) != (row.analyzer_version, row.facet_keys):
            continue  # deleted or re-analysed meanwhile
        facts, home = new["facts"], homes[(new["sig"]["scheme"], new["sig"]["key"])]
        root, old = chains[home][-1], now.cluster_id
        updates.append({**facts, "b_id": row.id, "diagnosis": new["diagnosis"], "analyzer_version": current[:40],
                        "cluster_id": root, "home_cluster_id": home, "facet_keys": facet_keys_of(new["facets"])})
        if root == old and (facts["build_number"], facts["engine_version"]) == (row.build_number, row.engine_version):
            counts.recount(root, new["old_facets"], new["facets"], engines=(row.engine_name, facts["engine_name"]),
                           build=row.build_number, verdict=facts["verdict"])
        else:
            counts.remove(old, row.received_at, new["old_facets"], engine=row.engine_name, build=row.build_number)
            counts.add(root, row.received_at, new["facets"], engine=facts["engine_name"], build=facts["build_number"],
                       engine_version=facts["engine_version"], verdict=facts["verdict"])
            moved += int(root != old)
        counts.titles[home] = new["sig"]["title"]
    if updates:
        cols = [k for k in updates[0] if k != "b_id"]
        session.execute(update(BT).where(b.id == bindparam("b_id")).values({k: bindparam(k) for k in cols}), updates)
    counts.apply(session)
    return len(updates), moved, counts.started


def _retrying(db: Database, work: Callable[[Session], tuple]) -> tuple:
    """``work(session)`` in one write transaction, run again (up to :data:`RETRIES` times) when a
    cluster changed under it or PostgreSQL broke a deadlock by failing it."""
    for attempt in range(RETRIES):
        try:
            with db.write_lock(), db.Session() as session, session.begin():
                return work(session)
        except _Changed:
            continue
        except OperationalError as exc:
            if attempt + 1 >= RETRIES or getattr(getattr(exc, "orig", None), "sqlstate", None) not in ("40P01", "40001"):
                raise
    raise ApiError(409, "the clusters kept changing; try again", code="conflict")


def reanalyze(db: Database, *, batch_size: int = 50, max_batches: int | None = None,
              progress: Callable[[dict], None] | None = None) -> dict:
    """Re-run the analyzer over bundles whose ``analyzer_version`` differs from the current one, and
    over those stored before migration 0004 (their facet values of the new kinds are counted then).

    Each batch reads its bundles without locks, analyses them outside any transaction, then writes
    them in one short transaction (:func:`_write_batch`) whose counter changes go through
    :class:`Counts` in the uploads' lock order; so re-analysis beside uploads holds no cluster row
    for longer than those last statements, and it can be stopped at any point and run again without
    double counting. Returns ``{"seen", "moved", "batches", "remaining", "longest_write_ms",
    "longest_hold_ms"}``: the longest write transaction (retries included), and the longest time a
    batch held counter rows (cluster, facet, day, build, total rows), from its first counter update to
    its commit.
    """
    current = analysis.analyzer_version()
    needs = or_(BT.c.analyzer_version != current, BT.c.facet_keys.is_(None))
    stats = {"seen": 0, "moved": 0, "batches": 0, "remaining": 0, "longest_write_ms": 0.0, "longest_hold_ms": 0.0}
    last_id = ""
    while max_batches is None or stats["batches"] < max_batches:
        with db.Session() as session:
            rows = session.execute(select(*_TO_REDO).where(needs, BT.c.id > last_id).order_by(BT.c.id)
                                   .limit(batch_size)).all()
        if not rows:
            break
        last_id = rows[-1].id
        work = [(row, _reanalysis_of(row)) for row in rows]
        also: set[int] = set()
        t0 = time.perf_counter()
        seen, moved, counting = _retrying(db, lambda session, work=work, also=also:
                                          _write_batch(session, current, work, also))
        done = time.perf_counter()  # committed
        stats["longest_write_ms"] = max(stats["longest_write_ms"], (done - t0) * 1000)
        stats["longest_hold_ms"] = max(stats["longest_hold_ms"], (done - counting) * 1000)
        stats["seen"] += seen
        stats["moved"] += moved
        stats["batches"] += 1
        if progress:
            progress(dict(stats))
    with db.Session() as session:
        stats["remaining"] = session.execute(select(func.count()).select_from(BT).where(needs)).scalar_one()
    return stats


# -- merges ---------------------------------------------------------------------------------------

_MOVED = (BT.c.id, BT.c.received_at, BT.c.build_number, BT.c.engine_version, BT.c.verdict, BT.c.facet_keys)


def _move_bundles(session: Session, where, src: int, dst: int) -> int:
    """Move the bundles of cluster ``src`` that match ``where`` to cluster ``dst``; both clusters'
    counters follow (the totals over all bundles do not change: the same bundles, in another cluster)."""
    rows = session.execute(update(BT).where(BT.c.cluster_id == src, where).values(cluster_id=dst)
                           .returning(*_MOVED)).all()
    legacy = [r.id for r in rows if r.facet_keys is None]
    old = {r.id: counted_facets(r) for r in session.execute(select(Bundle).where(Bundle.id.in_(legacy))).scalars()} \
        if legacy else {}
    counts = Counts()
    for r in rows:  # the totals over all bundles and per build cancel out: the same bundles, elsewhere
        facets = old[r.id] if r.facet_keys is None else counted_facets(r)
        counts.remove(src, r.received_at, facets, engine=None, build=r.build_number)
        counts.add(dst, r.received_at, facets, engine=None, build=r.build_number, engine_version=r.engine_version,
                   verdict=r.verdict)
    counts.apply(session)
    return len(rows)


def merge_clusters(db: Database, source_id: int, into_id: int) -> dict:
    """Merge cluster ``source_id`` into ``into_id`` (or the cluster that one was merged into): its
    bundles move there with their counts, and later uploads of its signature count there too.
    Returns ``{"merged", "into", "moved"}``; ApiError 404 / 409 when it cannot be done."""
    if source_id == into_id:
        raise ApiError(409, "a cluster cannot be merged into itself", code="conflict", field="into")

    def work(session: Session) -> tuple:
        for cid, field in ((source_id, None), (into_id, "into")):
            if session.get(Cluster, cid) is None:
                raise ApiError(404, f"no cluster {cid}", code="not_found", field=field)
        target = root_cluster(session, into_id)
        if target == source_id:
            raise ApiError(409, f"cluster {into_id} is merged into cluster {source_id}: merging back would "
                                "make a loop", code="conflict", field="into")
        pinned = _pin(session, (source_id, target), exclusive=True)
        if pinned.get(target, 0) is not None:
            raise _Changed()  # the target was merged (or removed) meanwhile
        if pinned.get(source_id) is not None:
            raise ApiError(409, f"cluster {source_id} is already merged into cluster {pinned[source_id]}; "
                                "unmerge it first", code="conflict")
        session.execute(update(CT).where(CT.c.id == source_id).values(merged_into=target, merged_at=utcnow()))
        return (target, _move_bundles(session, True, source_id, target))

    target, moved = _retrying(db, work)
    return {"merged": source_id, "into": target, "moved": moved}


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

    def work(session: Session) -> tuple:
        c = session.get(Cluster, cluster_id)
        if c is None:
            raise ApiError(404, f"no cluster {cluster_id}", code="not_found")
        if c.merged_into is None:
            raise ApiError(409, f"cluster {cluster_id} is not merged into another", code="conflict")
        chain = _chain(session, cluster_id)
        root = chain[-1]
        pinned = _pin(session, (cluster_id, root), exclusive=True)
        if pinned.get(cluster_id) != chain[1] or pinned.get(root, 0) is not None:
            raise _Changed()
        session.execute(update(CT).where(CT.c.id == cluster_id).values(merged_into=None, merged_at=None))
        homes = sorted(_merged_under(session, cluster_id))
        return (root, _move_bundles(session, func.coalesce(BT.c.home_cluster_id, BT.c.cluster_id).in_(homes),
                                    root, cluster_id))

    root, moved = _retrying(db, work)
    return {"unmerged": cluster_id, "from": root, "moved": moved}


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
    """Delete an empty cluster that no bundle and no merged cluster refers to; True when deleted.
    The row is locked first (lock order step 1): an upload that pinned it is counted by then."""
    b = BT.c
    c = session.execute(select(Cluster).where(Cluster.id == cid).with_for_update()).scalar()
    if c is None or c.count > 0:
        return False
    used = session.execute(select(func.count()).select_from(BT).where(
        (b.cluster_id == cid) | (b.home_cluster_id == cid))).scalar_one()
    merged = session.execute(select(func.count()).select_from(Cluster).where(Cluster.merged_into == cid)).scalar_one()
    if used or merged:
        return False
    session.execute(delete(ClusterFacet.__table__).where(ClusterFacet.__table__.c.cluster_id == cid))
    session.execute(delete(ClusterDay.__table__).where(ClusterDay.__table__.c.cluster_id == cid))
    session.execute(delete(CT).where(CT.c.id == cid))
    return True
