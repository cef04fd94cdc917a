"""Reading an upload body within limits (issue 8): size as sent, size after gzip (bomb-safe),
JSON nesting depth, string lengths, NaN/Infinity, huge integers, NUL bytes and invalid UTF-8.

Every refusal is an :class:`~kvreport_server.errors.ApiError` naming the limit. Text that PostgreSQL
cannot store (NUL, lone surrogates) and bytes that are not UTF-8 are replaced with U+FFFD, so a
strange log is stored safely instead of failing the insert.
"""

from __future__ import annotations

import json
import math
import re
import zlib

from flask import Request

from kvreport_server.errors import ApiError

CHUNK = 64 * 1024
REPLACEMENT = "\ufffd"
MAX_ABS_INT = 2**63 - 1


def read_body(request: Request, max_body: int, max_json: int) -> bytes:
    """The request body, decompressed when ``Content-Encoding: gzip``; reads at most the limits."""
    length = request.content_length
    if length is not None and length > max_body:
        raise ApiError(413, f"request body of {length} bytes exceeds the limit of {max_body} bytes "
                            "(KVREPORT_MAX_BODY_BYTES)", code="too_large", extra={"limit": max_body})
    stream = request.stream
    raw = bytearray()
    while True:
        chunk = stream.read(min(CHUNK, max_body + 1 - len(raw)))
        if not chunk:
            break
        raw += chunk
        if len(raw) > max_body:
            raise ApiError(413, f"request body exceeds the limit of {max_body} bytes (KVREPORT_MAX_BODY_BYTES)",
                           code="too_large", extra={"limit": max_body})
    encoding = (request.headers.get("Content-Encoding") or "identity").strip().lower()
    if encoding in ("identity", ""):
        data = bytes(raw)
    elif encoding in ("gzip", "x-gzip", "deflate"):
        data = _inflate(bytes(raw), max_json, gzip=encoding != "deflate")
    else:
        raise ApiError(415, f"unsupported Content-Encoding {encoding!r} (use gzip or none)",
                       code="unsupported_media_type")
    if len(data) > max_json:
        raise ApiError(413, f"JSON body exceeds the limit of {max_json} bytes (KVREPORT_MAX_JSON_BYTES)",
                       code="too_large", extra={"limit": max_json})
    return data


def _inflate(raw: bytes, max_out: int, gzip: bool) -> bytes:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS if gzip else zlib.MAX_WBITS)
    out = bytearray()
    try:
        buf = raw
        while buf:
            piece = d.decompress(buf, max_out + 1 - len(out))
            out += piece
            if len(out) > max_out:
                raise ApiError(413, f"decompressed body exceeds the limit of {max_out} bytes "
                                    "(KVREPORT_MAX_JSON_BYTES)", code="too_large", extra={"limit": max_out})
            buf = d.unconsumed_tail
            if d.eof:
                break
        if not d.eof:
            raise ApiError(400, "truncated gzip body", code="bad_encoding")
        if d.unused_data:
            raise ApiError(400, "bytes after the end of the gzip stream", code="bad_encoding")
    except zlib.error as exc:
        raise ApiError(400, f"body is not valid gzip: {exc}", code="bad_encoding") from None
    return bytes(out)


def _refuse_constant(name: str):
    raise ApiError(422, f"{name} is not allowed in a bundle (numbers must be finite)", code="invalid")


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 overflows to infinity: JSONB refuses it, JSON cannot carry it
        raise ApiError(422, f"number {text[:40]} is out of range (numbers must be finite)", code="invalid")
    return value


def _parse_int(text: str) -> int | float:
    """An integer, or beyond 64 bits the JSON number as a float (as JavaScript reads it): open
    sections keep it, typed integer fields (bounded in the OpenAPI document) refuse it. ``float`` is
    linear in the digits, ``int`` is not; more digits than a double holds are refused as infinite."""
    if len(text.lstrip("-")) > 18:
        value = int(text) if len(text.lstrip("-")) <= 19 else None
        if value is None or abs(value) > MAX_ABS_INT:
            return _parse_float(text)
        return value
    return int(text)


# One JSON token at a time (whitespace first). Each alternative accepts a superset of what the json
# module accepts and none can backtrack (the string is the unrolled loop), so the scan is linear.
_TOKEN = re.compile(r'[ \t\n\r]*(?:("[^"\\]*(?:\\.[^"\\]*)*")|([\[{])|([\]}])|(,)|(:)|([-+0-9A-Za-z.]+))', re.S)
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|.)", re.S)


def _decoded_length(raw: str) -> int:
    """Characters of a JSON string token (quotes included in ``raw``) once its escapes are decoded."""
    n = len(raw) - 2
    if "\\" in raw:
        for m in _ESCAPE.finditer(raw, 1, len(raw) - 1):
            n -= 5 if m.group(1)[0] == "u" else 1
    return n


def check_shape(text: str, *, max_nodes: int, max_depth: int, max_items: int, max_string: int) -> None:
    """The upload's shape budget, checked on the JSON text before any object is built.

    ``max_nodes``: values and keys in all (KVREPORT_MAX_JSON_NODES); ``max_depth``: nesting of
    objects/arrays (KVREPORT_MAX_JSON_DEPTH); ``max_items``: entries of any one array or object
    (KVREPORT_MAX_JSON_ITEMS); ``max_string``: characters of any string (KVREPORT_MAX_STRING_CHARS).
    The first breach raises a 413 :class:`ApiError` naming the limit; the scan stops there, so its
    time is linear in the text and bounded by ``max_nodes``. Text that is not JSON is left to the
    parser (the scan stops at the first token it cannot read).
    """
    stack: list[list] = []  # [is_object, entries, expecting_key]
    nodes = 0
    pos = 0
    end = len(text)
    match = _TOKEN.match
    while pos < end:
        m = match(text, pos)
        if m is None:
            return
        pos = m.end()
        kind = m.lastindex
        if kind in (1, 2, 6):  # a string, an opening bracket or a literal: one node
            nodes += 1
            if nodes > max_nodes:
                raise ApiError(413, f"the body has more than {max_nodes} JSON values and keys "
                                    "(KVREPORT_MAX_JSON_NODES)", code="too_large", extra={"limit": max_nodes})
            if stack:
                top = stack[-1]
                if not top[0] or top[2]:  # an array element, or an object's key
                    top[1] += 1
                    if top[1] > max_items:
                        what = "an object has more than" if top[0] else "an array has more than"
                        raise ApiError(413, f"{what} {max_items} entries (KVREPORT_MAX_JSON_ITEMS)",
                                       code="too_large", extra={"limit": max_items})
                top[2] = False
            if kind == 1 and len(m.group(1)) - 2 > max_string and _decoded_length(m.group(1)) > max_string:
                raise ApiError(413, f"string longer than {max_string} characters (KVREPORT_MAX_STRING_CHARS)",
                               code="too_large", extra={"limit": max_string})
            if kind == 2:
                if len(stack) >= max_depth:
                    raise ApiError(413, f"JSON nested deeper than {max_depth} levels (KVREPORT_MAX_JSON_DEPTH)",
                                   code="too_deep", extra={"limit": max_depth})
                is_object = m.group(2) == "{"
                stack.append([is_object, 0, is_object])
        elif kind == 3:
            if not stack:
                return
            stack.pop()
        elif kind == 4:
            if not stack:
                return
            stack[-1][2] = stack[-1][0]


def parse_json(data: bytes, **shape) -> object:
    """Decode UTF-8 (invalid bytes become U+FFFD) and parse; NaN/Infinity, numbers that overflow to
    infinity and >19-digit integers refused. With ``shape`` (``check_shape``'s keywords) the
    budget is checked on the text first."""
    text = data.decode("utf-8", errors="replace")
    if text[:1] == "\ufeff":
        text = text[1:]
    if shape:
        check_shape(text, **shape)
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_int=_parse_int, parse_float=_parse_float)
    except RecursionError:
        raise ApiError(413, "JSON nested too deeply", code="too_deep") from None
    except ValueError as exc:
        msg = getattr(exc, "msg", None) or str(exc)
        if msg.endswith(" at"):  # "Invalid control character at", "Unterminated string starting at"
            msg = msg[:-3]
        where = f" at line {exc.lineno} column {exc.colno}" if hasattr(exc, "lineno") else ""
        raise ApiError(400, f"body is not JSON: {msg}{where}", code="not_json") from None


_ASCII_INT = re.compile(r"-?[0-9]+")


def ascii_int(text: object, max_digits: int = 18, signed: bool = False) -> int | None:
    """``text`` as an int when it is ASCII digits only (``-`` first when ``signed``) and at most
    ``max_digits`` long; None otherwise (``str.isdigit`` and ``int`` accept ``³``, ``②`` or ``٣``)."""
    if not isinstance(text, str) or not _ASCII_INT.fullmatch(text) or (text[0] == "-" and not signed):
        return None
    if len(text.lstrip("-")) > max_digits:
        return None
    return int(text)


def clean_text(s: str) -> str:
    """``s`` with NUL characters and lone surrogates replaced by U+FFFD (storable in PostgreSQL)."""
    return _clean_str(s)


def _clean_str(s: str) -> str:
    if "\x00" in s:
        s = s.replace("\x00", REPLACEMENT)
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        s = s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return s


def check_and_clean(obj: object, *, max_depth: int, max_string: int, max_log_lines: int,
                    max_devices: int) -> object:
    """Walk a parsed body: enforce depth, string length and list limits; return a cleaned copy.

    Raises :class:`ApiError` (413 for a limit, naming the field path) on the first breach.
    """

    def walk(value, path: str, depth: int):
        if depth > max_depth:
            raise ApiError(413, f"JSON nested deeper than {max_depth} levels (KVREPORT_MAX_JSON_DEPTH)",
                           code="too_deep", field=path or None, extra={"limit": max_depth})
        if isinstance(value, str):
            if len(value) > max_string:
                raise ApiError(413, f"string longer than {max_string} characters (KVREPORT_MAX_STRING_CHARS)",
                               code="too_large", field=path or None, extra={"limit": max_string})
            return _clean_str(value)
        if isinstance(value, bool) or value is None:
            return value
        if isinstance(value, int):
            if abs(value) > MAX_ABS_INT:  # beyond 64 bits: the number as a float (see _parse_int)
                try:
                    return walk(float(value), path, depth)
                except OverflowError:
                    raise ApiError(422, "numbers must be finite", code="invalid", field=path or None) from None
            return value
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ApiError(422, "numbers must be finite", code="invalid", field=path or None)
            return value
        if isinstance(value, list):
            return [walk(v, f"{path}.{i}" if path else str(i), depth + 1) for i, v in enumerate(value)]
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                if len(k) > 200:
                    raise ApiError(413, "object key longer than 200 characters", code="too_large",
                                   field=path or None)
                ck = _clean_str(k)
                out[ck] = walk(v, f"{path}.{ck}" if path else ck, depth + 1)
            return out
        return value

    if isinstance(obj, dict):
        log = obj.get("log")
        if isinstance(log, dict) and isinstance(log.get("lines"), list) and len(log["lines"]) > max_log_lines:
            raise ApiError(413, f"log.lines has {len(log['lines'])} entries; the limit is {max_log_lines} "
                                "(KVREPORT_MAX_LOG_LINES)", code="too_large", field="log.lines",
                           extra={"limit": max_log_lines})
        devices = obj.get("devices")
        if isinstance(devices, list) and len(devices) > max_devices:
            raise ApiError(413, f"devices has {len(devices)} entries; the limit is {max_devices} "
                                "(KVREPORT_MAX_DEVICES)", code="too_large", field="devices",
                           extra={"limit": max_devices})
    return walk(obj, "", 0)
