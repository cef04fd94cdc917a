"""``kvreport analyze PATH|- [--json] [--command CMD]``: diagnose a bundle or a raw log offline.

Exit status (design.md): 0 when a failure was diagnosed, 1 when the input holds no failure
(``--json`` still prints the diagnosis with its memory numbers), 2 when the input cannot be read
(one line on stderr, no traceback). A raw log is read in one streaming pass
(:func:`kvreport.logs.parse_file`, see :mod:`kvreport.logs.scan`; standard input is first spooled to a temporary file so that it
gets the same fast path), so a multi-GB log costs little memory; text pasted from a GitHub issue
(code fences, ``> `` quotes) is accepted as it is.

A bundle is validated with :func:`kvreport.bundle.validate_bundle` (another schema version, wrong
types: exit 2 naming the field). The server's own download format (``/bundles/<id>.json``:
``{"id", "url", "bundle": {...}, "diagnosis": {...}}``) is accepted; its diagnosis is ignored and
recomputed, as the server itself does.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tempfile

from kvreport.analyze import _parse_command, analyze, diagnose
from kvreport.bundle import BundleError, validate_bundle
from kvreport.errors import InputError
from kvreport.logcheck import HEAD_BYTES, refuse
from kvreport.logs import parse_file, parse_stream
from kvreport.render import render_text


def _open(path: str):
    """A binary file object for ``path``; standard input ('-') is spooled to a named temporary file."""
    if path == "-":
        src = sys.stdin.buffer if hasattr(sys.stdin, "buffer") else io.BytesIO(sys.stdin.read().encode())
        spool = tempfile.NamedTemporaryFile(prefix="kvreport-stdin-", suffix=".log", delete=False)  # noqa: SIM115
        try:
            shutil.copyfileobj(src, spool, 8 << 20)
            spool.flush()
            spool.seek(0)
        except BaseException:
            spool.close()
            os.unlink(spool.name)
            raise
        return spool
    try:
        return open(path, "rb")
    except IsADirectoryError as exc:
        raise InputError(f"cannot read {path}: it is a directory") from exc
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _has_text(obj, depth: int = 0) -> bool:
    """A JSON value holds a string somewhere (a log record's message, a bundle's fields): ``{}``, ``[1, 2]`` hold none."""
    if isinstance(obj, str):
        return bool(obj.strip())
    if depth > 8:
        return True
    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list) else ()
    return any(_has_text(v, depth + 1) for v in values)


def _as_bundle(head: bytes, fh) -> dict | None:
    """The bundle in a JSON file, validated; None when the file is not a JSON object (a log)."""
    data = head + fh.read()
    try:
        obj = json.loads(data.decode("utf-8", "replace"))
    except RecursionError:
        raise InputError("not a valid bundle: the JSON is nested too deeply") from None
    except ValueError as exc:
        if b"kvreport/bundle@" in data[:400]:  # a bundle cut short or edited by hand: never read as a log
            raise InputError(f"not a valid bundle: its JSON does not parse ({exc})") from None
        return None  # e.g. JSON lines of a log (--log-jsonl): read as a log
    if not _has_text(obj):
        raise InputError("the input is JSON with no text in it: neither a kvreport bundle nor an engine log")
    if not isinstance(obj, dict):
        return None
    if "schema" not in obj and isinstance(obj.get("bundle"), dict):
        obj = obj["bundle"]  # the server's /bundles/<id>.json
    if "schema" not in obj and "log" not in obj:
        return None  # a JSON object that is a log line, not a bundle
    try:
        return validate_bundle(obj)
    except BundleError as exc:
        raise InputError(str(exc)) from None


def _extra(command_line: str | None, model_path: str | None) -> dict:
    """The parts of a bundle that the command line gives: the parsed command, and the model's GGUF header when
    ``--model`` names a file or the command's ``-m`` names one that exists here."""
    extra: dict = {}
    if command_line:
        extra["command"] = _parse_command(command_line)
    if model_path or command_line:
        from kvreport.collect import model_section

        section = model_section(model_path, extra.get("command") or {})
        if model_path and section and section.get("error") and not section.get("gguf"):
            raise InputError(f"cannot read the model {model_path}: {section['error']}")
        if section and section.get("gguf"):
            extra["model"] = section
    return extra


class _CrLines:
    """A binary file whose lines end with CR alone, read as LF-ended lines."""

    def __init__(self, fh):
        self.fh = fh

    def read(self, n: int = -1) -> bytes:
        return self.fh.read(n).replace(b"\r", b"\n")


def _diagnose(fh, command_line: str | None, model_path: str | None = None,
              explain: bool = False, source: str = "the input") -> tuple[dict, dict | None, object | None]:
    """The diagnosis, the bundle (None for a raw log) and the log's facts (None for a bundle)."""
    head = fh.read(HEAD_BYTES)
    refuse(head, source)
    if head.lstrip().startswith(b"[") and len(head) < HEAD_BYTES:
        # (a whole input that is one JSON array: "[1, 2]" is no log; a log line that starts with "[" does not parse)
        try:
            arr = json.loads(head.decode("utf-8", "replace"))
        except (ValueError, RecursionError):
            arr = None
        if isinstance(arr, list) and not _has_text(arr):
            raise InputError("the input is JSON with no text in it: neither a kvreport bundle nor an engine log")
    if head.lstrip().startswith(b"{"):
        bundle = _as_bundle(head, fh)
        if bundle is not None:
            bundle.update(_extra(command_line, model_path))
            return analyze(bundle, explain), bundle, None
        fh.seek(0)
        head = fh.read(HEAD_BYTES)
    name = getattr(fh, "name", None)
    if b"\n" not in head and b"\r" in head:
        # lines ended by CR alone (classic Mac OS, some serial consoles and terminal captures): each CR ends a line
        fh.seek(0)
        facts = parse_stream(_CrLines(fh))
    elif isinstance(name, str) and os.path.isfile(name):
        facts = parse_file(name)  # hyperscan / grep prefilter, runs parsed once: big logs at near grep speed
    else:
        fh.seek(0)
        facts = parse_stream(fh)
    extra = _extra(command_line, model_path)
    return diagnose(facts, extra, explain), None, facts


def known_matches(diagnosis: dict, bundle: dict | None, facts=None, log_path: str | None = None,
                  extra: dict | None = None) -> list[dict]:
    """Entries of the known-issues catalogs (:mod:`kvreport.known`, offline) that match this diagnosis.
    ``bundle`` None: a raw log, whose facts and file (for the catalog's whole-log patterns) are given; ``extra``:
    the parts of a bundle the command line gave (``--command``). A fetched catalog that no longer reads is a
    note on stderr; a failure of the matching itself never costs the diagnosis."""
    from kvreport import strict
    from kvreport.known import known_for

    def lines():
        with open(log_path, encoding="utf-8", errors="replace") as fh:
            yield from fh

    try:
        matches, notes = known_for(diagnosis, bundle if bundle is not None else (extra or {}), facts,
                                   lines if bundle is None and log_path else None)
    except Exception as exc:  # noqa: BLE001 - the diagnosis stands without the catalog
        strict.check()
        matches, notes = [], [f"known issues not checked: {exc}"]
    for note in notes:
        print(f"kvreport: note: {note}", file=sys.stderr)
    return matches


def cli_analyze(path: str, as_json: bool = False, command_line: str | None = None, model_path: str | None = None,
                explain: bool = False) -> int:
    """Run ``kvreport analyze``; returns the exit status (0 diagnosed, 1 no failure, 2 bad input)."""
    try:
        fh = _open(path)
        try:
            diagnosis, bundle, facts = _diagnose(fh, command_line, model_path, explain,
                                                 "standard input" if path == "-" else path)
            extra = {"command": _parse_command(command_line)} if command_line and bundle is None else None
            known = known_matches(diagnosis, bundle, facts, fh.name if bundle is None else None, extra)
        except OSError as exc:
            raise InputError(f"cannot read {path}: {exc.strerror or exc}") from exc
        finally:
            fh.close()
            if path == "-":
                os.unlink(fh.name)
    except InputError as exc:
        print(f"kvreport: error: {exc}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps({**diagnosis, "known": known}, indent=2, ensure_ascii=False))
    else:
        from kvreport.known import render as render_known

        sys.stdout.write(render_text(diagnosis, bundle, facts))
        sys.stdout.write(render_known(known))
        if explain:
            from kvreport.explain import render

            sys.stdout.write(render(diagnosis.get("explain") or []))
    return 1 if diagnosis["failure"]["phase"] == "none" else 0
