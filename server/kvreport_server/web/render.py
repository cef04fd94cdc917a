"""Rendering helpers for templates: sanitized Markdown, sparklines as inline SVG, log folding,
and the prefilled "Open an issue" URL."""

from __future__ import annotations

import re
from urllib.parse import quote

import nh3
from markdown_it import MarkdownIt
from markupsafe import Markup

from kvreport.textsafe import visible_controls

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
            rows.append((n, visible_controls(str(text)), str(text).strip() in marks))
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


MEM_BAR_WIDTH = 640
"""Pixels a full-scale memory bar spans (the SVG's viewBox scales it to the page)."""
_CHAR_PX = 6.6  # width of one character of the 11px labels, for deciding whether a label fits its segment


def _label(p: dict, cap_x: float | None) -> tuple[str, float]:
    """The longest label of piece ``p`` that fits inside it, and where it starts. A piece that crosses the
    size line is labelled on the wider side of the line, so that no text runs across it."""
    from kvreport.picture import SHORT_LABEL
    from kvreport.units import fmt_mib

    left, right = p["x"], p["x"] + p["w"]
    start, room = left, right - left
    if cap_x is not None and left < cap_x < right:
        start, room = (left, cap_x - left) if cap_x - left >= right - cap_x else (cap_x, right - cap_x)
    for text in (f"{p['label']} {fmt_mib(p['mib'])} MiB", f"{p['label'].split(' (')[0]} {fmt_mib(p['mib'])} MiB",
                 f"{SHORT_LABEL.get(p['kind'], '')} {fmt_mib(p['mib'])} MiB".strip(),
                 f"{fmt_mib(p['mib'])} MiB", fmt_mib(p["mib"])):
        if len(text) * _CHAR_PX + 8 <= room:
            return text, start + 4
    return "", start


def memory_rows(picture: dict | None, width: int = MEM_BAR_WIDTH) -> list[dict]:
    """The bundle page's memory bars: per device of a :func:`kvreport.picture.memory_picture`, the pieces
    with ``x`` / ``w`` in pixels and the label that fits inside each (``text`` / ``text_x``), the capacity line
    ``cap_x``, the part past the capacity ``over`` = (x0, x1), the words under the bar (``note``: by how much
    the stack went past the device, or the failed request when it is too thin to label) and the bar's text
    equivalent. Only numbers and the picture's own words go into the SVG; the template escapes them."""
    from kvreport.picture import scale_of, scaled, summary
    from kvreport.units import fmt_mib

    rows = []
    for d in (picture or {}).get("devices") or []:
        parts = []
        x = 0.0
        span = scale_of(d)
        for p in scaled(d, width, min_width=3.0):
            w = max(p["w"], 8.0) if p["kind"] == "request" else p["w"]  # the failed request is always visible
            parts.append({**p, "x": x, "w": w})
            x += w
        cap = d.get("capacity_mib")
        cap_x = cap / span * width if cap is not None and span > 0 else None
        if cap_x is not None and parts and parts[-1]["kind"] == "free":
            cap_x = parts[-1]["x"] + parts[-1]["w"]  # the free piece ends at the size line, whatever the rounding
        end_x = parts[-1]["x"] + parts[-1]["w"] if parts else 0.0
        for p in parts:
            p["text"], p["text_x"] = _label(p, cap_x)
        over = (cap_x, end_x) if cap_x is not None and end_x > cap_x + 0.5 else None
        req = next((p for p in parts if p["kind"] == "request"), None)
        note, note_x, anchor = "", 0.0, "end"
        if over and (d.get("short_mib") or d.get("over_mib")):
            note = f"{fmt_mib(d['short_mib'])} MiB more than was left" if d.get("short_mib") \
                else f"{fmt_mib(d['over_mib'])} MiB past the device's size"
            note_x = over[1]
        if req and not req["text"]:
            what = f"failed: {d['request']['label']} {fmt_mib(d['request']['mib'])} MiB"
            if note:
                note = f"{what}; {note}"
            else:  # under the thin request, reading rightwards from it
                note, note_x, anchor = what, req["x"], "start"
        top = 0 if cap_x is not None else 12  # no size label above the bar: no room kept for it
        rows.append({"device": d, "parts": parts, "cap_x": cap_x, "over": over, "note": note,
                     "top": top, "height": (60 if note else 46) - top,
                     "note_x": min(max(note_x, len(note) * _CHAR_PX), max(float(width), end_x)) if anchor == "end"
                     else min(note_x, max(0.0, float(width) - len(note) * _CHAR_PX)), "note_anchor": anchor,
                     "view_w": max(float(width), end_x) + 2, "summary": summary(d, unit=" MiB")})
    return rows


def memory_section(picture: dict | None) -> dict:
    """What the bundle page's memory section draws: ``rows`` (:func:`memory_rows`) and the picture's ``notes``."""
    return {"rows": memory_rows(picture), "notes": list((picture or {}).get("notes") or [])}
