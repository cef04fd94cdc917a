"""Reading a log FILE into an :class:`~kvreport.excerpt.Excerpt` fast (``kvreport collect --log``).

The line-by-line path (:func:`read_excerpt_slow`: decode every line, test it with
:func:`kvreport.logs.is_key_line`) costs about 30 s on a 200 MB log. This path gives exactly the
same excerpt (same line count, key lines, tail, cut lines) from three cheap passes:

* the line count: ``b"\\n"`` counted in 8 MiB binary blocks (plus one for a last line without a
  newline), as binary file iteration counts lines;
* the key lines with their line numbers: ``grep -a -n -E -f`` over the file with the analyzer's
  own pattern (:func:`kvreport.logs.grep_ere`, the literal set of :data:`kvreport.logs.KEYWORDS`,
  ``LC_ALL=C``) — a superset of the key lines, since a keyword after the excerpt's line cut does
  not count: each candidate is decoded, cut and tested with :func:`~kvreport.logs.is_key_line`
  exactly as :meth:`Excerpt.feed` does; grep stops once the excerpt has its first
  ``max_key_lines`` key lines (later ones are never kept);
* the tail: blocks read backwards from the end of the file until it holds enough lines.

Without grep (Windows) or when grep fails, :func:`read_excerpt` uses the line-by-line path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import deque

from kvreport.excerpt import Excerpt
from kvreport.logs import grep_pattern_file, is_key_line

_BLOCK = 8 << 20


def _prepared(excerpt: Excerpt, raw: bytes) -> str:
    """A raw line as :meth:`Excerpt.feed` stores it (decoded, CR/LF stripped, cut)."""
    line = raw.decode("utf-8", "replace").rstrip("\r\n")
    if len(line) > excerpt.max_line_chars:
        line = line[: excerpt.max_line_chars] + "…[cut]"
    return line


def read_excerpt_slow(path: str, excerpt: Excerpt | None = None) -> Excerpt:
    """The reference path: every line of the file fed to :meth:`Excerpt.feed`. Raises OSError."""
    excerpt = excerpt if excerpt is not None else Excerpt()
    with open(path, "rb") as fh:
        for raw in fh:
            excerpt.feed(raw.decode("utf-8", "replace"))
    return excerpt


def _count_lines(fd: int, size: int) -> int:
    newlines = 0
    pos = 0
    last = b"\n"
    while pos < size:
        block = os.pread(fd, min(_BLOCK, size - pos), pos)
        if not block:
            break
        newlines += block.count(b"\n")
        last = block[-1:]
        pos += len(block)
    return newlines + (0 if pos == 0 or last == b"\n" else 1)


def _tail(fd: int, size: int, total: int, n: int) -> list[tuple[int, bytes]]:
    """The last ``n`` lines (``(line number, raw bytes without the newline)``) of a file of ``total`` lines."""
    if n <= 0 or total == 0:
        return []
    data = b""
    pos = size
    block = 1 << 16
    while pos > 0:
        step = min(block, pos)
        pos -= step
        data = os.pread(fd, step, pos) + data
        # n complete lines need n newlines before them (or the start of the file) plus their own
        if data.count(b"\n", 0, len(data) - 1) >= n:
            break
        block = min(block * 2, _BLOCK)
    body = data[:-1] if data.endswith(b"\n") else data
    parts = body.split(b"\n")
    if pos > 0:
        parts = parts[1:]  # the first piece is the end of an earlier line
    parts = parts[-n:]
    first = total - len(parts) + 1
    return [(first + i, raw) for i, raw in enumerate(parts)]


def _grep_key_lines(grep: str, path: str, excerpt: Excerpt) -> bool:
    """Fill ``excerpt.key`` from grep's candidates; False when grep failed. Once the excerpt holds
    its ``max_key_lines`` key lines grep is stopped, so ``key_dropped`` (no part of the bundle)
    stays 0 on this path."""
    try:
        with grep_pattern_file("-E") as kw:
            env = {**os.environ, "LC_ALL": "C"}
            with subprocess.Popen([grep, "-a", "-n", "-E", "-f", kw, "--", path], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env) as proc:
                key = excerpt.key
                cap = excerpt.max_key_lines
                for out in proc.stdout:
                    num, _, raw = out.partition(b":")
                    if not num.isdigit():
                        continue
                    line = _prepared(excerpt, raw)
                    if not is_key_line(line):
                        continue
                    key.append((int(num), line))
                    if len(key) >= cap:  # the excerpt keeps the first `cap` key lines: the rest is not read
                        proc.kill()
                        proc.stdout.close()
                        proc.wait()
                        return True
                code = proc.wait()
        return code in (0, 1)
    except OSError:
        return False


def read_excerpt_fast(path: str, grep: str) -> Excerpt | None:
    """The fast path (see the module doc); None when grep failed. Raises OSError when unreadable."""
    excerpt = Excerpt()
    with open(path, "rb") as fh:
        fd = fh.fileno()
        size = os.fstat(fd).st_size
        if not _grep_key_lines(grep, path, excerpt):
            return None
        total = _count_lines(fd, size)
        tail_n = excerpt.tail.maxlen or 0
        tail = _tail(fd, size, total, tail_n)
    excerpt.line_count = total
    excerpt.tail = deque(((n, _prepared(excerpt, raw)) for n, raw in tail), maxlen=tail_n)
    return excerpt


def read_excerpt(path: str, use_grep: bool = True) -> Excerpt:
    """An :class:`Excerpt` of the log file at ``path``: the fast path when ``grep`` is on the
    PATH, else (or when it fails) the line-by-line one. Same result either way. Raises OSError."""
    grep = shutil.which("grep") if use_grep else None
    if grep is not None and os.path.isfile(path):
        fast = read_excerpt_fast(path, grep)
        if fast is not None:
            return fast
    return read_excerpt_slow(path)
