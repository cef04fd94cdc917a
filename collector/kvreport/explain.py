"""``kvreport analyze --explain``: for every fact of a diagnosis, the rule that produced it and the log line it read.

Sentry's grouping information is the model: a maintainer sees why kvreport said what it said, and a wrong fact points
at the rule to fix. :func:`explain` is pure: it takes the parsed log (:class:`kvreport.logs.LogFacts`), the diagnosis,
and what the diagnosis recorded about its own steps (``trail``: the events that placed the failure, the rule that
read them, where the free memory came from, the fix rows that ranked each suggestion), and returns a list of entries::

    {"fact": "failure.requested_mib", "value": 65536.0, "rule": "logs.llamacpp failure chain (ggml)",
     "line": [87, "... failed to allocate CPU buffer of size ..."] | None,
     "basis": "log" | "command" | "gguf" | "bundle" | "derived" | "assumed" | "default", "why": "..."}

Every entry has a rule, and either a line or a basis of derived / assumed / default with a reason.
"""

from __future__ import annotations

from kvreport.logs.facts import LogFacts

_FAILURE_FACTS = ("phase", "backend", "failing_device", "requested_mib", "free_mib", "verdict")
_INPUT_KEYS = {"n_ctx": ("ctx:n_ctx", "ctx:kv_size"), "n_seq": ("ctx:n_seq_max",),
               "n_layer": ("hparams:n_layer",), "n_head_kv": ("hparams:n_head_kv",),
               "head_dim_k": ("hparams:n_embd_head_k",), "head_dim_v": ("hparams:n_embd_head_v",),
               "cache_type_k": ("ctx:type_k",), "cache_type_v": ("ctx:type_v",), "n_swa": ("hparams:n_swa",)}


def _line(ev: dict | None) -> list | None:
    if not ev or ev.get("lineno") is None:
        return None
    return [ev["lineno"], str(ev.get("line") or "")[:300]]


def _entry(fact: str, value, rule: str, line: list | None, basis: str, why: str) -> dict:
    return {"fact": fact, "value": value, "rule": rule, "line": line, "basis": basis, "why": why}


def _close(a, b) -> bool:
    return a is not None and b is not None and abs(float(a) - float(b)) <= max(0.01, 0.005 * abs(float(b)))


def _failure_entries(f: LogFacts, failure: dict, trail: dict) -> list[dict]:
    rule = trail.get("rule") or "analyze.failure"
    events = trail.get("events") or []
    first = events[0] if events else None
    out = []
    for key in _FAILURE_FACTS:
        v = failure.get(key)
        if v is None or (key in ("backend", "verdict") and v == "unknown" and key != "backend"):
            continue
        fact = f"failure.{key}"
        if key == "phase":
            ev = next((e for e in events if e.get("kind") == "reason"), None) or \
                next((e for e in events if e.get("phase")), None) or first
            if v == "none":
                out.append(_entry(fact, v, "analyze.failure", None, "derived",
                                  "no failure event in the log (or every failure was recovered from)"))
            else:
                out.append(_entry(fact, v, rule, _line(ev), "log" if ev else "derived",
                                  "the line that says what the failed buffer was for" if ev else
                                  "no line names the buffer"))
        elif key == "backend":
            ev = next((e for e in events if e.get("backend") == v), None) or \
                next((e for e in events if e.get("device")), None)
            if ev:
                out.append(_entry(fact, v, rule, _line(ev), "log", "the failing line's backend or device name"))
            elif v == "unknown":
                out.append(_entry(fact, v, "analyze._backend_guess", None, "default",
                                  "no line names the backend of the failure and the log shows no device"))
            else:
                out.append(_entry(fact, v, "analyze._backend_guess", None, "derived",
                                  "no failing line names one: the GPU backend the log's device and buffer lines show"))
        elif key == "failing_device":
            ev = next((e for e in events if e.get("device") == v), None) or \
                next((e for e in events if e.get("device_index") is not None), None)
            out.append(_entry(fact, v, rule, _line(ev or first), "log", "the device the failing line names"))
        elif key == "requested_mib":
            ev = next((e for e in events if _close(e.get("mib"), v) or _close(e.get("requested_mib"), v)), None)
            if ev:
                out.append(_entry(fact, v, rule, _line(ev), "log", "the size the failing line prints, in MiB"))
            else:
                out.append(_entry(fact, v, "analyze.summary_numbers", None, "derived",
                                  "the KV at the stated context, from the model's geometry"))
        elif key == "free_mib":
            src = trail.get("free") or {}
            out.append(_entry(fact, v, src.get("rule") or "analyze._device_free", src.get("line"),
                              src.get("basis") or "log", src.get("why") or "the failing device's free memory"))
        elif key == "verdict" and v != "unknown":
            out.append(_entry(fact, v, "analyze._free_and_verdict", None, "derived",
                              f"requested {failure.get('requested_mib')} MiB against "
                              + ("an allocation or process limit" if v == "exceeds_alloc_limit" else
                                 f"{failure.get('free_mib')} MiB free (less what was already allocated there)")))
    return out


def _default_cache_type(engine: str | None) -> str:
    """Why a cache type nobody set is 16-bit, in the engine's own terms."""
    if engine in ("vllm", "sglang", "tgi", "lmdeploy", "mlx-lm"):
        return (f"{engine}'s default KV dtype is the model's own ('auto'), 16-bit for the usual bf16/f16 checkpoints: "
                "2 bytes per value, as f16")
    return "llama.cpp's default cache type (f16)"


def _input_entries(f: LogFacts, mem: dict, trail: dict, engine: str | None = None) -> list[dict]:
    inputs = mem.get("inputs") or {}
    src = inputs.get("source")
    out = []
    for key, where in _INPUT_KEYS.items():
        v = inputs.get(key)
        if v is None:
            continue
        fact = f"memory.inputs.{key}"
        line = next((f.source_lines[k] for k in where if k in f.source_lines), None)
        if key in ("cache_type_k", "cache_type_v") and not line and "kv" in f.source_lines:
            line = f.source_lines["kv"]  # "llama_kv_cache: size = ... K (f16): ..., V (f16): ..."
        if key == "n_ctx" and (trail.get("config") or {}).get("n_ctx_line"):
            line = trail["config"]["n_ctx_line"]  # the line config() took the context from
        if key in ("n_ctx", "n_seq", "cache_type_k", "cache_type_v"):
            origin = (trail.get("config") or {}).get(key)
            if line:
                out.append(_entry(fact, v, "logs.llamacpp context parameters", line, "log",
                                  "the engine's own context line"))
            elif origin == "command":
                out.append(_entry(fact, v, "cmdline.parse_command", None, "command", "the command line's flag"))
            elif origin == "log":
                out.append(_entry(fact, v, "analyze.config", None, "log",
                                  "read from the log (KV size lines, the fit step, Ollama's load request or a typed "
                                  "summary)"))
            else:
                out.append(_entry(fact, v, "analyze.config", None, "default",
                                  {"n_seq": "one sequence unless the log or command says otherwise",
                                   "cache_type_k": _default_cache_type(engine),
                                   "cache_type_v": _default_cache_type(engine)}.get(key, "not in the log")))
        elif src == "gguf":
            out.append(_entry(fact, v, "gguf_meta.shape_from_metadata", None, "gguf", "the model file's header"))
        elif line:
            out.append(_entry(fact, v, "kvcache.shape_from_hparams", line, "log", "the model's printed geometry"))
        else:
            out.append(_entry(fact, v, "kvcache.shape_from_hparams", None, "derived" if src == "log" else "assumed",
                              "derived from the other printed hyper-parameters" if src == "log" else
                              "the model's geometry is not in the log"))
    for key in ("kv_required_mib", "kv_mib_per_1k_tokens"):
        v = mem.get(key)
        if v is None:
            continue
        printed = key == "kv_required_mib" and "kv" in f.source_lines and any(
            _close(k.get("mib"), v) for k in f.kv_caches if not k.get("dry_run"))
        if printed:
            out.append(_entry(f"memory.{key}", v, "logs.llamacpp KV size line", f.source_lines["kv"], "log",
                              "the KV size the engine printed for its real attempt"))
        else:
            out.append(_entry(f"memory.{key}", v, "kvcache.kv_size", None, "derived",
                              "kvreport's KV arithmetic over the inputs above (or the failed KV buffer itself)"))
    return out


def explain(f: LogFacts, d: dict, trail: dict) -> list[dict]:
    """The explanation of diagnosis ``d`` (see the module docstring)."""
    out: list[dict] = []
    eng = d.get("engine")
    hint = f.engine_lines.get(eng)
    if hint:
        out.append(_entry("engine", eng, "logs.decide_engine", hint, "log",
                          f"engine hints counted per line: {dict(f.engine_hints)}; this is the first line for {eng}"))
    elif eng == "unknown":
        out.append(_entry("engine", eng, "logs.decide_engine", None, "default", "no line names an engine"))
    else:
        out.append(_entry("engine", eng, "analyze.engine", None, "command",
                          "from the command line or the bundle's engine section"))
    out += _failure_entries(f, d.get("failure") or {}, trail)
    out += _input_entries(f, d.get("memory") or {}, trail, eng)
    sig = d.get("signature") or {}
    for part, note in zip(("engine", "phase", "backend"), sig.get("notes") or [], strict=False):
        out.append(_entry(f"signature.{part}", (sig.get("key") or "").split("/")[("engine", "phase", "backend").index(part)]
                          if sig.get("key") else None, "signature.signature", None, "derived", note))
    for item in trail.get("suggestions") or []:
        out.append(_entry(f"suggestion.{item['id']}", item["rank"], item.get("rule") or "fixes.RULES", None,
                          "derived", "the fix-table row that gave this suggestion its rank (docs/fix-rules.md)"))
    return out


def render(entries: list[dict]) -> str:
    """The explanation as text, one fact a line (``kvreport analyze --explain``)."""
    lines = ["Why kvreport says this (fact = value  <- rule, line or basis):"]
    for e in entries:
        where = f"line {e['line'][0]}: {e['line'][1].strip()[:120]}" if e.get("line") else f"{e['basis']}: {e['why']}"
        lines.append(f"  {e['fact']} = {e['value']}  <- {e['rule']}; {where}")
    return "\n".join(lines) + "\n"
