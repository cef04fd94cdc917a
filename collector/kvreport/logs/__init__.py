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

import contextlib
import os
import re
import tempfile
from collections.abc import Iterable, Iterator

import re2

from kvreport import strict
from kvreport.engines import REGISTRY
from kvreport.logs import llamacpp, ollama, oom, sglang, tgi, vllm
from kvreport.logs.common import KeywordSet, clean_line, clean_pasted, re2_options
from kvreport.logs.facts import LogFacts
from kvreport.logs.runs import LITERALS as _RUN_LITERALS
from kvreport.logs.runs import is_run_start

__all__ = ["LogFacts", "clean_pasted", "clean_line", "is_key_line", "parse_log", "parse_stream", "parse_file",
           "decide_engine"]

_MODULES = {"llamacpp": llamacpp, "ollama": ollama, "vllm": vllm, "sglang": sglang, "tgi": tgi}
# the engines' parsers in registry order (kvreport.engines), then the failure layer under all of them
_PARSERS = (*(_MODULES[e.parser] for e in REGISTRY if e.parser), oom)
KEYWORDS: tuple[str, ...] = tuple(sorted({k for p in _PARSERS for k in p.KEYWORDS} | set(_RUN_LITERALS)))
"""Every literal that makes a line a key line: each parser's (derived from its rule tables / sections) and the run
starts of :mod:`kvreport.logs.runs`. The Python check, ``grep -E`` and the hyperscan database all select by it."""


def _literals(words) -> str:
    return "|".join(re.escape(k) for k in sorted(words, key=len, reverse=True))


# Alternations of literals run in RE2 (a DFA: one pass whatever the number of keywords; Python's re tries each
# alternative at each position, 30-50 us a line for these sets against 1-3 us)
_KEY = re2.compile(_literals(KEYWORDS), options=re2_options())
# each parser only sees the lines its own keywords select (a key line for llama.cpp is not read by the vLLM regexes):
# the line's keywords are found once (one RE2 Set pass), each parser's by a set intersection
_ALL = KeywordSet(KEYWORDS)
_OWN = tuple((p, frozenset(p.KEYWORDS)) for p in _PARSERS)
_KEY_BYTES = re2.compile(_literals(KEYWORDS).encode(), options=re2_options())


def grep_ere() -> str:
    """:data:`KEYWORDS` as ONE POSIX extended regex (an alternation of the escaped literals) for ``grep -E``.

    It selects exactly the lines :func:`is_key_line` selects (``LC_ALL=C``, ``-a``). One alternation runs through
    GNU grep's DFA, which reads each byte once whatever the number of keywords; ``grep -F -f`` with the same ~110
    literals uses a Commentz-Walter skip table whose shifts shrink to 1-2 bytes with that many patterns (measured on
    the 200 MB bench log: -E alternation 0.4-0.7 s, -F -f 0.8-1.4 s, on the same machine and load).
    """
    return "|".join(re.sub(r"([.\[\]()*+?{}|^$\\])", r"\\\1", k) for k in KEYWORDS)



@contextlib.contextmanager
def grep_pattern_file(mode: str = "-E") -> Iterator[str]:
    """Path of a temporary ``grep -f`` file holding the key-line prefilter, removed on exit.

    ``mode`` "-E": the keywords as one extended regex (:func:`grep_ere`); "-F": one literal a line.
    """
    with tempfile.NamedTemporaryFile("wb", suffix=".kw", delete=False) as kwf:
        kwf.write((grep_ere() + "\n").encode() if mode == "-E" else "\n".join(KEYWORDS).encode())
    try:
        yield kwf.name
    finally:
        with contextlib.suppress(OSError):
            os.unlink(kwf.name)


_USER_TEXT = re.compile(r"log_server_r\w*: |Received request \S+: prompt: |"
                        r"msg=\"?(?:chat|completion|generate|embed)\w* request|Receive: obj=\w+ReqInput\(")
"""A server's record of a request or its answer, whose text is the user's (llama-server's ``srv  log_server_r:
request: {"messages": ...}`` at -lv 4, vLLM's ``Received request chatcmpl-1: prompt: '...'``, Ollama's debug
``msg="chat request" ... prompt=...``, SGLang's ``Receive: obj=GenerateReqInput(text=...``): a prompt that quotes an
out-of-memory error is no failure of the server, and no part of it may become the bundle's error line."""


def user_text(line: str) -> bool:
    """Whether ``line`` is a request or response body a server logged (:data:`_USER_TEXT`, within its first 200
    characters): no parser reads it."""
    return _USER_TEXT.search(line[:200]) is not None


def is_key_line(line: str) -> bool:
    """True when ``line`` carries a fact some parser reads (kept in every bundle excerpt).

    Every parser only looks at lines that pass this test, so a bundle excerpt that keeps the key
    lines gives the same facts as the whole log. A request or answer a server logged is never one
    (:func:`user_text`).
    """
    try:
        return _KEY.search(line) is not None and not user_text(line)
    except TypeError:
        return False


# two log lines pasted onto one (a lost newline): "... size 337  E llama_model_load: ..."
_JOINED = re.compile(r"\s{2,}(?=[EWID] \w+: )")
# ... or glued with no space at all (old SYCL: "can't malloc N Bytes memory on deviceggml_gallocr_reserve_n: ...")
# ... or with one space, as Ollama's error strings concatenate the runner's messages ("... size = 16571.89 MiB
# ggml_gallocr_reserve_n: failed to allocate Metal buffer of size ...")
_GLUED = re.compile(r"(?<=[a-zA-Z0-9)])\s?(?=(?:ggml_gallocr_reserve_n\w*|alloc_tensor_range|ggml_backend_\w+_alloc_buffer|"
                    r"llama_new_context_with_model|llama_init_from_model|llama_kv_cache_init|graph_reserve): )")


# Engine messages that people paste re-wrapped over two lines (terminal width, e-mail, issue quotes): when two
# consecutive key lines hold one of these phrases only once joined, the joined text is read too. Each phrase is
# part of a message an engine rule reads (vLLM V0/V1 capacity and start-up gate, Ollama's memory check, torch's
# OOM, SGLang's pool check, llama.cpp's KV failure).
WRAP_PHRASES = ("out of memory. Tried to allocate", "KV cache is needed", "larger than the available KV cache memory", "can be stored in KV cache",
                "less than desired GPU memory utilization", "more system memory", "Tried to allocate",
                "increase --mem-fraction-static", "No available memory for the cache blocks",
                "failed to allocate buffer for kv cache", "failed to allocate buffer for the kv cache",
                "is longer than the model's context length", "your prompt contains at least",
                # ggml-cuda's allocation line cut before its reason ("... on device 1: cudaMalloc" / "failed: out of
                # memory"), as an issue's quote wraps it
                "cudaMalloc failed", "hipMalloc failed")


WRAP_PAIRS = (("max seq len", "KV cache is needed"), ("max seq len", "maximum number of tokens that can be stored"),
              ("Free memory on device", "desired GPU memory utilization"), ("out of memory.", "Tried to allocate"),
              ("Tried to allocate", "has a total capacity of"), ("Tried to allocate", "total capacity;"),
              ("has a total capacity of", "is free."),
              ("model requires more", "than is available"), ("failed to allocate", "buffer of size"),
              ("Buffer overflow when allocating", "bytes available in AlignedAllocator"),
              ("using device", "MiB free"), ("maximum context length is", "However, you requested"),
              # the TPU runtime's status message puts a newline after the program's name (tpu-inference#3408)
              ("Error loading program", "That was not possible"))
"""(start, continuation) of the same messages when the break falls between two phrases."""


def wrap_join(prev: str, line: str, adjacent: bool = True) -> str | None:
    """``prev`` and ``line`` as one message when a :data:`WRAP_PHRASES` phrase appears only once they are joined
    (directly for a word cut in two, else with a space), or when ``line`` continues a :data:`WRAP_PAIRS` message
    that ``prev`` began; else None. Not ``adjacent`` (one line between them: a paste that doubled its line breaks,
    as Markdown renders them): only the :data:`WRAP_PAIRS`, whose two halves are each specific."""
    for start, cont in WRAP_PAIRS:
        if start in prev and cont in line and cont not in prev and start not in line:
            return prev + " " + line
    if not adjacent:
        return None
    if prev.endswith("(") and line[:1].isdigit() and _KEY.search(prev):
        return prev + line  # a number wrapped off its parenthesis: "... stored in KV cache (" / "3984). Try ..."
    for sep in ("", " "):
        joined = prev + sep + line
        for phrase in WRAP_PHRASES:
            if phrase in joined and phrase not in prev and phrase not in line:
                return joined
    return None


def _feed_one(f: LogFacts, raw, lineno: int) -> None:
    line = clean_line(raw)
    present = _ALL.present(line) if line else None
    if not present or oom.prose_not_failure(line) or user_text(line):
        return  # (a typed sentence that mentions an error without reporting one: "no more OOM", a question; a
        # prompt or an answer the server logged)
    f.key_line_count += 1
    if is_run_start(line) and f.run_failed():
        f.fold()  # a new run after a failure: count the failed run, keep only the new run's facts
    prev = f.prev_key
    f.prev_key = (lineno, line)
    if prev and lineno - 2 <= prev[0] < lineno and len(prev[1]) < 4000:
        joined = wrap_join(prev[1], line, adjacent=prev[0] == lineno - 1)
        if joined is not None:
            # the failure layer reads the whole message again from the joined text: its half read alone goes
            # (so does a torch OOM an engine parser read from the first half)
            f.events[:] = [e for e in f.events if not ((e["kind"] == "oom" or e.get("torch_oom"))
                                                       and e["lineno"] == prev[0])]
            f.prev_key = (lineno, joined)  # (a message wrapped over three lines joins its third to the first two)
            _feed_parts(f, joined, lineno)
            return
    _feed_parts(f, line, lineno, present)


def _feed_parts(f: LogFacts, line: str, lineno: int, present: frozenset[str] | None = None) -> None:
    """Hand ``line`` (or each message glued into it) to the parsers whose keywords it holds; ``present``: the
    keywords of ``line`` when the caller found them already."""
    parts = _JOINED.split(line) if "  " in line and len(line) > 40 else [line]
    if "\\n" in line and ('error="' in line or 'err="' in line):
        # Go's slog quotes an attribute with its newlines escaped (Ollama: error="llama runner process no longer
        # running: -1 CUDA error: out of memory\n  current device: 0, in function alloc at ..."): its lines, one by one
        parts = [q for part in parts for q in part.split("\\n")]
    if "alloc" in line:
        parts = [q for part in parts for q in _GLUED.split(part)]
    for part in parts:
        before = f.n_events
        hints = sum(f.engine_hints.values())
        if present is None or part is not line:
            present = _ALL.present(part)
        for parser, own in _OWN:
            if present.isdisjoint(own):
                continue
            added = f.n_events - before
            if parser is oom and added and any(not e.get("weak") for e in f.events[len(f.events) - added:]):
                continue  # the failure layer reads only what no engine-specific rule read (a weak guess is not)
            try:
                parser.feed(f, part, lineno)
            except Exception:  # noqa: BLE001 - a parser bug must never stop the diagnosis
                strict.check()
                f.warnings.append(f"parser {parser.__name__} skipped line {lineno}")
        if sum(f.engine_hints.values()) != hints and len(f.engine_lines) < len(f.engine_hints):
            for name in f.engine_hints:
                f.engine_lines.setdefault(name, [lineno, part[:300]])


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
        strict.check()
        f.warnings.append(f"log reading stopped after line {n}")
    f.line_count = n
    return _finish(f)


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
        strict.check()
        f.warnings.append(f"log reading stopped after line {lineno}")
    f.line_count = lineno
    return _finish(f)


def parse_file(path, use_grep: bool = True, workers: int | None = None, backend: str | None = None) -> LogFacts:
    """The facts of a log file on disk, as :func:`parse_log` gives them, at near the speed of ``grep``.

    ``backend`` (:mod:`kvreport.logs.scan`): ``"hyperscan"`` (the default when it imports),
    ``"grep"`` (the default otherwise), ``"python"`` (``use_grep=False``, or no grep, or grep failed). Every backend
    selects the same lines (any of :data:`KEYWORDS` in the raw bytes) and parses each distinct run of a
    crash-looping log once (:func:`kvreport.logs.scan.parse_runs`). ``workers`` is accepted for compatibility and
    ignored. Memory stays bounded whatever the file holds. Raises OSError when the file cannot be read.
    """
    from kvreport.logs import scan

    with open(path, "rb") as fh:
        fd = fh.fileno()
        size = os.fstat(fd).st_size
        backend = (backend or scan.best_backend()) if use_grep else "python"
        f = LogFacts()
        try:
            nl, _hits, failed_run = scan.parse_runs(f, fd, size, scan.scanner(backend), _feed_one, _is_start_raw)
        except OSError:
            if backend != "grep":
                raise
            f = LogFacts()  # grep failed: Python reads the file
            nl, _hits, failed_run = scan.parse_runs(f, fd, size, scan.scanner("python"), _feed_one, _is_start_raw)
        f.line_count = nl + (1 if size and os.pread(fd, 1, size - 1) != b"\n" else 0)
    return _finish(f, failed_run)


def _is_start_raw(raw: bytes) -> bool:
    """:func:`kvreport.logs.runs.is_run_start` for a raw line, as :func:`_feed_one` tests it."""
    return is_run_start(clean_line(raw))  # its literals are keywords: a run start is a key line


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


def _finish(f: LogFacts, failed_run: LogFacts | None = None) -> LogFacts:
    """The end of every path: the failed run to diagnose (:meth:`LogFacts.finish_runs`), then the engine."""
    f.finish_runs(failed_run)
    f.engine = decide_engine(f)
    return f


def decide_engine(f: LogFacts) -> str | None:
    """The engine that wrote the log, from the hints the parsers counted (None when unknown).

    Ollama, vLLM, SGLang and TGI lines are specific; llama.cpp lines also appear inside Ollama
    logs (its runner is llama.cpp), so llama.cpp is chosen only when no other engine spoke.
    """
    h = f.engine_hints
    best = max((e.name for e in REGISTRY if e.name != "llama.cpp"), key=lambda k: h.get(k, 0))
    if h.get(best, 0) >= 2 and h.get(best, 0) >= h.get("other", 0):
        return best
    if h.get("llama.cpp", 0) > 0 and h.get("other", 0) == 0:
        return "llama.cpp"
    if h.get("other", 0):
        return None
    if h.get("llama.cpp", 0) > 0:
        return "llama.cpp"
    return None
