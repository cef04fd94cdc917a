"""Tables (SQLAlchemy 2.x declarative). The schema changes only through Alembic (migrations/).

* ``Bundle``: a bundle stored whole (``data``, JSON / JSONB on PostgreSQL) with its current
  diagnosis and the indexed facts used by filters.
* ``Cluster``: one failure signature (``scheme``, ``key``) with counters kept up to date in the
  upload transaction (``store.py``), so the cluster list never scans bundles.
* ``ClusterFacet``: per-cluster counts of a fact (engine version, GPU, model, n_ctx, suggestion...).
* ``ClusterDay``: per-cluster bundle count per UTC day (sparklines, trend).
* ``EngineBuild``: bundles per engine and build number (the regression view).
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


class Bundle(Base):
    __tablename__ = "bundles"
    __table_args__ = (
        Index("ix_bundles_cluster_received", "cluster_id", "received_at"),
        Index("ix_bundles_engine_build", "engine_name", "build_number"),
        Index("ix_bundles_cluster_build", "cluster_id", "build_number"),  # a cluster's build range, re-counted
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


class EngineBuild(Base):
    """Bundles per (engine, build number): the regression view's "N bundles from earlier builds" is a
    sum over builds, not a count over bundles (kept with the other counters by ``store.Counts``)."""

    __tablename__ = "engine_builds"

    engine: Mapped[str] = mapped_column(String(40), primary_key=True)
    build_number: Mapped[int] = mapped_column(Integer, primary_key=True)
    count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)


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
