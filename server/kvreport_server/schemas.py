"""marshmallow schemas of the HTTP API (they also write the OpenAPI document)."""

from __future__ import annotations

from marshmallow import EXCLUDE, RAISE, Schema, ValidationError, fields, validate

from kvreport.bundle import StrictBoolean
from kvreport_server.models import CLUSTER_STATUSES
from kvreport_server.queries import SORTS

NO_NUL = r"^[^\u0000]*$"
ISSUE_URL = r"^(https?://[^ \t\r\n<>\"'\u0000]*)?$"
INT64 = 2**63 - 1


class SafeString(fields.String):
    """A string PostgreSQL can store and compare: no NUL characters, no lone surrogates. The
    OpenAPI document says so (``pattern``), unless the field has a pattern of its own."""

    def __init__(self, *args, **kwargs):
        metadata = dict(kwargs.pop("metadata", None) or {})
        validators = kwargs.get("validate")
        validators = validators if isinstance(validators, list | tuple) else [validators] if validators else []
        if not any(isinstance(v, validate.Regexp | validate.OneOf) for v in validators):
            metadata.setdefault("pattern", NO_NUL)
        super().__init__(*args, metadata=metadata, **kwargs)

    def _deserialize(self, value, attr, data, **kwargs):
        text = super()._deserialize(value, attr, data, **kwargs)
        if "\x00" in text:
            raise ValidationError("must not contain NUL characters")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValidationError("must be valid Unicode text") from None
        return text


class AsciiInteger(fields.Integer):
    """An integer from a query string: ASCII digits only (``int()`` would take ``٣``; ``²`` would fail)."""

    def _deserialize(self, value, attr, data, **kwargs):
        if isinstance(value, str):
            from kvreport_server.limits import ascii_int

            parsed = ascii_int(value, max_digits=18, signed=True)
            if parsed is None:
                raise self.make_error("invalid", input=value)
            value = parsed
        return super()._deserialize(value, attr, data, **kwargs)


class ApiErrorDetailSchema(Schema):
    code = fields.String(required=True)
    message = fields.String(required=True)
    field = fields.String()
    limit = fields.Integer()
    accepted = fields.List(fields.String())


class ApiErrorSchema(Schema):
    error = fields.Nested(ApiErrorDetailSchema, required=True)


class WhatWorkedSchema(Schema):
    id = fields.String(required=True, metadata={"description": "suggestion id (design.md vocabulary)"})
    machines = fields.Integer(required=True, metadata={"description": "distinct machines that confirmed it"})
    of = fields.Integer(required=True, metadata={"description": "distinct machines of the cluster"})
    outcomes = fields.Integer(required=True)
    text = fields.String(required=True, metadata={"description": "'reduce-ctx: confirmed on 7 of 9 machines'"})
    examples = fields.List(fields.String(), metadata={"description": "up to three changes that worked"})


class ClusterRefSchema(Schema):
    id = fields.Integer(required=True)
    key = fields.String(required=True)
    title = fields.String(required=True)
    count = fields.Integer(required=True)
    status = fields.String()
    known_fix = fields.String(allow_none=True)
    issue_url = fields.String(allow_none=True)
    url = fields.String()
    what_worked = fields.List(fields.Nested(WhatWorkedSchema),
                              metadata={"description": "what confirmed outcomes say worked here, most machines first"})


class UploadResponseSchema(Schema):
    id = fields.String(required=True)
    url = fields.String(required=True)
    cluster = fields.Nested(ClusterRefSchema, required=True)
    diagnosis = fields.Dict(required=True)
    flagged_secrets = fields.List(fields.String())


class ClusterSchema(Schema):
    id = fields.Integer(required=True)
    key = fields.String(required=True)
    scheme = fields.Integer()
    signature_id = fields.String(allow_none=True)
    title = fields.String(required=True)
    engine = fields.String(allow_none=True)
    phase = fields.String(allow_none=True)
    backend = fields.String(allow_none=True)
    verdict = fields.String(allow_none=True)
    count = fields.Integer(required=True)
    machines = fields.Integer()
    first_seen = fields.String(allow_none=True, metadata={"format": "date-time"})
    last_seen = fields.String(allow_none=True, metadata={"format": "date-time"})
    min_build = fields.Integer(allow_none=True)
    max_build = fields.Integer(allow_none=True)
    first_version = fields.String(allow_none=True)
    status = fields.String(required=True)
    known_fix = fields.String(allow_none=True)
    issue_url = fields.String(allow_none=True)
    url = fields.String()
    sparkline = fields.List(fields.Integer())
    trend = fields.Integer()
    backends = fields.List(fields.String())
    gpus = fields.List(fields.String())
    engine_versions = fields.List(fields.String())
    merged_into = fields.Integer(allow_none=True)


class ClusterListSchema(Schema):
    items = fields.List(fields.Nested(ClusterSchema), required=True)
    page = fields.Integer(required=True)
    per_page = fields.Integer(required=True)
    total = fields.Integer(required=True)


class FacetValueSchema(Schema):
    value = fields.String(required=True)
    count = fields.Integer(required=True)
    confirmed = fields.Integer(metadata={"description": "suggestion facet: machines whose outcome confirmed it"})


class BundleSummarySchema(Schema):
    id = fields.String(required=True)
    url = fields.String()
    received_at = fields.String(allow_none=True)
    created_at = fields.String(allow_none=True)
    engine = fields.String(allow_none=True)
    engine_version = fields.String(allow_none=True)
    build_number = fields.Integer(allow_none=True)
    backend = fields.String(allow_none=True)
    gpu = fields.String(allow_none=True)
    model = fields.String(allow_none=True)
    n_ctx = fields.Integer(allow_none=True)
    phase = fields.String(allow_none=True)
    verdict = fields.String(allow_none=True)
    requested_mib = fields.Float(allow_none=True)
    free_mib = fields.Float(allow_none=True)


class RegressionSchema(Schema):
    first_build = fields.Integer(allow_none=True)
    last_build = fields.Integer(allow_none=True)
    first_version = fields.String(allow_none=True)
    earlier_bundles = fields.Integer(allow_none=True)
    unversioned_bundles = fields.Integer()
    bundles = fields.Integer()


class CorrelationItemSchema(Schema):
    kind = fields.String(required=True)
    kind_title = fields.String()
    value = fields.String(required=True)
    cluster_count = fields.Integer(required=True, metadata={"description": "bundles of the cluster with the value"})
    cluster_share = fields.Float(required=True, metadata={"description": "cluster_count / bundles of the cluster"})
    overall_count = fields.Integer(required=True, metadata={"description": "bundles on the server with the value"})
    overall_share = fields.Float(required=True, metadata={"description": "overall_count / all bundles"})
    rest_share = fields.Float(metadata={"description": "share among the bundles outside the cluster"})
    ratio = fields.Float(allow_none=True, metadata={"description": "cluster_share / rest_share (null: only here)"})
    url = fields.String(metadata={"description": "the clusters list filtered on this value"})


class CorrelationsSchema(Schema):
    total_bundles = fields.Integer(required=True)
    cluster_bundles = fields.Integer(required=True)
    min_support = fields.Integer(required=True)
    min_share = fields.Float()
    min_ratio = fields.Float()
    items = fields.List(fields.Nested(CorrelationItemSchema), required=True)


class MergedClusterSchema(Schema):
    id = fields.Integer(required=True)
    title = fields.String()
    key = fields.String()
    merged_at = fields.String(allow_none=True)


class ClusterDetailSchema(ClusterSchema):
    facets = fields.Dict(keys=fields.String(), values=fields.List(fields.Nested(FacetValueSchema)))
    what_worked = fields.List(fields.Nested(WhatWorkedSchema),
                              metadata={"description": "what worked here: suggestion ids confirmed by later runs"})
    regression = fields.Nested(RegressionSchema)
    bundles = fields.List(fields.Nested(BundleSummarySchema))
    correlations = fields.Nested(CorrelationsSchema)
    merged_from = fields.List(fields.Nested(MergedClusterSchema))
    merged_into_title = fields.String(allow_none=True)


class MergeRequestSchema(Schema):
    class Meta:
        unknown = "raise"

    into = fields.Integer(required=True, strict=True, validate=validate.Range(min=1, max=2**31 - 1),
                          metadata={"description": "the cluster that absorbs this one"})


class MergeResultSchema(Schema):
    merged = fields.Integer()
    unmerged = fields.Integer()
    into = fields.Integer()
    from_ = fields.Integer(data_key="from", attribute="from")
    moved = fields.Integer(required=True)
    cluster = fields.Nested(ClusterDetailSchema, required=True)


class BundleResponseSchema(Schema):
    id = fields.String(required=True)
    url = fields.String(required=True)
    cluster = fields.Nested(ClusterRefSchema, required=True)
    received_at = fields.String(allow_none=True)
    analyzer_version = fields.String()
    bundle = fields.Dict(required=True)
    diagnosis = fields.Dict(required=True)


class ClusterQuerySchema(Schema):
    class Meta:
        unknown = EXCLUDE

    engine = SafeString(validate=validate.Length(max=100))
    backend = SafeString(validate=validate.Length(max=100))
    phase = SafeString(validate=validate.Length(max=100))
    verdict = SafeString(validate=validate.Length(max=100))
    version = SafeString(validate=validate.Length(max=100))
    gpu = SafeString(validate=validate.Length(max=200))
    status = SafeString(validate=validate.OneOf(CLUSTER_STATUSES))
    q = SafeString(validate=validate.Length(max=200))
    facet = SafeString(validate=[validate.Length(max=230), validate.Regexp(r"^[a-z_]{1,20}:.+$",
                                 error="must be kind:value, e.g. driver:cuda 550.54")])
    sort = SafeString(load_default="count", validate=validate.OneOf(SORTS))
    page = AsciiInteger(load_default=1, validate=validate.Range(min=1, max=100000))
    per_page = AsciiInteger(load_default=None, validate=validate.Range(min=1, max=200))


class ClusterPatchSchema(Schema):
    class Meta:
        unknown = "raise"

    known_fix = SafeString(allow_none=True, validate=validate.Length(max=20000))
    # the pattern is what the OpenAPI document states and what is checked: http(s) only, no spaces,
    # quotes, angle brackets or NUL; "" clears the link
    issue_url = SafeString(allow_none=True, validate=[
        validate.Length(max=500),
        validate.Regexp(ISSUE_URL, error="must be an http(s) URL without spaces or quotes")])
    status = SafeString(validate=validate.OneOf(CLUSTER_STATUSES))


class DeletedSchema(Schema):
    id = fields.String(required=True)
    deleted = fields.Boolean(required=True)


class HealthSchema(Schema):
    status = fields.String(required=True)
    database = fields.String(required=True)
    analyzer_version = fields.String()


class KnownEntrySchema(Schema):
    id = fields.String(required=True, metadata={"description": "cluster-<cluster id>"})
    title = fields.String(required=True)
    url = fields.String(allow_none=True, metadata={"description": "the upstream issue the maintainers linked"})
    cluster_url = fields.String(required=True)
    status = fields.String()
    workaround = fields.String(allow_none=True, metadata={"description": "the cluster's known fix (Markdown)"})
    count = fields.Integer(metadata={"description": "bundles in the cluster"})
    match = fields.Dict(required=True, metadata={
        "description": "conditions in the client's catalog format: {signature: 'engine/phase/backend'}"})


class KnownCatalogSchema(Schema):
    schema = fields.String(required=True, metadata={"description": "kvreport-known/1"})
    description = fields.String()
    server = fields.String(required=True)
    generated_at = fields.String(required=True, metadata={"format": "date-time"})
    entries = fields.List(fields.Nested(KnownEntrySchema), required=True)

# ------------------------------------------------------------------ outcomes (kvreport_server.outcomes)
OUTCOME_ID = r"^[0-9A-HJKMNP-TV-Z]{26}$"
MACHINE_HASH = r"^[0-9a-f]{64}$"
ISO_UTC = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?Z$"
MAX_CHANGES = 32
_SCALAR_DOC = [{"type": "string", "maxLength": 200, "pattern": NO_NUL},
               {"type": "number", "minimum": -INT64, "maximum": INT64}, {"type": "boolean"}]
FLAG_VALUE_DOC = {"nullable": True, "anyOf": [*_SCALAR_DOC, {"type": "array", "maxItems": 16, "items": {
    "nullable": True, "anyOf": _SCALAR_DOC}}],
    "description": "null, a boolean, a number, a string of at most 200 characters, or a list of at most 16 of those"}


def _suggestion_ids() -> tuple[str, ...]:
    from kvreport.fixes import SUGGESTION_IDS

    return SUGGESTION_IDS


def _scalar(v) -> bool:
    if v is None or isinstance(v, bool):
        return True
    if isinstance(v, int):
        return -INT64 <= v <= INT64
    if isinstance(v, float):
        return v == v and -INT64 <= v <= INT64
    if isinstance(v, str):
        if len(v) > 200 or "\x00" in v:
            return False
        try:
            v.encode("utf-8")  # no lone surrogates (PostgreSQL refuses them)
        except UnicodeEncodeError:
            return False
        return True
    return False


def _flag_value(v) -> bool:
    """A value a flag can take (FLAG_VALUE_DOC)."""
    if isinstance(v, list):
        return len(v) <= 16 and all(_scalar(x) for x in v)
    return _scalar(v)


class FlagValue(fields.Raw):
    def _deserialize(self, value, attr, data, **kwargs):
        if not _flag_value(value):
            raise ValidationError(FLAG_VALUE_DOC["description"])
        return value


class OutcomeSchema(Schema):
    """The body of ``POST /api/v1/bundles/<id>/outcomes`` (kvreport_server.outcomes)."""

    class Meta:
        unknown = RAISE

    id = SafeString(required=True, validate=validate.Regexp(OUTCOME_ID, error="must be a ULID (26 characters)"),
                    metadata={"description": "the outcome's id, made by the client (idempotency key)"})
    machine = SafeString(required=True, validate=validate.Regexp(MACHINE_HASH, error="must be 64 lower-case hex digits"),
                         metadata={"description": "SHA-256 of a salt kept on the client and its machine facts"})
    worked = StrictBoolean(required=True)
    change = fields.Dict(keys=SafeString(validate=validate.Length(max=200)),
                         values=fields.List(FlagValue(allow_none=True, metadata=FLAG_VALUE_DOC),
                                            validate=validate.Length(equal=2)),
                         required=True, validate=validate.Length(max=MAX_CHANGES),
                         metadata={"description": "{flag as typed: [from, to]}", "maxProperties": MAX_CHANGES})
    suggestion_ids = fields.List(SafeString(validate=validate.OneOf(_suggestion_ids())), required=True,
                                 validate=validate.Length(max=20))
    engine = SafeString(allow_none=True, load_default=None, validate=validate.Length(max=40))
    created_at = SafeString(required=True, validate=validate.Regexp(ISO_UTC, error="must be UTC ISO 8601 (…Z)"))


class OutcomeResponseSchema(Schema):
    id = fields.String(required=True)
    bundle_id = fields.String(required=True)
    url = fields.String(required=True)
    cluster = fields.Nested(ClusterRefSchema, required=True)
