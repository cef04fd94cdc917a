"""Line framing shared by every engine parser: ANSI colours, NUL bytes, CR, pasted GitHub text, JSON lines.

Nothing here anchors at the start of a line: timestamps (``0.00.038.391 E``), level letters,
``srv    load_model:`` prefixes, docker-compose ``name  |`` columns and ``> `` quotes may all
precede the message, so every parser searches inside the cleaned line (kv-facts.md §1.1).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

import re2

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_FENCE = re.compile(r"^\s*(?:>\s*)*(?:```|~~~)[\w+-]*\s*$")
_QUOTE = re.compile(r"^(?:\s{0,3}[>\u258e\u2502\u2503][ \t]?)+")  # "> " and the quote bars chats paste (▎ │ ┃)

from kvreport.units import GIB, MIB  # noqa: E402,F401 - one copy of the units, re-exported for the parsers

LINE_KEEP = 32 << 10
"""Characters (or bytes) kept at each end of a line longer than twice this (:func:`clean_line`); the longest engine
lines (an Ollama error string with its escaped runner output, a vLLM config dump) are a few KiB."""


def clean_line(raw) -> str:
    """One raw log line (str or bytes) -> the text a parser searches: no ANSI codes, NUL, CR or
    trailing newline, no leading ``> `` quote marks, the ``msg`` of a ``--log-jsonl`` record.

    Never raises; a code-fence line becomes ``""``.
    """
    if isinstance(raw, (str, bytes, bytearray)) and len(raw) > 2 * LINE_KEEP:
        # a line of megabytes (a dump, a base64 blob, a runaway progress bar): its head and its tail, where the
        # messages are, keep every search over it bounded
        raw = raw[:LINE_KEEP] + (b" ... " if isinstance(raw, (bytes, bytearray)) else " ... ") + raw[-LINE_KEEP:]
    if isinstance(raw, (bytes, bytearray)):
        raw = bytes(raw).decode("utf-8", "replace")
    elif not isinstance(raw, str):
        raw = str(raw)
    line = raw.replace("\x00", "").rstrip("\r\n")
    if "\r" in line:
        # progress bars rewrite the line with CR: keep the last non-empty segment
        parts = [p for p in line.split("\r") if p.strip()]
        line = parts[-1] if parts else ""
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    if (line[:1] in (">", " ") and ">" in line[:8]) or line[:1] in ("\u258e", "\u2502", "\u2503"):
        line = _QUOTE.sub("", line)
    if "```" in line or "~~~" in line:
        if _FENCE.match(line):
            return ""
    if line.startswith('{"') and ('"msg"' in line or '"log"' in line[:12] or '"MESSAGE"' in line):
        line = _jsonl_msg(line)
    return line.strip()


def _jsonl_msg(line: str) -> str:
    """The message of a JSON log record: llama.cpp's ``--log-jsonl`` (``{"type":"log",...,"msg":"..."}``), docker's
    json-file driver (``{"log":"...\n","stream":"stderr","time":...}``, the file under /var/lib/docker/containers),
    journald's ``journalctl -o json`` (``{..., "MESSAGE":"...", ...}``)."""
    try:
        obj = json.loads(line)
    except ValueError:
        return line
    if isinstance(obj, dict):
        for key in ("log", "MESSAGE"):
            if isinstance(obj.get(key), str) and not isinstance(obj.get("msg"), str):
                return obj[key].rstrip("\r\n")
    if isinstance(obj, dict) and isinstance(obj.get("msg"), str):
        level = str(obj.get("level", ""))[:1].upper()
        msg = obj["msg"].rstrip("\n")
        return f"{level} {msg}" if level else msg
    return line


def clean_pasted(text: str) -> str:
    """Text pasted from a GitHub issue or a terminal -> plain log text.

    Removes code fences (```` ``` ````, ``~~~``), ``> `` quote marks, ANSI colour codes and NUL
    bytes, turns CRLF into LF. Line order is kept; never raises.
    """
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    out = []
    for raw in str(text).replace("\r\n", "\n").split("\n"):
        line = clean_line(raw)
        if line or raw.strip() == "":
            out.append(line)
    return "\n".join(out)


def to_float(text) -> float | None:
    """``"1,234.5"`` -> 1234.5; None when it is not a number."""
    try:
        return float(str(text).replace(",", ""))
    except (TypeError, ValueError):
        return None


def to_int(text) -> int | None:
    """``"131,072"`` -> 131072; None when it is not an integer."""
    try:
        return int(str(text).replace(",", "").strip())
    except (TypeError, ValueError):
        return None


def size_to_mib(value: float, unit: str) -> float:
    """A size with its unit (``B``, ``KiB``, ``MiB``, ``GiB``, ``TiB``; ``MB``/``GB`` as printed
    by engines that mean MiB/GiB) -> MiB (2**20 bytes)."""
    u = unit.strip().lower()
    if u in ("b", "bytes", ""):
        return value / MIB
    if u.startswith("k"):
        return value / 1024.0
    if u.startswith("m"):
        return value
    if u.startswith("g"):
        return value * 1024.0
    if u.startswith("t"):
        return value * 1024.0 * 1024.0
    return value


PY_ARG_TYPES = {"tensor_parallel_size": int, "pipeline_parallel_size": int, "gpu_memory_utilization": float,
                "max_model_len": int, "max_num_seqs": int, "max_num_batched_tokens": int, "enable_chunked_prefill": bool,
                "kv_cache_dtype": str, "enforce_eager": bool, "cpu_offload_gb": float,
                # SGLang's ServerArgs
                "tp_size": int, "mem_fraction_static": float, "context_length": int, "max_running_requests": int,
                "chunked_prefill_size": int}
"""The settings of a Python engine that its own start-up line prints and the fixes read (vLLM V0 "args: Namespace(...)",
V1 "non-default args: {...}", SGLang "server_args=ServerArgs(...)"), each with its type."""
_PY_ARG = re.compile(r"'?\b(" + "|".join(PY_ARG_TYPES) + r")'?(?:=|: )('[^']*'|\"[^\"]*\"|[^,)}\s]+)")


def py_args(line: str) -> dict:
    """The :data:`PY_ARG_TYPES` settings an engine's argument line prints, typed; ``None`` values are left out."""
    return typed_settings({key: raw.strip("'\"") for key, raw in _PY_ARG.findall(line)})


def typed_settings(raw: dict) -> dict:
    """``{name: text}`` -> the :data:`PY_ARG_TYPES` settings among them, typed (``"0.95"`` -> 0.95, ``"False"`` ->
    False); unknown names, ``None`` and values that do not read as their type are left out."""
    out = {}
    for key, text in raw.items():
        kind, text = PY_ARG_TYPES.get(key), str(text)
        if kind is None or text in ("None", "null", ""):
            continue
        if kind is bool:
            value = {"true": True, "false": False}.get(text.lower())
        elif kind is int:
            value = to_int(text)
        elif kind is float:
            value = to_float(text)
        else:
            value = text
        if value is not None:
            out[key] = value
    return out


def re2_options():
    """RE2's options for the keyword alternations (a few hundred literals): a DFA budget of 64 MiB, not the default 8,
    which a line of tens of KiB with many near-matches (a CR-only log read as one line, a progress bar) used up --
    RE2 then fell back to its NFA and wrote "DFA out of memory" to stderr in the middle of a diagnosis; and no error
    logging of its own (a fallback is slower, never wrong)."""
    import re2

    opts = re2.Options()
    opts.max_mem = 64 << 20
    opts.log_errors = False
    return opts


def case_variants(*phrases: str) -> tuple[str, ...]:
    """Every way engines capitalise a phrase: each word lower or capitalised, and all upper ("out of memory", "Out of
    Memory" (tt-metal's TT_FATAL), "Out Of Memory", "OUT OF MEMORY"...). The prefilter's literals are case-sensitive,
    so a phrase that selects lines lists every form (a rule's regex then reads the line case-insensitively)."""
    out: dict[str, None] = {}
    for phrase in phrases:
        words = phrase.split(" ")
        for mask in range(1 << len(words)):
            out[" ".join(w[:1].upper() + w[1:] if mask >> i & 1 else w for i, w in enumerate(words))] = None
        out[phrase.upper()] = None
    return tuple(out)


class KeywordSet:
    """Which of a table's literal keywords a line holds, in one pass (RE2's multi-pattern ``Set``: every keyword that
    occurs, overlapping ones included), so that a parser walks only the rows of its table whose keywords are there
    instead of testing each row's keywords in turn (``any(k in line for k in row.keywords)`` for every row was most of
    the cost of a key line). Exactly the rows the ``any()`` test selects."""

    def __init__(self, keywords: Iterable[str]):
        self.words = tuple(dict.fromkeys(keywords))
        self._set = re2.Set.SearchSet(re2_options())
        for w in self.words:
            self._set.Add(re.escape(w))
        self._set.Compile()

    def present(self, line: str) -> frozenset[str]:
        """The keywords that occur in ``line``."""
        ids = self._set.Match(line)  # None when no keyword occurs
        if not ids:
            return _NONE
        words = self.words
        return frozenset([words[i] for i in ids])


_NONE: frozenset[str] = frozenset()
