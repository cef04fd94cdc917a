"""Reading an upload body within limits (issue 8): size as sent, size after gzip (bomb-safe),
JSON nesting depth, string lengths, NaN/Infinity, huge integers, NUL bytes and invalid UTF-8.

Every refusal is an :class:`~kvreport_server.errors.ApiError` naming the limit. Text that PostgreSQL
cannot store (NUL, lone surrogates) and bytes that are not UTF-8 are replaced with U+FFFD, so a
strange log is stored safely instead of failing the insert.
"""

from __future__ import annotations

import json
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
    except zlib.error as exc:
        raise ApiError(400, f"body is not valid gzip: {exc}", code="bad_encoding") from None
    return bytes(out)


def _refuse_constant(name: str):
    raise ApiError(422, f"{name} is not allowed in a bundle (numbers must be finite)", code="invalid")


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > 19:
        raise ApiError(422, "integer out of range (more than 19 digits)", code="invalid")
    return int(text)


def parse_json(data: bytes) -> object:
    """Decode UTF-8 (invalid bytes become U+FFFD) and parse; NaN/Infinity and >19-digit integers refused."""
    text = data.decode("utf-8", errors="replace")
    if text[:1] == "\ufeff":
        text = text[1:]
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_int=_parse_int)
    except RecursionError:
        raise ApiError(413, "JSON nested too deeply", code="too_deep") from None
    except ValueError as exc:
        msg = getattr(exc, "msg", None) or str(exc)
        where = f" at line {exc.lineno} column {exc.colno}" if hasattr(exc, "lineno") else ""
        raise ApiError(400, f"body is not JSON: {msg}{where}", code="not_json") from None


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
            if abs(value) > MAX_ABS_INT:
                raise ApiError(422, "integer out of range", code="invalid", field=path or None)
            return value
        if isinstance(value, float):
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
