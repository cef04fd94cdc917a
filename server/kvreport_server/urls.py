"""Permalinks: KVREPORT_PUBLIC_URL when set (a server behind a proxy), else the request's host URL."""

from __future__ import annotations

from urllib.parse import urlencode

from flask import current_app, has_request_context, request


def base_url() -> str:
    configured = current_app.config.get("PUBLIC_URL")
    if configured:
        return str(configured).rstrip("/")
    if has_request_context():
        return request.host_url.rstrip("/")
    return ""


def bundle_url(bundle_id: str) -> str:
    return f"{base_url()}/bundles/{bundle_id}"


def cluster_url(cluster_id: int) -> str:
    return f"{base_url()}/clusters/{cluster_id}"


FILTER_PARAM = {"gpu": "gpu", "engine_version": "version", "backend": "backend", "verdict": "verdict"}
"""facet kind -> the clusters list's own filter; other kinds use ``facet=kind:value``."""


def facet_filter_path(kind: str, value: str) -> str:
    """``/?gpu=…`` (or ``/?facet=driver:…``): the clusters list filtered on one facet value."""
    param = FILTER_PARAM.get(kind)
    query = {param: value} if param else {"facet": f"{kind}:{value}"}
    return "/?" + urlencode(query)


def facet_filter_url(kind: str, value: str) -> str:
    return base_url() + facet_filter_path(kind, value)
