"""/api/v1/known-issues: the known fixes and issue links the maintainers set on clusters, in the client's
known-issues catalog format (``kvreport-known/1``, :mod:`kvreport.known`), for ``kvreport known --update``.

Each cluster with a known fix or an issue link is one entry whose ``match`` is its failure signature
(``engine/phase/backend``), so that a client matches the same failures offline. Reading follows the server's
read rule: public servers answer everyone; private ones a signed-in user or any valid token.
"""

from __future__ import annotations

import datetime as dt

from flask.views import MethodView
from flask_smorest import Blueprint
from sqlalchemy import or_, select

from kvreport_server import auth
from kvreport_server.api.common import error_responses
from kvreport_server.db import get_session
from kvreport_server.models import Cluster
from kvreport_server.schemas import KnownCatalogSchema
from kvreport_server.urls import base_url, cluster_url

blp = Blueprint("known", __name__, url_prefix="/api/v1",
                description="Known fixes of this server's clusters, in the client's offline catalog format")

MAX_ENTRIES = 2000


def _signature(c: Cluster) -> str:
    parts = str(c.key or "").split("/")
    engine = c.engine or (parts[0] if parts else None)
    phase = c.phase or (parts[1] if len(parts) > 1 else None)
    backend = c.backend or (parts[2] if len(parts) > 2 else None)
    return "/".join(p or "unknown" for p in (engine, phase, backend))


def cluster_entry(c: Cluster) -> dict:
    """One catalog entry for a cluster with a known fix or an issue link."""
    return {
        "id": f"cluster-{c.id}",
        "title": (c.title or c.key or f"cluster {c.id}")[:300],
        "url": c.issue_url or None,
        "cluster_url": cluster_url(c.id),
        "status": c.status,
        "workaround": c.known_fix or None,
        "count": c.count,
        "match": {"signature": _signature(c)},
    }


def known_catalog(session) -> dict:
    """The catalog document; entries the client's validator would refuse (a malformed link kept from an older
    server) are left out rather than breaking every client's update."""
    from kvreport.known import SCHEMA, entry_problem

    rows = session.execute(
        select(Cluster).where(or_(Cluster.known_fix.is_not(None), Cluster.issue_url.is_not(None)))
        .order_by(Cluster.count.desc(), Cluster.id).limit(MAX_ENTRIES)).scalars().all()
    entries = [e for e in map(cluster_entry, rows) if entry_problem(e, curated=False) is None]
    return {
        "schema": SCHEMA,
        "description": "Known fixes and issue links set by this server's maintainers, one entry per cluster",
        "server": base_url(),
        "generated_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "entries": entries,
    }


@blp.route("/known-issues")
class KnownIssues(MethodView):
    @blp.doc(security=[{}, {"bearerAuth": []}])
    @blp.response(200, KnownCatalogSchema)
    @error_responses(blp, 401, 429)
    def get(self):
        """The maintainers' known fixes as an offline catalog (``kvreport known --update`` stores it)."""
        auth.require_read()
        return known_catalog(get_session())
