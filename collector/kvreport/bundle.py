"""The bundle: the redacted facts of one failure, as `kvreport collect` writes them.

A bundle is a JSON object (``schema = "kvreport/bundle@1"``) holding facts only; the diagnosis is
never part of it (``kvreport.analyze.analyze(bundle)`` recomputes it). The same
:class:`BundleSchema` validates bundles on the client before they are written and on the server
when they are uploaded (design.md, "Bundle JSON").

Units: every memory amount is in MiB (2**20 bytes) and named ``*_mib``; file sizes are bytes
(``size_bytes``); token counts are plain integers (``n_ctx``...).

Shape (every key of a section is optional unless marked required)::

    schema        str, required, "kvreport/bundle@1"
    id            str, required, a ULID made by the client (26 chars, Crockford base32)
    created_at    str, required, UTC ISO 8601 ("2026-11-30T01:02:03Z")
    collector     {"name": "kvreport", "version": str}
    host          {os, os_release, kernel, machine, cpu_model, cpu_cores_physical, cpu_cores_logical,
                   ram_total_mib, ram_free_mib, swap_total_mib, swap_free_mib, container, wsl,
                   memory_limit_mib (cgroup memory.max / v1 memory.limit_in_bytes of the collector's
                   own cgroup; absent = none), address_space_limit_mib (the collector's RLIMIT_AS,
                   `ulimit -v`; absent = unlimited), data_limit_mib (RLIMIT_DATA, `ulimit -d`)}
    devices       [{backend, index, name, total_mib, free_mib, used_mib, driver_version,
                    cuda_driver_version, compute_capability, uuid, pci_bus_id, source,
                    max_alloc_mib, processes: [{name, used_mib}]}]; only what the probes measured
                    (the devices a log names are read from ``log`` by the analysis)
    probes        {probe name: "ok" | "absent" | "failed: <reason>"}
    engine        {name, version, build_number, commit, compiler, target, binary, binary_realpath,
                   version_output, list_devices_output, list_devices: [{name, description, total_mib, free_mib}]}
    command       {line: str (as typed, redacted), argv: [str], engine_argv: [str], program: str,
                   flags: {canonical flag name: value}, env: {name: value},
                   limits: {address_space_limit_kib (`ulimit -v N` / `prlimit --as` before the engine,
                   KiB), data_limit_kib (`ulimit -d`, KiB), resident_set_limit_kib (`ulimit -m`, KiB,
                   not enforced by Linux), locked_memory_limit_kib (`ulimit -l`, KiB),
                   container_memory_limit_mib (`docker run -m/--memory`, MiB)}; only keys that are set}
    model         {path, file_name, size_bytes, gguf: {metadata key: value}, error}
    log           {line_count: int, truncated: bool, source: str, lines: [[line number (1-based), text]]}
    memory_before_launch  [{device, name, backend, free_mib, total_mib, source}]
    redactions    {kind: count}

Unknown keys inside the sections are kept (a newer client may send more facts); unknown top-level
keys are refused so that a typo or a diagnosis smuggled into a bundle is caught.
"""

from __future__ import annotations

import json
from typing import Any

from marshmallow import RAISE, Schema, ValidationError, fields, validate

SCHEMA_ID = "kvreport/bundle@1"
"""The bundle schema this code writes and reads; the number moves only with an incompatible change."""

ACCEPTED_SCHEMAS = (SCHEMA_ID,)

MAX_LOG_LINES = 20000
"""Most excerpt lines a bundle may carry (the collector keeps far fewer: see ``kvreport.excerpt``)."""


class BundleError(ValueError):
    """A bundle that cannot be read or is not valid; ``messages`` maps field paths to problems."""

    def __init__(self, message: str, messages: dict | None = None):
        super().__init__(message)
        self.messages = messages or {}


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


def validate_bundle(data: Any) -> dict:
    """Validate a decoded bundle and return it with defaults filled in.

    Raises :class:`BundleError` naming the offending field paths when ``data`` is not a valid
    bundle (wrong schema version, missing ``id``, wrong types...).
    """
    if not isinstance(data, dict):
        raise BundleError("a bundle is a JSON object")
    try:
        loaded = BundleSchema().load(data)
    except ValidationError as exc:
        messages = exc.normalized_messages()
        paths = ", ".join(_flatten_paths(messages))
        raise BundleError(f"invalid bundle: {paths}", messages) from None
    # Keep the unknown keys of open sections exactly as given (marshmallow includes them).
    return loaded


def _flatten_paths(messages: Any, prefix: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(messages, dict):
        for key, val in messages.items():
            out.extend(_flatten_paths(val, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(messages, list) and messages and all(isinstance(m, str) for m in messages):
        out.append(f"{prefix or '<bundle>'}: {messages[0]}")
    elif isinstance(messages, list):
        for m in messages:
            out.extend(_flatten_paths(m, prefix))
    else:
        out.append(f"{prefix or '<bundle>'}: {messages}")
    return out


def looks_like_bundle(text: str) -> bool:
    """True when ``text`` is a JSON object with a ``schema`` key starting ``kvreport/bundle``."""
    head = text.lstrip()[:1]
    if head != "{":
        return False
    try:
        data = json.loads(text)
    except ValueError:
        return False
    return isinstance(data, dict) and str(data.get("schema", "")).startswith("kvreport/bundle")


def log_text(bundle: dict) -> str:
    """The bundle's log excerpt as one string of lines joined by newlines ('' when absent)."""
    log = bundle.get("log") or {}
    return "\n".join(text for _n, text in (log.get("lines") or []))


def new_bundle_id() -> str:
    """A new ULID string (26 characters, time-ordered, 80 bits of randomness)."""
    from ulid import ULID

    return str(ULID())
