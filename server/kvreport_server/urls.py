"""Permalinks: KVREPORT_PUBLIC_URL when set (a server behind a proxy), else the request's host URL."""

from __future__ import annotations

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
