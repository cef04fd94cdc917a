"""Tables (SQLAlchemy 2.x declarative). The schema changes only through Alembic (migrations/).

* ``Bundle``: a bundle stored whole (``data``, JSON / JSONB on PostgreSQL) with its current
  diagnosis and the indexed facts used by filters.
* ``Cluster``: one failure signature (``scheme``, ``key``) with counters kept up to date in the
  upload transaction (``store.py``), so the cluster list never scans bundles.
* ``ClusterFacet``: per-cluster counts of a fact (engine version, GPU, model, n_ctx, suggestion...).
* ``ClusterDay``: per-cluster bundle count per UTC day (sparklines, trend).
* ``Cluster.trend``: the cluster's trend (its bundles of the last 7 UTC days minus the 7 before, from
  ``cluster_days``), which holds from ``trend_day`` through ``trend_until`` (NULL: for good), kept by the
  writers (``counts.Counts``) and brought to a new day by :func:`kvreport_server.counts.refresh_trends`,
  so that ``sort=trend`` reads an index (``ix_clusters_trend``).
* Search (``q``) on PostgreSQL: pg_trgm GIN indexes on ``lower(title)``, ``lower(key)`` and the
  ``lower(value)`` of the facet kinds searched (migration 0007; none where pg_trgm is missing).
* ``FacetTotal``: per-facet-value counts over all bundles (the "overall" side of correlations),
  kept in the same transaction as ``ClusterFacet``.
* ``EngineBuild``: bundles per (engine, build number), for the regression view's "bundles from
  earlier builds" (a sum over builds, not a count over bundles), kept the same way.
* Merges: ``Cluster.merged_into`` points a merged cluster at the one that absorbed it; each bundle
  keeps ``home_cluster_id``, the cluster of its own signature, so that an unmerge knows which
  bundles go back. ``Bundle.facet_keys`` is what the bundle added to the facet counters.
* ``Outcome``: a later run that worked on the reporter's machine, linked to the failed bundle (a salted machine
  hash, the change and its suggestion ids; facts sent by ``kvreport run`` / ``collect``, kvreport.confirm), and
  ``OutcomeSuggestion`` one row per suggestion id it confirms (the "what worked here" counts per cluster).
* ``ApiToken`` / ``User``: access (tokens stored as SHA-256 digests; passwords with a KDF).
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Date,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

JSONType = JSON().with_variant(postgresql.JSONB(), "postgresql")

CLUSTER_STATUSES = ("new", "known_fix", "linked_issue", "ignored")
SCOPES = ("upload", "write", "admin")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class Base(DeclarativeBase):
    pass


class Cluster(Base):
    __tablename__ = "clusters"
    __table_args__ = (UniqueConstraint("scheme", "key", name="uq_clusters_scheme_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    scheme: Mapped[int] = mapped_column(Integer, nullable=False, default=1)
    key: Mapped[str] = mapped_column(String(300), nullable=False)
    signature_id: Mapped[str | None] = mapped_column(String(64))
    title: Mapped[str] = mapped_column(String(500), nullable=False, default="")
    engine: Mapped[str | None] = mapped_column(String(40), index=True)
    phase: Mapped[str | None] = mapped_column(String(40), index=True)
    backend: Mapped[str | None] = mapped_column(String(40), index=True)
    verdict: Mapped[str | None] = mapped_column(String(40), index=True)
    count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    machines: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    first_seen: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    last_seen: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), index=True)
    min_build: Mapped[int | None] = mapped_column(Integer)
    max_build: Mapped[int | None] = mapped_column(Integer)
    first_version: Mapped[str | None] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(20), nullable=False, default="new", index=True)
    known_fix: Mapped[str | None] = mapped_column(Text)
    issue_url: Mapped[str | None] = mapped_column(String(500))
    updated_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    merged_into: Mapped[int | None] = mapped_column(ForeignKey("clusters.id", name="fk_clusters_merged_into"))
    merged_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    trend: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    trend_day: Mapped[dt.date | None] = mapped_column(Date)
    trend_until: Mapped[dt.date | None] = mapped_column(Date, index=True)


# ``sort=trend`` (ORDER BY trend DESC, count DESC, id ... LIMIT): read in index order
Index("ix_clusters_trend", Cluster.trend.desc(), Cluster.count.desc(), Cluster.id)

# Indexes that migration 0007 adds on PostgreSQL where pg_trgm can be had, and nowhere else: not in
# these models, and left alone by autogenerate and by the test that compares models and migrations.
TRIGRAM_INDEXES = ("ix_clusters_title_trgm", "ix_clusters_key_trgm", "ix_cluster_facets_value_trgm")


def compared(obj, name, type_, reflected, compare_to) -> bool:
    """Alembic ``include_object``: everything but :data:`TRIGRAM_INDEXES`."""
    return not (type_ == "index" and name in TRIGRAM_INDEXES)


class Bundle(Base):
    __tablename__ = "bundles"
    __table_args__ = (
        Index("ix_bundles_cluster_received", "cluster_id", "received_at"),
        Index("ix_bundles_engine_build", "engine_name", "build_number"),
        Index("ix_bundles_cluster_build", "cluster_id", "build_number"),
    )

    id: Mapped[str] = mapped_column(String(26), primary_key=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id"), nullable=False)
    content_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    data: Mapped[dict] = mapped_column(JSONType, nullable=False)
    diagnosis: Mapped[dict] = mapped_column(JSONType, nullable=False)
    analyzer_version: Mapped[str] = mapped_column(String(40), nullable=False, index=True)
    created_at: Mapped[str | None] = mapped_column(String(40))
    received_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    engine_name: Mapped[str | None] = mapped_column(String(40))
    engine_version: Mapped[str | None] = mapped_column(String(100))
    build_number: Mapped[int | None] = mapped_column(Integer)
    backend: Mapped[str | None] = mapped_column(String(40))
    gpu: Mapped[str | None] = mapped_column(String(200))
    model_name: Mapped[str | None] = mapped_column(String(300))
    n_ctx: Mapped[int | None] = mapped_column(BigInteger)
    phase: Mapped[str | None] = mapped_column(String(40))
    verdict: Mapped[str | None] = mapped_column(String(40))
    machine: Mapped[str | None] = mapped_column(String(32))
    size_bytes: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    suggestion_ids: Mapped[list | None] = mapped_column(JSONType)
    flagged_secrets: Mapped[list | None] = mapped_column(JSONType)  # ["path (kind)"], values never stored here
    token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id", ondelete="SET NULL"))
    # the cluster of the bundle's own signature (differs from cluster_id while that one is merged)
    home_cluster_id: Mapped[int | None] = mapped_column(
        ForeignKey("clusters.id", name="fk_bundles_home_cluster"), index=True)
    facet_keys: Mapped[list | None] = mapped_column(JSONType)  # [[kind, value], ...] as counted


class ClusterFacet(Base):
    __tablename__ = "cluster_facets"
    __table_args__ = (Index("ix_cluster_facets_kind_value", "kind", "value"),)

    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"), primary_key=True)
    kind: Mapped[str] = mapped_column(String(20), primary_key=True)
    value: Mapped[str] = mapped_column(String(200), primary_key=True)
    count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)


class ClusterDay(Base):
    __tablename__ = "cluster_days"

    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"), primary_key=True)
    day: Mapped[dt.date] = mapped_column(Date, primary_key=True)
    count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)


class FacetTotal(Base):
    __tablename__ = "facet_totals"

    kind: Mapped[str] = mapped_column(String(20), primary_key=True)
    value: Mapped[str] = mapped_column(String(200), primary_key=True)
    count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)


class EngineBuild(Base):
    __tablename__ = "engine_builds"

    engine: Mapped[str] = mapped_column(String(40), primary_key=True)
    build_number: Mapped[int] = mapped_column(Integer, primary_key=True)
    count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
class Outcome(Base):
    __tablename__ = "outcomes"

    id: Mapped[str] = mapped_column(String(26), primary_key=True)  # the client's ULID: the idempotency key
    bundle_id: Mapped[str] = mapped_column(ForeignKey("bundles.id", ondelete="CASCADE"), nullable=False, index=True)
    machine: Mapped[str] = mapped_column(String(64), nullable=False)  # SHA-256 of a client-side salt and facts
    worked: Mapped[bool] = mapped_column(Boolean, nullable=False)
    change: Mapped[dict] = mapped_column(JSONType, nullable=False)  # {shown flag: [from, to]}
    suggestion_ids: Mapped[list] = mapped_column(JSONType, nullable=False)
    engine: Mapped[str | None] = mapped_column(String(40))
    created_at: Mapped[str] = mapped_column(String(40), nullable=False)
    received_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    content_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id", ondelete="SET NULL"))


class OutcomeSuggestion(Base):
    __tablename__ = "outcome_suggestions"
    __table_args__ = (Index("ix_outcome_suggestions_bundle", "bundle_id"),)

    outcome_id: Mapped[str] = mapped_column(ForeignKey("outcomes.id", ondelete="CASCADE"), primary_key=True)
    suggestion_id: Mapped[str] = mapped_column(String(60), primary_key=True)
    bundle_id: Mapped[str] = mapped_column(ForeignKey("bundles.id", ondelete="CASCADE"), nullable=False)


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), nullable=False, index=True)
    prefix: Mapped[str] = mapped_column(String(16), nullable=False, unique=True)
    digest: Mapped[str] = mapped_column(String(64), nullable=False)
    scope: Mapped[str] = mapped_column(String(10), nullable=False, default="upload")
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    last_used_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    username: Mapped[str] = mapped_column(String(100), nullable=False, unique=True)
    password_hash: Mapped[str] = mapped_column(String(300), nullable=False)
    is_maintainer: Mapped[bool] = mapped_column(Boolean, nullable=False, default=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    disabled: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    # moves on at every sign-out: session cookies carry the version they were issued with
    session_version: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")

    # Flask-Login protocol
    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def is_active(self) -> bool:
        return not self.disabled

    @property
    def is_anonymous(self) -> bool:
        return False

    def get_id(self) -> str:
        return str(self.id)
