"""Known upstream issues, offline: a catalog of failure patterns mapped to the upstream issue, its fix and a
workaround, matched against a diagnosis with no network.

Two catalogs are read, both in the same format (``"schema": "kvreport-known/1"``, a list of ``entries``):

* the one shipped with the client, ``kvreport/data/known_issues.json`` (curated: every entry links an issue or
  pull request of the engine's GitHub repository);
* the one ``kvreport known --update`` fetched from the team server (``GET /api/v1/known-issues``: the known fixes
  and issue links its maintainers set on clusters), stored as ``<user data dir>/kvreport/known_issues.json``.

An entry::

    {"id": "llamacpp-vulkan-compute-over-alloc-limit",       # [a-z0-9-], unique in its catalog
     "title": "...", "url": "https://github.com/<owner>/<repo>/(issues|pull)/<n>",
     "related": [url, ...], "status": "open" | "fixed" | "closed" | "by-design" | <a cluster status>,
     "fixed_in": "b6650" | "0.6.5" | null, "fix_url": url | null, "fix_note": str, "workaround": str,
     "match": {conditions}}

Conditions (all that an entry lists must hold):

* ``signature``: ``engine/phase/backend`` (scheme 2 key of :mod:`kvreport.signature`), ``*`` for any part;
  a list of such patterns matches when one does.
* ``build``: ``{"min": N, "max": N}`` on the llama.cpp build number (min inclusive, max exclusive: the first
  fixed build); ``version``: ``{"min", "above", "max"}`` on the engine's dotted version (``0.6.4.post1``,
  ``0.5.13-rc2``). The engine's build and version come from the bundle's ``engine`` section, else the log.
  A lower bound needs the value to be known (a regression is only claimed with evidence); an entry with only
  an upper bound ("affected until fixed") also matches when the build or version is unknown.
* ``device`` / ``driver``: a regular expression searched in the device names (probed devices, the devices the
  log names) / their driver strings (probed driver versions and the log's device lines, where ggml_vulkan
  names the driver).
* ``flags``: ``{canonical flag name: true | false | regex}`` on the parsed command (``bundle.command.flags``,
  names as :mod:`kvreport.cmdline` gives them: ``n_gpu_layers``, ``n_ctx``, ``mmproj``, ``gpu_memory_utilization``,
  Ollama's ``context_length``...): ``true`` set, ``false`` not set, a string a regex on the value. Needs a
  known command: without one no flag condition holds.
* ``error``: a regex searched in the failure's ``allocator_error`` / ``final_error`` lines and the log's error
  and warning lines (and the engine's auto-fit status); ``log``: a regex searched in every log line at hand.
* ``ctx_min`` (n_ctx at least), ``ctx_is_train`` (the context equals the model's training context, i.e. the
  default was taken), ``seqs_min`` (sequences / slots at least), ``devices_min`` (accelerators at least),
  ``fit`` (llama.cpp's auto-fit ran), ``model`` (a regex on the model file or name).

Every regular expression runs on RE2 (linear time): a fetched catalog cannot stall the client.
Pure: no network, no writes; :func:`match` never raises on odd input.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from kvreport.errors import InputError

SCHEMA = "kvreport-known/1"
SHIPPED = Path(__file__).with_name("data") / "known_issues.json"
FETCHED_NAME = "known_issues.json"
MAX_REGEX = 400
MAX_ENTRIES = 5000

_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,99}$")
_GITHUB = re.compile(r"^https://github\.com/[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*/(issues|pull)/\d+$")
_HTTP = re.compile(r"^https?://[^\s<>\"'\x00]{1,500}$")
_FLAG = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_VERSION = re.compile(r"v?(\d+(?:\.\d+)*)(?:[-.+_]?(dev|a|alpha|b|beta|rc|post)\.?(\d*))?", re.I)
_TAG_RANK = {"dev": -4, "a": -3, "alpha": -3, "b": -2, "beta": -2, "rc": -1, "post": 1}
CONDITIONS = ("signature", "build", "version", "device", "driver", "flags", "error", "log", "ctx_min",
              "ctx_is_train", "seqs_min", "devices_min", "fit", "model")
_REGEX_KEYS = ("device", "driver", "error", "log", "model")


class CatalogError(InputError):
    """A catalog file that is not in the known-issues format (its first problem, in one line)."""


# --- validation ---------------------------------------------------------------------------------------------

def _regex(text: Any):
    import re2

    if not isinstance(text, str) or not text or len(text) > MAX_REGEX:
        raise ValueError(f"a regex is a string of 1 to {MAX_REGEX} characters")
    try:
        return re2.compile(text)
    except Exception as exc:  # noqa: BLE001 - re2 raises its own error type
        raise ValueError(f"{text!r} is not a regex RE2 can run ({exc})") from None


def _signature_problem(value) -> str | None:
    from kvreport.vocab import BACKENDS, ENGINES, PHASES

    patterns = value if isinstance(value, list) else [value]
    if not patterns or not all(isinstance(p, str) for p in patterns):
        return "signature must be 'engine/phase/backend' or a list of them"
    for p in patterns:
        parts = p.split("/")
        if len(parts) != 3:
            return f"signature {p!r} must have three parts engine/phase/backend"
        for part, allowed, what in zip(parts, (ENGINES, PHASES, BACKENDS), ("engine", "phase", "backend"), strict=True):
            if part != "*" and part not in allowed:
                return f"signature {p!r}: {what} {part!r} is not one of {', '.join(allowed)} or *"
    return None


def _range_problem(name: str, value, numeric: bool) -> str | None:
    if not isinstance(value, dict) or not value or set(value) - {"min", "max", "above"}:
        return f"{name} must be an object with min / above / max"
    for k, v in value.items():
        if numeric and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            return f"{name}.{k} must be a build number (an integer >= 0)"
        if not numeric and (not isinstance(v, str) or parse_version(v) is None):
            return f"{name}.{k} must be a dotted version such as 0.6.4"
    return None


def _flags_problem(value) -> str | None:
    if not isinstance(value, dict) or not value:
        return "flags must be an object {flag: true | false | regex}"
    for k, v in value.items():
        if not isinstance(k, str) or not _FLAG.match(k):
            return f"flag {k!r} is not a canonical flag name (lower case, underscores)"
        if isinstance(v, str):
            try:
                _regex(v)
            except ValueError as exc:
                return f"flags.{k}: {exc}"
        elif not isinstance(v, bool):
            return f"flags.{k} must be true, false or a regex"
    return None


def _cond_problem(key: str, value) -> str | None:
    """What is wrong with one condition, else None."""
    if key == "signature":
        return _signature_problem(value)
    if key in ("build", "version"):
        return _range_problem(key, value, key == "build")
    if key == "flags":
        return _flags_problem(value)
    if key in _REGEX_KEYS:
        try:
            _regex(value)
        except ValueError as exc:
            return f"{key}: {exc}"
        return None
    if key in ("ctx_min", "seqs_min", "devices_min"):
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        return None if ok else f"{key} must be an integer >= 0"
    if key in ("ctx_is_train", "fit"):
        return None if isinstance(value, bool) else f"{key} must be true or false"
    return f"unknown condition {key!r} (known: {', '.join(CONDITIONS)})"


def _text_problem(entry: dict, key: str, required: bool, limit: int) -> str | None:
    value = entry.get(key)
    if value is None:
        return f"{key} is required" if required else None
    if not isinstance(value, str) or not value.strip() or len(value) > limit or "\x00" in value:
        return f"{key} must be non-empty text of at most {limit} characters"
    return None


def _url_problem(value, key: str, curated: bool) -> str | None:
    if value is None:
        return None
    pattern = _GITHUB if curated else _HTTP
    if not isinstance(value, str) or not pattern.match(value):
        where = "an issue or pull request on https://github.com/<owner>/<repo>/" if curated else "an http(s) URL"
        return f"{key} {str(value)[:80]!r} is not {where}"
    return None


def entry_problem(entry, curated: bool = True) -> str | None:
    """The first thing wrong with one catalog entry, else None. ``curated``: the shipped catalog, whose links
    must be GitHub issues or pull requests (a server's entries link wherever its maintainers pointed)."""
    if not isinstance(entry, dict):
        return "an entry must be an object"
    if not isinstance(entry.get("id"), str) or not _ID.match(entry["id"]):
        return f"id {str(entry.get('id'))[:40]!r} must be 1-100 characters of a-z, 0-9 and -"
    for key, required, limit in (("title", True, 300), ("workaround", curated, 20000), ("fixed_in", False, 40),
                                 ("fix_note", False, 500), ("status", False, 20)):
        problem = _text_problem(entry, key, required, limit)
        if problem:
            return problem
    problem = (_url_problem(entry.get("url"), "url", curated) or _url_problem(entry.get("fix_url"), "fix_url", curated)
               or _url_problem(entry.get("cluster_url"), "cluster_url", False))
    if problem:
        return problem
    if curated and not entry.get("url"):
        return "url is required"
    related = entry.get("related", [])
    if not isinstance(related, list):
        return "related must be a list of URLs"
    for url in related:
        problem = _url_problem(url, "related", curated)
        if problem:
            return problem
    cond = entry.get("match")
    if not isinstance(cond, dict) or "signature" not in cond:
        return "match must be an object with at least a signature"
    for key, value in cond.items():
        problem = _cond_problem(key, value)
        if problem:
            return problem
    return None


def validate_catalog(doc, curated: bool = True, what: str = "the catalog") -> list[dict]:
    """The entries of a catalog document, checked; raises :class:`CatalogError` naming the first problem."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise CatalogError(f"{what} is not a known-issues catalog (schema {SCHEMA!r} expected)")
    entries = doc.get("entries")
    if not isinstance(entries, list) or len(entries) > MAX_ENTRIES:
        raise CatalogError(f"{what}: entries must be a list of at most {MAX_ENTRIES}")
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        problem = entry_problem(entry, curated)
        if problem:
            ident = entry.get("id") if isinstance(entry, dict) else None
            raise CatalogError(f"{what}: entry {i + 1}{f' ({ident})' if isinstance(ident, str) else ''}: {problem}")
        if entry["id"] in seen:
            raise CatalogError(f"{what}: entry {i + 1}: id {entry['id']!r} appears twice")
        seen.add(entry["id"])
    return entries


# --- loading ------------------------------------------------------------------------------------------------

def fetched_path() -> Path:
    """Where ``kvreport known --update`` keeps the server's catalog (the client's user data directory)."""
    from kvreport.config import data_dir

    return data_dir() / FETCHED_NAME


def read_catalog(path: Path, curated: bool) -> dict:
    """A catalog file, validated (its ``entries`` checked); raises :class:`CatalogError`."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    except ValueError as exc:
        raise CatalogError(f"{path} is not JSON ({exc})") from None
    validate_catalog(doc, curated, str(path))
    return doc


def load_entries(include_fetched: bool = True) -> tuple[list[dict], list[str]]:
    """Every entry of the shipped catalog and, when present, of the fetched one, each with ``source``
    (``"shipped"`` or the server's URL); and the problems met (a fetched file that no longer reads is skipped
    with a note, never an error: the analysis must go on)."""
    entries = [dict(e, source="shipped") for e in read_catalog(SHIPPED, True)["entries"]]
    notes: list[str] = []
    if include_fetched:
        path = fetched_path()
        if path.is_file():
            try:
                doc = read_catalog(path, False)
            except CatalogError as exc:
                notes.append(f"{exc}; run `kvreport known --update` again")
            else:
                server = doc.get("server") if isinstance(doc.get("server"), str) else "server"
                entries += [dict(e, source=server) for e in doc["entries"]]
    return entries, notes


# --- facts of a diagnosis -------------------------------------------------------------------------------------

def parse_version(text) -> tuple | None:
    """``"0.6.4.post1"`` -> comparable tuple; ``"v0.15.5"``, ``"0.5.13-rc2"``, ``"0.8.3.dev172+g2b93162f"``; None
    when the text holds no version."""
    if not isinstance(text, str):
        return None
    m = _VERSION.search(text.strip())
    if not m:
        return None
    nums = [int(x) for x in m.group(1).split(".")][:6]
    nums += [0] * (6 - len(nums))
    tag = (m.group(2) or "").lower()
    return (*nums, _TAG_RANK.get(tag, 0), int(m.group(3) or 0))


def _build_of(bundle: dict, facts) -> int | None:
    engine = bundle.get("engine") if isinstance(bundle.get("engine"), dict) else {}
    for value in (engine.get("build_number"), getattr(facts, "build", None)):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    for text in (engine.get("version"), getattr(facts, "version", None)):
        m = re.fullmatch(r"b(\d+)", str(text or "").strip())
        if m and int(m.group(1)) > 0:
            return int(m.group(1))
    return None


def _version_of(bundle: dict, facts) -> str | None:
    engine = bundle.get("engine") if isinstance(bundle.get("engine"), dict) else {}
    for text in (engine.get("version"), getattr(facts, "version", None)):
        if isinstance(text, str) and parse_version(text) and not re.fullmatch(r"b\d+", text.strip()):
            return text.strip()
    return None


def _devices(bundle: dict, facts) -> tuple[list[str], list[str], int]:
    """Device names, driver strings and the number of accelerators."""
    names: list[str] = []
    drivers: list[str] = []
    keys: set[str] = set()
    for d in bundle.get("devices") or []:
        if isinstance(d, dict) and d.get("backend") not in ("cpu",):
            names.append(str(d.get("name") or ""))
            drivers += [str(d[k]) for k in ("driver_version", "cuda_driver_version") if d.get(k)]
            keys.add(f"probe{d.get('index')}")
    for key, dev in (getattr(facts, "devices", None) or {}).items():
        if str(key).upper().startswith("CPU"):
            continue
        text = str((dev or {}).get("description") or (dev or {}).get("name") or "")
        names.append(text)
        drivers.append(text)
        keys.add(str(key))
    engine = bundle.get("engine") if isinstance(bundle.get("engine"), dict) else {}
    for d in engine.get("list_devices") or []:
        if isinstance(d, dict):
            names.append(f"{d.get('name') or ''} {d.get('description') or ''}".strip())
    return [n for n in names if n], [d for d in drivers if d], len(keys)


def _texts(diagnosis: dict, facts) -> list[str]:
    f = diagnosis.get("failure") or {}
    out = [f.get("allocator_error"), f.get("final_error")]
    if facts is not None:
        out += [facts.final_error, facts.cause_error, *(facts.error_lines or []), *(facts.warnings or [])]
        fit = facts.fit or {}
        out += [fit.get("status"), *[x if isinstance(x, str) else str(x) for x in (fit.get("lines") or [])]]
    return [str(t) for t in out if t]


def _models(bundle: dict, facts) -> list[str]:
    model = bundle.get("model") if isinstance(bundle.get("model"), dict) else {}
    flags = _command(bundle)[0] or {}
    out = [model.get("file_name"), model.get("path"), flags.get("model"), flags.get("model_path"), flags.get("hf_repo")]
    gguf = model.get("gguf") if isinstance(model.get("gguf"), dict) else {}
    out.append(gguf.get("general.name"))
    if facts is not None:
        out += [(facts.gguf_kv or {}).get("general.name"), (facts.vllm or {}).get("model"),
                (facts.sglang or {}).get("model_path"), (facts.ollama or {}).get("model")]
    return [str(x) for x in out if isinstance(x, (str, int, float)) and str(x)]


def _command(bundle: dict) -> tuple[dict | None, bool]:
    """The parsed flags, and whether a command is known at all."""
    cmd = bundle.get("command") if isinstance(bundle.get("command"), dict) else {}
    known = bool(cmd.get("line") or cmd.get("argv") or cmd.get("engine_argv"))
    flags = cmd.get("flags") if isinstance(cmd.get("flags"), dict) else {}
    return (flags if known else None), known


def _ctx_train(facts) -> int | None:
    if facts is None:
        return None
    for key in ("n_ctx_train",):
        value = (facts.hparams or {}).get(key)
        if value is not None and str(value).strip().isdigit():
            return int(str(value).strip())
    for key, value in (facts.gguf_kv or {}).items():
        if str(key).endswith(".context_length") and str(value).strip().isdigit():
            return int(str(value).strip())
    return None


def context(diagnosis: dict, bundle: dict | None = None, facts=None, log_lines=None) -> dict:
    """The facts the conditions read, from a diagnosis, its bundle (when there is one) and the log's facts
    (:class:`kvreport.logs.LogFacts`; parsed from ``bundle.log`` when not given). ``log_lines``: an iterable
    factory (a callable returning lines) for the ``log`` condition; default: the bundle's log lines."""
    bundle = bundle if isinstance(bundle, dict) else {}
    diagnosis = diagnosis if isinstance(diagnosis, dict) else {}
    log = bundle.get("log") if isinstance(bundle.get("log"), dict) else {}
    lines = log.get("lines") if isinstance(log.get("lines"), list) else []
    if facts is None and lines:
        from kvreport.logs import parse_log

        facts = parse_log(lines)
    if log_lines is None:
        def log_lines():
            return (str(x[1]) if isinstance(x, (list, tuple)) and len(x) > 1 else str(x) for x in lines)
    key = str((diagnosis.get("signature") or {}).get("key") or "unknown/unknown/unknown").split("/")
    names, drivers, n_devices = _devices(bundle, facts)
    inputs = (diagnosis.get("memory") or {}).get("inputs") or {}
    flags, command_known = _command(bundle)
    return {
        "key": (key + ["unknown"] * 3)[:3],
        "build": _build_of(bundle, facts),
        "version": _version_of(bundle, facts),
        "devices": names, "drivers": drivers, "n_devices": n_devices,
        "flags": flags, "command_known": command_known,
        "texts": _texts(diagnosis, facts),
        "log_lines": log_lines,
        "n_ctx": inputs.get("n_ctx") or (getattr(facts, "ctx", None) or {}).get("n_ctx"),
        "n_ctx_train": _ctx_train(facts),
        "n_seq": inputs.get("n_seq") or (getattr(facts, "ctx", None) or {}).get("n_seq_max"),
        "fit_ran": bool((getattr(facts, "fit", None) or {}).get("ran")),
        "models": _models(bundle, facts),
        "phase": (diagnosis.get("failure") or {}).get("phase"),
    }


# --- matching -----------------------------------------------------------------------------------------------

def _sig_ok(patterns, key: list[str]) -> bool:
    for p in patterns if isinstance(patterns, list) else [patterns]:
        if all(a == "*" or a == b for a, b in zip(p.split("/"), key, strict=False)):
            return True
    return False


def _range_ok(rng: dict, value, conv) -> bool:
    if value is None:
        return "min" not in rng and "above" not in rng
    v = conv(value)
    if v is None:
        return "min" not in rng and "above" not in rng
    if "min" in rng and v < conv(rng["min"]):
        return False
    if "above" in rng and v <= conv(rng["above"]):
        return False
    return not ("max" in rng and v >= conv(rng["max"]))


def _search(pattern: str, texts) -> bool:
    rx = _regex(pattern)
    return any(rx.search(t) for t in texts)


def _flags_ok(want: dict, flags: dict | None) -> bool:
    if flags is None:
        return False
    for name, cond in want.items():
        present = name in flags and flags[name] is not None
        if cond is True and not present or cond is False and present:
            return False
        if isinstance(cond, str) and (not present or not _regex(cond).search(str(flags[name]))):
            return False
    return True


def _int_at_least(value, minimum: int) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= minimum


def _condition_ok(key: str, want, ctx: dict) -> bool:
    checks = {
        "signature": lambda: _sig_ok(want, ctx["key"]),
        "build": lambda: _range_ok(want, ctx["build"], lambda x: int(x)),
        "version": lambda: _range_ok(want, ctx["version"], parse_version),
        "device": lambda: _search(want, ctx["devices"]),
        "driver": lambda: _search(want, ctx["drivers"]),
        "flags": lambda: _flags_ok(want, ctx["flags"]),
        "error": lambda: _search(want, ctx["texts"]),
        "log": lambda: _search(want, ctx["log_lines"]()),
        "ctx_min": lambda: _int_at_least(ctx["n_ctx"], want),
        "ctx_is_train": lambda: (ctx["n_ctx"] is not None and ctx["n_ctx"] == ctx["n_ctx_train"]) == want,
        "seqs_min": lambda: _int_at_least(ctx["n_seq"], want),
        "devices_min": lambda: ctx["n_devices"] >= want,
        "fit": lambda: ctx["fit_ran"] == want,
        "model": lambda: _search(want, ctx["models"]),
    }
    check = checks.get(key)
    return bool(check and check())


_ORDER = ("signature", "build", "version", "flags", "ctx_min", "ctx_is_train", "seqs_min", "devices_min", "fit",
          "device", "driver", "model", "error", "log")


def entry_matches(entry: dict, ctx: dict) -> bool:
    """Whether every condition of ``entry`` holds for the facts ``ctx`` (:func:`context`); the log scan last."""
    cond = entry.get("match") or {}
    if ctx.get("phase") in (None, "none"):
        return False
    return all(_condition_ok(k, cond[k], ctx) for k in _ORDER if k in cond)


def public(entry: dict) -> dict:
    """What a match shows (``--json``'s ``known`` list)."""
    keys = ("id", "title", "url", "related", "status", "fixed_in", "fix_url", "fix_note", "workaround", "source",
            "cluster_url")
    out = {k: entry.get(k) for k in keys if entry.get(k) not in (None, [], "")}
    out["match"] = entry.get("match")
    return out


def match(diagnosis: dict, bundle: dict | None = None, facts=None, entries: list[dict] | None = None,
          log_lines=None) -> list[dict]:
    """The catalog entries (shipped and fetched unless ``entries`` is given) that match a diagnosis, shipped
    first, in catalog order. Nothing failed (phase ``none``): no match."""
    if entries is None:
        entries = load_entries()[0]
    ctx = context(diagnosis, bundle, facts, log_lines)
    return [public(e) for e in entries if entry_matches(e, ctx)]


def _fix_words(m: dict) -> str:
    if m.get("fixed_in"):
        return f"fixed in {m['fixed_in']}"
    if m.get("fix_url"):
        words = {"fixed": "fixed by", "partly-fixed": "partly fixed by", "open": "fix proposed:"}
        return f"{words.get(str(m.get('status')), 'fix:')} {m['fix_url']}"
    return {"open": "not fixed yet", "by-design": "by design"}.get(str(m.get("status")), "")


def render(matches: list[dict]) -> str:
    """``known: <title> — <url>; fixed in X; workaround: ...`` lines for the terminal ('' for none)."""
    lines = []
    for m in matches:
        parts = [f"known: {m.get('title')} — {m.get('url') or m.get('cluster_url') or '(no link)'}"]
        fix = _fix_words(m)
        if fix:
            parts.append(fix)
        if m.get("workaround"):
            text = " ".join(str(m["workaround"]).split())
            parts.append(f"workaround: {text[:600]}")
        line = "; ".join(parts)
        if m.get("source") and m.get("source") != "shipped":
            line += f"  [from {m['source']}]"
        lines.append(line)
    return "".join(line + "\n" for line in lines)


def known_for(diagnosis: dict, bundle: dict | None = None, facts=None, log_lines=None) -> tuple[list[dict], list[str]]:
    """Matches for the CLI, and notes about a fetched catalog that could not be read; never raises for a broken
    fetched file (the shipped one is part of the package and is tested)."""
    entries, notes = load_entries()
    return match(diagnosis, bundle, facts, entries, log_lines), notes
