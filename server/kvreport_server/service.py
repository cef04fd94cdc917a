"""Writes other than uploads: a maintainer's changes to a cluster (API PATCH and the web form)."""

from __future__ import annotations

from kvreport_server.db import Database
from kvreport_server.limits import clean_text
from kvreport_server.models import Cluster, utcnow


def update_cluster(db: Database, cluster_id: int, changes: dict) -> bool:
    """Set ``known_fix`` (Markdown), ``issue_url`` and/or ``status`` of a cluster.

    Empty strings clear a field. When ``status`` is not given it follows the content: a known fix
    makes a "new" cluster "known_fix", an issue URL makes it "linked_issue". Returns False when the
    cluster does not exist.
    """
    with db.write_lock(), db.Session() as session, session.begin():
        c = session.get(Cluster, cluster_id, with_for_update=True)
        if c is None:
            return False
        if "known_fix" in changes:
            c.known_fix = clean_text(changes["known_fix"] or "").strip()[:20000] or None
        if "issue_url" in changes:
            c.issue_url = clean_text(changes["issue_url"] or "").strip()[:500] or None
        if changes.get("status"):
            c.status = changes["status"]
        elif c.status in ("new", "known_fix", "linked_issue"):
            c.status = "known_fix" if c.known_fix else "linked_issue" if c.issue_url else "new"
        c.updated_at = utcnow()
    return True
