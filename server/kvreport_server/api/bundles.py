"""/api/v1/bundles: upload (POST), read (GET) and purge (DELETE) bundles."""

from __future__ import annotations

import re

from flask import current_app, request
from flask.views import MethodView
from flask_smorest import Blueprint

from kvreport_server import analysis, auth, limits, store
from kvreport_server.api.common import cluster_ref, error_responses
from kvreport_server.db import get_db, get_session
from kvreport_server.errors import ApiError
from kvreport_server.models import Bundle, Cluster
from kvreport_server.queries import iso
from kvreport_server.schemas import (
    BundleResponseSchema,
    DeletedSchema,
    OutcomeResponseSchema,
    UploadResponseSchema,
)
from kvreport_server.urls import bundle_url

blp = Blueprint("bundles", __name__, url_prefix="/api/v1", description="Bundles: upload and read")

BUNDLE_ID = r"^[0-9A-HJKMNP-TV-Z]{26}$"
UPLOAD_BODY = {
    "required": True,
    "description": "a kvreport bundle (kvreport/bundle@1); may be sent with Content-Encoding: gzip",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Bundle"}}},
}


def is_bundle_id(text: str) -> bool:
    return re.fullmatch(BUNDLE_ID, text) is not None


def parse_upload() -> tuple[dict, int]:
    """The request's bundle, checked against the limits and validated (ApiError otherwise)."""
    ctype = (request.mimetype or "").lower()
    if ctype not in ("application/json", "") and not ctype.endswith("+json"):
        raise ApiError(415, f"Content-Type must be application/json, not {ctype}", code="unsupported_media_type")
    cfg = current_app.config
    body = limits.read_body(request, cfg["MAX_BODY_BYTES"], cfg["MAX_JSON_BYTES"])
    data = limits.parse_json(body, max_nodes=cfg["MAX_JSON_NODES"], max_depth=cfg["MAX_JSON_DEPTH"],
                             max_items=max(cfg["MAX_JSON_ITEMS"], cfg["MAX_LOG_LINES"]),
                             max_string=cfg["MAX_STRING_CHARS"])
    data = limits.check_and_clean(data, max_depth=cfg["MAX_JSON_DEPTH"], max_string=cfg["MAX_STRING_CHARS"],
                                  max_log_lines=cfg["MAX_LOG_LINES"], max_devices=cfg["MAX_DEVICES"])
    from kvreport.bundle import ACCEPTED_SCHEMAS, BundleError, validate_bundle

    if not isinstance(data, dict):
        raise ApiError(422, "a bundle is a JSON object", code="invalid")
    if "schema" in data and data["schema"] not in ACCEPTED_SCHEMAS:
        raise ApiError(422, f"unsupported bundle schema {str(data['schema'])[:80]!r}; this server accepts "
                            + ", ".join(ACCEPTED_SCHEMAS), code="unsupported_schema", field="schema",
                       extra={"accepted": list(ACCEPTED_SCHEMAS)})
    try:
        bundle = validate_bundle(data)
    except BundleError as exc:
        field, message = _first_problem(exc)
        raise ApiError(422, str(exc)[:2000], code="invalid", field=field,
                       extra={"accepted": list(ACCEPTED_SCHEMAS)} if field == "schema" else None) from None
    return bundle, len(body)


def _first_problem(exc) -> tuple[str | None, str]:
    from kvreport.bundle import _flatten_paths

    paths = _flatten_paths(exc.messages)
    if not paths:
        return None, str(exc)
    field, _, message = paths[0].partition(": ")
    return (None if field == "<bundle>" else field), message


def bundle_response(row: Bundle, cluster: Cluster) -> dict:
    return {"id": row.id, "url": bundle_url(row.id), "cluster": cluster_ref(cluster, get_session()),
            "received_at": iso(row.received_at), "analyzer_version": row.analyzer_version,
            "bundle": row.data, "diagnosis": row.diagnosis}


@blp.route("/bundles")
class Bundles(MethodView):
    @blp.doc(security=[{"bearerAuth": []}], requestBody=UPLOAD_BODY,
             description="Store a bundle; idempotent on its id (201 new, 200 same content, 409 different).")
    @blp.response(201, UploadResponseSchema)
    @blp.alt_response(200, schema=UploadResponseSchema, description="already stored with the same content")
    @error_responses(blp, 400, 401, 403, 409, 413, 415, 422, 429)
    def post(self):
        token = auth.require_scope("upload")
        bundle, size = parse_upload()
        refuse, flagged = analysis.find_secrets(bundle)
        if refuse and current_app.config.get("SECRETS_POLICY", "refuse") != "flag":
            paths = ", ".join(sorted({p for p, _k in refuse})[:10])
            kinds = ", ".join(sorted({k for _p, k in refuse}))
            raise ApiError(422, f"the bundle still carries secrets ({kinds}) at {paths}; "
                                "redact them (update kvreport) and upload again", code="secrets_found",
                           field=refuse[0][0])
        flagged = flagged + refuse
        result = store.ingest(get_db(), bundle, size_bytes=size, token_id=token.id,
                              flagged=[f"{p} ({k})" for p, k in flagged])
        answer = {"id": result.bundle_id, "url": bundle_url(result.bundle_id),
                  "cluster": cluster_ref(result.cluster, get_session()), "diagnosis": result.diagnosis}
        if flagged:
            answer["flagged_secrets"] = sorted({p for p, _k in flagged})
        headers = {"Location": bundle_url(result.bundle_id)}
        return answer, result.status, headers


@blp.route("/bundles/<string:bundle_id>")
class BundleItem(MethodView):
    @blp.doc(security=[{}, {"bearerAuth": []}])
    @blp.response(200, BundleResponseSchema)
    @error_responses(blp, 401, 404, 429)
    def get(self, bundle_id: str):
        auth.require_read()
        session = get_session()
        row = session.get(Bundle, bundle_id) if is_bundle_id(bundle_id) else None
        if row is None:
            raise ApiError(404, f"no bundle {bundle_id[:40]}", code="not_found")
        return bundle_response(row, session.get(Cluster, row.cluster_id))

    @blp.doc(security=[{"bearerAuth": []}])
    @blp.response(200, DeletedSchema)
    @error_responses(blp, 401, 403, 404, 429)
    def delete(self, bundle_id: str):
        auth.require_scope("admin")
        if not is_bundle_id(bundle_id) or not store.delete_bundle(get_db(), bundle_id):
            raise ApiError(404, f"no bundle {bundle_id[:40]}", code="not_found")
        return {"id": bundle_id, "deleted": True}


OUTCOME_BODY = {
    "required": True,
    "description": "what worked after this bundle's failure on the same machine (kvreport run / collect)",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Outcome"}}},
}


@blp.route("/bundles/<string:bundle_id>/outcomes")
class BundleOutcomes(MethodView):
    @blp.doc(security=[{"bearerAuth": []}], requestBody=OUTCOME_BODY,
             description="Store an outcome of a failed bundle (a later run that worked: the salted machine hash, "
                         "the change and its suggestion ids); idempotent on its id (201 new, 200 same content, "
                         "409 different). The reply's cluster says what worked here.")
    @blp.response(201, OutcomeResponseSchema)
    @blp.alt_response(200, schema=OutcomeResponseSchema, description="already stored with the same content")
    @error_responses(blp, 400, 401, 403, 404, 409, 413, 415, 422, 429)
    def post(self, bundle_id: str):
        from kvreport_server import outcomes

        token = auth.require_scope("upload")
        if not is_bundle_id(bundle_id):
            raise ApiError(404, f"no bundle {bundle_id[:40]}", code="not_found")
        ctype = (request.mimetype or "").lower()
        if ctype not in ("application/json", "") and not ctype.endswith("+json"):
            raise ApiError(415, f"Content-Type must be application/json, not {ctype}", code="unsupported_media_type")
        cfg = current_app.config
        body = limits.read_body(request, min(cfg["MAX_BODY_BYTES"], 65536), min(cfg["MAX_JSON_BYTES"], 65536))
        data = limits.parse_json(body, max_nodes=2000, max_depth=6, max_items=64, max_string=cfg["MAX_STRING_CHARS"])
        if isinstance(data, dict) and isinstance(data.get("change"), dict):
            # flag names are free-form keys (OpenAPI 3.0 cannot state a pattern for them): cleaned like a
            # bundle's keys (no NUL, no lone surrogates); values are checked, not cleaned
            data["change"] = {limits._clean_str(k): v for k, v in data["change"].items()}
        outcome = outcomes.load_outcome(data)
        outcomes.check_secrets(outcome)
        status, cluster_id = outcomes.store(get_db(), bundle_id, outcome, token_id=token.id)
        session = get_session()
        answer = {"id": outcome["id"], "bundle_id": bundle_id, "url": bundle_url(bundle_id),
                  "cluster": cluster_ref(session.get(Cluster, cluster_id), session)}
        return answer, status
