"""``kvreport analyze PATH|- [--json] [--command CMD]``: diagnose a bundle or a raw log offline.

Exit status (design.md): 0 when a failure was diagnosed, 1 when the input holds no failure
(``--json`` still prints the diagnosis with its memory numbers), 2 when the input cannot be read
(one line on stderr, no traceback). A raw log is read in one streaming pass
(:func:`kvreport.logs.parse_stream`), so a multi-GB log costs little memory; text pasted from a
GitHub issue (code fences, ``> `` quotes) is accepted as it is.
"""

from __future__ import annotations

import io
import json
import os
import sys

from kvreport.analyze import _parse_command, analyze, diagnose
from kvreport.errors import InputError
from kvreport.logs import parse_file, parse_stream
from kvreport.render import render_text


def _open(path: str):
    if path == "-":
        data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
        return io.BytesIO(data)
    try:
        return open(path, "rb")
    except IsADirectoryError as exc:
        raise InputError(f"cannot read {path}: it is a directory") from exc
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _diagnose(fh, command_line: str | None) -> tuple[dict, dict | None]:
    head = fh.read(64 * 1024)
    stripped = head.lstrip()
    if stripped.startswith(b"{") and b'"schema"' in head and b"kvreport/bundle" in head:
        data = head + fh.read()
        try:
            bundle = json.loads(data.decode("utf-8", "replace"))
        except ValueError as exc:
            raise InputError(f"not a valid bundle: {exc}") from exc
        if not isinstance(bundle, dict):
            raise InputError("not a valid bundle: the JSON is not an object")
        if command_line:
            bundle["command"] = _parse_command(command_line)
        return analyze(bundle), bundle
    name = getattr(fh, "name", None)
    if isinstance(name, str) and os.path.isfile(name):
        facts = parse_file(name)  # grep -F prefilter when available: big logs at near grep speed
    else:
        stream = io.BufferedReader(_Chain(head, fh)) if head else fh
        facts = parse_stream(stream)
    extra = {"command": _parse_command(command_line)} if command_line else {}
    return diagnose(facts, extra), None


class _Chain(io.RawIOBase):
    """Bytes already read followed by the rest of the file."""

    def __init__(self, head: bytes, rest):
        self.head, self.rest = head, rest

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self.head:
            n = min(len(b), len(self.head))
            b[:n] = self.head[:n]
            self.head = self.head[n:]
            return n
        data = self.rest.read(len(b))
        n = len(data)
        b[:n] = data
        return n


def cli_analyze(path: str, as_json: bool = False, command_line: str | None = None) -> int:
    """Run ``kvreport analyze``; returns the exit status (0 diagnosed, 1 no failure, 2 bad input)."""
    try:
        fh = _open(path)
        try:
            diagnosis, bundle = _diagnose(fh, command_line)
        except OSError as exc:
            raise InputError(f"cannot read {path}: {exc.strerror or exc}") from exc
        finally:
            fh.close()
    except InputError as exc:
        print(f"kvreport: error: {exc}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(diagnosis, indent=2, ensure_ascii=False))
    else:
        sys.stdout.write(render_text(diagnosis, bundle))
    return 1 if diagnosis["failure"]["phase"] == "none" else 0
