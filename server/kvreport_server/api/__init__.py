"""The JSON API (flask-smorest) at /api/v1; OpenAPI document at /api/v1/openapi.json."""

from __future__ import annotations

from flask import Flask
from flask_smorest import Api

from kvreport_server.api import bundles, clusters
from kvreport_server.schemas import ApiErrorSchema


class KvreportApi(Api):
    """flask-smorest's Api with kvreport's error schema (``{"error": {"code", "message", "field"?}}``)."""

    ERROR_SCHEMA = ApiErrorSchema


def init_api(app: Flask) -> Api:
    app.config.setdefault("API_TITLE", "kvreport")
    app.config.setdefault("API_VERSION", "v1")
    app.config.setdefault("OPENAPI_VERSION", "3.0.3")
    app.config.setdefault("OPENAPI_URL_PREFIX", "/api/v1")
    app.config.setdefault("OPENAPI_JSON_PATH", "openapi.json")
    app.config.setdefault("API_SPEC_OPTIONS", {
        "info": {"description": "Upload kvreport bundles and browse failure clusters (design.md, HTTP API)."},
        "components": {"securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}}},
    })
    api = KvreportApi(app)
    from kvreport.bundle import BundleSchema

    if "Bundle" not in api.spec.components.schemas:
        api.spec.components.schema("Bundle", schema=BundleSchema)
    api.register_blueprint(bundles.blp)
    api.register_blueprint(clusters.blp)
    return api
