"""/api/v1/clusters: list (filters, search, sort, pages), one cluster, and maintainers' PATCH."""

from __future__ import annotations

from flask import current_app
from flask.views import MethodView
from flask_smorest import Blueprint

from kvreport_server import auth
from kvreport_server.api.common import error_responses
from kvreport_server.db import get_db, get_session
from kvreport_server.errors import ApiError
from kvreport_server.limits import ascii_int
from kvreport_server.queries import cluster_detail, list_clusters
from kvreport_server.schemas import (
    ClusterDetailSchema,
    ClusterListSchema,
    ClusterPatchSchema,
    ClusterQuerySchema,
    MergeRequestSchema,
    MergeResultSchema,
)
from kvreport_server.service import update_cluster
from kvreport_server.store import merge_clusters, unmerge_cluster
from kvreport_server.urls import bundle_url, cluster_url, facet_filter_url

blp = Blueprint("clusters", __name__, url_prefix="/api/v1", description="Clusters of bundles by failure signature")


@blp.route("/clusters")
class Clusters(MethodView):
    @blp.doc(security=[{}, {"bearerAuth": []}])
    @blp.arguments(ClusterQuerySchema, location="query", as_kwargs=True)
    @blp.response(200, ClusterListSchema)
    @error_responses(blp, 401, 422, 429)
    def get(self, page=1, per_page=None, **filters):
        auth.require_read()
        per_page = per_page or current_app.config["PAGE_SIZE"]
        items, total = list_clusters(get_session(), page=page, per_page=per_page, db=get_db(), **filters)
        for item in items:
            item["url"] = cluster_url(item["id"])
        return {"items": items, "page": page, "per_page": per_page, "total": total}


def _cluster_id(raw: str) -> int:
    value = ascii_int(raw, max_digits=9)
    if value is None:
        raise ApiError(404, f"no cluster {raw[:40]}", code="not_found")
    return value


@blp.route("/clusters/<string:cluster_id>")
class ClusterItem(MethodView):
    @blp.doc(security=[{}, {"bearerAuth": []}])
    @blp.response(200, ClusterDetailSchema)
    @error_responses(blp, 401, 404, 429)
    def get(self, cluster_id: str):
        auth.require_read()
        detail = cluster_detail(get_session(), _cluster_id(cluster_id))
        if detail is None:
            raise ApiError(404, f"no cluster {cluster_id}", code="not_found")
        return with_urls(detail)

    @blp.doc(security=[{"bearerAuth": []}])
    @blp.arguments(ClusterPatchSchema)
    @blp.response(200, ClusterDetailSchema)
    @error_responses(blp, 401, 403, 404, 422, 429)
    def patch(self, changes: dict, cluster_id: str):
        auth.require_scope("write")
        cid = _cluster_id(cluster_id)
        if not update_cluster(get_db(), cid, changes):
            raise ApiError(404, f"no cluster {cluster_id}", code="not_found")
        return with_urls(cluster_detail(get_session(), cid))


def with_urls(detail: dict) -> dict:
    """A cluster detail with the permalinks of the cluster, its bundles and its correlation filters."""
    detail["url"] = cluster_url(detail["id"])
    for b in detail["bundles"]:
        b["url"] = bundle_url(b["id"])
    for item in (detail.get("correlations") or {}).get("items", []):
        item["url"] = facet_filter_url(item["kind"], item["value"])
    return detail


@blp.route("/clusters/<string:cluster_id>/merge")
class ClusterMerge(MethodView):
    @blp.doc(security=[{"bearerAuth": []}], description=(
        "Merge this cluster into another one that is the same root cause (write scope): its bundles "
        "and counts move there, and later uploads of its signature count there too. Undo with /unmerge."))
    @blp.arguments(MergeRequestSchema)
    @blp.response(200, MergeResultSchema)
    @error_responses(blp, 401, 403, 404, 409, 422, 429)
    def post(self, body: dict, cluster_id: str):
        auth.require_scope("write")
        result = merge_clusters(get_db(), _cluster_id(cluster_id), body["into"])
        get_session().expire_all()
        result["cluster"] = with_urls(cluster_detail(get_session(), result["into"]))
        return result


@blp.route("/clusters/<string:cluster_id>/unmerge")
class ClusterUnmerge(MethodView):
    @blp.doc(security=[{"bearerAuth": []}], description=(
        "Undo a merge (write scope): the bundles of this cluster's signature, and of the clusters "
        "merged into it, go back here with their counts."))
    @blp.response(200, MergeResultSchema)
    @error_responses(blp, 401, 403, 404, 409, 429)
    def post(self, cluster_id: str):
        auth.require_scope("write")
        result = unmerge_cluster(get_db(), _cluster_id(cluster_id))
        get_session().expire_all()
        result["cluster"] = with_urls(cluster_detail(get_session(), result["unmerged"]))
        return result
