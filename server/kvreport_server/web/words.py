"""Plain words for the pages: a diagnosis id (``exceeds_free``, ``kv_cache``, ``cuda``) shown as its
title from :mod:`kvreport.vocab`, with the id in a tooltip; numbers with thousands separators;
counts with the right plural."""

from __future__ import annotations

from markupsafe import Markup, escape

try:
    from kvreport import vocab
except ImportError:  # pragma: no cover - the server without the analyzer
    vocab = None

FACET_TITLE = {"engine_version": "engine build", "gpu": "GPU", "model": "model", "backend": "backend",
               "verdict": "verdict", "n_ctx": "context size", "suggestion": "suggestion", "driver": "driver",
               "os": "OS", "model_family": "model family", "cache_type": "KV cache type", "flag": "flag",
               "error": "error line", "machine": "machine"}


def _titled(table_name: str, value) -> Markup:
    if value is None or value == "":
        return Markup("—")
    table = getattr(vocab, table_name, {}) if vocab is not None else {}
    title = table.get(str(value))
    if not title or title == value:
        return Markup(escape(str(value)))
    return Markup(f'<span class="term" title="{escape(str(value))}">{escape(title)}</span>')


def verdict(value) -> Markup:
    return _titled("VERDICT_TITLE", value)


def phase(value) -> Markup:
    return _titled("PHASE_TITLE", value)


def backend(value) -> Markup:
    return _titled("BACKEND_TITLE", value)


def engine(value) -> Markup:
    return _titled("ENGINE_TITLE", value)


def facet_value(kind: str, value) -> Markup:
    """A facet value as a reader says it (verdicts and backends titled; others as stored)."""
    if kind == "verdict":
        return verdict(value)
    if kind == "backend":
        return backend(value)
    if kind == "n_ctx":
        return Markup(escape(num(value)))
    return Markup(escape(str(value)))


def kind(name: str) -> str:
    return FACET_TITLE.get(name, name.replace("_", " "))


def device(name) -> str:
    """``CPU`` -> "the CPU (system memory)", a GPU name as given, nothing -> "an unnamed device"."""
    if not name:
        return "an unnamed device"
    text = str(name)
    return "the CPU (system memory)" if text.upper() == "CPU" else text


def num(value) -> str:
    """47872 -> "47,872"; a string of digits too; anything else as given; None -> "—"."""
    if isinstance(value, bool) or value is None:
        return "—"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if value == int(value) else f"{value:,.1f}"
    text = str(value)
    return f"{int(text):,}" if text.isascii() and text.isdigit() and len(text) < 19 else text


def plural(n, one: str, many: str | None = None) -> str:
    """``plural(1, "bundle")`` -> "1 bundle"; ``plural(3, "machine")`` -> "3 machines"."""
    try:
        count = int(n)
    except (TypeError, ValueError):
        count = 0
    return f"{num(count)} {one if count == 1 else (many or one + 's')}"


def share(x) -> str:
    """0.8333 -> "83%"; tiny non-zero shares -> "<1%"."""
    if not isinstance(x, int | float):
        return "—"
    pct = x * 100
    if 0 < pct < 1:
        return "<1%"
    return f"{pct:.0f}%"


def cache_type(t) -> str:
    """A key of ``max_ctx_fit`` (``f16``, ``q8_0``) as a reader says it."""
    return f"{t} KV cache"


def label(kind: str, value) -> str:
    """Plain text (no markup: a menu option) for a filter value: ``exceeds_free`` -> its title."""
    table = {"verdict": "VERDICT_TITLE", "phase": "PHASE_TITLE", "backend": "BACKEND_TITLE",
             "engine": "ENGINE_TITLE"}.get(kind)
    if table and vocab is not None:
        return getattr(vocab, table, {}).get(str(value), str(value))
    return str(value)
