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

from kvreport.bundle_check import ACCEPTED_SCHEMAS, MAX_LOG_LINES, SCHEMA_ID, fast_load

# SCHEMA_ID: the bundle schema this code writes and reads; the number moves only with an incompatible change.
# MAX_LOG_LINES: most excerpt lines a bundle may carry (the collector keeps far fewer: see ``kvreport.excerpt``).
__all__ = ["ACCEPTED_SCHEMAS", "MAX_LOG_LINES", "SCHEMA_ID", "BundleError", "validate_bundle", "looks_like_bundle",
           "log_text", "new_bundle_id"]


def __getattr__(name: str):
    """The marshmallow schema classes (``BundleSchema``...), imported when first asked for."""
    if name.endswith("Schema") or name == "StrictBoolean":
        from kvreport import bundle_schema

        return getattr(bundle_schema, name)
    raise AttributeError(name)


class BundleError(ValueError):
    """A bundle that cannot be read or is not valid; ``messages`` maps field paths to problems."""

    def __init__(self, message: str, messages: dict | None = None):
        super().__init__(message)
        self.messages = messages or {}


def validate_bundle(data: Any) -> dict:
    """Validate a decoded bundle and return it with defaults filled in.

    Raises :class:`BundleError` naming the offending field paths when ``data`` is not a valid
    bundle (wrong schema version, missing ``id``, wrong types...).
    """
    if not isinstance(data, dict):
        raise BundleError("a bundle is a JSON object")
    fast = fast_load(data)
    if fast is not None:
        return fast
    from marshmallow import ValidationError

    from kvreport.bundle_schema import BundleSchema

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


_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_bundle_id() -> str:
    """A new ULID string (26 characters, time-ordered, 80 bits of randomness).

    The ULID layout (a 48-bit Unix time in milliseconds, then 80 random bits, 128 bits written as
    26 Crockford base-32 digits) made here in a few lines: the ``ulid`` package's import alone took
    longer than a whole ``kvreport --help``.
    """
    import os
    import time

    value = ((time.time_ns() // 1_000_000) & 0xFFFF_FFFF_FFFF) << 80 | int.from_bytes(os.urandom(10), "big")
    return "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))
