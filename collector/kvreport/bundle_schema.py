"""The marshmallow schema of a bundle (see :mod:`kvreport.bundle` for its shape).

Imported only when needed: by the server (validation messages, the OpenAPI document) and by
:func:`kvreport.bundle.validate_bundle` when the fast path (:mod:`kvreport.bundle_check`) is unsure.
"""

from __future__ import annotations

from marshmallow import RAISE, Schema, fields, validate

from kvreport.bundle_check import ACCEPTED_SCHEMAS, MAX_LOG_LINES


def _finite_number(**kw):
    return fields.Float(allow_nan=False, allow_none=True, **kw)


class StrictBoolean(fields.Boolean):
    """``true`` or ``false`` only: no ``"yes"``, ``"on"``, ``1`` or ``"true"`` coerced."""

    def _deserialize(self, value, attr, data, **kwargs):
        if not isinstance(value, bool):
            raise self.make_error("invalid", input=value)
        return value


class _Open(Schema):
    """A section whose unknown keys are kept as they are."""

    class Meta:
        unknown = "include"


class HostSchema(_Open):
    os = fields.String(allow_none=True)
    os_release = fields.String(allow_none=True)
    kernel = fields.String(allow_none=True)
    machine = fields.String(allow_none=True)
    cpu_model = fields.String(allow_none=True)
    cpu_cores_physical = fields.Integer(allow_none=True, strict=True)
    cpu_cores_logical = fields.Integer(allow_none=True, strict=True)
    ram_total_mib = _finite_number()
    ram_free_mib = _finite_number()
    swap_total_mib = _finite_number()
    swap_free_mib = _finite_number()
    container = fields.Raw(allow_none=True)
    wsl = StrictBoolean(allow_none=True)


class ProcessSchema(_Open):
    name = fields.String(allow_none=True)
    used_mib = _finite_number()


class DeviceSchema(_Open):
    backend = fields.String(allow_none=True)
    index = fields.Integer(allow_none=True, strict=True)
    name = fields.String(allow_none=True)
    total_mib = _finite_number()
    free_mib = _finite_number()
    used_mib = _finite_number()
    driver_version = fields.String(allow_none=True)
    compute_capability = fields.String(allow_none=True)
    source = fields.String(allow_none=True)
    max_alloc_mib = _finite_number()
    processes = fields.List(fields.Nested(ProcessSchema), allow_none=True)


class EngineSchema(_Open):
    name = fields.String(allow_none=True)
    version = fields.String(allow_none=True)
    build_number = fields.Integer(allow_none=True, strict=True)
    commit = fields.String(allow_none=True)
    binary = fields.String(allow_none=True)
    binary_realpath = fields.String(allow_none=True)


class CommandSchema(_Open):
    line = fields.String(allow_none=True)
    argv = fields.List(fields.String(), allow_none=True)
    engine_argv = fields.List(fields.String(), allow_none=True)
    program = fields.String(allow_none=True)
    flags = fields.Dict(keys=fields.String(), allow_none=True)
    env = fields.Dict(keys=fields.String(), values=fields.String(allow_none=True), allow_none=True)


class ModelSchema(_Open):
    path = fields.String(allow_none=True)
    file_name = fields.String(allow_none=True)
    size_bytes = fields.Integer(allow_none=True, strict=True)
    gguf = fields.Dict(keys=fields.String(), allow_none=True)


class LogSchema(_Open):
    line_count = fields.Integer(required=True, strict=True, validate=validate.Range(min=0))
    truncated = StrictBoolean(load_default=False)
    source = fields.String(allow_none=True)
    lines = fields.List(
        fields.Tuple((fields.Integer(strict=True, validate=validate.Range(min=1)), fields.String())),
        required=True,
        validate=validate.Length(max=MAX_LOG_LINES),
    )


class MemoryBeforeSchema(_Open):
    device = fields.String(required=True)
    name = fields.String(allow_none=True)
    backend = fields.String(allow_none=True)
    free_mib = _finite_number()
    total_mib = _finite_number()
    source = fields.String(allow_none=True)


class BundleSchema(Schema):
    """Validates a whole bundle (a ``dict`` decoded from JSON); ``load`` raises ``ValidationError``."""

    class Meta:
        unknown = RAISE

    schema = fields.String(required=True, validate=validate.OneOf(ACCEPTED_SCHEMAS))
    id = fields.String(required=True, validate=validate.Regexp(r"^[0-9A-HJKMNP-TV-Z]{26}$"))
    created_at = fields.String(required=True, validate=validate.Length(min=10, max=40))
    collector = fields.Dict(keys=fields.String(), load_default=dict)
    host = fields.Nested(HostSchema, load_default=dict)
    devices = fields.List(fields.Nested(DeviceSchema), load_default=list, validate=validate.Length(max=64))
    probes = fields.Dict(keys=fields.String(), values=fields.String(), load_default=dict)
    engine = fields.Nested(EngineSchema, load_default=dict)
    command = fields.Nested(CommandSchema, load_default=dict)
    model = fields.Nested(ModelSchema, allow_none=True, load_default=None)
    log = fields.Nested(LogSchema, allow_none=True, load_default=None)
    memory_before_launch = fields.List(fields.Nested(MemoryBeforeSchema), load_default=list,
                                       validate=validate.Length(max=64))
    redactions = fields.Dict(keys=fields.String(), values=fields.Integer(strict=True), load_default=dict)
