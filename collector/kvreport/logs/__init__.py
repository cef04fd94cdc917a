"""Log understanding: one parser per engine, all reading lines into facts (owned by the analyzer).

API used by the rest of the package (docs/architecture.md):

* :func:`is_key_line` — True for every line any parser uses (the bundle excerpt keeps them all,
  so ``analyze(bundle)`` equals analyzing the whole log).
* :func:`clean_pasted` — GitHub-pasted text (fences, ``> `` quotes, ANSI, CRLF, NUL) -> log text.
* :func:`parse_log` — one streaming pass over lines -> :class:`LogFacts`; never raises.
* :func:`parse_stream` — the same over a binary/text file object, read in chunks with a fast
  prefilter (used for big files: only key lines reach the Python-level parsers).
* :func:`parse_file` — a file on disk, with ``grep -F`` as the prefilter when available.

Modules: :mod:`.common` (framing), :mod:`.llamacpp` (llama.cpp and programs built on it),
:mod:`.ollama`, :mod:`.vllm`, :mod:`.sglang`, :mod:`.tgi`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from kvreport.logs import llamacpp, ollama, sglang, tgi, vllm
from kvreport.logs.common import clean_line, clean_pasted
from kvreport.logs.facts import LogFacts

__all__ = ["LogFacts", "clean_pasted", "clean_line", "is_key_line", "parse_log", "parse_stream", "parse_file",
           "decide_engine"]

_PARSERS = (llamacpp, ollama, vllm, sglang, tgi)
KEYWORDS: tuple[str, ...] = tuple(sorted({k for p in _PARSERS for k in p.KEYWORDS}))
_KEY = re.compile("|".join(re.escape(k) for k in sorted(KEYWORDS, key=len, reverse=True)))
_KEY_BYTES = re.compile("|".join(re.escape(k) for k in sorted(KEYWORDS, key=len, reverse=True)).encode())


def is_key_line(line: str) -> bool:
    """True when ``line`` carries a fact some parser reads (kept in every bundle excerpt).

    Every parser only looks at lines that pass this test, so a bundle excerpt that keeps the key
    lines gives the same facts as the whole log.
    """
    try:
        return _KEY.search(line) is not None
    except TypeError:
        return False


# two log lines pasted onto one (a lost newline): "... size 337  E llama_model_load: ..."
_JOINED = re.compile(r"\s{2,}(?=[EWID] \w+: )")
# ... or glued with no space at all (old SYCL: "can't malloc N Bytes memory on deviceggml_gallocr_reserve_n: ...")
_GLUED = re.compile(r"(?<=[a-z0-9)])(?=(?:ggml_gallocr_reserve_n\w*|alloc_tensor_range|ggml_backend_\w+_alloc_buffer|"
                    r"llama_new_context_with_model|llama_init_from_model|llama_kv_cache_init|graph_reserve): )")


def _feed_one(f: LogFacts, raw, lineno: int) -> None:
    line = clean_line(raw)
    if not line or _KEY.search(line) is None:
        return
    f.key_line_count += 1
    parts = _JOINED.split(line) if "  " in line and len(line) > 40 else [line]
    if "alloc" in line:
        parts = [q for part in parts for q in _GLUED.split(part)]
    for part in parts:
        for parser in _PARSERS:
            try:
                parser.feed(f, part, lineno)
            except Exception:  # noqa: BLE001 - a parser bug must never stop the diagnosis
                f.warnings.append(f"parser {parser.__name__} skipped line {lineno}")


def parse_log(lines: Iterable) -> LogFacts:
    """Read a log in one streaming pass and return its facts.

    ``lines``: any iterable of str or bytes lines (a file object works), or of ``(line_number,
    text)`` pairs as stored in a bundle. Lines are cleaned (:func:`clean_line`), filtered by
    :func:`is_key_line` and handed to each engine parser. Holds only the facts, never the log.
    Never raises on any input.
    """
    f = LogFacts()
    n = 0
    try:
        for item in lines:
            n += 1
            if isinstance(item, (tuple, list)) and len(item) == 2:
                lineno, raw = item
                lineno = lineno if isinstance(lineno, int) else n
            else:
                lineno, raw = n, item
            _feed_one(f, raw, lineno)
    except Exception:  # noqa: BLE001 - a broken iterator ends the pass, it does not fail it
        f.warnings.append(f"log reading stopped after line {n}")
    f.line_count = n
    f.engine = decide_engine(f)
    return f


def parse_stream(fileobj, chunk_bytes: int = 8 << 20) -> LogFacts:
    """:func:`parse_log` for a binary file object, read ``chunk_bytes`` at a time.

    A C-level regex search over each chunk finds the key lines; only those are decoded and
    parsed, so the cost per non-key line is a few nanoseconds. Memory stays at about two chunks.
    Line numbers are counted exactly.
    """
    f = LogFacts()
    lineno = 0
    tail = b""
    try:
        while True:
            chunk = fileobj.read(chunk_bytes)
            if isinstance(chunk, str):
                chunk = chunk.encode("utf-8", "replace")
            if not chunk:
                break
            data = tail + chunk
            cut = data.rfind(b"\n")
            if cut < 0:
                tail = data
                continue
            body, tail = data[: cut + 1], data[cut + 1:]
            lineno = _scan(f, body, lineno)
        if tail:
            lineno = _scan(f, tail + b"\n", lineno)
    except Exception:  # noqa: BLE001
        f.warnings.append(f"log reading stopped after line {lineno}")
    f.line_count = lineno
    f.engine = decide_engine(f)
    return f


def parse_file(path, use_grep: bool = True) -> LogFacts:
    """:func:`parse_stream` for a file on disk, with ``grep -F`` as the prefilter when there is one.

    ``grep -a -n -F`` with the parsers' keywords (the same literal set as :func:`is_key_line`)
    finds the key lines at grep's speed; Python then counts the lines (``bytes.count``) and parses
    only the key lines, in order. Without a usable grep (Windows, a failure) the pure-Python chunk
    scan is used. Same facts either way. Raises OSError when the file cannot be read.
    """
    import os
    import shutil
    import subprocess
    import tempfile

    grep = shutil.which("grep") if use_grep else None
    with open(path, "rb") as fh:
        if grep is None:
            return parse_stream(fh)
        kw = None
        try:
            with tempfile.NamedTemporaryFile("wb", suffix=".kw", delete=False) as kwf:
                kwf.write("\n".join(KEYWORDS).encode())
                kw = kwf.name
            proc = subprocess.Popen([grep, "-a", "-n", "-F", "-f", kw, "--", os.fspath(path)],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    env={**os.environ, "LC_ALL": "C"})
            f = LogFacts()
            assert proc.stdout is not None
            for raw in proc.stdout:
                num, _, text = raw.partition(b":")
                if num.isdigit():
                    _feed_one(f, text, int(num))
            proc.wait()
            if proc.returncode not in (0, 1):
                fh.seek(0)
                return parse_stream(fh)
        finally:
            if kw:
                try:
                    os.unlink(kw)
                except OSError:
                    pass
        n = 0
        last = b"\n"
        while True:
            chunk = fh.read(16 << 20)
            if not chunk:
                break
            n += chunk.count(b"\n")
            last = chunk[-1:]
        f.line_count = n + (0 if last == b"\n" else 1)
        f.engine = decide_engine(f)
        return f


def _scan(f: LogFacts, body: bytes, lineno: int) -> int:
    """Feed the key lines of ``body`` (complete lines) to the parsers; return the new line count."""
    pos = 0  # start of the first line not yet counted
    search = _KEY_BYTES.search
    count = body.count
    end = len(body)
    while True:
        m = search(body, pos)
        if m is None:
            return lineno + count(b"\n", pos, end)
        start = body.rfind(b"\n", 0, m.start()) + 1
        stop = body.find(b"\n", m.end())
        if stop < 0:
            stop = end
        lineno += count(b"\n", pos, start) + 1
        _feed_one(f, body[start:stop], lineno)
        pos = stop + 1
        if pos >= end:
            return lineno


def decide_engine(f: LogFacts) -> str | None:
    """The engine that wrote the log, from the hints the parsers counted (None when unknown).

    Ollama, vLLM, SGLang and TGI lines are specific; llama.cpp lines also appear inside Ollama
    logs (its runner is llama.cpp), so llama.cpp is chosen only when no other engine spoke.
    """
    h = f.engine_hints
    best = max(("ollama", "vllm", "sglang", "tgi"), key=lambda k: h.get(k, 0))
    if h.get(best, 0) >= 2 and h.get(best, 0) >= h.get("other", 0):
        return best
    if h.get("llama.cpp", 0) > 0 and h.get("other", 0) == 0:
        return "llama.cpp"
    if h.get("other", 0):
        return None
    if h.get("llama.cpp", 0) > 0:
        return "llama.cpp"
    return None
