"""The JSON API (flask-smorest) at /api/v1; OpenAPI document at /api/v1/openapi.json."""

from __future__ import annotations

from flask import Flask
from flask_smorest import Api

from kvreport_server.api import bundles, clusters, known
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
    from kvreport_server.schemas import OutcomeSchema

    if "Bundle" not in api.spec.components.schemas:
        api.spec.components.schema("Bundle", schema=BundleSchema)
    if "Outcome" not in api.spec.components.schemas:
        api.spec.components.schema("Outcome", schema=OutcomeSchema)
    api.register_blueprint(bundles.blp)
    api.register_blueprint(clusters.blp)
    api.register_blueprint(known.blp)
    _state_limits(api.spec.components.schemas)
    return api


def _state_limits(schemas: dict) -> None:
    """Integers the server reads are 64-bit (issue 13, item 11): every integer property of the
    documented schemas without a range gets -(2**63-1)..2**63-1 (a bigger one in a typed field is
    refused; in an open section it is kept as a float)."""
    from kvreport_server.schemas import INT64

    def walk(node):
        if isinstance(node, dict):
            any_of = node.get("anyOf")
            if (isinstance(any_of, list) and len(any_of) == 2 and "$ref" in any_of[0]
                    and any_of[1] == {"type": "object", "nullable": True}):
                # apispec's "Nested or null" lets any object through; say "this schema, or null"
                del node["anyOf"]
                node["allOf"] = [any_of[0]]
                node["nullable"] = True
            if node.get("type") == "integer":
                node.setdefault("minimum", -INT64)
                node.setdefault("maximum", INT64)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schemas)
    lines = (schemas.get("Log") or {}).get("properties", {}).get("lines")
    if isinstance(lines, dict) and lines.get("items") == {}:
        # a log line is [line number >= 1, text]: stated as a JSON Schema (draft 4) tuple, which
        # schemathesis and jsonschema read (OpenAPI 3.0 proper has no tuples)
        lines["items"] = {"type": "array", "minItems": 2, "maxItems": 2, "additionalItems": False,
                          "items": [{"type": "integer", "minimum": 1, "maximum": INT64}, {"type": "string"}],
                          "description": "[line number (integer >= 1), text (string)]"}
