"""Read-side queries shared by the API and the pages (no request objects here).

The clusters list reads only ``clusters`` plus small per-page lookups into ``cluster_facets`` and
``cluster_days`` (indexed), never the bundles table, so its cost does not grow with bundles. Its
orders read indexes of ``clusters``: ``sort=trend`` the stored trend (``counts.py``, brought to a new
day first by one UPDATE), and on PostgreSQL the search ``q`` the trigram indexes of migration 0007.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import and_, bindparam, exists, func, literal, or_, select, union_all
from sqlalchemy.orm import Session

from kvreport_server import counts
from kvreport_server.correlations import correlations
from kvreport_server.limits import ascii_int
from kvreport_server.models import Bundle, Cluster, ClusterDay, ClusterFacet, EngineBuild
from kvreport_server.store import as_utc

SPARK_DAYS = 30
SORTS = ("count", "last_seen", "first_seen", "trend", "machines")


def _like(text: str) -> str:
    esc = text.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{esc}%"


def _facet_match(kind: str | tuple[str, ...], text: str):
    kinds = (kind,) if isinstance(kind, str) else kind
    f = ClusterFacet
    return exists().where(f.cluster_id == Cluster.id, f.kind.in_(kinds),
                          func.lower(f.value).like(_like(text), escape="\\"))


def _today() -> dt.date:
    return counts.utc_today()


SEARCHED_KINDS = ("model", "error", "gpu")  # the facet kinds ``q`` matches (besides title and key)


def _search(text: str, dialect: str):
    """``q``: the clusters whose lower()ed title, key, or a model, error or GPU facet value holds ``text``.
    On PostgreSQL the same match written as ``id IN (… UNION ALL …)``, one branch per trigram index of
    migration 0007 (its facet kinds inline, as the partial index names them), so that each is an index
    scan instead of a LIKE over every cluster's rows."""
    pattern = _like(text)
    if dialect != "postgresql":
        return or_(func.lower(Cluster.title).like(pattern, escape="\\"),
                   func.lower(Cluster.key).like(pattern, escape="\\"),
                   _facet_match(SEARCHED_KINDS, text))
    c, f = Cluster.__table__.c, ClusterFacet.__table__.c
    kinds = bindparam("q_kinds", list(SEARCHED_KINDS), expanding=True, literal_execute=True)
    ids = union_all(select(c.id).where(func.lower(c.title).like(pattern, escape="\\")),
                    select(c.id).where(func.lower(c.key).like(pattern, escape="\\")),
                    select(f.cluster_id).where(f.kind.in_(kinds), func.lower(f.value).like(pattern, escape="\\")))
    return Cluster.id.in_(ids)


def _fresh_trends(session: Session, db) -> None:
    """Bring the stored trends to today before ``sort=trend`` reads them (an index read when they are;
    the first request of a day runs the one UPDATE, in its own transaction when ``db`` is given)."""
    today = _today()
    if not counts.stale_trends(session, today):
        return
    if db is None:
        counts.refresh_trends(session, today)
        return
    with db.write_lock(), db.Session() as writer, writer.begin():
        counts.refresh_trends(writer, today)


def _exact_facet(text: str):
    """``kind:value`` (a facet link of the cluster page): clusters that hold that exact value."""
    kind, _, value = text.partition(":")
    f = ClusterFacet
    return exists().where(f.cluster_id == Cluster.id, f.kind == kind.strip(), f.value == value.strip())


def list_clusters(session: Session, *, engine=None, backend=None, phase=None, verdict=None, version=None,
                  gpu=None, status=None, q=None, facet=None, sort="count", page=1, per_page=50,
                  include_empty=False, db=None) -> tuple[list[dict], int]:
    """A page of clusters as dicts (``cluster_dict`` plus ``sparkline``, ``facets`` top values, ``trend``).
    ``db`` (the app's :class:`~kvreport_server.db.Database`): where ``sort=trend`` writes the day's trend
    refresh (else in ``session``'s transaction)."""
    conds = []
    if facet:
        conds.append(_exact_facet(facet))
    if not include_empty:
        conds.append(Cluster.count > 0)
    for col, val in ((Cluster.engine, engine), (Cluster.backend, backend), (Cluster.phase, phase),
                     (Cluster.verdict, verdict), (Cluster.status, status)):
        if val:
            conds.append(col == val)
    if version:
        conds.append(_facet_match("engine_version", version))
    if gpu:
        conds.append(_facet_match("gpu", gpu))
    if q:
        conds.append(_search(q, session.get_bind().dialect.name))
    where = and_(*conds) if conds else True
    count_all = select(func.count()).select_from(Cluster).where(where)

    if sort == "trend":
        _fresh_trends(session, db)
    today = _today()
    order = {
        "count": [Cluster.count.desc(), Cluster.last_seen.desc()],
        "last_seen": [Cluster.last_seen.desc()],
        "first_seen": [Cluster.first_seen.desc()],
        "machines": [Cluster.machines.desc(), Cluster.count.desc()],
        "trend": [Cluster.trend.desc(), Cluster.count.desc()],  # ix_clusters_trend
    }.get(sort, [Cluster.count.desc()])
    page_of = select(Cluster).where(where).order_by(*order, Cluster.id).offset((page - 1) * per_page).limit(per_page)
    if q:  # the search is matched once: the page's rows carry the number of matches (a window count)
        got = session.execute(page_of.add_columns(func.count().over().label("total"))).all()
        rows = [r[0] for r in got]
        total = got[0].total if got else (session.execute(count_all).scalar_one() if page > 1 else 0)
    else:
        total = session.execute(count_all).scalar_one()
        rows = session.execute(page_of).scalars().all()
    ids = [c.id for c in rows]
    sparks = sparklines(session, ids, today)
    tops = top_facets(session, ids, ("backend", "gpu"), per_kind=5)
    # the version range comes from min/max build; only clusters without build numbers list versions
    no_builds = [c.id for c in rows if c.min_build is None]
    for cid, kinds in top_facets(session, no_builds, ("engine_version",), per_kind=5).items():
        tops.setdefault(cid, {}).update(kinds)
    items = []
    for c in rows:
        item = cluster_dict(c)
        item["sparkline"] = sparks.get(c.id, [0] * SPARK_DAYS)
        item["trend"] = sum(item["sparkline"][-7:]) - sum(item["sparkline"][-14:-7])
        facets = tops.get(c.id, {})
        item["backends"] = [v for v, _n in facets.get("backend", [])]
        item["gpus"] = [v for v, _n in facets.get("gpu", [])]
        item["engine_versions"] = [v for v, _n in facets.get("engine_version", [])]
        items.append(item)
    return items, total


_CHOICES = ("engine", "backend", "phase", "verdict")


def filter_choices(session: Session) -> dict[str, list[str]]:
    """Distinct engines, backends, phases and verdicts of non-empty clusters (for the filter menus), in
    the database's order: one scan of ``clusters`` (their distinct combinations), then each column's
    values of those few rows."""
    combos = (select(*(getattr(Cluster, name) for name in _CHOICES)).where(Cluster.count > 0).distinct()
              .cte("choice_combos"))
    parts = [select(literal(name).label("name"), combos.c[name].label("value")).where(combos.c[name].is_not(None))
             .distinct() for name in _CHOICES]
    out: dict[str, list[str]] = {name: [] for name in _CHOICES}
    query = union_all(*parts).subquery()
    for name, value in session.execute(select(query.c.name, query.c.value).order_by(query.c.name, query.c.value)):
        out[name].append(value)
    return out


def sparklines(session: Session, ids: list[int], today: dt.date | None = None) -> dict[int, list[int]]:
    """Per-day counts over the last 30 days (oldest first) for each cluster id."""
    if not ids:
        return {}
    today = today or _today()
    start = today - dt.timedelta(days=SPARK_DAYS - 1)
    out = {i: [0] * SPARK_DAYS for i in ids}
    for cid, day, n in session.execute(select(ClusterDay.cluster_id, ClusterDay.day, ClusterDay.count)
                                       .where(ClusterDay.cluster_id.in_(ids), ClusterDay.day >= start)):
        idx = (day - start).days
        if 0 <= idx < SPARK_DAYS:
            out[cid][idx] = n
    return out


def top_facets(session: Session, ids: list[int], kinds, per_kind: int = 10) -> dict[int, dict[str, list]]:
    """``{cluster_id: {kind: [(value, count)...]}}``, most frequent first, at most ``per_kind`` each
    (ranked in SQL with a window function, so a cluster with thousands of values costs ``per_kind`` rows)."""
    if not ids:
        return {}
    f = ClusterFacet
    rank = func.row_number().over(partition_by=(f.cluster_id, f.kind), order_by=(f.count.desc(), f.value)).label("rk")
    ranked = (select(f.cluster_id, f.kind, f.value, f.count, rank)
              .where(f.cluster_id.in_(ids), f.kind.in_(list(kinds))).subquery())
    rows = session.execute(select(ranked.c.cluster_id, ranked.c.kind, ranked.c.value, ranked.c.count)
                           .where(ranked.c.rk <= per_kind)
                           .order_by(ranked.c.cluster_id, ranked.c.kind, ranked.c.rk))
    out: dict[int, dict[str, list]] = {}
    for cid, kind, value, n in rows:
        out.setdefault(cid, {}).setdefault(kind, []).append((value, n))
    return out


def iso(value: dt.datetime | None) -> str | None:
    value = as_utc(value)
    return value.isoformat().replace("+00:00", "Z") if value else None


def cluster_dict(c: Cluster) -> dict:
    return {
        "id": c.id, "key": c.key, "scheme": c.scheme, "signature_id": c.signature_id, "title": c.title,
        "engine": c.engine, "phase": c.phase, "backend": c.backend, "verdict": c.verdict,
        "count": c.count, "machines": c.machines, "first_seen": iso(c.first_seen), "last_seen": iso(c.last_seen),
        "min_build": c.min_build, "max_build": c.max_build, "first_version": c.first_version,
        "status": c.status, "known_fix": c.known_fix, "issue_url": c.issue_url, "merged_into": c.merged_into,
    }


def bundle_summary(b: Bundle) -> dict:
    failure = (b.diagnosis or {}).get("failure") or {}
    return {
        "id": b.id, "received_at": iso(b.received_at), "created_at": b.created_at,
        "engine": b.engine_name, "engine_version": b.engine_version, "build_number": b.build_number,
        "backend": b.backend, "gpu": b.gpu, "model": b.model_name, "n_ctx": b.n_ctx,
        "phase": b.phase, "verdict": b.verdict,
        "requested_mib": _num(failure.get("requested_mib")), "free_mib": _num(failure.get("free_mib")),
    }


def _num(v):
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def regression(session: Session, c: Cluster) -> dict:
    """The regression view of a cluster: the first build its signature appears in, how many bundles
    of the same engine from earlier builds the server holds (none of which has this signature:
    "first seen in b6xxx; 0 of 140 bundles from earlier builds"), and how many of the cluster's
    bundles report no engine version at all (so that a view without builds says why).

    Builds come from ``bundle.engine.build_number`` (probed, or read from the log by
    ``kvreport collect --log``, ``"version_source": "log"``).
    """
    # each bundle adds at most one engine_version facet, so the facet counts give the versioned ones
    versioned = session.execute(select(func.coalesce(func.sum(ClusterFacet.count), 0)).where(
        ClusterFacet.cluster_id == c.id, ClusterFacet.kind == "engine_version")).scalar_one()
    unversioned = max(0, c.count - int(versioned))
    out = {"first_build": c.min_build, "last_build": c.max_build, "first_version": c.first_version,
           "earlier_bundles": None, "unversioned_bundles": unversioned, "bundles": c.count}
    if c.min_build is not None:  # bundles per (engine, build) are counters: one row per build, not per bundle
        out["earlier_bundles"] = int(session.execute(select(func.coalesce(func.sum(EngineBuild.count), 0)).where(
            EngineBuild.engine == c.engine, EngineBuild.build_number < c.min_build)).scalar_one())
    return out


def cluster_detail(session: Session, cluster_id: int, newest: int = 20) -> dict | None:
    """One cluster with facet tables, suggestion counts (ranked by confirmations), what worked here
    (:func:`kvreport_server.outcomes.what_worked`), regression view and its newest bundles."""
    c = session.get(Cluster, cluster_id)
    if c is None:
        return None
    out = cluster_dict(c)
    kinds = ("engine_version", "gpu", "model", "backend", "verdict", "n_ctx", "suggestion")
    facets = top_facets(session, [c.id], kinds, per_kind=50).get(c.id, {})
    out["facets"] = {k: [{"value": v, "count": n} for v, n in facets.get(k, [])] for k in kinds}
    if facets.get("n_ctx"):
        out["facets"]["n_ctx"].sort(key=lambda x: ascii_int(x["value"], 30) or 0)
    from kvreport_server.outcomes import rank_suggestions, what_worked

    # what worked here (confirmed outcomes), and the suggestions given ranked by those confirmations
    out["what_worked"] = what_worked(session, c)
    out["facets"]["suggestion"] = rank_suggestions(out["facets"]["suggestion"], out["what_worked"])
    out["sparkline"] = sparklines(session, [c.id]).get(c.id, [0] * SPARK_DAYS)
    out["regression"] = regression(session, c)
    skip = {(k, v) for k, v in (("backend", c.backend), ("verdict", None)) if v}
    out["correlations"] = correlations(session, c.id, c.count, skip=skip)
    out["merged_from"] = [{"id": m.id, "title": m.title, "key": m.key, "merged_at": iso(m.merged_at)}
                          for m in session.execute(select(Cluster).where(Cluster.merged_into == c.id)
                                                   .order_by(Cluster.id)).scalars()]
    if c.merged_into is not None:
        target = session.get(Cluster, c.merged_into)
        out["merged_into_title"] = target.title if target is not None else None
    rows = session.execute(select(Bundle).where(Bundle.cluster_id == c.id)
                           .order_by(Bundle.received_at.desc(), Bundle.id.desc()).limit(newest)).scalars().all()
    out["bundles"] = [bundle_summary(b) for b in rows]
    return out
