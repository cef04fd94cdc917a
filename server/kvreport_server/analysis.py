"""The server's use of the analysis core: diagnosis, issue Markdown, secret scan, and the facts
(facets) of a bundle that the cluster counters and filters use.

The diagnosis is always recomputed here with ``kvreport.analyze.analyze`` (never taken from a
client). If the analyzer raises on a strange but schema-valid bundle, the bundle is still stored
with an ``unknown`` diagnosis carrying ``analyzer_error``, so one bad rule cannot turn an upload
into a 500; ``kvreport admin reanalyze`` fixes those rows once the analyzer is.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re

log = logging.getLogger("kvreport_server")

LEGACY_FACET_KINDS = ("engine_version", "gpu", "model", "backend", "verdict", "n_ctx", "suggestion", "machine", "error")
"""The kinds counted before migration 0004 (bundles stored then have no ``facet_keys``)."""
FACET_KINDS = LEGACY_FACET_KINDS + ("driver", "os", "model_family", "cache_type", "flag")
MAX_FACET_CHARS = 200


def analyzer_version() -> str:
    try:
        from kvreport.analyze import ANALYZER_VERSION
    except ImportError:
        return "unavailable"
    return str(ANALYZER_VERSION)


SIGNATURE_SCHEME = 2
"""kvreport.signature.SCHEME of this release (kept here so the server answers even without the analyzer)."""


def _fallback(reason: str) -> dict:
    return {
        "analyzer_version": analyzer_version(),
        "engine": "unknown",
        "failure": {"phase": "unknown", "backend": "unknown", "failing_device": None, "requested_mib": None,
                    "free_mib": None, "allocator_error": None, "final_error": None, "verdict": "unknown"},
        "memory": None,
        "findings": [],
        "signature": {"id": "unknown", "key": "unknown/unknown/unknown",
                      "title": "Not analyzed", "scheme": SIGNATURE_SCHEME, "notes": [reason]},
        "suggestions": [],
        "analyzer_error": reason,
    }


def diagnose(bundle: dict) -> dict:
    """The diagnosis of a validated bundle (design.md "Diagnosis JSON"); never raises."""
    try:
        from kvreport.analyze import analyze
    except ImportError as exc:
        return _fallback(f"analyzer not installed ({exc})")
    try:
        diag = analyze(bundle)
    except Exception as exc:  # noqa: BLE001 - a bad rule must not lose an upload
        log.exception("analyzer failed on bundle %s", bundle.get("id"))
        return _fallback(f"analyzer error: {type(exc).__name__}")
    if not isinstance(diag, dict) or not isinstance(diag.get("signature"), dict):
        return _fallback("analyzer returned no signature")
    return diag


def diagnose_with_devices(bundle: dict) -> tuple[dict, list[dict]]:
    """:func:`diagnose` and :func:`all_devices` of a validated bundle with its log parsed once, not twice.

    ``kvreport.analyze.analyze(bundle)`` is ``diagnose(parse_log(lines), bundle)`` and
    ``devices_in_log(bundle)`` reads ``parse_log(lines).devices``; the log parse is most of an
    upload's analysis, so both are taken here from one parse. ``tests/server/test_ingest_parse_once.py``
    checks that the answers equal the two separate calls on every real case. Never raises.
    """
    try:
        from kvreport.analyze import diagnose as diagnose_facts
        from kvreport.logs import parse_log
    except ImportError as exc:
        return _fallback(f"analyzer not installed ({exc})"), _probed_then_logged(bundle, [])
    log_section = bundle.get("log") if isinstance(bundle.get("log"), dict) else {}
    lines = log_section.get("lines") or []
    try:
        facts = parse_log(lines if isinstance(lines, list) else [])
        logged = _log_devices(facts)  # before the diagnosis, which may consume parts of the facts
        diag = diagnose_facts(facts, bundle)
    except Exception as exc:  # noqa: BLE001 - a bad rule must not lose an upload
        log.exception("analyzer failed on bundle %s", bundle.get("id"))
        return _fallback(f"analyzer error: {type(exc).__name__}"), _probed_then_logged(bundle, [])
    if not isinstance(diag, dict) or not isinstance(diag.get("signature"), dict):
        return _fallback("analyzer returned no signature"), _probed_then_logged(bundle, logged)
    return diag, _probed_then_logged(bundle, logged)


def _log_devices(facts) -> list[dict]:
    """``kvreport.analyze.devices_in_log`` of an already parsed log."""
    from kvreport.analyze import devices_of_facts

    return devices_of_facts(facts)


def explain(bundle: dict) -> list[dict]:
    """For the bundle page's collapsed "Why kvreport says this": every fact with its rule and log line
    (kvreport.explain), recomputed from the stored bundle; [] when the analyzer is not installed or fails."""
    try:
        from kvreport.analyze import analyze

        return analyze(bundle, explain=True).get("explain") or []
    except Exception:  # noqa: BLE001 - the page shows the stored diagnosis without its explanation
        log.exception("explain failed on bundle %s", bundle.get("id"))
        return []


def memory_picture(bundle: dict, diagnosis: dict) -> dict | None:
    """Per device: what it had, what the engine placed there, the request that failed
    (:func:`kvreport.picture.memory_picture`); None when the analyzer is not installed or fails."""
    try:
        from kvreport.picture import memory_picture as _picture

        return _picture(bundle, diagnosis)
    except Exception:  # noqa: BLE001 - the page shows the diagnosis without the picture
        log.exception("memory picture failed on bundle %s", bundle.get("id"))
        from kvreport import strict

        strict.check()
        return None


def signature_of(diagnosis: dict) -> dict:
    sig = diagnosis.get("signature") or {}
    key = str(sig.get("key") or "unknown/unknown/unknown")[:300]
    try:
        scheme = int(sig.get("scheme") or SIGNATURE_SCHEME)
    except (TypeError, ValueError):
        scheme = SIGNATURE_SCHEME
    return {"key": key, "scheme": scheme, "id": str(sig.get("id") or "")[:64] or None,
            "title": str(sig.get("title") or key)[:500]}


STRONG_SECRET_KINDS = ("token", "authorization", "url_credentials")
"""Kinds recognised by the value itself (``hf_…``, ``sk-…``, ``Bearer …``, ``user:pass@``): refused.
Name-based kinds (``secret_env``, ``secret_flag``: a word like "token" next to a value) also fire on
harmless log text such as ``n_tokens = 512`` or ``--max-total-tokens 11000``, so they refuse only
inside the structured ``command.env`` / ``command.argv`` and are otherwise only flagged."""


def find_secrets(bundle: dict) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The server's second redaction pass over a bundle: ``(refuse, flag)`` lists of
    ``(field path, kind)`` (``kvreport.redact.find_secrets`` with the secret kinds only)."""
    try:
        from kvreport.redact import SECRET_KINDS
        from kvreport.redact import find_secrets as _find
    except ImportError:
        return [], []
    try:
        found = [(str(p), str(k)) for p, k in _find(bundle, kinds=SECRET_KINDS)]
    except Exception:  # noqa: BLE001
        log.exception("find_secrets failed")
        return [], []
    refuse, flag = [], []
    for path, kind in found:
        structured = path.startswith(("command.env", "command.argv", "command.engine_argv"))
        (refuse if kind in STRONG_SECRET_KINDS or structured else flag).append((path, kind))
    return refuse, flag


def issue_markdown(bundle: dict, diagnosis: dict, url: str | None) -> str:
    """GitHub issue body for a bundle (``kvreport.markdown.issue_body``)."""
    try:
        from kvreport.markdown import issue_body
    except ImportError:
        issue_body = None
    if issue_body is not None:
        try:
            return issue_body(bundle, diagnosis, url)
        except Exception:  # noqa: BLE001
            log.exception("issue_body failed on bundle %s", bundle.get("id"))
    sig = diagnosis.get("signature") or {}
    # no Markdown or HTML from the bundle, on one line (issue 13, item 8)
    title = " ".join(str(sig.get("title") or "kvreport bundle").split())
    title = "".join("\\" + ch if ch in "\\`*_{}[]<>()#+!|~&-" else ch for ch in title)
    return f"## {title}\n\nBundle: {' '.join(str(url or bundle.get('id')).split())}\n"


def issue_title(bundle: dict, diagnosis: dict) -> str:
    try:
        from kvreport.markdown import issue_title as _title

        return _title(bundle, diagnosis)
    except Exception:  # noqa: BLE001 - ImportError or a bad bundle: fall back to the signature title
        return str((diagnosis.get("signature") or {}).get("title") or "kvreport report")


def content_hash(bundle: dict) -> str:
    """SHA-256 of the canonical JSON of a validated bundle (idempotency: same id, same content)."""
    text = json.dumps(bundle, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _cut(value, n: int = MAX_FACET_CHARS) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text[:n] if text else None


def _int_or_none(value, lo: int = -(2**31), hi: int = 2**31 - 1) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if lo <= value <= hi else None
    if isinstance(value, str):
        from kvreport_server.limits import ascii_int

        v = ascii_int(value.strip(), max_digits=18)  # ASCII digits only: int("²") raises
        return v if v is not None and lo <= v <= hi else None
    return None


def machine_fingerprint(bundle: dict) -> str | None:
    """A short hash of the reporter's machine (CPU, RAM, kernel, device names and sizes): counts
    distinct machines without storing anything identifying."""
    host = bundle.get("host") or {}
    devices = bundle.get("devices") or []
    parts = [host.get("cpu_model"), host.get("ram_total_mib"), host.get("os"), host.get("machine")]
    parts += [(d.get("name"), d.get("total_mib"), d.get("uuid")) for d in devices if isinstance(d, dict)]
    if not any(p for p in parts):
        return None
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]


def _n_ctx(bundle: dict, diagnosis: dict) -> int | None:
    inputs = ((diagnosis.get("memory") or {}).get("inputs") or {})
    val = _int_or_none(inputs.get("n_ctx"), 0, 2**53)
    if val is not None:
        return val
    flags = ((bundle.get("command") or {}).get("flags") or {})
    for key in ("n_ctx", "--ctx-size", "ctx_size", "-c", "max_model_len", "--max-model-len"):
        val = _int_or_none(flags.get(key), 0, 2**53)
        if val is not None:
            return val
    return None


_BUILD_VERSION = re.compile(r"^b(\d{1,7})$")


def build_number_of(engine: dict) -> int | None:
    """The engine's build number: ``engine.build_number``, else a llama.cpp-style version ``b6895``.

    Both are filled by the collector from ``--version`` output or, with ``"version_source": "log"``,
    from the log's ``build: 6895 (4341dc8bc)`` line (llama.cpp common/common.cpp prints it at start).
    """
    build = _int_or_none(engine.get("build_number"), 0)
    if build is None and isinstance(engine.get("version"), str):
        m = _BUILD_VERSION.match(engine["version"].strip())
        build = int(m.group(1)) if m else None
    return build


def is_gpu(device: dict) -> bool:
    """True for an accelerator entry of ``bundle.devices`` (probed, or ``"source": "log"``): any
    named device whose backend (any case) is not ``cpu`` and whose name is not the CPU itself."""
    backend = str(device.get("backend") or "").strip().lower()
    name = str(device.get("name") or "").strip()
    return bool(name) and backend != "cpu" and name.upper() != "CPU"


def all_devices(bundle: dict) -> list[dict]:
    """The devices the probes measured (``bundle.devices``) and, after them, those only the log names
    (:func:`kvreport.analyze.devices_in_log`)."""
    from kvreport.analyze import devices_in_log

    return _probed_then_logged(bundle, devices_in_log(bundle))


def _probed_then_logged(bundle: dict, logged: list[dict]) -> list[dict]:
    probed = [d for d in (bundle.get("devices") or []) if isinstance(d, dict)]
    names = {str(d.get("name") or "").strip().lower() for d in probed}
    return probed + [d for d in logged if d["name"].lower() not in names]


def bundle_facts(bundle: dict, diagnosis: dict, devices: list[dict] | None = None) -> dict:
    """The indexed columns of a bundle row (values cut to their column sizes; None when absent). ``devices``:
    :func:`all_devices` of the bundle when the caller has it already (it parses the log)."""
    engine = bundle.get("engine") or {}
    failure = diagnosis.get("failure") or {}
    devices = all_devices(bundle) if devices is None else devices
    model = bundle.get("model") or {}
    gpu = next((d.get("name") for d in devices if is_gpu(d)), None)
    return {
        "engine_name": _cut(diagnosis.get("engine") or engine.get("name"), 40),
        "engine_version": _cut(engine.get("version"), 100),
        "build_number": build_number_of(engine),
        "backend": _cut(failure.get("backend"), 40),
        "gpu": _cut(gpu, 200),
        "model_name": _cut(model.get("file_name"), 300),
        "n_ctx": _n_ctx(bundle, diagnosis),
        "phase": _cut(failure.get("phase"), 40),
        "verdict": _cut(failure.get("verdict"), 40),
        "machine": machine_fingerprint(bundle),
        "suggestion_ids": [str(f.get("id"))[:60] for f in (diagnosis.get("suggestions") or []) if isinstance(f, dict)][:20],
    }


def facts_and_facets(bundle: dict, diagnosis: dict,
                     devices: list[dict] | None = None) -> tuple[dict, set[tuple[str, str]]]:
    """:func:`bundle_facts` and :func:`facets` of one bundle, with its log parsed at most once for the
    devices (not at all when the caller has them: :func:`diagnose_with_devices`)."""
    devices = all_devices(bundle) if devices is None else devices
    facts = bundle_facts(bundle, diagnosis, devices)
    return facts, facets(bundle, diagnosis, devices, facts=facts)


def facets(bundle: dict, diagnosis: dict, devices: list[dict] | None = None, *,
           facts: dict | None = None) -> set[tuple[str, str]]:
    """The (kind, value) pairs a bundle adds to its cluster's facet counts (each pair once)."""
    devices = all_devices(bundle) if devices is None else devices
    facts = bundle_facts(bundle, diagnosis, devices) if facts is None else facts
    engine = bundle.get("engine") or {}
    out: set[tuple[str, str]] = set()

    def add(kind, value):
        v = _cut(value)
        if v:
            out.add((kind, v))

    version = engine.get("version")
    build = facts["build_number"]
    add("engine_version", f"b{build}" if build is not None else version)
    for d in devices:
        if is_gpu(d):
            add("gpu", d.get("name"))
    add("model", facts["model_name"])
    add("backend", facts["backend"])
    add("verdict", facts["verdict"])
    if facts["n_ctx"] is not None:
        add("n_ctx", str(facts["n_ctx"]))
    for sid in facts["suggestion_ids"] or []:
        add("suggestion", sid)
    add("machine", facts["machine"])
    failure = diagnosis.get("failure") or {}
    add("error", failure.get("allocator_error") or failure.get("final_error"))
    from kvreport_server.correlations import extra_facets

    for kind, value in extra_facets(bundle, diagnosis, devices, is_gpu):
        add(kind, value)
    return out
