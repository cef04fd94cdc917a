"""Helpers shared by the API views: documented error responses and cluster references."""

from __future__ import annotations

from kvreport_server.models import Cluster
from kvreport_server.queries import cluster_dict
from kvreport_server.schemas import ApiErrorSchema
from kvreport_server.urls import cluster_url


def error_responses(blp, *codes: int):
    """Document ``codes`` as ``{"error": ...}`` responses of a view."""

    def deco(fn):
        for code in codes:
            fn = blp.alt_response(code, schema=ApiErrorSchema, description="error")(fn)
        return fn

    return deco


def cluster_ref(c: Cluster, session=None) -> dict:
    """A cluster as the bundle and outcome replies name it; with a ``session`` also ``what_worked``
    (:func:`kvreport_server.outcomes.what_worked`: what confirmed outcomes say worked for others)."""
    d = cluster_dict(c)
    ref = {"id": d["id"], "key": d["key"], "title": d["title"], "count": d["count"], "status": d["status"],
           "known_fix": d["known_fix"], "issue_url": d["issue_url"], "url": cluster_url(c.id)}
    if session is not None:
        from kvreport_server.outcomes import what_worked

        ref["what_worked"] = what_worked(session, c)  # an upload's cluster is its row as committed
    return ref
