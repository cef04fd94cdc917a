"""Reading a log FILE fast: the key-line prefilter as a multi-pattern scanner, and runs parsed once.

Two costs dominate a big log: finding the key lines (:data:`kvreport.logs.KEYWORDS`) among the others, and parsing
the key lines in Python (30-50 µs each). This module cuts both.

**Scanners** (:func:`scanner`): the same selection three ways — every line whose raw bytes hold one of the
keywords — so that every path hands :func:`kvreport.logs._feed_one` the same lines:

* ``hyperscan`` (PyPI ``hyperscan``, the ``fast`` extra): the keywords compiled into one literal database, run
  over 8 MiB blocks in C; chosen when it imports;
* ``grep``: ``grep -a -n -E`` with the keywords as one alternation (:func:`kvreport.logs.grep_ere`), ``LC_ALL=C``;
  chosen when hyperscan is missing;
* ``python``: the same alternation as a ``bytes`` regex; the last resort.

**Runs** (:func:`parse_runs`, every backend): a crash-looping service's log is the same few runs over and over. The
file is cut into segments at run-start lines (:mod:`kvreport.logs.runs`; found by the backend's scanner over the
run-start literals, with grep as one ``grep -b -F`` process); each segment's bytes are hashed (64-bit XXH3 from
PyPI ``xxhash``, the ``fast`` extra, else BLAKE2b: :func:`_hasher_type`). From :data:`FORK_MIN` up a forked child
finds and hashes the segments while this process parses. A run is parsed once: what parsing a chain of segments
from a fresh start gave (did the run fail, its failure key, its line and key-line counts) is remembered by the
chain's hash, and a later run with the same bytes is counted from that memory instead of being parsed again (line
numbers do not enter the facts that are remembered). The last run is always parsed, so its facts carry their real
line numbers. The result equals :func:`kvreport.logs.parse_log` over the same lines (tests/test_logs_fast.py checks
it on every real case); memory is a few blocks plus at most :data:`MEMO_MAX` remembered runs.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import struct
import subprocess
import threading

from kvreport import strict

BLOCK = 8 << 20
"""Bytes read at a time (cut back to the last newline)."""
MEMO_MAX = 4096
"""Remembered run chains; the memory is emptied when it is full (0: nothing is remembered, every run is parsed)."""
_MAX_LINE = 1 << 20
"""A line longer than this is read in parts (each part is then one line for the prefilter)."""


def _blocks(fd: int, start: int, end: int):
    """``(offset, bytes, n)`` for ``[start, end)`` in blocks of whole lines: the block is ``data[:n]`` (``data`` may
    run on past the last newline; not cutting it saves a copy). The last block may end without a newline."""
    pos = start
    while pos < end:
        data = os.pread(fd, min(BLOCK, end - pos), pos)
        if not data:
            return
        n = len(data)
        if pos + n < end:
            cut = data.rfind(b"\n")
            while cut < 0 and pos + len(data) < end and len(data) < _MAX_LINE:
                more = os.pread(fd, min(BLOCK, end - pos - len(data)), pos + len(data))
                if not more:
                    break
                i = more.find(b"\n")
                data += more if i < 0 else more[: i + 1]
                cut = len(data) - 1 if i >= 0 else -1
            n = cut + 1 if cut >= 0 else len(data)
        yield pos, data, n
        pos += n


def _spans_from_ends(data: bytes, n: int, ends) -> list[tuple[int, int]]:
    """``(start, stop)`` of each line of ``data[:n]`` holding a match ending at one of ``ends`` (ascending, unique;
    ``stop`` is the newline's index or ``n``)."""
    out: list[tuple[int, int]] = []
    last = -1
    rfind, find = data.rfind, data.find
    for e in sorted(ends):
        if e <= last:
            continue
        s = rfind(b"\n", 0, e - 1) + 1
        stop = find(b"\n", e - 1, n)
        stop = n if stop < 0 else stop
        out.append((s, stop))
        last = stop
    return out


class _RegexSpans:
    """Line spans holding a literal, found with a compiled ``bytes`` alternation (the pure-Python path)."""

    def __init__(self, literals):
        self.rx = re.compile(b"|".join(re.escape(k.encode()) for k in sorted(literals, key=len, reverse=True)))

    def __call__(self, data: bytes, n: int) -> list[tuple[int, int]]:
        out = []
        search, rfind, find = self.rx.search, data.rfind, data.find
        pos = 0
        while True:
            m = search(data, pos, n)
            if m is None:
                return out
            s = rfind(b"\n", 0, m.start()) + 1
            stop = find(b"\n", m.end(), n)
            stop = n if stop < 0 else stop
            out.append((s, stop))
            pos = stop + 1
            if pos >= n:
                return out


class _HyperscanSpans:
    """Line spans holding a literal, found by a hyperscan literal database (block mode, one scratch)."""

    def __init__(self, literals):
        import hyperscan

        lits = sorted({k.encode() for k in literals})
        self.db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        self.db.compile(expressions=lits, ids=list(range(len(lits))), elements=len(lits), flags=0, literal=True)

    def __call__(self, data: bytes, n: int) -> list[tuple[int, int]]:
        ends: list[int] = []
        add = ends.append

        def on_match(_id, _frm, to, _flags, _ctx):
            add(to)

        self.db.scan(memoryview(data)[:n] if n < len(data) else data, match_event_handler=on_match)
        return _spans_from_ends(data, n, ends)


def _have_hyperscan() -> bool:
    try:
        import hyperscan  # noqa: F401
    except ImportError:
        return False
    return True


def best_backend() -> str:
    """``"hyperscan"`` when it imports (for every size: its two databases build in a few milliseconds, less than
    the grep processes it saves), else ``"grep"`` when there is one, else ``"python"``."""
    if _have_hyperscan():
        return "hyperscan"
    return "grep" if shutil.which("grep") else "python"


class Scanner:
    """The key lines of a byte range, fed in order with their line numbers (one backend, see the module doc)."""

    def __init__(self, backend: str, keywords, run_literals):
        self.backend = backend
        self.run_literals = tuple(run_literals)
        if backend == "hyperscan":
            self.key_spans, self.start_spans = _HyperscanSpans(keywords), _HyperscanSpans(run_literals)
        else:
            self.key_spans, self.start_spans = _RegexSpans(keywords), _RegexSpans(run_literals)

    def feed_range(self, fd: int, start: int, end: int, nl: int, feed) -> int:
        """Call ``feed(line_number, raw_bytes)`` for every key line of ``[start, end)`` (which starts a line;
        ``nl`` newlines lie before it) and return the newlines before ``end``. Raises OSError."""
        if self.backend == "grep":
            return _grep_range(fd, start, end, nl, feed)
        for _off, data, n in _blocks(fd, start, end):
            pos = 0
            count = data.count
            for s, stop in self.key_spans(data, n):
                nl += count(b"\n", pos, s)
                feed(nl + 1, data[s:stop])
                pos = s
            nl += count(b"\n", pos, n)
        return nl


def _grep_range(fd: int, start: int, end: int, nl: int, feed) -> int:
    """:meth:`Scanner.feed_range` through one ``grep -a -n -E`` process fed the range on its standard input."""
    from kvreport.logs import grep_pattern_file

    with grep_pattern_file("-E") as kw, _grep(fd, start, end, ["-n", "-E", "-f", kw], count=True) as (out, newlines):
        for line in out:
            num, _, text = line.partition(b":")
            if num.isdigit():
                feed(nl + int(num), text[:-1] if text.endswith(b"\n") else text)
    return nl + newlines[0]


@contextlib.contextmanager
def _grep(fd: int, start: int, end: int, args: list[str], count: bool = False):
    """``(output lines, [newlines])`` of one ``grep -a <args>`` process (``LC_ALL=C``) fed ``[start, end)`` of ``fd``
    on its standard input by a thread, which counts the newlines it sends when ``count`` (read the count once the
    output is read to its end). Raises OSError when there is no grep or it fails."""
    grep = shutil.which("grep")
    if grep is None:
        raise OSError("no grep")
    newlines = [0]
    errors: list[BaseException] = []
    proc = subprocess.Popen([grep, "-a", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env={**os.environ, "LC_ALL": "C"})

    def pump() -> None:
        try:
            for _off, data, n in _blocks(fd, start, end):
                if count:
                    newlines[0] += data.count(b"\n", 0, n)
                proc.stdin.write(memoryview(data)[:n])
        except (OSError, ValueError) as exc:  # a broken pipe: grep died
            errors.append(exc)
        finally:
            with contextlib.suppress(OSError):
                proc.stdin.close()

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    done = False
    try:
        yield proc.stdout, newlines
        done = True
    finally:
        if not done:
            proc.kill()
        t.join()
        proc.stdout.close()
        code = proc.wait()
    if errors or code not in (0, 1):
        raise OSError(f"grep failed ({code})")


def _hasher_type():
    """A streaming 64-bit hash of bytes (``update``, ``intdigest``): xxHash's XXH3 (PyPI ``xxhash``, the ``fast``
    extra; tens of GB/s) where it imports, else BLAKE2b cut to 8 bytes (hashlib; about 1 GB/s)."""
    try:
        import xxhash
    except ImportError:
        import hashlib

        class _Blake:
            __slots__ = ("h",)

            def __init__(self):
                self.h = hashlib.blake2b(digest_size=8)

            def update(self, data) -> None:
                self.h.update(data)

            def intdigest(self) -> int:
                return int.from_bytes(self.h.digest(), "little")

        return _Blake
    return xxhash.xxh3_64


class _Runs:
    """The segment-by-segment state of :func:`parse_runs` (see the module doc)."""

    def __init__(self, f, fd: int, scanner: Scanner, feed_one):
        self.f, self.fd, self.scanner, self.feed_one = f, fd, scanner, feed_one
        self.memo: dict = {}
        self.nl = 0  # newlines before the current segment's start
        self.live = False  # f holds the current run up to the current segment's start
        self.pending = (0, 0)  # (offset, newlines before it): where the current run starts
        self.chain = 0
        self.run_keys = 0  # f.key_line_count when the current run started
        self.hits = 0
        self.failed_range: tuple[int, int, int] | None = None  # the last failed run, when it was not parsed

    def _parse(self, start: int, end: int, nl: int) -> int:
        f, feed_one = self.f, self.feed_one
        return self.scanner.feed_range(self.fd, start, end, nl, lambda n, raw: feed_one(f, raw, n))

    def segment(self, start: int, end: int, digest: int, last: bool) -> None:
        """The segment ``[start, end)`` (one run-start line at most, first) was read; ``digest`` is its hash."""
        f = self.f
        chain = hash((self.chain, digest))
        if not self.live and not last:
            got = self.memo.get(chain)
            if got is not None:
                failed, key, seg_nl, keys = got
                self.hits += 1
                self.nl += seg_nl
                if failed:
                    f.key_line_count += keys
                    f.count_run(key)
                    f.last_failed = None  # this run is the last failed one now: parsed again if it is needed
                    self.failed_range = (self.pending[0], end, self.pending[1])
                    self._fresh(end)
                else:
                    self.chain = chain
                return
        seg_nl0 = self.nl
        if not self.live:
            self.nl = self._parse(self.pending[0], end, self.pending[1])
            self.live = True
        else:
            self.nl = self._parse(start, end, self.nl)
        if last:
            return
        failed = f.run_failed()
        if len(self.memo) >= MEMO_MAX:
            self.memo.clear()
        if MEMO_MAX > 0:
                self.memo[chain] = (failed, f.run_key() if failed else None, self.nl - seg_nl0,
                                f.key_line_count - self.run_keys)
        if failed:
            f.fold()
            self.failed_range = None
            self._fresh(end)
        else:
            self.chain = chain

    def _fresh(self, end: int) -> None:
        self.live = False
        self.pending = (end, self.nl)
        self.chain = 0
        self.run_keys = self.f.key_line_count


_SYSLOG_PREFIX = (
    rb"(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?) "
    rb"(\S+ [^\s\[:]+)\[\d+\]: (?:time=\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:?\d\d)? )?")
_SYSLOG = re.compile(rb"(?m)^" + _SYSLOG_PREFIX)
_SYSLOG_NL = re.compile(rb"\n" + _SYSLOG_PREFIX)  # the same after a newline: re finds a literal first byte faster
"""The line prefix of syslog and ``journalctl`` (short and short-iso): "Dec 01 10:00:01 host ollama[1234]: ", and
Ollama's own ``time=...`` field right after it. In a crash-looping service's journal the timestamp and the PID change
with every run while the rest repeats: the segment hash leaves them out (host and program kept), so the runs are
parsed once. Nothing a parser reads is lost: the remembered facts of a run (failed or not, its failure key with
digits as N, its line and key-line counts) do not depend on them, and the last failed run is parsed again."""
SYSLOG_SHARE = 0.5
"""A file is read as a journal when at least this share of its first lines (up to 200) carry :data:`_SYSLOG`."""


def _normalizer(fd: int, size: int):
    """``bytes -> bytes`` that drops the journal's changing prefix (:data:`_SYSLOG`) when the file starts as a journal,
    else None (the bytes are hashed as they are)."""
    head = os.pread(fd, min(size, 64 << 10), 0)
    lines = head.split(b"\n", 200)[:200]
    hits = sum(1 for ln in lines if _SYSLOG.match(ln))
    if not lines or hits < SYSLOG_SHARE * len(lines):
        return None
    sub = _SYSLOG_NL.sub
    return lambda data: sub(rb"\n\1: ", b"\n" + data)[1:]  # every piece handed to it starts at a line start


def _confirmer(is_start):
    """``is_start`` with a memory: the same candidate lines come back in a crash loop, each is confirmed once."""
    seen: dict[bytes, bool] = {}

    def confirm(raw: bytes) -> bool:
        ok = seen.get(raw)
        if ok is None:
            ok = is_start(raw)
            if len(raw) < 4096:
                if len(seen) >= 4096:
                    seen.clear()
                seen[raw] = ok
        return ok

    return confirm


def _segments(fd: int, size: int, spans, is_start):
    """``(start, end, digest)`` of every segment of the file: cut before each confirmed run-start line; the last one
    ends at ``size``. ``spans(data, n)``: the candidate lines of a block (:attr:`Scanner.start_spans`)."""
    seg_start = 0
    hasher = _hasher_type()
    h = hasher()
    confirm = _confirmer(is_start)
    norm = _normalizer(fd, size)
    for off, data, n in _blocks(fd, 0, size):
        mv = memoryview(data)[:n]
        pos = 0
        for s, stop in spans(data, n):
            if off + s == seg_start or not confirm(data[s:stop]):
                continue
            h.update(norm(mv[pos:s]) if norm else mv[pos:s])
            yield seg_start, off + s, h.intdigest()
            h = hasher()
            pos, seg_start = s, off + s
        h.update(norm(mv[pos:]) if norm else mv[pos:])
    yield seg_start, size, h.intdigest()


def _grep_segments(fd: int, size: int, literals, is_start):
    """:func:`_segments` with the candidate lines found by one ``grep -a -b -F`` process (their byte offsets), each
    segment's bytes then read and hashed."""
    seg_start = 0
    hasher = _hasher_type()
    confirm = _confirmer(is_start)
    norm = _normalizer(fd, size)
    with _grep(fd, 0, size, ["-b", "-F", *(a for lit in literals for a in ("-e", lit))]) as (out, _nl):
        for line in out:
            num, _, raw = line.partition(b":")
            if not num.isdigit():
                continue
            off = int(num)
            if off == seg_start or not confirm(raw[:-1] if raw.endswith(b"\n") else raw):
                continue
            yield seg_start, off, _hash_range(fd, seg_start, off, hasher, norm)
            seg_start = off
    yield seg_start, size, _hash_range(fd, seg_start, size, hasher, norm)


def _hash_range(fd: int, start: int, end: int, hasher, norm=None) -> int:
    h = hasher()
    for _off, data, n in _blocks(fd, start, end):
        h.update(norm(memoryview(data)[:n]) if norm else memoryview(data)[:n])
    return h.intdigest()


_REC = struct.Struct("<qqQ")
FORK_MIN = 64 << 20
"""From this size on (and where ``os.fork`` exists, with more than one CPU) the segments are found and hashed by a
child process while this one parses: the two halves of the work run on two cores."""


FLUSH_BYTES = 4 << 20
"""The child sends its records on as soon as they cover this many more bytes of the file."""


def _segments_forked(segments):
    """The records of the generator ``segments()`` (:func:`_segments`, :func:`_grep_segments`) computed by a forked
    child and read from a pipe. Raises OSError when the child fails."""
    r, w = os.pipe()
    with contextlib.suppress(AttributeError, OSError):
        import fcntl

        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)  # ~40,000 segments ahead
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child (its coverage is not collected)
        code = 1
        try:
            os.close(r)
            with os.fdopen(w, "wb", buffering=1 << 16) as out:
                count = flushed = 0
                for rec in segments():
                    out.write(_REC.pack(*rec))
                    count += 1
                    if rec[1] - flushed >= FLUSH_BYTES:
                        # hand the parent what it can parse now: a buffer that waits for 2,730 records would keep
                        # a log of few, long runs from the parent until this child is done (no overlap at all)
                        out.flush()
                        flushed = rec[1]
                out.write(_REC.pack(-1, count, 0))
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    done = False
    try:
        with os.fdopen(r, "rb", buffering=1 << 16) as inp:
            while True:
                rec = inp.read(_REC.size)
                if len(rec) < _REC.size:
                    break
                start, end, digest = _REC.unpack(rec)
                if start == -1:
                    done = True
                    break
                yield start, end, digest
    finally:
        if not done:
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
        _pid, status = os.waitpid(pid, 0)
    if not done or status != 0:
        raise OSError("the segment reader stopped")


def parse_runs(f, fd: int, size: int, scanner: Scanner, feed_one, is_start, fork: bool | None = None):
    """Fill ``f`` from the file ``fd`` of ``size`` bytes (see the module doc). ``is_start(raw)`` confirms a run-start
    candidate line; ``fork`` (default: from :data:`FORK_MIN` up, where it can) reads the segments in a child
    process. Returns (newlines, memo hits, the facts of the last failed run when it was counted from memory and the
    last run did not fail, else None) — the last for :meth:`LogFacts.finish_runs`. Raises OSError."""
    if fork is None:
        fork = size >= FORK_MIN and hasattr(os, "fork") and (os.cpu_count() or 1) > 1
    runs = _Runs(f, fd, scanner, feed_one)
    if scanner.backend == "grep":
        segments = functools.partial(_grep_segments, fd, size, scanner.run_literals, is_start)
    else:
        segments = functools.partial(_segments, fd, size, scanner.start_spans, is_start)
    for start, end, digest in _segments_forked(segments) if fork else segments():
        runs.segment(start, end, digest, last=end == size)
    failed_run = None
    if runs.failed_range is not None and f.last_failed is None and not f.run_failed():
        failed_run = type(f)()
        start, end, nl = runs.failed_range
        scanner.feed_range(fd, start, end, nl, lambda n, raw: feed_one(failed_run, raw, n))
    return runs.nl, runs.hits, failed_run


@functools.lru_cache(maxsize=4)
def scanner(backend: str | None = None) -> Scanner:
    """A :class:`Scanner` for ``backend`` (default :func:`best_backend`); hyperscan falls back to grep, then
    Python, when it cannot be built. Built once per backend (compiling the hyperscan database takes a moment)."""
    from kvreport.logs import KEYWORDS
    from kvreport.logs.runs import LITERALS

    backend = backend or best_backend()
    if backend == "hyperscan":
        try:
            return Scanner("hyperscan", KEYWORDS, LITERALS)
        except Exception:  # noqa: BLE001 - a hyperscan that does not load (CPU without SSSE3): the next backend
            strict.check()
            backend = "grep" if shutil.which("grep") else "python"
    return Scanner(backend, KEYWORDS, LITERALS)
