"""GitHub issue bodies for a bundle: every field a llama.cpp bug report needs, the diagnosis and
the permalink (`kvreport issue`, the server's ``.md`` view and its "Copy as GitHub issue" button).

The fields follow the playbook's "What a good report contains" (shared/reference/playbook.md) and
llama.cpp's own bug-report template (``.github/ISSUE_TEMPLATE/011-bug-results.yml``: name and
version, operating systems, GGML backends, hardware, models, problem description, first bad
commit, relevant log output). Everything comes from the bundle (already redacted on the client)
and the diagnosis recomputed from it; nothing is read from the machine here.
"""

from __future__ import annotations

import re

import click

from kvreport import linre
from kvreport.devices import all_devices, device_label
from kvreport.engines import BY_NAME
from kvreport.picture import memory_picture, text_bars
from kvreport.textsafe import visible_controls
from kvreport.vocab import SETTING_TITLE, free_words, what_failed

FENCE = "```"

PHASE_WORDS = {
    "kv_cache": "KV cache allocation failed",
    "compute_buffer": "compute buffer allocation failed",
    "model_weights": "model weights did not fit",
    "context": "context creation failed",
    "kv_capacity": "KV cache too small for the configured length",
    "memory_budget": "the engine's memory check refused to start",
    "none": "no failure",
    "unknown": "unplaced failure",
}


def _fmt_mib(value) -> str:
    if value is None:
        return "?"
    try:
        return f"{float(value):,.0f} MiB" if float(value) >= 10 else f"{float(value):.2f} MiB"
    except (TypeError, ValueError):
        return "?"


_LINE_BREAKS = re.compile(r"[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]+")
_BACKTICKS = re.compile(r"`+")
# what a cell or a line of text may hold as it is: no Markdown syntax, no HTML, no link of any kind
_PLAIN = re.compile(r"[A-Za-z0-9 .,;=%+/()\-]*")
_PIPE = linre.compile(r"(?P<bs>\\*)\|")  # RE2: a long run of backslashes cannot make it backtrack
_ESCAPE = re.compile(r"([\\`*_{}\[\]<>()#+!|~&-])")


def _one_line(text: str) -> str:
    return _LINE_BREAKS.sub(" ", text)


def _code(text: str) -> str:
    """An inline code span that no character of ``text`` can leave: one line, fenced by a backtick
    run longer than any inside (issue 13, item 8)."""
    text = visible_controls(text) if isinstance(text, str) else text
    text = _one_line(str(text))
    longest = max((len(m) for m in _BACKTICKS.findall(text)), default=0)
    fence = "`" * (longest + 1)
    return f"{fence} {text} {fence}"


def _text(value) -> str:
    """Untrusted text inside a Markdown line: one line, every Markdown character escaped (no link,
    image, emphasis or HTML); a URL-like text (autolinked by GitHub) becomes code."""
    text = _one_line(str(value)).strip()
    if _PLAIN.fullmatch(text) and "www." not in text.lower():
        return text
    if "://" in text or "www." in text.lower():
        return _code(text)
    return _ESCAPE.sub(r"\\\1", text)


def _cell(value) -> str:
    """A Markdown table cell: one line; plain text as it is, anything else as code with its pipes
    escaped (GitHub splits table rows on ``|`` even inside code), so that no cell can emit a link,
    an image, a heading, HTML or a new row."""
    value = visible_controls(value) if isinstance(value, str) else value
    if value is None or value == "" or value == []:
        return "—"
    text = ", ".join(map(str, value)) if isinstance(value, list | tuple) else str(value)
    text = _one_line(text).strip()
    if _PLAIN.fullmatch(text) and "www." not in text.lower():
        return text
    # "\|" keeps a pipe in its cell; a backslash before it is doubled so that it cannot pair with ours
    return _code(_PIPE.sub(lambda m: m.group("bs") * 2 + "\\|", text))


def _fenced(text: str, lang: str = "") -> str:
    """A fenced code block whose fence is longer than any backtick run in ``text``."""
    text = visible_controls(text) if isinstance(text, str) else text
    longest = max((len(m) for m in _BACKTICKS.findall(text)), default=0)
    fence = "`" * max(len(FENCE), longest + 1)
    lang = lang if _PLAIN.fullmatch(lang) else ""
    return f"{fence}{lang}\n{text}\n{fence}"


def issue_title(bundle: dict, diagnosis: dict) -> str:
    """One line: engine, what failed, backend and the numbers (e.g. for the issue's title field)."""
    failure = diagnosis.get("failure") or {}
    engine = diagnosis.get("engine") or (bundle.get("engine") or {}).get("name") or "engine"
    what = PHASE_WORDS.get(failure.get("phase") or "unknown", "failure")
    if (failure.get("phase") or "unknown") == "unknown":
        what = what_failed(diagnosis, short=True)
    parts = [f"{engine}: {what}"]
    if failure.get("failing_device"):
        parts.append(f"on {failure['failing_device']}")
    if failure.get("requested_mib") is not None:
        req = f"({_fmt_mib(failure['requested_mib'])} requested"
        if failure.get("free_mib") is not None:
            req += f", {free_words(diagnosis)}"
        parts.append(req + ")")
    return " ".join(parts)


def _setting_rows(engine_name: str | None, flags: dict, inputs: dict | None = None) -> list[tuple[str, object]]:
    """The engine's memory settings in its own words (kvreport.engines: ``Context (-c)``, ``Context (num_ctx)``,
    ``Parallel (OLLAMA_NUM_PARALLEL)``), their values from the command, else (context and cache types) what the log
    showed the engine use (the diagnosis's memory inputs, marked "from the log"); an unknown engine reads as
    llama.cpp."""
    engine = BY_NAME.get(engine_name or "") or BY_NAME["llama.cpp"]
    inputs = inputs if isinstance(inputs, dict) and inputs.get("source") in ("log", "gguf") else {}
    logged = {"context": [inputs.get("n_ctx")], "cache_types": [inputs.get("cache_type_k"), inputs.get("cache_type_v")]}
    rows = []
    for setting in engine.settings:
        values = [flags.get(k) for k in setting.keys]
        if all(v is None for v in values) and any(v is not None for v in logged.get(setting.what, [])):
            values = [f"{v} (from the log)" if v is not None else None for v in logged[setting.what]]
        if setting.default is not None:
            values = [f"{setting.default} (default)" if v is None else v for v in values]
        shown = " / ".join(str(v) for v in values if v is not None) or None
        rows.append((f"{SETTING_TITLE[setting.what]} ({setting.word})", shown))
    return rows


def _gpu_rows(bundle: dict) -> list[tuple[str, object]]:
    """One ``GPU`` row per accelerator the probes measured or the log names (``CUDA0: NVIDIA GeForce RTX 3060``,
    its size when known)."""
    rows = []
    for dev in all_devices(bundle):
        label = device_label(dev)
        if dev.get("total_mib") is not None:
            label += f" ({_fmt_mib(dev['total_mib'])})"
        rows.append(("GPU", label))
    return rows


def _environment_rows(bundle: dict, engine_name: str | None = None, inputs: dict | None = None) -> list[tuple[str, object]]:
    engine = bundle.get("engine") or {}
    host = bundle.get("host") or {}
    command = bundle.get("command") or {}
    flags = command.get("flags") or {}
    model = bundle.get("model") or {}
    version = engine.get("version")
    if engine.get("build_number") is not None or engine.get("commit"):
        version = f"{version or ''} (b{engine.get('build_number', '?')}, commit {engine.get('commit') or '?'})".strip()
    binary = engine.get("binary")
    if binary and engine.get("binary_realpath") and engine["binary_realpath"] != binary:
        binary = f"{binary} -> {engine['binary_realpath']}"
    os_line = " ".join(str(x) for x in (host.get("os"), host.get("os_release")) if x)
    if host.get("kernel"):
        os_line += f" (kernel {host['kernel']})"
    if host.get("wsl"):
        os_line += ", WSL"
    if host.get("container"):
        os_line += f", container: {host['container']}"
    ram = None
    if host.get("ram_total_mib") is not None:
        ram = f"{_fmt_mib(host['ram_total_mib'])} total, {_fmt_mib(host.get('ram_free_mib'))} free"
    name = engine.get("name") or command.get("engine") or engine_name
    return [
        ("Engine", name),
        ("Version", version),
        ("Binary", binary),
        ("Build", " ".join(str(x) for x in (engine.get("compiler"), engine.get("target")) if x) or None),
        ("OS", os_line or None),
        ("CPU", host.get("cpu_model")),
        *_gpu_rows(bundle),
        ("RAM", ram),
        ("Model", model.get("file_name")),
        *_setting_rows(name, flags, inputs),
    ]


def _device_rows(bundle: dict) -> list[str]:
    before = {m.get("device"): m for m in bundle.get("memory_before_launch") or []}
    out = []
    for dev in bundle.get("devices") or []:
        name = dev.get("name")
        label = f"{dev.get('backend') or ''}{dev.get('index') if dev.get('index') is not None else ''}"
        free = dev.get("free_mib")
        for key in (label, name):
            if key in before and before[key].get("free_mib") is not None:
                free = before[key]["free_mib"]
        out.append(f"| {_cell(label)} | {_cell(name)} | {_cell(_fmt_mib(dev.get('total_mib')))} | "
                   f"{_cell(_fmt_mib(free))} | {_cell(dev.get('driver_version'))} | "
                   f"{_cell(dev.get('compute_capability'))} |")
    if not out and before:
        for key, mem in before.items():
            out.append(f"| {_cell(key)} | {_cell(mem.get('name'))} | {_cell(_fmt_mib(mem.get('total_mib')))} | "
                       f"{_cell(_fmt_mib(mem.get('free_mib')))} | — | — |")
    return out


def _log_excerpt(bundle: dict, diagnosis: dict, max_lines: int | None) -> tuple[str, bool]:
    lines = ((bundle.get("log") or {}).get("lines")) or []
    texts = [t for _n, t in lines]
    failure = diagnosis.get("failure") or {}
    if max_lines is not None and len(texts) > max_lines:
        # Keep the lines around the allocator error and the final error, then the tail.
        marks = {failure.get("allocator_error"), failure.get("final_error")} - {None}
        keep = set(range(max(0, len(texts) - max_lines // 2), len(texts)))
        for i, t in enumerate(texts):
            if t in marks:
                keep.update(range(max(0, i - 5), min(len(texts), i + 3)))
        keep_sorted = sorted(keep)[-max_lines:]
        return "\n".join(texts[i] for i in keep_sorted), True
    return "\n".join(texts), False


def _failure_line(failure: dict) -> str:
    """``Phase: `kv_cache`; backend: `cuda`; failing device: `CUDA0`; verdict: `exceeds_free```; a fact the
    diagnosis lacks is left out, a failure on no named device says so."""
    parts = [f"{what}: {_code(failure[key])}" for what, key in (("Phase", "phase"), ("backend", "backend"))
             if failure.get(key) is not None]
    if failure.get("failing_device") is not None:
        parts.append(f"failing device: {_code(failure['failing_device'])}")
    elif (failure.get("phase") or "none") != "none":
        parts.append("failing device: not named in the log")
    if failure.get("verdict") is not None:
        parts.append(f"verdict: {_code(failure['verdict'])}")
    return "; ".join(parts)


def issue_body(bundle: dict, diagnosis: dict, url: str | None = None, max_log_lines: int | None = 400) -> str:
    """The Markdown body of a GitHub issue for ``bundle`` and its ``diagnosis``.

    ``url`` is the bundle's permalink on a kvreport server (shown at the top when known).
    ``max_log_lines`` bounds the log section (``None``: the whole excerpt); the lines around the
    allocator and final error lines are kept first. Returns a ``str``; never raises on missing facts.
    """
    failure = diagnosis.get("failure") or {}
    memory = diagnosis.get("memory") or {}
    command = bundle.get("command") or {}
    out: list[str] = []
    out.append("### Name and Version")
    out.append("")
    engine = bundle.get("engine") or {}
    version_output = engine.get("version_output")
    out.append(_fenced(version_output.strip() if version_output else
                       f"{engine.get('name') or diagnosis.get('engine') or 'unknown engine'} "
                       f"{engine.get('version') or '(version not recorded)'}"))
    out.append("")
    out.append("### What failed")
    out.append("")
    out.append(f"**{_text(issue_title(bundle, diagnosis))}**")
    out.append("")
    out.append("- " + _failure_line(failure))
    if failure.get("requested_mib") is not None:
        out.append(f"- Requested: {_fmt_mib(failure.get('requested_mib'))}; on that device: "
                   f"{free_words(diagnosis) or 'free memory not known'}")
    if memory.get("kv_required_mib") is not None:
        line = f"- KV cache of this configuration: {_fmt_mib(memory['kv_required_mib'])}"
        if memory.get("kv_mib_per_1k_tokens") is not None:
            line += f" ({memory['kv_mib_per_1k_tokens']:.2f} MiB per 1k tokens)"
        out.append(line)
    if memory.get("max_ctx_fit"):
        fits = ", ".join(f"{t}: {n:,}" for t, n in memory["max_ctx_fit"].items() if n is not None)
        out.append(f"- Largest context whose KV fits the free memory: {fits} tokens")
    if failure.get("allocator_error"):
        out.append(f"- Allocator error: {_code(str(failure['allocator_error']).strip())}")
    if failure.get("final_error") and failure.get("final_error") != failure.get("allocator_error"):
        out.append(f"- Final error: {_code(str(failure['final_error']).strip())}")
    for finding in diagnosis.get("findings") or []:
        out.append(f"- {_text(finding.get('text'))}")
    bars = text_bars(memory_picture(bundle, diagnosis))
    if bars:
        out.append("")
        out.append("### Memory per device")
        out.append("")
        out.append(_fenced("\n".join(bars)))
    suggestions = diagnosis.get("suggestions") or []
    if suggestions:
        out.append("")
        out.append("### Suggested fixes (kvreport)")
        out.append("")
        for i, s in enumerate(suggestions, 1):
            head = f"{i}. **{_text(s.get('title') or s.get('id'))}** ({_code(s.get('id'))})"
            if s.get("expected"):
                head += f": {_text(s['expected'])}"
            out.append(head)
            if s.get("command"):
                out.append("   " + _fenced(s["command"], "sh").replace("\n", "\n   "))
    out.append("")
    out.append("### Command")
    out.append("")
    out.append(_fenced(command.get("line") or " ".join(command.get("argv") or []) or "(not recorded)", "sh"))
    out.append("")
    out.append("### Environment")
    out.append("")
    out.append("| | |")
    out.append("|---|---|")
    for key, value in _environment_rows(bundle, diagnosis.get("engine"), (diagnosis.get("memory") or {}).get("inputs")):
        out.append(f"| {key} | {_cell(value)} |")  # keys are ours
    devices = _device_rows(bundle)
    if devices:
        out.append("")
        out.append("| device | name | total | free before launch | driver | compute capability |")
        out.append("|---|---|---|---|---|---|")
        out.extend(devices)
    log_text, cut = _log_excerpt(bundle, diagnosis, max_log_lines)
    if log_text:
        log = bundle.get("log") or {}
        out.append("")
        out.append("### Relevant log output")
        out.append("")
        count = log.get("line_count")
        note = f"{count if isinstance(count, int) and not isinstance(count, bool) else '?'} lines in all"
        if log.get("truncated") or cut:
            note += "; key lines and the tail kept"
        out.append(f"<details><summary>log ({note})</summary>")
        out.append("")
        out.append(_fenced(log_text))
        out.append("")
        out.append("</details>")
    out.append("")
    sig = diagnosis.get("signature") or {}
    foot = (f"Reported with kvreport (analyzer {_text(diagnosis.get('analyzer_version'))}, "
            f"signature {_code(sig.get('key'))}).")
    if url:
        foot = f"Full report: {_one_line(url)}\n\n" + foot
    out.append(foot)
    return "\n".join(out) + "\n"


def cli_issue(path: str, url: str | None = None) -> int:
    """`kvreport issue PATH`: print the issue body of a bundle file (exit 0; bad file: exit 2)."""
    from kvreport.analyze import analyze
    from kvreport.config import uploaded_url
    from kvreport.upload import read_bundle_file

    bundle = read_bundle_file(path)
    diagnosis = analyze(bundle)
    click.echo(issue_body(bundle, diagnosis, url=url or uploaded_url(bundle["id"]), max_log_lines=None), nl=False)
    return 0
