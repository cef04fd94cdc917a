"""The counters every writer keeps, and how they are written: :class:`Counts`.

A cluster's ``count``, distinct ``machines``, first/last seen, build range and first version (the
``clusters`` row), its facet counts (``cluster_facets``) and per-day counts (``cluster_days``), the
bundles per engine build (``engine_builds``) and the facet counts over all bundles (``facet_totals``)
equal what a full scan of ``bundles`` gives (``tests/server/server_helpers.scan`` checks). A writer
(``store.py``: an upload, a delete, a merge, a re-analysis batch) gathers its changes in a
:class:`Counts` as it goes and applies them at the end of its transaction, in one order: the facet
rows, the day rows, the cluster rows, the build rows, the totals, each table in key order in one
statement. That is step 3 of the global lock order (``store.py``'s docstring): the counter rows a
popular signature shares, and the totals every upload touches, are held only from there to the
commit, and no two writers wait for each other in a cycle.

The statements are built once per shape with every value a parameter (building a SQLAlchemy
statement costs more CPU than running it).

**Trend.** ``clusters.trend`` is the cluster's bundles of the last 7 UTC days minus the 7 before (its
``cluster_days`` rows of ``(day - 14, day]``), so that ``sort=trend`` reads an index instead of summing
every cluster's day rows. The value holds from ``trend_day`` (the day it was computed for) through
``trend_until`` (NULL: for good): the day before the first day on which one of the cluster's day rows
crosses a week boundary (:func:`trend_until`), so a new day changes only the rows with bundles on the
two days that cross, and :func:`refresh_trends` (the first ``sort=trend`` request of a day) rewrites only
those, in one UPDATE. A writer keeps the value in the UPDATE of the cluster row it makes anyway, after
its day rows: where the stored value holds on the writer's today, it adds the writer's change
(:func:`trend_delta`) and takes the earlier of the two last days; PostgreSQL evaluates that on the row
as the previous writer committed it (a waiting UPDATE re-reads the row), so concurrent writers each add
their own change. Where it does not hold (the first write after a day it no longer holds on), the
UPDATE marks it (``RESUM``) and a second UPDATE, a new statement on the row now locked, sums the
cluster's day rows as of today again (at most 14 and those after today, through the primary key): that
statement reads every day row a writer committed before it, and a writer still running adds its own
change after it. So the stored trend stays exact under concurrent writers, at midnight too, for one
statement per upload as before.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import time
from collections import Counter
from collections.abc import Iterable

from sqlalchemy import Date, Integer, any_, bindparam, case, delete, func, literal_column, select, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from kvreport_server.models import Bundle, Cluster, ClusterDay, ClusterFacet, EngineBuild, FacetTotal, utcnow

CT, BT, DT = Cluster.__table__, Bundle.__table__, ClusterDay.__table__
TREND_DAYS = 7  # the trend compares the last 7 days with the 7 before
RESUM = dt.date(1970, 1, 1)  # trend_until for a moment inside a writer: its trend is to be summed again


def utc_today() -> dt.date:
    """Today's UTC date: the day trends are as of (the pages' sparklines use the same)."""
    return dt.datetime.now(dt.timezone.utc).date()


def trend_window(today: dt.date) -> dict:
    """The bounds of the trend as of ``today``: this week is ``(week, today]``, last week ``(fortnight, week]``."""
    return {"p_today": today, "p_week": today - dt.timedelta(days=TREND_DAYS),
            "p_fortnight": today - dt.timedelta(days=2 * TREND_DAYS)}


def trend_delta(days: Iterable[tuple[dt.date, int]], today: dt.date) -> int:
    """What day count changes ``(day, delta)`` change a trend as of ``today`` by."""
    w = trend_window(today)
    return sum((d if day > w["p_week"] else -d) for day, d in days if w["p_fortnight"] < day <= today)


def trend_until(days: Iterable[dt.date], today: dt.date) -> dt.date | None:
    """The last day on which a trend as of ``today`` still holds as far as day rows ``days`` go: a day of
    this week moves to last week 7 days on, a day of last week leaves 14 days on, a day after today
    comes in on its day; None when none of them ever changes it."""
    w = trend_window(today)
    ends = [day - dt.timedelta(days=1) if day > today else
            day + dt.timedelta(days=TREND_DAYS - 1) if day > w["p_week"] else
            day + dt.timedelta(days=2 * TREND_DAYS - 1) for day in days if day > w["p_fortnight"]]
    return min(ends, default=None)


def _plus_days(col, n: int, dialect: str):
    """``col`` (a date) plus ``n`` days, in the dialect's words."""
    if dialect == "postgresql":
        return col + literal_column(str(n), Integer)
    return func.date(col, f"{n:+d} days", type_=Date)


def _trend_sum(cluster_id):
    """The trend of the cluster ``cluster_id`` (a column or parameter) as of ``p_today``, summed from its
    day rows (a scalar subquery; at most 14 rows, read through the primary key)."""
    d = DT.c
    week, fortnight = bindparam("p_week", type_=d.day.type), bindparam("p_fortnight", type_=d.day.type)
    return (select(func.coalesce(func.sum(case((d.day > week, d.count), else_=-d.count)), 0))
            .where(d.cluster_id == cluster_id, d.day > fortnight, d.day <= bindparam("p_today", type_=d.day.type))
            .scalar_subquery())


def _until_sum(cluster_id, dialect: str):
    """:func:`trend_until` of the cluster's day rows, in SQL (a scalar subquery: NULL when none counts)."""
    d = DT.c
    week, fortnight = bindparam("p_week", type_=d.day.type), bindparam("p_fortnight", type_=d.day.type)
    end = case((d.day > bindparam("p_today", type_=d.day.type), _plus_days(d.day, -1, dialect)),
               (d.day > week, _plus_days(d.day, TREND_DAYS - 1, dialect)),
               else_=_plus_days(d.day, 2 * TREND_DAYS - 1, dialect))
    return select(func.min(end)).where(d.cluster_id == cluster_id, d.day > fortnight).scalar_subquery()


def as_utc(value: dt.datetime | None) -> dt.datetime | None:
    """SQLite gives naive datetimes back: they are UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=dt.timezone.utc)
    return value


def _version_of(build: int | None, engine_version: str | None) -> str | None:
    return f"b{build}" if build is not None else engine_version


@dataclasses.dataclass
class _Span:
    """What arriving bundles add to a cluster row: received times, build range, first version, verdict."""

    first: dt.datetime | None = None
    last: dt.datetime | None = None
    first_version: str | None = None  # the version of the earliest arrival (for clusters without builds)
    lo: int | None = None
    hi: int | None = None
    verdict: str | None = None

    def add(self, t: dt.datetime | None, build: int | None, version: str | None, verdict: str | None) -> None:
        if t is not None:
            if self.first is None or t < self.first:
                self.first, self.first_version = t, version
            self.last = t if self.last is None or t > self.last else self.last
        if build is not None:
            self.lo = build if self.lo is None or build < self.lo else self.lo
            self.hi = build if self.hi is None or build > self.hi else self.hi
        if verdict and verdict != "unknown" and self.verdict is None:
            self.verdict = verdict

    def parts(self) -> tuple[set[str], dict]:
        """Which parts of :func:`_cluster_update` merge these arrivals into a cluster row, and their values."""
        parts: set[str] = set()
        values: dict = {}
        if self.first is not None:
            parts.add("times")
            values.update(p_first=self.first, p_last=self.last)
        if self.lo is not None:
            parts.add("builds")
            values.update(p_lo=self.lo, p_hi=self.hi, p_lo_version=f"b{self.lo}")
        elif self.first is not None:  # no builds: the version of the earliest bundle, while none has a build
            parts.add("version")
            values["p_version"] = self.first_version
        if self.verdict:
            parts.add("verdict")
            values["p_verdict"] = self.verdict
        return parts, values


@functools.cache
def _cluster_update(parts: frozenset[str], dialect: str = ""):
    """``UPDATE clusters`` of one cluster (``p_id``) with the given parts, every value a parameter: one
    statement object per shape, built once (building SQLAlchemy statements costs more CPU than
    running them). Every right side reads the row as it was before the statement."""
    c = CT.c
    p_first, p_last = bindparam("p_first", type_=CT.c.first_seen.type), bindparam("p_last", type_=CT.c.last_seen.type)
    p_lo, p_hi = bindparam("p_lo", type_=CT.c.min_build.type), bindparam("p_hi", type_=CT.c.max_build.type)
    text_of = CT.c.first_version.type
    values: dict = {"updated_at": bindparam("p_now", type_=CT.c.updated_at.type)}
    if "count" in parts:
        values.update(count=c.count + bindparam("p_count", type_=CT.c.count.type),
                      machines=c.machines + bindparam("p_machines", type_=CT.c.machines.type))
    if "times" in parts:
        values["first_seen"] = case((c.first_seen.is_(None) | (c.first_seen > p_first), p_first), else_=c.first_seen)
        values["last_seen"] = case((c.last_seen.is_(None) | (c.last_seen < p_last), p_last), else_=c.last_seen)
    if "builds" in parts:
        values["min_build"] = case((c.min_build.is_(None) | (c.min_build > p_lo), p_lo), else_=c.min_build)
        values["max_build"] = case((c.max_build.is_(None) | (c.max_build < p_hi), p_hi), else_=c.max_build)
        values["first_version"] = case((c.min_build.is_(None) | (c.min_build > p_lo),
                                        bindparam("p_lo_version", type_=text_of)), else_=c.first_version)
    if "version" in parts:
        values["first_version"] = case((c.min_build.is_(None) & (c.first_seen.is_(None) | (c.first_seen > p_first)),
                                        bindparam("p_version", type_=text_of)), else_=c.first_version)
    if "verdict" in parts:  # not part of the key (scheme 2): the cluster shows a known one once a bundle has it
        values["verdict"] = case((c.verdict.is_(None) | (c.verdict == "unknown"),
                                  bindparam("p_verdict", type_=CT.c.verdict.type)), else_=c.verdict)
    if "trend_add" in parts or "trend_add_until" in parts:  # this change, where the stored trend holds today
        today = bindparam("p_today", type_=Date())
        holds = (c.trend_day.is_(None) | (c.trend_day <= today)) & (c.trend_until.is_(None) | (c.trend_until >= today))
        until = c.trend_until
        if "trend_add_until" in parts:  # the earlier of the two last days
            new_until = bindparam("p_until", type_=Date())
            until = case((c.trend_until.is_(None) | (c.trend_until > new_until), new_until), else_=c.trend_until)
        values.update(trend=case((holds, c.trend + bindparam("p_trend", type_=c.trend.type)), else_=c.trend),
                      trend_day=case((holds, today), else_=c.trend_day),
                      trend_until=case((holds, until), else_=bindparam("p_resum", type_=Date())))
    if "trend_sum" in parts:  # summed from the day rows (this transaction's included) as of today
        values.update(trend=_trend_sum(c.id), trend_until=_until_sum(c.id, dialect),
                      trend_day=bindparam("p_today", type_=Date()))
    if "range" in parts:  # recomputed from the bundles (after some left)
        values.update({k: bindparam(f"p_{k}", type_=CT.c[k].type) for k in _RANGE})
    stmt = update(CT).where(c.id == bindparam("p_id", type_=CT.c.id.type))
    if "title" in parts:
        title = bindparam("p_title", type_=CT.c.title.type)
        values["title"] = title
        if parts == {"title"}:
            stmt = stmt.where(c.title != title)
    return stmt.values(values).returning(*CT.c)


_RANGE = ("first_seen", "last_seen", "min_build", "max_build", "first_version")


@dataclasses.dataclass
class Counts:
    """The counter changes of one transaction, gathered as it goes and applied by :meth:`apply` at
    its end in the global lock order (see the module docstring)."""

    facets: Counter = dataclasses.field(default_factory=Counter)   # (cluster, kind, value) -> delta
    days: Counter = dataclasses.field(default_factory=Counter)     # (cluster, day) -> delta
    count: Counter = dataclasses.field(default_factory=Counter)    # cluster -> delta
    totals: Counter = dataclasses.field(default_factory=Counter)   # (kind, value) -> delta
    builds: Counter = dataclasses.field(default_factory=Counter)   # (engine, build number) -> delta
    spans: dict[int, _Span] = dataclasses.field(default_factory=dict)
    lost: set[int] = dataclasses.field(default_factory=set)        # clusters some bundle left
    titles: dict[int, str] = dataclasses.field(default_factory=dict)
    started: float = 0.0  # perf_counter() when apply() began taking counter rows
    today: dt.date | None = None  # the day the trends written by apply() are as of
    day_changes: dict[int, list] = dataclasses.field(default_factory=dict)  # cluster -> [(day, delta)]

    def _bump(self, cid: int, t: dt.datetime, facets: Iterable[tuple[str, str]], delta: int) -> None:
        self.count[cid] += delta
        self.days[(cid, as_utc(t).date())] += delta
        for kind, value in facets:
            self.facets[(cid, kind, value)] += delta
            self.totals[(kind, value)] += delta

    def _build(self, engine: str | None, build: int | None, delta: int) -> None:
        if engine is not None and build is not None:
            self.builds[(engine, build)] += delta

    def add(self, cid: int, t: dt.datetime, facets: Iterable[tuple[str, str]], *, engine: str | None,
            build: int | None, engine_version: str | None, verdict: str | None) -> None:
        """Count in a bundle received at ``t`` (its engine, build number, engine version and verdict)."""
        t = as_utc(t)
        self._bump(cid, t, facets, 1)
        self._build(engine, build, 1)
        self.spans.setdefault(cid, _Span()).add(t, build, _version_of(build, engine_version), verdict)

    def remove(self, cid: int, t: dt.datetime, facets: Iterable[tuple[str, str]], *, engine: str | None,
               build: int | None) -> None:
        """Count out a bundle (the cluster's range is then recomputed from its bundles)."""
        self._bump(cid, t, facets, -1)
        self._build(engine, build, -1)
        self.lost.add(cid)

    def recount(self, cid: int, old: Iterable[tuple[str, str]], new: Iterable[tuple[str, str]], *,
                engines: tuple[str | None, str | None], build: int | None, verdict: str | None) -> None:
        """A bundle that stays in its cluster with the same time and build: only its facet values,
        its engine (old, new) and the cluster's verdict may change."""
        for kind, value in old:
            self.facets[(cid, kind, value)] -= 1
            self.totals[(kind, value)] -= 1
        for kind, value in new:
            self.facets[(cid, kind, value)] += 1
            self.totals[(kind, value)] += 1
        self._build(engines[0], build, -1)
        self._build(engines[1], build, 1)
        self.spans.setdefault(cid, _Span()).add(None, None, None, verdict)

    def apply(self, session: Session) -> dict[int, Cluster]:
        """Write every change, in the global lock order; the cluster rows written, by id."""
        self.started = time.perf_counter()
        self.today = utc_today()
        self.day_changes = {}
        for (cid, day), d in self.days.items():
            if d:
                self.day_changes.setdefault(cid, []).append((day, d))
        machines: Counter = Counter()
        for (cid, kind, _v), n, d in _add_counts(session, ClusterFacet.__table__, ("cluster_id", "kind", "value"),
                                                 self.facets):
            if kind == "machine":
                machines[cid] += (n > 0) - (n - d > 0)
        _add_counts(session, ClusterDay.__table__, ("cluster_id", "day"), self.days)
        out = {}
        for cid in sorted(set(self.count) | set(self.spans) | self.lost | set(self.titles) | set(machines)
                          | set(self.day_changes)):
            row = self._cluster(session, cid, machines[cid])
            if row is not None:
                out[cid] = Cluster(**dict(row._mapping))
        _add_counts(session, EngineBuild.__table__, ("engine", "build_number"), self.builds)
        _add_counts(session, FacetTotal.__table__, ("kind", "value"), self.totals)
        return out

    def _cluster(self, session: Session, cid: int, machines: int):
        parts: set[str] = set()
        values: dict = {"p_id": cid, "p_now": utcnow()}
        if self.count[cid] or machines:
            parts.add("count")
            values.update(p_count=self.count[cid], p_machines=machines)
        if cid in self.spans:
            more, more_values = self.spans[cid].parts()
            if cid in self.lost:  # recomputed below, from the bundles
                more -= {"times", "builds", "version"}
            parts |= more
            values.update(more_values)
        if cid in self.day_changes:  # see the module docstring
            changes = self.day_changes[cid]
            until = trend_until((day for day, _d in changes), self.today)
            parts.add("trend_add" if until is None else "trend_add_until")
            values.update(p_trend=trend_delta(changes, self.today), p_until=until, p_today=self.today,
                          p_resum=RESUM)
        if cid in self.titles:
            parts.add("title")
            values["p_title"] = self.titles[cid]
        if cid in self.lost:
            parts.add("count")  # locks the row before its bundles are read
        if not parts:
            return None
        dialect = session.get_bind().dialect.name
        row = session.execute(_cluster_update(frozenset(parts), dialect), {"p_count": 0, "p_machines": 0, **values}
                              ).one_or_none()
        if row is not None and row.trend_until == RESUM:  # the row is locked now: sum its day rows as of today
            row = session.execute(_cluster_update(frozenset({"trend_sum"}), dialect),
                                  {"p_id": cid, "p_now": utcnow(), **trend_window(self.today)}).one_or_none()
        if cid in self.lost:  # the row is locked now: the cluster's bundles are settled
            rng = {f"p_{k}": v for k, v in _range_of(session, cid).items()}
            row = session.execute(_cluster_update(frozenset({"range"})), {"p_id": cid, "p_now": utcnow(), **rng}
                                  ).one_or_none()
        return row


@functools.cache
def _upsert(dialect: str, table):
    """``INSERT … ON CONFLICT (key) DO UPDATE SET count = count + excluded.count RETURNING key, count``
    for ``table``, built once per dialect; run with a list of rows it is sent as one multi-row INSERT
    whose rows are locked in list order."""
    stmt = (pg_insert if dialect == "postgresql" else sqlite_insert)(table)
    keys = [c for c in table.primary_key.columns]
    stmt = stmt.on_conflict_do_update(index_elements=[c.name for c in keys],
                                      set_={"count": table.c.count + stmt.excluded.count})
    return stmt.returning(*keys, table.c.count)


@functools.cache
def _delete_zero(table):
    return delete(table).where(*(c == bindparam(c.name) for c in table.primary_key.columns), table.c.count <= 0)


def _add_counts(session: Session, table, key_cols: tuple[str, ...], deltas: Counter) -> list:
    """Add ``deltas`` ({key tuple: delta}) to the ``count`` of ``table``'s rows (``key_cols``: its primary
    key), in key order, in one upsert; delete the rows that reach 0. Returns ``(key, new count, delta)``
    per row changed."""
    items = sorted((k, d) for k, d in deltas.items() if d)
    if not items:
        return []
    rows = [{**dict(zip(key_cols, k, strict=True)), "count": d} for k, d in items]
    got = {tuple(r[:-1]): r[-1] for r in session.execute(_upsert(session.get_bind().dialect.name, table), rows)}
    out = [(k, got[k], d) for k, d in items]
    gone = [dict(zip(key_cols, k, strict=True)) for k, n, _d in out if n <= 0]
    if gone:
        session.execute(_delete_zero(table), gone)
    return out


def _range_of(session: Session, cid: int) -> dict:
    """First/last seen, build range and first version of a cluster, from its bundles (after some left)."""
    b = BT.c
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


def _stale(today):
    """Cluster rows whose trend no longer holds on ``today`` (``trend_until`` before it; an index read)."""
    return CT.c.trend_until < today


@functools.cache
def _refresh(dialect: str):
    """``UPDATE clusters`` bringing rows to ``p_today``: their trend and the last day it holds, summed
    from their day rows. On PostgreSQL the rows are the ids ``p_ids`` locked before
    (:func:`refresh_trends`), else the stale ones (SQLite: one writer at a time)."""
    c = CT.c
    if dialect == "postgresql":
        where = c.id == any_(bindparam("p_ids", type_=postgresql.ARRAY(c.id.type)))
    else:
        where = _stale(bindparam("p_today", type_=Date()))
    return update(CT).where(where).values(trend=_trend_sum(c.id), trend_until=_until_sum(c.id, dialect),
                                          trend_day=bindparam("p_today", type_=Date()))


def refresh_trends(session: Session, today: dt.date | None = None) -> int:
    """Bring the clusters whose trend changes on ``today`` (default: :func:`utc_today`) to it, in one
    UPDATE of those rows only (none after the first call of a day); the caller commits. Returns the
    rows updated.

    On PostgreSQL those rows are locked first, in id order (the writers' order, ``store.py``, so no
    writer and refresh wait for each other in a cycle; a row a writer brought to today meanwhile drops
    out, as the lock re-reads it), and the UPDATE is a later statement: it reads every day row committed
    before it, and a writer still running adds its own change after it (the module docstring)."""
    today = today or utc_today()
    params = trend_window(today)
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        params["p_ids"] = list(session.execute(select(CT.c.id).where(_stale(today)).order_by(CT.c.id)
                                               .with_for_update(key_share=True)).scalars())
        if not params["p_ids"]:
            return 0
    return session.execute(_refresh(dialect), params).rowcount


def stale_trends(session: Session, today: dt.date | None = None) -> bool:
    """Whether some cluster's trend no longer holds on ``today`` (an index read)."""
    today = today or utc_today()
    return session.execute(select(CT.c.id).where(_stale(today)).limit(1)).first() is not None
