"""A fast, conservative path for :func:`kvreport.bundle.validate_bundle`.

:func:`fast_load` walks a decoded bundle once in plain Python and returns exactly what
``BundleSchema().load(data)`` (marshmallow) returns — the same keys, the same values, floats for the
``*_mib`` numbers, ``(int, str)`` tuples for the log lines, the defaults filled in — when the bundle is
certainly valid, and ``None`` whenever anything is unusual (a wrong type, a string where a number
goes, a bool where an integer goes, a value at a limit's edge...). ``None`` means "ask marshmallow",
which then accepts or names the problem: this path never refuses a bundle and never accepts one the
schema refuses (``tests/test_bundle_check.py`` checks both against marshmallow on every example and
case bundle and on mutated ones).

Why: importing marshmallow costs tens of milliseconds at start-up (its e-mail validator compiles
large regular expressions) and its load takes a few milliseconds per bundle on the server; this
walk takes a fraction of a millisecond.

Keep it in step with the schema in :mod:`kvreport.bundle_schema`: a field added there and not here
only sends bundles that carry it to marshmallow (``fast_load`` answers ``None`` for nothing it does
not know in a closed place, and keeps unknown keys of open sections as they are, as the schema does).
"""

from __future__ import annotations

import math
from typing import Any

SCHEMA_ID = "kvreport/bundle@1"
ACCEPTED_SCHEMAS = (SCHEMA_ID,)
MAX_LOG_LINES = 20000
MAX_DEVICES = 64
_ULID_CHARS = frozenset("0123456789ABCDEFGHJKMNPQRSTVWXYZ")


class _Unsure(Exception):
    """Raised inside the walk: let marshmallow decide."""


# Field kinds: "s" string or None, "i" strict integer or None, "f" finite number or None (loaded as
# float), "b" true/false or None, "r" anything, "ls" list of strings or None, "dk" dict with string
# keys or None, "dss" dict of string -> string-or-None or None, "proc" list of process sections or None.
_HOST = {"os": "s", "os_release": "s", "kernel": "s", "machine": "s", "cpu_model": "s",
         "cpu_cores_physical": "i", "cpu_cores_logical": "i", "ram_total_mib": "f", "ram_free_mib": "f",
         "swap_total_mib": "f", "swap_free_mib": "f", "container": "r", "wsl": "b"}
_PROCESS = {"name": "s", "used_mib": "f"}
_DEVICE = {"backend": "s", "index": "i", "name": "s", "total_mib": "f", "free_mib": "f", "used_mib": "f",
           "driver_version": "s", "compute_capability": "s", "source": "s", "max_alloc_mib": "f",
           "processes": "proc"}
_ENGINE = {"name": "s", "version": "s", "build_number": "i", "commit": "s", "binary": "s", "binary_realpath": "s"}
_COMMAND = {"line": "s", "argv": "ls", "engine_argv": "ls", "program": "s", "flags": "dk", "env": "dss"}
_MODEL = {"path": "s", "file_name": "s", "size_bytes": "i", "gguf": "dk"}
_MEMORY = {"device": "S", "name": "s", "backend": "s", "free_mib": "f", "total_mib": "f", "source": "s"}


def _float(v: Any) -> float:
    t = type(v)
    if t is float:
        if math.isfinite(v):
            return v
        raise _Unsure
    if t is int:
        try:
            f = float(v)
        except OverflowError:
            raise _Unsure from None
        if math.isfinite(f):
            return f
    raise _Unsure


def _strings(v: Any) -> list:
    if type(v) is not list:
        raise _Unsure
    for s in v:
        if type(s) is not str:
            raise _Unsure
    return list(v)


def _str_keys(v: Any) -> dict:
    if type(v) is not dict:
        raise _Unsure
    for k in v:
        if type(k) is not str:
            raise _Unsure
    return dict(v)


def _typed(t: type):
    def check(v: Any) -> Any:
        if type(v) is t:
            return v
        raise _Unsure

    return check


def _str_map(v: Any) -> dict:
    out = _str_keys(v)
    for x in out.values():
        if x is not None and type(x) is not str:
            raise _Unsure
    return out


def _processes(v: Any) -> list:
    if type(v) is not list:
        raise _Unsure
    return [_section(_PROCESS, p) for p in v]


_LOADERS = {"s": _typed(str), "S": _typed(str), "i": _typed(int), "b": _typed(bool), "f": _float,
            "r": lambda v: v, "ls": _strings, "dk": _str_keys, "dss": _str_map, "proc": _processes}


def _value(kind: str, v: Any) -> Any:
    if v is None:
        if kind == "S":
            raise _Unsure
        return None
    return _LOADERS[kind](v)


def _section(spec: dict[str, str], data: Any) -> dict:
    """An open section: the known keys in the schema's order, then the unknown ones as they are."""
    if type(data) is not dict:
        raise _Unsure
    out = {}
    for key, kind in spec.items():
        if key in data:
            out[key] = _value(kind, data[key])
        elif kind == "S":  # required
            raise _Unsure
    for key, v in data.items():
        if key not in spec:
            if type(key) is not str:
                raise _Unsure
            out[key] = v
    return out


def _log(data: Any) -> dict | None:
    if data is None:
        return None
    if type(data) is not dict:
        raise _Unsure
    count = data.get("line_count", _Unsure)
    lines = data.get("lines", _Unsure)
    if type(count) is not int or count < 0 or type(lines) is not list or len(lines) > MAX_LOG_LINES:
        raise _Unsure
    out_lines = []
    for pair in lines:
        if (type(pair) is not list and type(pair) is not tuple) or len(pair) != 2:  # a loaded bundle has tuples
            raise _Unsure
        n, text = pair
        if type(n) is not int or n < 1 or type(text) is not str:
            raise _Unsure
        out_lines.append((n, text))
    out: dict = {"line_count": count}
    truncated = data.get("truncated", False)
    if type(truncated) is not bool:
        raise _Unsure
    out["truncated"] = truncated
    if "source" in data:
        out["source"] = _value("s", data["source"])
    out["lines"] = out_lines
    for key, v in data.items():
        if key not in ("line_count", "truncated", "source", "lines"):
            if type(key) is not str:
                raise _Unsure
            out[key] = v
    return out


def _top(data: dict) -> dict:
    schema, bid, created = data.get("schema"), data.get("id"), data.get("created_at")
    if schema not in ACCEPTED_SCHEMAS or type(schema) is not str:
        raise _Unsure
    if type(bid) is not str or len(bid) != 26 or not _ULID_CHARS.issuperset(bid):
        raise _Unsure
    if type(created) is not str or not 10 <= len(created) <= 40:
        raise _Unsure
    out: dict = {"schema": schema, "id": bid, "created_at": created}
    out["collector"] = _str_keys(data["collector"]) if "collector" in data else {}
    out["host"] = _section(_HOST, data["host"]) if "host" in data else {}
    out["devices"] = _sections(_DEVICE, data.get("devices", []))
    out["probes"] = _typed_map(data, "probes", str)
    out["engine"] = _section(_ENGINE, data["engine"]) if "engine" in data else {}
    out["command"] = _section(_COMMAND, data["command"]) if "command" in data else {}
    model = data.get("model")
    out["model"] = None if model is None else _section(_MODEL, model)
    out["log"] = _log(data.get("log"))
    out["memory_before_launch"] = _sections(_MEMORY, data.get("memory_before_launch", []))
    out["redactions"] = _typed_map(data, "redactions", int)
    return out


def _sections(spec, items) -> list:
    """A list of at most MAX_DEVICES sections of one spec (devices, memory_before_launch)."""
    if type(items) is not list or len(items) > MAX_DEVICES:
        raise _Unsure
    return [_section(spec, x) for x in items]


def _typed_map(data: dict, key: str, typ: type) -> dict:
    """A string-keyed mapping whose values are all exactly ``typ`` (probes: str, redactions: int)."""
    out = _str_keys(data[key]) if key in data else {}
    if not all(type(v) is typ for v in out.values()):
        raise _Unsure
    return out


_TOP_KEYS = frozenset(("schema", "id", "created_at", "collector", "host", "devices", "probes", "engine", "command",
                       "model", "log", "memory_before_launch", "redactions"))


def fast_load(data: Any) -> dict | None:
    """What ``BundleSchema().load(data)`` returns, when ``data`` is certainly a valid bundle; else None."""
    if type(data) is not dict or not _TOP_KEYS.issuperset(data):
        return None
    try:
        return _top(data)
    except _Unsure:
        return None
