"""Rendering helpers for templates: sanitized Markdown, sparklines as inline SVG, log folding,
and the prefilled "Open an issue" URL."""

from __future__ import annotations

import re
from urllib.parse import quote

import nh3
from markdown_it import MarkdownIt
from markupsafe import Markup

_md = MarkdownIt("commonmark", {"html": False, "linkify": False})
GITHUB_URL_LIMIT = 8000  # characters; GitHub refuses much longer /issues/new URLs


def markdown_html(text: str | None) -> Markup:
    """Markdown -> HTML with raw HTML disabled, then sanitized by nh3 (links get rel=noopener)."""
    if not text:
        return Markup("")
    return Markup(nh3.clean(_md.render(text), url_schemes={"http", "https", "mailto"}))


def sparkline_svg(counts: list[int], width: int = 120, height: int = 24) -> Markup:
    """Inline SVG polyline of per-day counts (oldest first); only numbers go into the markup."""
    n = len(counts)
    if n == 0:
        return Markup("")
    top = max(max(counts), 1)
    step = width / max(n - 1, 1)
    pts = " ".join(f"{i * step:.1f},{height - 2 - (int(c) / top) * (height - 4):.1f}" for i, c in enumerate(counts))
    total = sum(int(c) for c in counts)
    return Markup(
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{total} in the last {n} days"><polyline fill="none" stroke="currentColor" '
        f'stroke-width="1.5" points="{pts}"/></svg>')


_DIGITS = re.compile(r"\d+")
_KEY_LINE = re.compile(r"(?i)failed|error|out of memory|\bOOM\b|MiB|GiB|\bdevice\b|buffer size")
SIMILAR_RUN = 4  # this many lines of one shape in a row fold to the first one


def line_shape(text: str) -> str:
    """A line with its numbers as ``N``: ``llama_kv_cache: layer 12: dev = CPU`` -> ``… layer N: dev = CPU``."""
    return " ".join(_DIGITS.sub("N", text).split())


def _similar_runs(rows: list[tuple]) -> list[tuple[int, int]]:
    """(start, end) of each run of at least SIMILAR_RUN lines with the same shape and no highlight."""
    runs, i = [], 0
    while i < len(rows):
        j = i
        shape = line_shape(rows[i][1])
        while j + 1 < len(rows) and not rows[j + 1][2] and line_shape(rows[j + 1][1]) == shape:
            j += 1
        if j - i + 1 >= SIMILAR_RUN and not rows[i][2] and shape:
            runs.append((i, j))
        i = j + 1
    return runs


def fold_log(lines: list, marks: set[str], context: int = 3) -> list[dict]:
    """Group ``[[n, text], ...]`` into blocks: ``{"folded": bool, "similar": str | None,
    "lines": [(n, text, highlighted)]}``.

    Highlighted lines (text equal to an allocator/final error line) and ``context`` lines around them,
    lines that state sizes, devices or errors, and the last 30 lines stay open; the rest is folded.
    A run of lines that differ only in their numbers (thirty ``llama_kv_cache: layer N: dev = CPU``)
    shows its first line and folds the others under "N more similar lines: <shape>".
    """
    rows = []
    for item in lines or []:
        if isinstance(item, list | tuple) and len(item) == 2:
            n, text = item
            rows.append((n, str(text), str(text).strip() in marks))
    keep = set()
    for i, (_n, text, hit) in enumerate(rows):
        if hit:
            keep.update(range(max(0, i - context), min(len(rows), i + context + 1)))
        elif _KEY_LINE.search(text):
            keep.add(i)
    keep.update(range(max(0, len(rows) - 30), len(rows)))
    similar = {}
    for start, end in _similar_runs(rows):
        keep.add(start)
        for k in range(start + 1, end + 1):
            similar[k] = start
    blocks: list[dict] = []
    for i, row in enumerate(rows):
        run = similar.get(i)
        folded = run is not None or i not in keep
        label = line_shape(rows[run][1]) if run is not None else None
        if not blocks or blocks[-1]["folded"] != folded or blocks[-1]["similar"] != label or \
                (run is not None and blocks[-1].get("run") != run):
            blocks.append({"folded": folded, "similar": label, "run": run, "lines": []})
        blocks[-1]["lines"].append(row)
    return blocks


def new_issue_url(repo: str | None, title: str, body: str) -> str | None:
    """``https://github.com/<repo>/issues/new?title=…&body=…`` kept under GitHub's URL length: the
    log section (from "Relevant log output" or the first code fence on) is cut first, then the body."""
    if not repo or "/" not in repo:
        return None
    base = f"https://github.com/{quote(repo.strip(), safe='/')}/issues/new?title={quote(title[:200])}&body="
    url = base + quote(body)
    if len(url) <= GITHUB_URL_LIMIT:
        return url
    cut_at = body.find("Relevant log output")
    if cut_at < 0:
        cut_at = body.find("```")
    note = "\n\n(log cut to fit a URL: see the bundle link above for the whole log)\n"
    if cut_at > 0:
        body = body[:cut_at] + note
        url = base + quote(body)
    while len(url) > GITHUB_URL_LIMIT and len(body) > 200:
        body = body[: int(len(body) * 0.8)] + note
        url = base + quote(body)
    return url
