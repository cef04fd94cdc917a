"""The diagnosis: a pure function of a bundle (no I/O), the same on the client and the server.

``analyze(bundle) -> dict`` returns design.md's diagnosis JSON::

    analyzer_version, engine, failure{phase, backend, failing_device, requested_mib, free_mib,
    allocator_error, final_error, verdict}, memory{kv_required_mib, rs_required_mib,
    kv_mib_per_1k_tokens, max_ctx_fit{f16,q8_0,q4_0}, fit, inputs{...,source}}, findings[],
    signature{id,key,title,scheme,notes}, suggestions[]

How the failure is placed (design.md "Phases"):

1. The log's failure chain (:mod:`kvreport.logs`) is cut into *allocation groups*: backend
   refusals (``cudaMalloc failed``, ``ErrorOutOfDeviceMemory``, ``ggml_aligned_malloc``...), the
   ggml line that names the buffer (``failed to allocate CUDA0 buffer of size N``) and the reason
   llama.cpp gives (``failed to allocate buffer for kv cache`` -> kv_cache, ``compute buffers`` ->
   compute_buffer, ``unable to allocate CUDA0 buffer`` while loading -> model_weights). Without a
   reason, a compute allocator (gallocr) means compute_buffer, a tensor allocation during
   ``load_tensors`` model_weights and during context creation kv_cache; a lone backend line stays
   ``unknown``.
2. A group the engine recovered from is not the failure (it becomes a ``recovered_allocation``
   finding): pinned host memory with fallback to plain host memory, a compute buffer retried
   without pipeline parallelism that then worked, anything followed by the server coming up.
   When the retry also fails, the first failure of that chain is the primary one and the later
   one a ``secondary_failure`` finding.
3. vLLM / SGLang / TGI / Ollama messages give their own phases (kv_capacity, memory_budget...).
4. Refusals that are not about memory (bad or truncated file, unknown architecture, a refused
   option) are ``unknown``; a log without any failure is ``none``.

``requested_mib`` is the buffer named at ggml level, else the backend's own line; ``free_mib`` the
failing device's free memory as the log printed it (``using device ... MiB free``,
``--list-devices``, Ollama inventory, the CPU's total memory as llama.cpp's fit reports it), else
``memory_before_launch`` (``kvreport run``); the collector's probes (``devices[]``,
``host.ram_free_mib``) are taken at collection time, after the failure, and only become a
``free_at_collection`` finding. The verdict compares the request with that free
memory minus what the engine had already allocated on the device before the failure.

``memory.kv_required_mib`` is the KV size the engine printed for its real attempt when it printed
one; otherwise kvreport's arithmetic (:mod:`kvreport.kvcache`) for the configuration the engine
allocated (its own ``llama_context: n_ctx`` etc. after padding, parallel and fit adjustments), and
as a last resort the failing KV buffer itself. ``kv_mib_per_1k_tokens`` is per 1024 tokens.
"""

from __future__ import annotations

import json
import re

from kvreport import fixes, strict
from kvreport.logs import LogFacts, parse_log
from kvreport.logs.common import MIB, to_float, to_int, typed_settings
from kvreport.logs.oom import FATAL, HOST_RULES, REQUEST_RULES, backend_of_words
from kvreport.signature import signature
from kvreport.units import BYTES_PER_VALUE, fmt_mib
from kvreport.vocab import BACKEND_DEVICE_PREFIX, ENGINES, backend_of_device  # noqa: F401 - re-exported

ANALYZER_VERSION = "2.0.0"
"""Version of the analysis rules; the server stores it and re-analyzes when it changes."""

_DEVICE_PREFIX = BACKEND_DEVICE_PREFIX
_GGML_CUDA_BLOCK = re.compile(r"\b(?:CUDA|ROCm|MUSA|HIP|CANN) error\b")
"""The first line of ggml's CUDA error block (ggml-cuda.cu ggml_cuda_error: "CUDA error: <reason>", "ROCm error" on
HIP builds; ggml-cann.cpp ggml_cann_error prints the same block as "CANN error"), whose next lines name the device
("current device: N, in function F at FILE:L")."""
KV_EXAMPLES = (
    # (shape, f16 KV bytes per token = n_layer x n_head_kv x head_dim x (K + V) x 2 bytes); from the models' configs
    ("Llama-3.1-8B (32 layers x 8 KV heads x 128)", 32 * 8 * 128 * 2 * 2),
    ("Qwen2.5-7B (28 x 4 x 128)", 28 * 4 * 128 * 2 * 2),
    ("Mistral-Nemo-12B (40 x 8 x 128)", 40 * 8 * 128 * 2 * 2),
)
"""Well-known dense-attention shapes shown, labelled as examples, when a failure names a context but no model."""
_ENGINES = tuple(e for e in ENGINES if e != "unknown")
_BYTES_PER_VALUE = BYTES_PER_VALUE


# ---------------------------------------------------------------------------------------------
# public API


def analyze(bundle: dict, explain: bool = False) -> dict:
    """The diagnosis of a bundle (design.md "Diagnosis JSON"). Pure; never raises on bad content.

    Reads ``bundle["log"]["lines"]``, ``bundle["command"]`` (flags parsed by
    :func:`kvreport.cmdline.parse_command` when absent), ``bundle["memory_before_launch"]``,
    ``bundle["devices"]``, ``bundle["host"]`` and ``bundle["model"]["gguf"]``.
    """
    bundle = bundle if isinstance(bundle, dict) else {}
    log = bundle.get("log") if isinstance(bundle.get("log"), dict) else {}
    lines = log.get("lines") or []
    facts = parse_log(lines if isinstance(lines, list) else [])
    return diagnose(facts, bundle, explain)


def devices_in_log(bundle: dict) -> list[dict]:
    """The accelerators the bundle's log names (llama.cpp ``Device 0: NVIDIA GeForce RTX 4090`` / ``using device
    CUDA0 (...) - 23000 MiB free`` / ``--list-devices``, Ollama's inference compute, vLLM's torch devices), as
    ``bundle.devices``-shaped entries with ``"source": "log"``: facts of the log, read by the analysis (a bundle's
    ``devices`` holds only what the probes measured). CPU is left out. Memory in MiB."""
    bundle = bundle if isinstance(bundle, dict) else {}
    log = bundle.get("log") if isinstance(bundle.get("log"), dict) else {}
    lines = log.get("lines") if isinstance(log.get("lines"), list) else []
    return devices_of_facts(parse_log(lines))


def devices_of_facts(facts: LogFacts) -> list[dict]:
    """:func:`devices_in_log` of an already parsed log (the server parses each upload's log once)."""
    out: list[dict] = []
    for key, dev in facts.devices.items():
        key = str(key)
        backend = backend_of_device(key)
        description = dev.get("description")
        if backend == "cpu" or key.upper() == "CPU" or (backend is None and not description):
            continue
        digits = key[len(key.rstrip("0123456789")):]
        entry = {"backend": backend, "index": int(digits) if digits else None, "name": str(description or key).strip(),
                 "device": key, "total_mib": dev.get("total_mib"), "free_mib": dev.get("free_mib"), "source": "log"}
        out.append({k: v for k, v in entry.items() if v is not None})
    return out


def analyze_text(text: str, command_line: str | None = None, explain: bool = False) -> dict:
    """The diagnosis of a raw log (or a bundle as JSON text), e.g. pasted from a GitHub issue.

    ``command_line``: the command that produced the log, if known (its flags refine the numbers
    and the suggestions are rewritten commands).
    """
    from kvreport.bundle import looks_like_bundle

    text = text if isinstance(text, str) else bytes(text or b"").decode("utf-8", "replace")
    if looks_like_bundle(text):
        bundle = json.loads(text)
        if command_line:
            bundle["command"] = _parse_command(command_line)
        return analyze(bundle, explain)
    facts = parse_log(text.splitlines())
    return diagnose(facts, {"command": _parse_command(command_line)} if command_line else {}, explain)


def _parse_command(line: str | None) -> dict:
    if not line:
        return {}
    try:
        from kvreport.cmdline import parse_command

        return parse_command(line)
    except Exception:  # noqa: BLE001 - an unparsable command only loses its flags
        strict.check()
        return {"line": line}


def diagnose(facts: LogFacts, bundle: dict | None = None, explain: bool = False) -> dict:
    """The diagnosis from parsed log facts plus the rest of a bundle (command, devices, model). With ``explain``
    it also holds ``explain``: for every fact, the rule and the log line behind it (:mod:`kvreport.explain`)."""
    bundle = bundle if isinstance(bundle, dict) else {}
    try:
        return _Diagnosis(facts, bundle, explain).run()
    except Exception as exc:  # noqa: BLE001 - the server must always get a diagnosis
        strict.check()
        return _fallback(facts, repr(exc))


def _fallback(facts: LogFacts, why: str) -> dict:
    engine = facts.engine if facts.engine in _ENGINES else "unknown"
    failure = {"phase": "unknown", "backend": "unknown", "failing_device": None, "requested_mib": None,
               "free_mib": None, "allocator_error": None, "final_error": facts.final_error, "verdict": "unknown"}
    return {"analyzer_version": ANALYZER_VERSION, "engine": engine, "failure": failure,
            "memory": _empty_memory(), "findings": [{"kind": "analyzer_error", "text": why[:300], "line": None}],
            "signature": signature({"engine": engine, **failure}), "suggestions": []}


def _empty_memory() -> dict:
    return {"kv_required_mib": None, "rs_required_mib": None, "kv_mib_per_1k_tokens": None, "max_ctx_fit": None,
            "fit": None, "inputs": {"n_ctx": None, "n_seq": None, "n_layer": None, "n_head_kv": None,
                                    "head_dim_k": None, "head_dim_v": None, "cache_type_k": None,
                                    "cache_type_v": None, "n_swa": None, "source": "assumed"}}


# ---------------------------------------------------------------------------------------------
# allocation groups


def _summary_first(fatal: list[_Group]) -> _Group:
    """The first failed group, unless it is only a reason line (a wrapper's summary pasted above the log, "Error: llama
    runner process has terminated: ... error loading model: unable to allocate backend buffer") and a later group holds
    the allocation that failed for the same reason: then that one, which has the numbers."""
    first = fatal[0]
    if first.events or not first.reasons:
        return first
    phases = {r.get("phase") for r in first.reasons}
    return next((g for g in fatal[1:] if g.events and phases & {r.get("phase") for r in g.reasons}), first)


class _Group:
    __slots__ = ("events", "reasons", "closed", "retried", "success_after", "ok_after")

    def __init__(self):
        self.events: list[dict] = []
        self.reasons: list[dict] = []
        self.closed = False
        self.retried = False
        self.success_after = False
        self.ok_after = False

    @property
    def only_pinned(self) -> bool:
        return bool(self.events) and all(e["kind"] == "pinned" for e in self.events) and not self.reasons

    def phase(self) -> str:
        for r in self.reasons:
            if r.get("phase") and r["phase"] != "context":
                return r["phase"]
        if self.reasons:
            return self.reasons[0].get("phase") or "context"
        for e in self.events:
            if e["kind"] == "ggml":
                if e.get("buffer") == "compute":
                    return "compute_buffer"
                if e.get("buffer") in ("weights", "kv"):  # the static allocator named the tensor
                    return "model_weights" if e["buffer"] == "weights" else "kv_cache"
                if e.get("stage") == "weights":
                    return "model_weights"
                if e.get("stage") in ("context", "kv"):
                    return "kv_cache"
                if e.get("fn") == "alloc_tensor_range" and not e.get("stage"):
                    # ggml_backend_alloc_ctx_tensors_from_buft: the weights' buffers, or the KV cache's, which
                    # llama.cpp always follows with its own reason line ("failed to allocate buffer for kv cache")
                    # and which comes after the context stage began; with neither, the weights
                    return "model_weights"
        # only the backend's own line (ggml-cuda's "allocating N MiB on device D: cudaMalloc failed"): llama.cpp's
        # stage when it came places it — still loading the weights, or creating the context (which buffer unknown)
        stage = next((e.get("stage") for e in self.events if e["kind"] == "backend" and e.get("stage")), None)
        # (once the server serves, the weights and the KV were allocated at load: what fails is the graph's scratch)
        return {"weights": "model_weights", "context": "context", "kv": "kv_cache",
                "serving": "compute_buffer"}.get(stage or "", "unknown")

    def ggml(self) -> dict | None:
        for e in self.events:
            if e["kind"] == "ggml":
                return e
        return None

    def backend_events(self) -> list[dict]:
        return [e for e in self.events if e["kind"] == "backend"]


def _groups(events: list[dict], keep_dry: bool = False) -> list[_Group]:
    groups: list[_Group] = []
    cur: _Group | None = None
    prev = ""
    for ev in events:
        if ev.get("dry_run") and not keep_dry:
            continue
        kind = ev["kind"]
        if kind in ("backend", "pinned", "ggml"):
            if cur is None or cur.closed:
                cur = _Group()
                groups.append(cur)
            cur.events.append(ev)
        elif kind == "reason":
            if cur is None or (cur.closed and prev != "reason"):
                cur = _Group()
                groups.append(cur)
            cur.reasons.append(ev)
            # an "open" reason (an exception text follows) keeps the group open for the allocator lines after it
            cur.closed = not ev.get("open")
        elif kind == "retry":
            if cur is not None:
                cur.retried = True
                cur.closed = True
        elif kind == "alloc_ok":
            if cur is not None and not cur.closed:
                cur.closed = True
                cur.ok_after = True
        elif kind == "success":
            for g in groups:
                g.success_after = True
            if cur is not None:
                cur.closed = True
        prev = kind
    return groups


# ---------------------------------------------------------------------------------------------


def _line_of(ev: dict | None) -> list | None:
    return [ev["lineno"], str(ev.get("line") or "")[:300]] if ev and ev.get("lineno") is not None else None


class _Diagnosis:
    def __init__(self, facts: LogFacts, bundle: dict, want_explain: bool = False):
        self.f = facts
        self.b = bundle
        self.want_explain = want_explain
        self.trail: dict = {"rule": None, "events": []}
        self.findings: list[dict] = []
        cmd = bundle.get("command") if isinstance(bundle.get("command"), dict) else {}
        if cmd and not isinstance(cmd.get("flags"), dict) and (cmd.get("line") or cmd.get("argv")):
            parsed = _parse_command(cmd.get("line") or " ".join(map(str, cmd.get("argv") or [])))
            cmd = {**parsed, **{k: v for k, v in cmd.items() if v}}
            cmd["flags"] = parsed.get("flags") or {}
        self.command = cmd
        # the settings the engine printed for itself, below the command's own
        self.flags = {**self._log_flags(), **(dict(cmd.get("flags") or {}) if cmd else {})}

    # -- helpers
    def _log_flags(self) -> dict:
        """The settings the engine printed for itself, typed and named as the command's flags: vLLM's engine config
        and its args line, SGLang's ServerArgs, Ollama's "server config" record (its OLLAMA_* environment). They are
        the current values when the command line does not give them (a fix that "raises" a value to the one in effect
        would be a no-op; Ollama's slots and context size its KV)."""
        f = self.f
        cfg = (f.vllm or {}).get("config") or {}
        out = typed_settings({**cfg, "max_model_len": cfg.get("max_model_len") or cfg.get("max_seq_len"),
                              "enable_chunked_prefill": cfg.get("chunked_prefill_enabled")})
        out.update((f.vllm or {}).get("args") or {})
        out.update((f.sglang or {}).get("args") or {})
        if f.ollama.get("server_env"):
            from kvreport.cmdline import ollama_env_flags

            out.update(ollama_env_flags(f.ollama["server_env"]))
        return out

    def finding(self, kind: str, text: str, line: str | None = None) -> None:
        if len(self.findings) < 30:
            self.findings.append({"kind": kind, "text": text, "line": line})

    def engine(self) -> str:
        e = self.f.engine
        if e in _ENGINES:
            return e
        if e is None and self.f.engine_hints.get("other"):
            return "unknown"
        for cand in ((self.command or {}).get("engine"), ((self.b.get("engine") or {}).get("name")
                                                          if isinstance(self.b.get("engine"), dict) else None)):
            if cand:
                c = str(cand).lower()
                if c in _ENGINES:
                    return c
                if "llama" in c:
                    return "llama.cpp"
        return "unknown"

    # -- failure
    def failure(self) -> dict:
        f = self.f
        # a fit dry run that never finished (the process died inside it) is the real failure
        keep_dry = bool(f.in_fit)
        groups = _groups(f.events, keep_dry)
        fatal: list[_Group] = []
        pinned_fell_back = False
        for i, g in enumerate(groups):
            later_fatal = any(not h.only_pinned for h in groups[i + 1:])
            # pinned host memory falls back to plain host memory: recovered once the log goes on (a later buffer,
            # the server up, a later failure) or an earlier pinned refusal of the same log fell back; a log that ends
            # on its only pinned refusal does not show that the engine carried on
            last = max(e["lineno"] for e in (*g.events, *g.reasons))  # a group may hold only a reason line
            went_on = g.ok_after or g.success_after or i + 1 < len(groups) or pinned_fell_back or \
                any(e.get("fell_back") for e in g.events) or (f.prev_key is not None and f.prev_key[0] > last) or \
                any(e["lineno"] > last for e in f.events if e["kind"] in ("alloc_ok", "success"))
            pinned_fell_back = pinned_fell_back or (g.only_pinned and went_on)
            recovered = (g.only_pinned and went_on) or (g.retried and not later_fatal) or g.success_after
            if recovered:
                self._recovered(g)
            else:
                fatal.append(g)
        self.groups = groups
        real = [e for e in f.events if keep_dry or not e.get("dry_run")]
        engine_events = [e for e in real if e["kind"] == "engine"]
        strong_engine = [e for e in engine_events if not e.get("weak")]
        configs = [e for e in real if e["kind"] == "config"]
        finals = [e for e in real if e["kind"] == "final"]
        out = {"phase": "none", "backend": "unknown", "failing_device": None, "requested_mib": None,
               "free_mib": None, "allocator_error": None, "final_error": None, "verdict": "unknown"}
        self.primary = None
        self.limit = False
        self.kv_update = False
        self.has_memory_event = False
        self.weak = False
        self.summary = None
        self.fit_now: int | None = None
        self.oom_event = None
        self.others_mib = None  # MiB other processes held on the failing device (torch's process list)
        self.torch_oom = False  # the failure is torch's OutOfMemoryError (a Python engine's, whatever the engine)
        self.trail: dict = {"rule": None, "events": []}
        if fatal:
            first = _summary_first(fatal)
            idx = groups.index(first)
            primary = first
            while idx > 0 and groups[idx - 1].retried:
                idx -= 1
                primary = groups[idx]
            seen = set()
            for g in fatal[1:] + ([first] if primary is not first else []):
                gg = g.ggml() or (g.backend_events() or [{}])[0]
                sig = (gg.get("device"), round(gg.get("mib") or 0.0, 2))
                if gg.get("line") and g is not primary and sig not in seen:
                    seen.add(sig)
                    same = sig == ((primary.ggml() or (primary.backend_events() or [{}])[0]).get("device"),
                                   round((primary.ggml() or (primary.backend_events() or [{}])[0]).get("mib") or 0.0, 2))
                    text = ("the same allocation failed again later" if same else
                            f"after that, another allocation failed: {_fmt(gg.get('mib'))} MiB on "
                            f"{gg.get('device') or 'an unnamed device'}")
                    self.finding("secondary_failure", text, gg.get("line"))
            self.primary = primary
            self.trail = {"rule": "logs.llamacpp failure chain (allocation group: backend refusal, ggml buffer, "
                                  "reason)", "events": list(first.reasons) + list(primary.events)}
            phase = self._group_phase(first, primary)
            out.update(self._group_numbers(primary))
            out["phase"] = phase
            self.kv_update = any(r.get("kv_update") for r in first.reasons)
            self.has_memory_event = True
            out["final_error"] = f.final_error
        elif strong_engine:
            self._engine_failure(out, _first_of_burst(strong_engine), real)
        elif self._oom_failure(out, real) or self._fit_failure(out, real):
            pass
        elif engine_events or configs or finals:
            self._unplaced_end(out, engine_events, configs, finals)
        if out["phase"] not in ("none",) and (out["backend"] == "unknown" or not out["failing_device"]):
            self._oom_details(out, real)
        if out["backend"] == "unknown":
            # also when nothing failed: the backend the run used (its device lines, build, platform), not a failure's
            out["backend"] = self._backend_guess()
        if out["backend"] == "cuda" and self.f.vllm.get("platform") == "rocm":
            self._rocm_platform(out)
        if out["phase"] in fixes.MEMORY_PHASES and not out["failing_device"] and out["backend"] not in ("unknown", "cpu"):
            # the log lists exactly one device of the failing backend ("ggml_vulkan: Found 1 Vulkan devices"): that one
            own = [n for n in self.f.devices if backend_of_device(n) == out["backend"]]
            if len(own) == 1:
                out["failing_device"] = own[0]
        self._recovered_events(real)
        self._truncated_prompt()
        self._free_and_verdict(out)
        return out

    def _truncated_prompt(self) -> None:
        """Ollama cut a prompt to its context (runner.go "truncating input prompt"): the answer was made from part
        of the input; the context setting that keeps it whole is the remedy."""
        t = self.f.ollama.get("truncated")
        if t and t.get("prompt") and t.get("limit"):
            self.finding("prompt_truncated", f"Ollama cut a {t['prompt']:,}-token prompt to its {t['limit']:,}-token "
                         f"context: the model saw only part of it; num_ctx (or OLLAMA_CONTEXT_LENGTH) of at least "
                         f"{t['prompt']:,} keeps it whole, at the KV cost of that context", t["line"])

    def _unplaced_end(self, out: dict, engine_events: list[dict], configs: list[dict], finals: list[dict]) -> None:
        """A run that ended on a refusal or an end line, with no allocation failure placed: phase unknown, or
        ``context`` for llama.cpp's "failed to create context" with no refusal before it."""
        f = self.f
        out["phase"] = "unknown"
        last = (engine_events or configs or finals)[-1]
        self.trail = {"rule": f"logs.{last.get('engine') or 'llamacpp'} ({last['kind']}: a refusal or an end "
                              "line that names no memory failure)", "events": [last]}
        ctx_end = next((e for e in finals if _CONTEXT_NOT_CREATED.search(e["line"])), None)
        if ctx_end is not None and not configs and not engine_events:
            # the context's buffers (KV, compute) could not be had and the log does not say which (design.md)
            out["phase"] = "context"
            self.trail = {"rule": "logs.llamacpp (the context could not be created; no refusal line names "
                                  "another cause)", "events": [ctx_end]}
        # the deepest specific reason (``n_seq_max must be <= 256``, ``error loading model: ...``), not the
        # generic epilogue (``exiting due to model loading error``) that follows it
        out["final_error"] = (f.cause_error if configs else None) or f.final_error or last["line"]
        weak = [e for e in engine_events if e.get("weak")]
        if weak:
            self.weak = True
            out["backend"] = weak[-1].get("backend") or "unknown"
            self.has_memory_event = bool(weak[-1].get("oom"))

    def _recovered_events(self, real: list[dict]) -> None:
        """An engine's own word that it met a memory shortage and carried on (SGLang's request retraction)."""
        recovered = [e for e in real if e["kind"] == "recovered"]
        if recovered:
            self.finding("recovered_allocation", f"{recovered[0]['what']} and carried on"
                         + (f" ({len(recovered)} times)" if len(recovered) > 1 else ""), recovered[0]["line"])

    # -- the failure layer (kvreport.logs.oom): memory-error lines that no engine-specific rule read
    def _oom_events(self, real: list[dict]) -> list[dict]:
        """``oom`` events that are the failure: not on a line an engine rule read, not followed by the engine
        coming up (those become ``recovered_allocation`` findings)."""
        read = {e["lineno"] for e in real if e["kind"] in ("backend", "pinned", "ggml", "reason")
                or (e["kind"] == "engine" and not e.get("weak"))}
        success = [e["lineno"] for e in real if e["kind"] == "success"]
        out = []
        for e in real:
            if e["kind"] != "oom" or e["lineno"] in read:
                continue
            if e.get("warn") and not any(x["lineno"] > e["lineno"] and x["kind"] in ("oom", "engine", "final", "config")
                                         for x in real):
                self.finding("recovered_allocation", "the program warned that memory could not be had and the log "
                             "shows no failure after it (it carried on: an allocator that frees its cache and retries, a "
                             "cache layer that skips storing)", e["line"])
                continue
            if any(n > e["lineno"] for n in success) and e.get("rule") not in REQUEST_RULES:
                # (a refused request is final for that request: a server that goes idle after it did not recover it)
                self.finding("recovered_allocation", "a memory error the engine carried on after (it came up later)",
                             e["line"])
                continue
            out.append(e)
        return out

    def _oom_failure(self, out: dict, real: list[dict]) -> bool:
        """Place a failure from the failure layer alone; False when it holds no memory-error line."""
        every = self._oom_events(real)
        evs = [e for e in every if e.get("memory", True)]
        if not evs:
            return self._fatal_failure(out, every, real)
        specific = [e for e in evs if not e.get("generic")]
        ev = (specific or evs)[0] if not any(e.get("mib") for e in (specific or evs)) else \
            next(e for e in (specific or evs) if e.get("mib"))
        self.trail = {"rule": f"logs.oom rule '{ev['rule']}'", "events": [ev]}
        out["phase"] = ev.get("phase") or self._oom_phase(ev)
        if ev.get("rule") in LAZY_ALLOCATOR_RULES and self.engine() in LAZY_ALLOCATOR_ENGINES:
            out["phase"] = "unknown"  # (MLX allocates weights, KV and activations alike inside its command buffers)
        out["backend"] = self._oom_backend(ev)
        out["failing_device"] = self._oom_device(ev)
        out["requested_mib"] = _r2(ev.get("mib"))
        out["free_mib"] = _r2(ev.get("free_mib"))
        out["allocator_error"] = ev["line"]
        out["final_error"] = self.f.final_error or evs[-1]["line"]
        if ev.get("rule") == "ggml-pool" and ev.get("limit_mib") is not None:
            self.limit = True  # the pool's size is the limit the request exceeded (not a device or driver limit)
            self.finding("pool_size", f"ggml's fixed memory pool of {_fmt(ev['limit_mib'])} MiB (sized by llama.cpp "
                         f"itself, not a device limit) was {_fmt((ev.get('mib') or 0) - ev['limit_mib'])} MiB short",
                         ev["line"])
        elif ev.get("count_limit") is not None:
            self.limit = True
            self.finding("alloc_limit", f"the allocator's count of live buffers reached the limit of "
                         f"{ev['count_limit']} that the line names (a number of buffers, not bytes)", ev["line"])
        elif ev.get("limit_mib") is not None and ev.get("mib") is not None and ev["mib"] > ev["limit_mib"]:
            self.limit = True
            self.finding("alloc_limit", f"the request of {_fmt(ev['mib'])} MiB is above a limit of "
                         f"{_fmt(ev['limit_mib'])} MiB that the line names", ev["line"])
        if ev.get("summary"):
            self.summary = ev
            self.finding("summary_line", "a summary of a failure (as typed in an issue or chat), not the engine's "
                         "own log: the numbers are what the line says", ev["line"])
        elif ev.get("generic"):
            self.finding("unrecognized_memory_error", "this line says memory could not be had, but kvreport does not "
                         "know its format fully: the phase is unknown and only what the line itself says is used",
                         ev["line"])
        elif ev.get("rule") in REQUEST_RULES:
            self.finding("request_refused", "a request longer than the context was refused (no allocation failed: the "
                         "context, and the KV cache sized for it, is too small for the request)", ev["line"])
        elif out["phase"] == "kv_capacity":
            self.finding("kv_capacity", "the engine's KV cache holds fewer tokens than it was asked to process (no "
                         "allocation failed; kvreport analyze --explain names the rule that read it)", ev["line"])
        else:
            self.finding("memory_error", "an out-of-memory error of the runtime" + (
                "; the log does not name the buffer it was for" if out["phase"] == "unknown" else "")
                + " (kvreport analyze --explain names the rule that read it)", ev["line"])
        self.has_memory_event = True
        self.oom_event = ev
        self.others_mib = ev.get("others_mib")
        return True

    def _fit_failure(self, out: dict, real: list[dict]) -> bool:
        """llama.cpp's auto-fit (common/fit.cpp, 2025-12+: "projected to use N MiB of device memory vs. M MiB of free
        device memory" ... "failed to fit params to free device memory") gave up with a projection above the free
        memory, and the log shows neither the load coming up nor another failure: a memory failure whose buffer the
        log does not reach (phase unknown), never "no failure"."""
        fit = self.f.fit or {}
        proj, free = fit.get("projected_mib"), fit.get("free_mib")
        if not str(fit.get("status", "")).startswith("failed") or proj is None or free is None or proj <= free:
            return False
        if any(e["kind"] in ("success", "alloc_ok") for e in real):
            return False
        out["phase"] = "unknown"
        out["final_error"] = self.f.final_error
        self.trail = {"rule": "logs.llamacpp auto-fit projection (failed, above free memory)", "events": []}
        self.finding("fit_projection", f"the engine's auto-fit projected {_fmt(proj)} MiB of device memory against "
                     f"{_fmt(free)} MiB free and could not fit the model; the log ends before the load's outcome", None)
        self.has_memory_event = True
        return True

    def _group_phase(self, first: _Group, primary: _Group) -> str:
        """The phase of a failed allocation group: its reason lines, else its buffer; a reason that says nothing more
        is the context; an allocation before the model's load failed is the weights."""
        phase = first.phase() if first.reasons else primary.phase()
        if phase == "unknown" and primary.events:
            # Ollama's new engine names the buffers that failed in its ErrNoMem panic after the backend's line
            # ("insufficient memory - required allocations: {... Cache:[... 167772160F ...]}")
            named = next((e.get("phase_hint") for e in self.f.events if e.get("rule") == "ollama-errnomem"
                          and e.get("phase_hint") and 0 < e["lineno"] - primary.events[-1]["lineno"] <= 20), None)
            if named:
                return named
        if phase == "unknown" and primary.reasons:
            return "context"
        if phase == "context" and not first.reasons and primary.events:
            # a lone backend refusal after the context printed its compute buffers: every buffer of the context was
            # allocated, so this is the running graph's scratch memory (ggml-sycl's pool, ggml-vulkan's preallocation)
            at = primary.events[0]["lineno"]
            if any(b.get("kind") == "compute" and not b.get("dry_run") and (b.get("lineno") or at) < at
                   for b in self.f.buffers):
                return "compute_buffer"
        if phase == "unknown" and primary.events and self._load_failed_after(primary.events[0]["lineno"]):
            return "model_weights"
        return phase

    def _engine_failure(self, out: dict, ev: dict, real: list[dict]) -> None:
        """The failure an engine's own parser placed (its last strong event)."""
        self.trail = {"rule": f"logs.{ev.get('engine') or self.f.engine or 'engine'} parser "
                              f"({ev.get('phase') or 'unknown'})", "events": [ev]}
        out["phase"] = ev.get("phase") or "unknown"
        out["backend"] = ev.get("backend") or "unknown"
        out["failing_device"] = ev.get("device")
        out["requested_mib"] = _r2(ev.get("requested_mib"))
        out["free_mib"] = _r2(ev.get("free_mib"))
        out["allocator_error"] = ev["line"] if ev.get("torch_oom") else None
        self.torch_oom = bool(ev.get("torch_oom"))
        if out["requested_mib"] is None and ev.get("phase") in ("compute_buffer", "model_weights", "kv_cache"):
            self._sizes_from_torch(out, ev, real)
        out["final_error"] = self.f.final_error or ev["line"]
        self.has_memory_event = True
        self.others_mib = ev.get("others_mib")

    @staticmethod
    def _rocm_platform(out: dict) -> None:
        """vLLM on ROCm names its devices "cuda:N" (torch's HIP build); its platform line ("Automatically detected
        platform rocm.") says the backend is ROCm."""
        out["backend"] = "rocm"
        if (out["failing_device"] or "").startswith("CUDA"):
            out["failing_device"] = "ROCm" + out["failing_device"][4:]

    def _sizes_from_torch(self, out: dict, ev: dict, real: list[dict]) -> None:
        """An engine's own OOM line without sizes (TGI's "Not enough memory to handle N prefill tokens", raised from
        the torch OutOfMemoryError just above it, or SGLang's step read on the torch line itself) takes the request,
        the free memory and the device from that torch line when it is within the few lines before."""
        torch = [e for e in real if e is not ev and 0 <= ev["lineno"] - e["lineno"] <= 5 and (
            (e["kind"] == "oom" and e.get("rule") == "torch-oom" and e.get("mib"))
            or (e["kind"] == "engine" and e.get("torch_oom") and e.get("requested_mib")))]
        if not torch:
            return
        t = torch[-1]
        t = {**t, "mib": t.get("mib") or t.get("requested_mib")}
        out["requested_mib"] = _r2(t["mib"])
        out["free_mib"] = out["free_mib"] if out["free_mib"] is not None else _r2(t.get("free_mib"))
        out["allocator_error"] = t["line"]
        self.torch_oom = True
        if not out["failing_device"] and t.get("device_index") is not None and out["backend"] in ("cuda", "rocm"):
            out["failing_device"] = f"{'ROCm' if out['backend'] == 'rocm' else 'CUDA'}{t['device_index']}"

    def _fatal_failure(self, out: dict, fatal: list[dict], real: list[dict]) -> bool:
        """A failure that the log shows but that is not about memory (a panic, a traceback, an assert): phase
        unknown, its line as final_error, no memory fix. Only when no engine rule said anything about the end."""
        if not fatal or any(e["kind"] in ("engine", "config", "final") for e in real):
            return False
        out["phase"] = "unknown"
        self.trail = {"rule": "logs.oom rule 'fatal-words'", "events": [fatal[-1]]}
        out["final_error"] = self.f.cause_error or self.f.final_error or fatal[-1]["line"]
        out["backend"] = next((e["backend"] for e in reversed(fatal) if e.get("backend")), "unknown")
        out["failing_device"] = next((self._oom_device(e) for e in reversed(fatal) if e.get("device_index") is not None),
                                     None)
        self.finding("failure_line", "the log shows a failure that kvreport does not read as a memory error",
                     fatal[-1]["line"])
        return True

    def _oom_phase(self, ev: dict) -> str:
        """A phase from where the error happened, when the error block names it (ggml's CUDA pool is the
        compute scratch memory: ``in function ggml_cuda_pool_malloc`` / ``alloc``); else unknown."""
        fn = ev.get("function") or ""
        if ev.get("phase_hint"):
            return ev["phase_hint"]  # the buffer the line names (ggml-metal's 'data' / 'kv' / 'eval' buffers)
        if fn.startswith(("ggml_cuda_pool", "ggml_cuda_graph", "ggml_cuda_op_", "ggml_cuda_mul_mat",
                          "ggml_cuda_compute_forward")) or fn == "alloc":
            # the scratch pools; a CUDA graph's capture / instantiate; an op of the running graph (cuBLAS's workspace)
            return "compute_buffer"
        if ev.get("py_stage"):
            return ev["py_stage"]  # a Python engine's start-up step (traceback frames, log words)
        # llama.cpp's own stage when the error came: still loading the weights, or creating the context; once the
        # context printed its compute buffer sizes every buffer of it was allocated, and what fails next is the
        # graph's run (its scratch pools): the compute buffer
        if ev.get("stage") == "serving" or (ev.get("stage") == "context" and any(
                "compute" in str(b.get("kind")) and not b.get("dry_run") for b in self.f.buffers or [])):
            return "compute_buffer"  # (serving: the weights and the KV were allocated at load)
        phase = {"weights": "model_weights", "context": "context", "kv": "kv_cache"}.get(
            ev.get("stage") or "", ev.get("fallback_phase") or "unknown")
        return "model_weights" if phase == "unknown" and self._load_failed_after(ev["lineno"]) else phase

    def _load_failed_after(self, lineno: int) -> bool:
        """The run ended with the model's load failing (llama.cpp's loader, a binding relaying it) after ``lineno``:
        an unplaced allocation error before it came while the weights were loading."""
        return any(e["kind"] == "final" and e.get("load_failed") and e["lineno"] > lineno for e in self.f.events)

    def _oom_backend(self, ev: dict) -> str:
        """The backend of a failure-layer event. ggml's CUDA code serves HIP and MUSA builds too, and before 2025 its
        error block said "CUDA error" on every one of them: the log's own device names (``ROCm0``, ``MUSA0``, a
        ``hipMalloc`` call in the block) decide. A process killed for memory on Apple silicon ran out of the unified
        memory Metal shares."""
        backend = ev.get("backend") or "unknown"
        names = [str(n) for n in self.f.devices] + [str(b.get("device")) for b in self.f.buffers]
        if ev.get("rule") in ("ggml-cuda-error", "cuda-malloc-oom", "cublas-alloc"):
            if ev.get("hip") or self.f.cuda_name == "ROCm" or any(n.startswith("ROCm") for n in names):
                return "rocm"
            if self.f.cuda_name == "MUSA" or any(n.startswith("MUSA") for n in names):
                return "musa"
        if ev.get("rule") == "oom-killer" and any(n.startswith(("MTL", "Metal")) for n in names):
            return "metal"
        return backend

    def _oom_device(self, ev: dict) -> str | None:
        if ev.get("device_name"):
            return ev["device_name"]  # the line names the device in ggml's words (Ollama's ErrNoMem blocks)
        idx = ev.get("device_index")
        backend = self._oom_backend(ev)
        if idx is None:
            # one device by construction: Metal (Apple silicon has one GPU), host memory for the host's own errors
            return "Metal" if backend == "metal" else "CPU" if backend == "cpu" and ev.get("memory", True) else None
        # torch's device index on its device type: ggml's name for that backend's device N (NPU 1 -> CANN1)
        prefix = {"rocm": "ROCm", "musa": "MUSA", "cann": "CANN", "sycl": "SYCL"}.get(ev.get("backend") or "", "CUDA") \
            if ev.get("rule") in ("ggml-cuda-error", "torch-oom", "torch-exceed-allowed", "cuda-malloc-oom",
                              "torch-allocator-warning") else None
        if ev.get("rule") == "ggml-cuda-error" or (prefix is None and _GGML_CUDA_BLOCK.search(ev.get("line") or "")):
            # (ggml's CUDA error block, "CUDA error: <any reason>" / "current device: N, in function F", names its
            # device whatever the reason)
            prefix = {"rocm": "ROCm", "musa": "MUSA", "cann": "CANN"}.get(self._oom_backend(ev),
                                                                            ev.get("cuda_name") or "CUDA")
        return f"{prefix}{idx}" if prefix else None

    def _oom_details(self, out: dict, real: list[dict]) -> None:
        """Backend and device of a failure placed by an engine rule, from the memory-error lines around it
        (``CUDA error: out of memory`` / ``current device: 1`` under Ollama's ``llama runner process has
        terminated``)."""
        # the host's own out-of-memory words (the OOM killer's "Killed", ENOMEM, bad_alloc) after a device failure an
        # engine rule placed are how the process ended, not the failing device
        evs = [e for e in real if e["kind"] == "oom" and not e.get("generic") and e.get("memory", True)
               and not (e.get("rule") in HOST_RULES and out["phase"] in ("kv_capacity", "memory_budget"))]
        if not evs:
            # a failure that is not about memory, on the device its own lines name (ggml's CUDA error block "current
            # device: 1" after an illegal memory access; ggml-vulkan's "device lost on Vulkan0")
            named = [e for e in real if e.get("rule") == FATAL.id and (e.get("device_index") is not None
                                                                         or e.get("device_name"))]
            if out["phase"] == "unknown" and not out["failing_device"]:
                out["failing_device"] = next(filter(None, map(self._oom_device, reversed(named))), None)
            return
        ev = evs[-1]
        if out["backend"] == "unknown" and ev.get("backend"):
            out["backend"] = ev["backend"]
        if not out["failing_device"]:
            out["failing_device"] = self._oom_device(ev)
        if not out["allocator_error"]:
            out["allocator_error"] = ev["line"]

    def _recovered(self, g: _Group) -> None:
        ev = (g.events or g.reasons)[0]
        if g.only_pinned:
            text = (f"{_fmt(ev.get('mib'))} MiB of pinned host memory could not be allocated "
                    f"({ev.get('error') or 'no reason given'}); llama.cpp fell back to ordinary host memory")
        elif g.retried:
            text = ("a compute buffer allocation failed with pipeline parallelism and llama.cpp retried without it "
                    f"({_fmt((g.ggml() or ev).get('mib'))} MiB on {(g.ggml() or ev).get('device') or 'the device'})")
        else:
            text = "an allocation failed but the engine carried on and came up"
        self.finding("recovered_allocation", text, ev.get("line"))

    def _group_numbers(self, g: _Group) -> dict:
        gg = g.ggml()
        backends = g.backend_events()
        device = gg.get("device") if gg else None
        requested = gg.get("mib") if gg else None
        if device is None or requested is None:
            for e in backends:
                if device is None and e.get("device"):
                    device = e["device"]
                if requested is None and e.get("mib") is not None:
                    requested = e["mib"]
        if requested is None:
            for e in g.events:
                if e.get("mib") is not None:
                    requested = e["mib"]
                    break
        backend = backend_of_device(device) or backend_of_device(next((e["device"] for e in g.events
                                                                      if e.get("device")), None))
        if backend is None:
            for e in backends:
                if e.get("backend"):
                    backend = e["backend"]
                    break
        detail = [e for e in backends if e.get("detail")]
        alloc = (detail or backends or ([gg] if gg else []) or [{}])[0].get("line")
        self.limit = any(e.get("limit") for e in g.events)
        return {"backend": backend or "unknown", "failing_device": device, "requested_mib": _r2(requested),
                "allocator_error": alloc}

    def _backend_guess(self) -> str:
        """The backend when no failing line names one: a GPU backend the log shows, else "cpu" for a
        log whose every device and buffer is host memory, else unknown."""
        f = self.f
        names = list(f.devices) + [b.get("device") for b in f.buffers]
        for name in names:
            b = backend_of_device(name)
            if b and b != "cpu":
                return b
        if f.cuda_name:
            return {"ROCm": "rocm", "CUDA": "cuda"}.get(f.cuda_name, "unknown")
        for item in f.ollama.get("layout") or []:
            b = backend_of_device(item.get("device"))
            if b and b != "cpu":
                return b
        lib = str(f.ollama.get("gpu_library") or "").lower()
        if lib in ("cuda", "rocm", "vulkan", "metal"):
            return lib
        # (vLLM's "Automatically detected platform cuda.", its engine config's "device_config=cuda" (V0), a V1 GPU
        # worker's records)
        platform = str(f.vllm.get("platform") or ((f.vllm.get("config") or {}).get("device_config"))
                       or ("cuda" if f.vllm.get("gpu_worker") else ""))
        if platform in ("cuda", "rocm", "cpu", "tpu", "xpu"):  # vLLM's "Automatically detected platform cuda."
            return {"xpu": "sycl", "tpu": "unknown"}.get(platform, platform)
        if (names and all(backend_of_device(n) == "cpu" for n in names)) or (not names and f.ctx.get("system_blas") == "0"):
            return "cpu"  # (a 2023-24 system_info line with BLAS = 0: a build without any GPU backend)
        # a backend's own allocator lines, recovered ones included (ggml-cuda's pinned host memory is CUDA's)
        for e in reversed(f.events):
            b = e.get("backend") if e["kind"] in ("pinned", "backend") else \
                backend_of_device(e.get("device")) if e["kind"] == "ggml" else None
            if b and b != "cpu":
                return b
        for line in reversed(f.error_lines or []):  # the error lines' own backend words ("vk::Queue::submit: ...")
            b = backend_of_words(line.lower())
            if b:
                return b
        # the failure layer's lines of the same end (ggml's "…/ggml-sycl/common.hpp:115: SYCL error" under a runner's
        # "process has terminated")
        return next((e["backend"] for e in reversed(f.events) if e["kind"] == "oom" and e.get("backend")), "unknown")

    def _device_free(self, device: str | None, backend: str) -> float | None:
        """Free MiB of ``device`` before the engine loaded, and where that figure came from.

        Precedence (design.md: analyze(bundle) equals analyzing its log):

        1. what the log itself printed (``using device CUDA0 (...) - N MiB free``, ``--list-devices``,
           ggml_cuda_init, llama.cpp's fit report of host memory, Ollama's inventory, Vulkan's budget):
           the engine measured it at load time, nearest to the failure;
        2. ``memory_before_launch`` (``kvreport run`` measured it right before launching the engine);
        3. nothing. ``devices[]`` / ``host.ram_free_mib`` are probes taken when the bundle was
           *collected*, usually after the crash; they never decide the verdict (see
           :meth:`_collect_time_finding`).

        Sets ``self.free_source`` to "log", "before_launch" or None.
        """
        self.free_source = None
        free = self._log_free(device, backend)
        if free is not None and backend == "sycl" and self.f.ctx.get("sycl_free_is_total"):
            # ggml-sycl's get_memory_info without Level Zero sysman: "ext_intel_free_memory is not supported (export/set
            # ZES_ENABLE_SYSMAN=1 to support), use total memory as free memory": the figure is the card's size
            self.finding("free_is_total", "the SYCL driver did not report free memory (ZES_ENABLE_SYSMAN=1 makes it "
                         f"do so): the {_fmt(free)} MiB the log calls free is the device's total; the free memory "
                         "at the failure is not known")
            free = None
        if free is not None:
            self.free_source = "log"
            src = (self.f.devices.get(device or "") or {}).get("source")
            self.trail["free"] = {"rule": f"logs device lines ({src or 'the engine inventory'})", "basis": "log",
                                  "line": next((self.f.source_lines[k] for k in (f"device:{device}", "fit:free",
                                                                                  "free:ollama_gpu", "free:vulkan")
                                                if k in self.f.source_lines), None),
                                  "why": f"the free memory the engine printed for {device or 'the device'} at load"}
            return free
        if device:
            for entry in self.b.get("memory_before_launch") or []:
                if isinstance(entry, dict) and entry.get("device") == device and entry.get("free_mib") is not None:
                    val = to_float(entry["free_mib"])
                    if val is not None:
                        self.free_source = "before_launch"
                        self.trail["free"] = {"rule": "bundle.memory_before_launch", "basis": "bundle",
                                              "why": "measured by kvreport run right before the engine started"}
                        return val
        return None

    def _log_free(self, device: str | None, backend: str) -> float | None:
        """Free MiB of ``device`` as the engine's own log printed it, else None."""
        if device:
            dev = self.f.devices.get(device)
            if dev and dev.get("free_mib") is not None:
                return dev["free_mib"]
            if device.startswith("CPU") or device.endswith("_Host"):
                fit = self.f.fit or {}
                if fit.get("memory") == "host" and fit.get("free_mib"):
                    return fit["free_mib"]
        gpu_avail = [x for x in (self.f.ollama.get("gpu_available_mib") or []) if x is not None]
        if len(gpu_avail) == 1 and backend not in ("cpu", "unknown"):
            return gpu_avail[0]
        if backend == "vulkan" and self.f.ctx.get("vk_free_mib"):
            if not device or device.startswith("Vulkan"):
                return self.f.ctx["vk_free_mib"]
        return None

    def _collect_time_free(self, device: str | None) -> float | None:
        """Free MiB of ``device`` the collector's probes saw when the bundle was collected (not a verdict input)."""
        if not device:
            return None
        for entry in self.b.get("devices") or []:
            if not isinstance(entry, dict):
                continue
            prefix = _DEVICE_PREFIX.get(str(entry.get("backend") or "").lower())
            if prefix and f"{prefix}{entry.get('index')}" == device and entry.get("free_mib") is not None:
                return to_float(entry["free_mib"])
        if device.startswith("CPU") or device.endswith("_Host"):
            host = self.b.get("host") if isinstance(self.b.get("host"), dict) else {}
            if host.get("ram_free_mib") is not None:
                return to_float(host["ram_free_mib"])
        return None

    def _used_before(self, device: str | None, lineno: int | None) -> float:
        """MiB the engine had allocated on ``device`` before the failing line (weights, KV, output...)."""
        if not device:
            return 0.0
        used = 0.0
        host = device.startswith("CPU")
        for buf in self.f.buffers if lineno is not None else []:
            if buf.get("dry_run"):
                continue
            name = buf.get("device") or ""
            # a GPU's "_Mapped" buffers (Metal's mmap-ed weights) sit in that GPU's memory (its working set)
            if name == device or (host and name == "CPU") or (not host and name == device + "_Mapped"):
                used += buf.get("mib") or 0.0
        if not used:
            # Ollama's new engine prints its layout instead ('msg="model weights" buffer=CUDA0 size="9.4 GiB"'): the
            # weights were placed before the KV and graph it then allocates
            used = sum(x.get("mib") or 0.0 for x in self.f.ollama.get("layout") or []
                       if x.get("what") == "model weights" and x.get("device") == device)
        return used

    def _draft_failed(self) -> bool:
        """The failed allocation came after llama-server began loading its speculative-decoding draft model."""
        start = self.f.ctx.get("draft_from_line")
        ev = (self.primary.events[0] if self.primary and self.primary.events else None) or getattr(self, "oom_event",
                                                                                                 None)
        return start is not None and ev is not None and ev.get("lineno", 0) > start

    def _ollama_layer(self, failure: dict) -> dict | None:
        """Ollama's refused layout on the failing GPU (or its only GPU), with the free memory the device had."""
        layouts = self.f.ollama.get("layout_layers") or {}
        dev = failure.get("failing_device") or (next(iter(layouts)) if len(layouts) == 1 else None)
        lay = layouts.get(dev) if dev else None
        free = (self.f.devices.get(dev) or {}).get("free_mib") if dev else None
        return {**lay, "free_mib": free} if lay and free else None

    def _split_room(self, failure: dict) -> float | None:
        """MiB the GPUs of the failing backend would have left, all together, after the failed request: the free
        memory each had at load less what the engine placed on it before the failure, less the request. Below zero
        no --tensor-split can place the load; None when a device's free memory is not in the log."""
        dev, req = failure.get("failing_device"), failure.get("requested_mib")
        backend = backend_of_device(dev)
        if not dev or req is None or backend in (None, "cpu"):
            return None
        names = [n for n in self.f.devices if backend_of_device(n) == backend]
        frees = [(self.f.devices[n] or {}).get("free_mib") for n in names]
        if len(names) < 2 or any(x is None for x in frees):
            return None
        at = self.primary.events[0]["lineno"] if self.primary and self.primary.events else None
        whole = getattr(self, "kv_whole_mib", None)
        if failure.get("phase") == "kv_cache" and whole:
            # the whole KV must fit besides the weights, and each device keeps llama.cpp's compute margin
            weights = sum(b.get("mib") or 0.0 for b in self.f.buffers if b.get("kind") == "model"
                          and not b.get("dry_run") and b.get("device") in names)
            from kvreport.fit import DEFAULT_HEADROOM_MIB
            return sum(frees) - weights - whole - DEFAULT_HEADROOM_MIB * len(names)
        return sum(frees) - sum(self._used_before(n, at) for n in names) - req

    def _only_device(self, out: dict) -> None:
        """A failing line that names no device (ggml-metal's "failed to allocate buffer, size = N MiB") on a backend of
        which the log shows exactly one device: that device."""
        if out["failing_device"] or out["phase"] == "none" or out["backend"] in ("unknown", "cpu"):
            return
        named = next((e["device"] for e in reversed(self.f.events) if e["kind"] == "reason" and e.get("device")
                      and backend_of_device(e["device"]) == out["backend"]), None)
        if named:
            out["failing_device"] = named
            self.trail.setdefault("device_rule", "the buffer type llama.cpp's failure line names")
            return
        devs = [n for n in self.f.devices if backend_of_device(n) == out["backend"]]
        if len(devs) == 1:
            out["failing_device"] = devs[0]
            self.trail.setdefault("device_rule", "the only device of that backend in the log")

    def _free_and_verdict(self, out: dict) -> None:
        self._only_device(out)
        device, backend = out["failing_device"], out["backend"]
        free = out["free_mib"]
        if free is not None:
            ev = next((e for e in self.trail.get("events") or [] if e.get("free_mib") is not None), None)
            self.trail["free"] = {"rule": self.trail.get("rule"), "line": _line_of(ev), "basis": "log",
                                  "why": "the free memory the failing line itself states"}
        from_inventory = free is None
        if free is None and out["phase"] not in ("none",):
            free = self._device_free(device, backend)
        out["free_mib"] = _r2(free)
        self.free_at_failure = None
        if free is not None:
            self._free_at_failure(out, free, device, from_inventory)
        if out["phase"] not in ("none",) and device:
            probe = self._collect_time_free(device)
            if probe is not None:
                self.finding("free_at_collection",
                             f"{_fmt(probe)} MiB free on {device} at collection time (after the failure; not used "
                             "for the verdict)")
        req = out["requested_mib"]
        self.mem_limit = None
        host_alloc = backend == "cpu" or str(device or "").startswith("CPU") or str(device or "").endswith("_Host")
        if out["phase"] not in ("none",) and host_alloc and self.has_memory_event:
            self.mem_limit = self._process_limit()
        if self.mem_limit is not None and self.free_at_failure is not None \
                and self.mem_limit[0] >= self.free_at_failure:
            self.mem_limit = None  # a cap above what the machine had free is not what refused the allocation
        if self.mem_limit is not None and req is not None and self.free_at_failure is not None \
                and req > self.free_at_failure:
            self.mem_limit = None  # the request exceeds the free RAM itself: raising the cap would not help
        if self.mem_limit is not None:
            lim, what = self.mem_limit
            had = f", below the {_fmt(self.free_at_failure)} MiB the machine had free" \
                if self.free_at_failure is not None else ""
            self.finding("memory_limit", f"the process ran under {what}{had}: the refused {_fmt(req)} MiB host "
                         "allocation, with everything the process had already mapped (program, weights, buffers), "
                         "ran into that cap")
        if out["phase"] == "none":
            out["verdict"] = "unknown"
        elif self.limit or self.mem_limit is not None:
            out["verdict"] = "exceeds_alloc_limit"
        elif req is not None and self.free_at_failure is not None:
            # an engine's own memory check refused (memory_budget): its figures are rounded for display ("requires
            # 5.3 GiB, 5.3 GiB available"), so equal figures are the check failing, not a fit
            slack = 0.01 * self.free_at_failure if out["phase"] == "memory_budget" else 0.0
            out["verdict"] = "exceeds_free" if req > self.free_at_failure - slack else "fits_but_failed"
        elif req is not None and (self._total_below(device, backend, req) or self._check_refused()):
            out["verdict"] = "exceeds_free"
        else:
            out["verdict"] = "unknown"

    def _free_at_failure(self, out: dict, free: float, device: str | None, from_inventory: bool) -> None:
        """``self.free_at_failure``: the device's free memory less what the engine placed there before the failure;
        None when the weights went there after a free figure read before loading and their size is not printed."""
        used = self._used_before(device, (self.primary.events[0]["lineno"] if self.primary and self.primary.events else None))
        self.free_at_failure = max(0.0, free - used)
        if from_inventory and not used and self._weights_unsized(out["phase"]):
            self.free_at_failure = None
            self.finding("free_before_load", f"{_fmt(free)} MiB was free on {device} before loading; the weights "
                         "were placed there after that (offloaded layers) and the log does not give their size, "
                         "so the free memory at the failure is not known")
        if used:
            when = {"log": "as the engine reported it at load", "before_launch": "measured right before launch"
                    }.get(getattr(self, "free_source", None), "")
            self.finding("free_after_allocations",
                         f"{_fmt(free)} MiB free on {device} before loading ({when}); {_fmt(used)} MiB already "
                         f"allocated there (weights, KV, output) left {_fmt(self.free_at_failure)} MiB"
                         if when else
                         f"{_fmt(free)} MiB free on {device}; {_fmt(used)} MiB already allocated there "
                         f"(weights, KV, output) left {_fmt(self.free_at_failure)} MiB")

    def _weights_unsized(self, phase: str) -> bool:
        """A failure after the weights were loaded onto the GPU (KV, compute, context) in a log that says layers were
        offloaded (llama.cpp's "offloaded 37/37 layers to GPU", Ollama's layers.offload) but prints no buffer sizes."""
        off = str(self.f.ctx.get("offloaded_layers") or "").split("/")[0]
        return phase in ("kv_cache", "compute_buffer", "context") and off.isdigit() and int(off) > 0

    def _check_refused(self) -> bool:
        """The engine's own check said its need is above what it has (vLLM's KV check), though the line was cut before
        the free figure."""
        return any(e.get("refused") for e in self.trail.get("events") or [])

    def _total_below(self, device: str | None, backend: str, req: float) -> bool:
        """No free figure at the failure, but an upper bound on it is below the request, so it exceeded what was free
        whatever that was: the device's whole memory (as its init line prints it: ``VRAM: 7882 MiB``), or what
        Ollama's scheduler saw free before loading anything (``memory.available`` of its one GPU). Not for Metal and
        host memory, whose printed totals are a working-set recommendation or exclude swap."""
        if backend in ("metal", "cpu", "unknown"):
            return False
        total = (self.f.devices.get(device or "") or {}).get("total_mib")
        if total and req > total:
            self.finding("request_above_total", f"the failed {_fmt(req)} MiB is more than {device}'s whole memory "
                         f"({_fmt(total)} MiB): it cannot fit there, whatever else is loaded")
            return True
        avail = [x for x in self.f.ollama.get("offload_available_mib") or [] if x is not None]
        if len(avail) == 1 and req > avail[0]:
            self.finding("request_above_total", f"the failed {_fmt(req)} MiB is more than the {_fmt(avail[0])} MiB "
                         "Ollama saw free on the GPU before loading anything (memory.available)")
            return True
        return False

    def _process_limit(self) -> tuple[float, str] | None:
        """The smallest per-process memory limit the bundle records, as (MiB, words), else None.

        ``command.limits`` (kvreport.cmdline: ``ulimit -v/-d`` and ``prlimit --as`` in KiB, docker ``--memory`` in
        MiB) are the engine's own; ``host.address_space_limit_mib`` / ``host.memory_limit_mib`` are the collector's
        (RLIMIT_AS, cgroup memory.max), which an engine started the same way inherits. ``ulimit -m`` is not enforced
        by Linux and is ignored."""
        cmd = self.command or {}
        lim = cmd.get("limits") if isinstance(cmd.get("limits"), dict) else {}
        cands: list[tuple[float, str]] = []
        for key, word in (("address_space_limit_kib", "an address-space limit of ulimit -v"),
                          ("data_limit_kib", "a data-segment limit of ulimit -d")):
            v = to_float(lim.get(key))
            if v and v > 0:
                cands.append((v / 1024.0, f"{word} {int(v)} ({_fmt(v / 1024.0)} MiB)"))
        v = to_float(lim.get("container_memory_limit_mib"))
        if v and v > 0:
            cands.append((v, f"a container memory limit of {_fmt(v)} MiB (docker --memory)"))
        if not cands:
            host = self.b.get("host") if isinstance(self.b.get("host"), dict) else {}
            for key, word in (("address_space_limit_mib", "an address-space limit (RLIMIT_AS, ulimit -v)"),
                              ("memory_limit_mib", "a cgroup memory limit (memory.max)")):
                v = to_float(host.get(key))
                if v and v > 0:
                    cands.append((v, f"{word} of {_fmt(v)} MiB where kvreport ran"))
        return min(cands) if cands else None

    # -- memory
    def config(self) -> dict:
        """The context configuration the engine allocated (log first, then the command's flags)."""
        f, fl = self.f, self.flags
        ctx = f.ctx if f.ctx.get("n_ctx") or f.ctx.get("kv_size") else {**f.dry_ctx, **f.ctx}
        n_ctx = to_int(ctx.get("n_ctx")) or to_int(ctx.get("kv_size"))
        src = "log" if n_ctx else None
        fit_change = ((f.fit or {}).get("changed") or {}).get("n_ctx")
        if not n_ctx and fit_change:
            n_ctx, src = fit_change[1], "log"
        full = [k for k in f.kv_caches if not k.get("dry_run") and k.get("section") in ("", "non-SWA", "main")
                and k.get("cells")]
        if not n_ctx and full:
            n_ctx, src = full[-1]["cells"] * (full[-1].get("n_stream") or 1), "log"
        if not n_ctx and isinstance(fl.get("n_ctx"), int):
            n_ctx, src = fl["n_ctx"], "command"
        if not n_ctx and f.ollama.get("kv_size"):
            n_ctx, src = f.ollama["kv_size"], "log"
        if not n_ctx and self.summary and self.summary.get("n_ctx"):
            n_ctx, src = int(self.summary["n_ctx"]), "log"  # a typed summary: "requested ctx=262144"
        per_request = False
        if not n_ctx and isinstance(fl.get("context_length"), int):
            n_ctx, src, per_request = fl["context_length"], "command", True
        sl = f.source_lines
        self.trail["n_ctx_line"] = next((sl[k] for k in ("ctx:n_ctx", "ctx:kv_size", "fit:ctx", "kv",
                                                         "ctx:ollama_kv_size") if k in sl), None) \
            if src == "log" else None
        if src == "log" and self.trail["n_ctx_line"] is None and self.summary:
            self.trail["n_ctx_line"] = [self.summary["lineno"], self.summary["line"][:300]]
        n_seq = to_int(ctx.get("n_seq_max"))
        n_seq_known = bool(n_seq)
        if not n_seq:
            par = fl.get("n_parallel") if fl.get("n_parallel") is not None else fl.get("num_parallel")  # (Ollama's env)
            n_seq = par if isinstance(par, int) and par > 0 else to_int(f.ctx.get("n_parallel_auto")) or \
                f.ollama.get("parallel") or None
            n_seq_known = n_seq is not None
            n_seq = n_seq or 1
        if per_request and f.ollama and n_seq_known and n_seq > 1:
            n_ctx *= n_seq  # (OLLAMA_CONTEXT_LENGTH is each request's: the runner's context is it x the slots)
        uni = ctx.get("kv_unified")
        if uni is not None:
            kv_unified = str(uni).lower() in ("true", "1")
        elif isinstance(fl.get("kv_unified"), bool):
            kv_unified = fl["kv_unified"]
        elif f.ollama:
            kv_unified = False
        else:
            kv_unified = n_seq <= 1 or f.ctx.get("n_parallel_auto") is not None
        real = [k for k in f.kv_caches if not k.get("dry_run")] or list(f.kv_caches)
        typed = (getattr(self, "summary", None) or {}).get("cache_type_k")  # a typed summary's "-ctk q8_0"
        tk = (real[-1].get("type_k") if real else None) or ctx.get("type_k") or fl.get("cache_type_k") or \
            f.ollama.get("kv_cache_type") or typed or "f16"
        tv = (real[-1].get("type_v") if real else None) or ctx.get("type_v") or fl.get("cache_type_v") or \
            f.ollama.get("kv_cache_type") or typed or "f16"
        fa_raw = str(ctx.get("flash_attn") or fl.get("flash_attn") or "").lower()
        flash = False if fa_raw in ("0", "disabled", "off", "false") else True if fa_raw else None
        swa_full = str(ctx.get("swa_full") or "").lower() == "true" or bool(fl.get("swa_full"))
        n_ubatch = to_int(ctx.get("n_ubatch")) or (fl.get("n_ubatch") if isinstance(fl.get("n_ubatch"), int) else None)
        n_batch = to_int(ctx.get("n_batch")) or (fl.get("n_batch") if isinstance(fl.get("n_batch"), int) else None)
        return {"n_ctx": n_ctx, "n_ctx_source": src, "n_seq": n_seq, "n_seq_known": n_seq_known, "kv_unified": kv_unified,
                "cache_type_k": str(tk), "cache_type_v": str(tv), "flash_attn": flash, "swa_full": swa_full,
                "n_ubatch": n_ubatch, "n_batch": n_batch}

    def shape(self):
        """The model geometry: what the engine printed (print_info / llm_load_print_meta hparams, the
        ``llama_model_loader: - kv`` lines) first; the GGUF metadata the collector read
        (``bundle.model.gguf``, ``--model``) only when the log has none, or when it agrees with the log (it is
        then the more exact of the two: full per-layer arrays). A GGUF that disagrees with the log (another
        file than the one the engine loaded) becomes a ``gguf_log_mismatch`` finding and is not used."""
        try:
            from kvreport import kvcache
        except Exception:  # noqa: BLE001
            strict.check()
            return None, None
        model = self.b.get("model") if isinstance(self.b.get("model"), dict) else {}
        meta = model.get("gguf") if isinstance(model.get("gguf"), dict) else None
        from_gguf = from_log = None
        if meta:
            try:
                from kvreport.gguf_meta import shape_from_metadata

                from_gguf = shape_from_metadata(meta)
            except Exception:  # noqa: BLE001 - fall back to the log
                strict.check()
                from_gguf = None
        if self.f.hparams or self.f.gguf_kv:
            try:
                from_log = kvcache.shape_from_hparams(self.f.hparams, self.f.gguf_kv)
            except Exception:  # noqa: BLE001
                strict.check()
                from_log = None
        if from_gguf is not None and from_log is not None:
            def geo(x):
                return (x.n_layer, tuple(x.n_head_kv), tuple(x.head_dim_k), tuple(x.head_dim_v))

            if geo(from_gguf) != geo(from_log):
                def words(x):
                    heads = sorted(set(x.n_head_kv))
                    dims = sorted(set(x.head_dim_k))
                    return (f"{x.n_layer} layers x {heads[0] if len(heads) == 1 else heads} KV heads x "
                            f"{dims[0] if len(dims) == 1 else dims} head dim")
                self.finding("gguf_log_mismatch", f"the model file given ({words(from_gguf)}) does not match the model "
                             f"the engine printed in its log ({words(from_log)}); the log's geometry is used")
                return kvcache, from_log
            return kvcache, from_gguf
        return kvcache, (from_log if from_log is not None else from_gguf)

    def printed_kv(self, failure: dict | None = None) -> tuple[float | None, bool]:
        """The KV MiB the engine printed for its last real attempt (or for the fit dry run); from per-device buffer
        lines, with the KV buffer that failed on another device added (the attempt's KV spans both)."""
        def last_set(items):
            sets: list[list[dict]] = []
            for k in items:
                if not sets or k.get("section") in ("", "non-SWA", "main"):
                    sets.append([k])
                else:
                    sets[-1].append(k)
            return sets[-1] if sets else []

        real = [k for k in self.f.kv_caches if not k.get("dry_run")]
        if real:
            return sum(k["mib"] for k in last_set(real)), False
        dry = [k for k in self.f.kv_caches if k.get("dry_run")]
        if dry:
            return sum(k["mib"] for k in last_set(dry)), True
        # no total line (or one cut short, as pasted): the per-device "<dev> KV buffer size = N MiB" lines of the last
        # context the engine created (a device seen again starts the next one)
        bufs = [b for b in self.f.kv_buffers if not b.get("dry_run")]
        last: list[dict] = []
        for b in bufs:
            if any(x["device"] == b["device"] and x.get("section") == b.get("section") for x in last):
                last = []
            last.append(b)
        if not last:
            return None, False
        total = sum(b["mib"] for b in last)
        if failure and failure.get("phase") == "kv_cache" and failure.get("requested_mib") \
                and failure.get("failing_device") and failure["failing_device"] not in {b["device"] for b in last}:
            total += failure["requested_mib"]  # ("CUDA0 KV buffer size = 5248 MiB", then CUDA1's 4992 MiB failed)
        return total, False

    def memory(self, failure: dict) -> tuple[dict, dict]:
        """The memory section: KV inputs, the KV size (printed, else computed, else the failed buffer), recurrent
        state, the engine's fit step, and the largest contexts that fit the failing device's KV budget."""
        f = self.f
        cfg_d = self.config()
        kvcache, shape = self.shape()
        mem = _empty_memory()
        inputs = mem["inputs"]
        inputs.update({"n_ctx": cfg_d["n_ctx"], "n_seq": cfg_d["n_seq"], "cache_type_k": cfg_d["cache_type_k"],
                       "cache_type_v": cfg_d["cache_type_v"]})
        size, cfg = self._size_from_shape(kvcache, shape, cfg_d, failure, inputs) if shape is not None else (None, None)
        printed, printed_dry = self.printed_kv(failure)
        kv = self._pick_kv(failure, size, printed, printed_dry)
        mem["kv_required_mib"] = _r2(kv)
        if failure["phase"] == "kv_cache" and failure.get("requested_mib") and (size is not None or printed):
            # (the whole configuration's KV, and the one buffer that failed: their ratio is that device's share)
            self.failed_kv_mib, self.kv_whole_mib = failure["requested_mib"], kv
        real_rs = [r for r in f.rs_caches if not r.get("dry_run")]
        if real_rs:
            mem["rs_required_mib"] = _r2(real_rs[-1]["mib"])
        elif size is not None and size.rs_bytes:
            mem["rs_required_mib"] = _r2(size.rs_mib)
        if size is not None and size.bytes_per_token:
            mem["kv_mib_per_1k_tokens"] = _r2(size.bytes_per_token * 1024 / MIB)
        self._fit_step(mem)
        budget_mib = self._kv_budget(failure, kv)
        if shape is not None and cfg is not None and budget_mib is not None and budget_mib > 0:
            share = self._kv_share(failure.get("failing_device"))
            fits = {}
            budget_mib = self._no_fa_budget(kvcache, shape, cfg, cfg_d, budget_mib, share, failure)
            for t in ("f16", "q8_0", "q4_0"):
                c = cfg.with_(cache_type_k=t, cache_type_v=t, flash_attn=True if t != "f16" else cfg.flash_attn)
                fits[t] = int(kvcache.max_ctx_fit(shape, budget_mib * MIB / share, c))
            mem["max_ctx_fit"] = fits
            if cfg.cache_type_k != cfg.cache_type_v:  # (-ctk q8_0 alone: the pair in use, not a same-type row)
                self.fit_now = int(kvcache.max_ctx_fit(shape, budget_mib * MIB / share, cfg))
        self.derived_bpt = None
        layout = getattr(self, "kv_from_layout", False)
        if shape is None and (failure["phase"] == "kv_cache" or layout) and kv is not None and cfg_d["n_ctx"] \
                and not printed and self._single_kv_device(failure.get("failing_device")):
            self._per_token_from_buffer(mem, kv, cfg_d, budget_mib,
                                        "Ollama's memory layout" if layout else "the failed KV buffer")
        self.size, self.cfg, self.shape_obj, self.kvcache = size, cfg, shape, kvcache
        self.budget_mib = budget_mib
        return mem, cfg_d

    def _size_from_shape(self, kvcache, shape, cfg_d: dict, failure: dict, inputs: dict):
        """The model's KV inputs into ``inputs`` and kvreport's KV size for the configuration the engine allocated:
        (KVSize or None, KVConfig)."""
        inputs["source"] = shape.source if shape.source in ("gguf", "log") else "log"
        inputs["n_layer"] = shape.n_layer
        kv_layers = [i for i in range(shape.n_layer) if not shape.has_kv or shape.has_kv[i]]

        def one_or_all(values):
            vals = sorted({values[i] for i in kv_layers}) if kv_layers else []
            return vals[0] if len(vals) == 1 else (vals or None)

        inputs["n_head_kv"] = one_or_all(shape.n_head_kv)
        inputs["head_dim_k"] = one_or_all(shape.head_dim_k)
        inputs["head_dim_v"] = one_or_all(shape.head_dim_v)
        inputs["n_swa"] = shape.n_swa or None
        n_ctx = cfg_d["n_ctx"] or shape.n_ctx_train or 4096
        unsized = not cfg_d["n_ctx"] and failure["phase"] == "unknown" and not self.has_memory_event \
            and not self.f.kv_caches
        if not cfg_d["n_ctx"]:
            inputs["source"] = "assumed"
            inputs["n_ctx"] = n_ctx
        build = self.f.build if self.f.build and self.f.build > 0 else None
        cfg = kvcache.KVConfig(n_ctx=n_ctx, n_seq=max(1, cfg_d["n_seq"] or 1), kv_unified=cfg_d["kv_unified"],
                               cache_type_k=cfg_d["cache_type_k"], cache_type_v=cfg_d["cache_type_v"],
                               flash_attn=cfg_d["flash_attn"] is not False, swa_full=cfg_d["swa_full"],
                               n_ubatch=cfg_d["n_ubatch"] or 512, build=build)
        if unsized:
            # no cache was configured or sized before a failure that is not about memory: print no KV
            inputs["n_ctx"] = None
            return None, cfg
        size = kvcache.kv_size(shape, cfg)
        inputs["n_ctx"] = size.n_ctx
        return size, cfg

    def _pick_kv(self, failure: dict, size, printed: float | None, printed_dry: bool) -> float | None:
        """The KV size: printed by the engine for its real attempt, else computed, else the dry run's, else the failed
        KV buffer, else SGLang's pool or Ollama's layout."""
        f = self.f
        computed = size.kv_mib if size is not None else None
        if printed is not None and not printed_dry:
            kv = printed
        elif computed is not None:
            kv = computed
        elif printed is not None:
            kv = printed
            self.finding("dry_run_kv", f"the KV size comes from the auto-fit dry run ({_fmt(printed)} MiB); "
                         "the real attempt did not print one")
        elif failure["phase"] == "kv_cache" and f.ollama.get("nomem_cache_mib"):
            kv = f.ollama["nomem_cache_mib"]
            self.finding("kv_from_ollama_layout", f"the KV size is the Cache list of Ollama's insufficient-memory table "
                         f"({_fmt(kv)} MiB, allocated and failed entries together)")
        elif failure["phase"] == "kv_cache" and failure["requested_mib"] is not None:
            kv = failure["requested_mib"]
            self.finding("kv_from_failed_buffer", "the log has no model parameters; the KV size is the failed KV "
                         f"buffer ({_fmt(kv)} MiB), a lower bound when the KV spans several devices")
        else:
            kv = None
        if printed is not None and computed is not None and not printed_dry and printed > 0 \
                and abs(computed - printed) / printed > 0.005:
            self.finding("kv_model_mismatch", f"kvreport's arithmetic gives {_fmt(computed)} MiB but the engine "
                         f"printed {_fmt(printed)} MiB; the printed value is used")
        if kv is None and f.sglang.get("kv_mib"):
            kv = f.sglang["kv_mib"]
        if kv is None and f.kv_pool_mib:
            kv = f.kv_pool_mib
        if kv is None and f.ollama.get("layout"):
            kvs = [x["mib"] for x in f.ollama["layout"] if x.get("what") == "kv cache" and x.get("mib")]
            if kvs:
                kv = sum(kvs)
                self.kv_from_layout = True
                self.finding("kv_from_ollama_layout", f"the KV size is Ollama's own memory layout ({_fmt(kv)} MiB)")
        return kv

    def _fit_step(self, mem: dict) -> None:
        """The engine's own auto-fit step (llama.cpp --fit, vLLM's max_model_len auto-fit) and its findings."""
        fit = self.f.fit
        if not fit:
            return
        mem["fit"] = {"ran": bool(fit.get("ran")), "status": fit.get("status") or "unknown",
                      "changed": dict(fit.get("changed") or {})}
        ch = (fit.get("changed") or {}).get("n_ctx")
        if ch:
            self.finding("fit_changed_ctx", f"the engine's auto-fit lowered n_ctx from {ch[0]} to {ch[1]}")
        if str(fit.get("status", "")).startswith("failed"):
            self.finding("fit_failed", "the engine's auto-fit could not make the model fit and left the "
                         "parameters as they were (the load that follows uses them unchanged)", None)

    def _per_token_from_buffer(self, mem: dict, kv: float, cfg_d: dict, budget_mib: float | None,
                               source: str = "the failed KV buffer") -> None:
        """No model parameters, but a KV size for all n_ctx cells (the failed KV buffer, Ollama's layout of the KV it
        planned): its cost per token, and the contexts that fit the budget at it."""
        self.derived_bpt = kv * MIB / float(cfg_d["n_ctx"])
        mem["kv_mib_per_1k_tokens"] = _r2(self.derived_bpt * 1024 / MIB)
        self.finding("kv_per_token_from_buffer",
                     f"{_fmt(mem['kv_mib_per_1k_tokens'])} MiB of KV per 1k tokens, derived from {source} "
                     f"({_fmt(kv)} MiB) for n_ctx {cfg_d['n_ctx']}")
        if budget_mib is not None and budget_mib > 0:
            cur = _BYTES_PER_VALUE.get(str(cfg_d["cache_type_k"]), 2.0)
            mem["max_ctx_fit"] = {t: int(budget_mib * MIB / (self.derived_bpt * _BYTES_PER_VALUE[t] / cur)) // 256 * 256
                                  for t in ("f16", "q8_0", "q4_0")}

    def _rounded_ctx(self) -> int | None:
        """N from ``n_ctx is not divisible by n_seq_max - rounding down to N`` (llama_context, llama.cpp)."""
        for w in self.f.warnings:
            if "rounding down to" in w:
                n = to_int(w.rsplit("rounding down to", 1)[1].strip().split()[0].rstrip(".,")) if \
                    w.rsplit("rounding down to", 1)[1].strip() else None
                if n:
                    return n
        return None

    def _single_kv_device(self, device: str | None) -> bool:
        """True when the log shows the KV on one device only (the failed buffer is then the whole KV)."""
        f = self.f
        devs = {b["device"] for b in f.kv_buffers} | {b["device"] for b in f.buffers if b.get("kind") == "model"}
        devs |= {n for n in f.devices if backend_of_device(n) not in (None, "cpu")}
        devs = {d for d in devs if d and not str(d).endswith(("_Host", "_Mapped"))}
        if device:
            devs.add(device)
        return len(devs) <= 1

    def _kv_share(self, device: str | None) -> float:
        """Fraction of the KV that lives on ``device``: from the per-device KV buffer lines; else, when the KV buffer
        of ``device`` is the one that failed and the layers are split over several GPUs (llama.cpp allocates each
        layer's KV on that layer's device), the failed buffer over the whole KV of the configuration."""
        bufs = [b for b in self.f.kv_buffers if not b.get("dry_run")] or list(self.f.kv_buffers)
        total = sum(b["mib"] for b in bufs)
        if device and total > 0:
            mine = sum(b["mib"] for b in bufs if b["device"] == device)
            if mine > 0:
                return mine / total
        failed, whole = getattr(self, "failed_kv_mib", None), getattr(self, "kv_whole_mib", None)
        gpus = {b.get("device") for b in self.f.buffers if b.get("kind") == "model" and not b.get("dry_run")
                and backend_of_device(b.get("device")) not in (None, "cpu")}
        if device and failed and whole and len(gpus) >= 2 and device in gpus and 0.05 < failed / whole < 0.98:
            return failed / whole
        return 1.0

    def _no_fa_budget(self, kvcache, shape, cfg, cfg_d: dict, budget_mib: float, share: float, failure: dict) -> float:
        """Without flash attention llama.cpp's compute buffer holds the attention scores of a micro-batch against the
        whole cache (n_kv x n_ubatch x n_head f32) and the logits (n_ubatch x n_vocab f32): at the context that fits
        it can exceed the margin kept for it. The budget is lowered until the margin covers that buffer at the context
        it gives (a few steps; each only shrinks the context)."""
        hp = self.f.hparams
        n_head, n_vocab = to_int(hp.get("n_head")), to_int(hp.get("n_vocab")) or 0
        head = getattr(self, "headroom_mib", None)
        if cfg_d.get("flash_attn") is not False or failure["phase"] != "kv_cache" or not n_head or head is None \
                or getattr(self, "headroom_printed", False):
            return budget_mib
        ub = cfg_d.get("n_ubatch") or 512
        budget_mib, head = kvcache.no_fa_budget(shape, cfg, budget_mib, head, ub, n_head, n_vocab, share)
        if head != self.headroom_mib:
            self.headroom_mib = head
            self.headroom_why = (f"{_fmt(head)} MiB for the compute buffer: without flash attention it holds the "
                                 f"attention scores (n_kv x {ub} x {n_head} heads x 4 B) and the logits")
            self.finding("kv_headroom_no_fa", f"flash attention is off: the compute buffer at the context that fits "
                         f"is about {_fmt(head)} MiB, kept out of the KV's budget ({_fmt(budget_mib)} MiB)")
        return budget_mib

    def _budget_less(self, free: float, head: float, why: str, dev: str | None) -> float:
        """The KV's budget: ``free`` less the compute headroom ``head`` (``why``: what it is), said as a finding."""
        self.headroom_mib, self.headroom_why = head, why
        budget = max(0.0, free - head)
        self.finding("kv_headroom", f"the largest context that fits counts the KV alone within the {_fmt(free)} MiB left on "
                     f"{dev or 'the failing device'} minus {why}: {_fmt(budget)} MiB")
        return budget

    def _kv_budget(self, failure: dict, kv: float | None) -> float | None:
        """MiB available to the KV cache on the failing device."""
        free = getattr(self, "free_at_failure", None)
        if free is None:
            return None
        if getattr(self, "mem_limit", None) is not None:
            # the process cap, not the machine's RAM, bounds a host KV (an upper bound: the cap also counts the
            # program and the weights)
            free = min(free, self.mem_limit[0])
        if failure["phase"] == "kv_cache" and not getattr(self, "torch_oom", False):
            # (a Python engine's KV pool that torch failed to allocate has no llama.cpp compute buffer after it)
            # leave room for the compute buffer llama.cpp allocates on the same device right after the KV: the one
            # the log printed for that device (real attempt, else the fit dry run), else llama.cpp's --fit target
            # margin (-fitt, 1024 MiB; kvreport.fit.DEFAULT_HEADROOM_MIB), as ``kvreport fit`` does
            dev = failure.get("failing_device")
            comp = [b["mib"] for b in self.f.buffers if b.get("kind") == "compute" and dev and b.get("device") == dev
                    and b.get("mib")]
            self.headroom_printed = bool(comp)
            if comp:
                head, why = max(comp), f"the {_fmt(max(comp))} MiB compute buffer the log printed for {dev}"
            else:
                from kvreport.fit import DEFAULT_HEADROOM_MIB

                head, why = DEFAULT_HEADROOM_MIB, (f"{_fmt(DEFAULT_HEADROOM_MIB)} MiB for the compute buffer "
                                                   "(llama.cpp's --fit target margin, -fitt)")
                if free < 2 * DEFAULT_HEADROOM_MIB and getattr(self, "mem_limit", None) is None:
                    # a small device: the margin would leave nothing; a compute buffer of a small context on it is
                    # a few hundred MiB, so keep half of what is free for it
                    head, why = free / 2, (f"half of it ({_fmt(free / 2)} MiB) for the compute buffer (llama.cpp's "
                                           f"--fit margin of {_fmt(DEFAULT_HEADROOM_MIB)} MiB is more than the device has)")
            return self._budget_less(free, head, why, dev)
        if failure["phase"] == "context" and getattr(self, "kv_from_layout", False):
            # Ollama planned KV and compute graph on that device and the context could not be created: the KV must
            # leave room for the graph its own layout gives there
            dev = failure.get("failing_device")
            graph = sum(x["mib"] for x in self.f.ollama.get("layout") or []
                        if x.get("what") == "compute graph" and x.get("mib") and (not dev or x.get("device") == dev))
            return self._budget_less(free, graph, f"the {_fmt(graph)} MiB compute graph of Ollama's layout", dev)
        if failure["phase"] == "compute_buffer" and failure["requested_mib"] is not None:
            # the KV was already allocated there; it must leave room for the compute buffer
            mine = kv * self._kv_share(failure.get("failing_device")) if kv else 0.0
            return free + mine - failure["requested_mib"]
        return None

    # -- findings from the log
    def log_findings(self, failure: dict, cfg_d: dict) -> None:
        f = self.f
        missing = self.flags.get("_missing_value")
        if missing:
            self.finding("command_incomplete", f"the command line ends with {', '.join(map(str, missing))} and no value "
                         "for it (the engine refuses such a line too): no changed command is printed, as a rewrite would "
                         "hand the option the next flag as its value")
        for w in f.warnings[:5]:
            if "rounding down to" in w:
                self.finding("ctx_inflated_by_parallel",
                             "n_ctx is not divisible by the parallel slots: llama.cpp rounded each slot UP to a "
                             "multiple of 256 cells (the warning says 'down')", w)
            elif "> n_ctx_train" in w:
                self.finding("ctx_exceeds_train", "the context per sequence is larger than the model was trained "
                             "for", w)
        n_train = to_int(f.hparams.get("n_ctx_train"))
        if n_train and cfg_d.get("n_ctx") and "n_ctx" not in self.flags and (self.command or {}).get("flags") and \
                cfg_d["n_ctx"] >= n_train and failure["phase"] == "kv_cache" and self.engine() != "ollama":
            self.finding("default_ctx", f"no -c was given, so llama.cpp used the model's full training context "
                         f"({n_train} tokens)")
        if getattr(self, "others_mib", None):
            self.finding("other_processes", f"other processes held {_fmt(self.others_mib)} MiB of the device when the "
                         "allocation failed (the process list of torch's out-of-memory message)")
        gate = f.vllm.get("gate")
        if gate and gate.get("free_mib") is not None and gate.get("total_mib"):
            other = gate["total_mib"] - gate["free_mib"]
            self.finding("other_processes", f"{_fmt(other)} MiB of the {_fmt(gate['total_mib'])} MiB GPU were "
                         "already in use by other processes at start-up")
        self.repeat_findings()
        devices = self.b.get("devices") if isinstance(self.b.get("devices"), list) else []
        for entry in devices:
            if isinstance(entry, dict) and isinstance(entry.get("processes"), list):
                names = ", ".join(str(p.get("name")) for p in entry["processes"][:5] if isinstance(p, dict))
                self.finding("other_processes",
                             f"processes on {entry.get('name') or 'a device'} at collection time: {names}")

    def repeat_findings(self) -> None:
        """A log of a crash loop: the earlier runs that failed (counted by :meth:`LogFacts.fold`, their facts not
        kept) — how often this failure repeated, and how many failed another way."""
        repeats = getattr(self.f, "repeats", None) or {}
        if not repeats:
            return
        key = self.f.run_key()
        same = repeats.get(key, 0) if key else 0
        other = sum(repeats.values()) - same
        if same:
            self.finding("repeated_failure", f"this failure repeated {same + 1} times in this log "
                         f"({self.f.runs} runs in all); the diagnosis is of the last one")
        if other:
            top = max(repeats.items(), key=lambda kv: (kv[1], kv[0]) if kv[0] != key else (-1, ""))
            self.finding("earlier_failures", f"{other} earlier run(s) of this log failed another way (most often, "
                         f"{top[1]} times: {top[0][:200]})")

    def summary_numbers(self, failure: dict, mem: dict, cfg_d: dict) -> None:
        """A typed summary line (``failed to allocate KV cache (requested ctx=262144, gpu memory free=1024 MiB)``):
        with the model known (``--model``, the command's GGUF, the log's geometry) the KV at that context is the
        request and the verdict follows; without it, labelled examples of well-known shapes give the scale."""
        if not self.summary:
            return
        kv, n_ctx = mem.get("kv_required_mib"), cfg_d.get("n_ctx")
        if kv is not None and mem["inputs"].get("source") in ("gguf", "log") and mem["inputs"].get("n_layer"):
            failure["requested_mib"] = _r2(kv)
            if failure["free_mib"] is not None and failure["verdict"] == "unknown":
                failure["verdict"] = "exceeds_free" if kv > failure["free_mib"] else "fits_but_failed"
            return
        if not n_ctx:
            self.finding("missing_facts", "the line gives no context size and no model: kvreport cannot size the KV "
                         "cache (give --command with the engine's command line, or --model FILE.gguf)")
            return
        examples = "; ".join(f"{name}: {_fmt(n_ctx * per_token / MIB)} MiB" for name, per_token in KV_EXAMPLES)
        self.finding("kv_examples", f"the model is not known (give --model FILE.gguf or --command with -m), so "
                     f"kvreport cannot size this KV cache. For scale only — examples, not your model — an f16 KV cache "
                     f"of {n_ctx:,} tokens takes {examples}")

    def _examples_fit(self) -> list[tuple[str, int]]:
        budget = getattr(self, "budget_mib", None)
        if not budget or budget <= 0:
            return []
        return [(name, int(budget * MIB / per_token) // 256 * 256) for name, per_token in KV_EXAMPLES]

    def run(self) -> dict:
        engine = self.engine()
        failure = self.failure()
        mem, cfg_d = self.memory(failure)
        self.summary_numbers(failure, mem, cfg_d)
        self.log_findings(failure, cfg_d)
        sig = signature({"engine": engine, **failure})
        suggestions, ranks = fixes.suggest_explained(self._situation(engine, failure, mem, cfg_d))
        d = {"analyzer_version": ANALYZER_VERSION, "engine": engine, "failure": failure, "memory": mem,
             "findings": self.findings, "signature": sig, "suggestions": suggestions}
        if self.want_explain:
            from kvreport.explain import explain

            self.trail["suggestions"] = ranks
            self.trail["config"] = {"n_ctx": cfg_d.get("n_ctx_source"), "n_ctx_line": self.trail.get("n_ctx_line")}
            d["explain"] = explain(self.f, d, self.trail)
        return d

    def _situation(self, engine: str, failure: dict, mem: dict, cfg_d: dict) -> fixes.Situation:
        f = self.f
        size, cfg, shape, kvcache = self.size, self.cfg, self.shape_obj, self.kvcache

        bpt = getattr(self, "derived_bpt", None)
        cur_bpv = _BYTES_PER_VALUE.get(str(cfg_d["cache_type_k"]), 2.0)

        def kv_at(n_ctx=None, n_seq=None, cache_type=None, kv_unified=None, swa_full=None):
            if size is None:
                if bpt is None or n_seq is not None or kv_unified is not None or swa_full is not None:
                    return None
                # linear in the context, scaled by the bytes per value of the cache type
                n = int(n_ctx) if n_ctx is not None else int(cfg_d["n_ctx"])
                ratio = _BYTES_PER_VALUE.get(cache_type, cur_bpv) / cur_bpv if cache_type else 1.0
                return round(bpt * n * ratio / MIB, 2)
            c = cfg
            if n_ctx is not None:
                c = c.with_(n_ctx=int(n_ctx))
            if n_seq is not None:
                c = c.with_(n_seq=int(n_seq))
            if cache_type is not None:
                c = c.with_(cache_type_k=cache_type, cache_type_v=cache_type, flash_attn=True)
            if kv_unified is not None:
                c = c.with_(kv_unified=kv_unified)
            if swa_full is not None:
                c = c.with_(swa_full=swa_full)
            return round(kvcache.kv_size(shape, c).kv_mib, 2)

        off = f.ctx.get("offloaded_layers")
        names = {n for n in f.devices if backend_of_device(n) not in (None, "cpu")}
        names |= {b["device"] for b in f.buffers if backend_of_device(b.get("device")) not in (None, "cpu")
                  and not str(b.get("device")).endswith("_Host")}
        n_req = self.flags.get("n_ctx") if isinstance(self.flags.get("n_ctx"), int) else None
        return fixes.Situation(
            engine=engine, phase=failure["phase"], backend=failure["backend"], verdict=failure["verdict"],
            failing_device=failure["failing_device"], requested_mib=failure["requested_mib"],
            free_mib=failure["free_mib"], free_at_failure_mib=getattr(self, "free_at_failure", None),
            command=self.command or None, flags=self.flags, n_ctx=mem["inputs"].get("n_ctx") or cfg_d["n_ctx"],
            n_ctx_requested=n_req, n_ctx_train=to_int(f.hparams.get("n_ctx_train")) or (shape.n_ctx_train if shape else None),
            n_seq=cfg_d["n_seq"], kv_unified=cfg_d["kv_unified"], cache_type_k=cfg_d["cache_type_k"],
            cache_type_v=cfg_d["cache_type_v"], flash_attn=cfg_d["flash_attn"], n_ubatch=cfg_d["n_ubatch"],
            n_batch=cfg_d["n_batch"], swa_full=cfg_d["swa_full"], n_layer=mem["inputs"].get("n_layer"),
            kv_mib=mem["kv_required_mib"], max_ctx_fit=mem["max_ctx_fit"], kv_at=kv_at, n_devices=len(names),
            kv_update=self.kv_update, alloc_limit=self.limit,
            offloaded_layers=to_int(str(off).split("/")[0]) if off else None, vllm=f.vllm, sglang=f.sglang, tgi=f.tgi,
            weak=self.weak, has_memory_event=self.has_memory_event,
            kv_basis=("ollama_layout" if getattr(self, "kv_from_layout", False) else "failed_buffer")
            if bpt is not None and size is None else ("model" if size is not None else None),
            n_gpu_layers_log=f.ollama.get("num_gpu"), kv_budget_mib=getattr(self, "budget_mib", None),
            kv_share=self._kv_share(failure.get("failing_device")),
            n_ctx_rounded=self._rounded_ctx(),
            mem_limit_mib=(self.mem_limit or (None, None))[0], mem_limit_what=(self.mem_limit or (None, None))[1],
            kv_headroom_mib=getattr(self, "headroom_mib", None), kv_headroom_why=getattr(self, "headroom_why", None),
            oom_rule=(self.oom_event or {}).get("rule"), py_stage=f.py_stage or None,
            request_tokens=(self.oom_event or {}).get("request_tokens"),
            limit_tokens=(self.oom_event or {}).get("limit_tokens"),
            limit_setting=(self.oom_event or {}).get("limit_setting"),
            limit_seqs=(self.oom_event or {}).get("limit_seqs"),
            running_seqs=next((e["running_seqs"] for e in f.events if e.get("running_seqs")), None),
            sampler_warmup=any(e.get("rule") == "vllm-sampler-warmup" for e in f.events),
            graph_capture=f.graph_capture and failure["phase"] == "compute_buffer",
            draft_failed=self._draft_failed(),
            min_cuda_compute=f.ollama.get("min_cuda_compute"), ollama_version=f.ollama.get("version"),
            ollama_layer=self._ollama_layer(failure),
            ollama_service=bool(f.ollama.get("systemd")),
            fa_auto_disabled=f.ctx.get("flash_attn_resolved") == "disabled",
            fa_logged=str(f.ctx.get("flash_attn") or "").lower() or None,
            split_room_mib=self._split_room(failure),
            max_ctx_fit_now=self.fit_now,
            kv_examples_fit=self._examples_fit() if self.summary and size is None else [],
            n_seq_known=cfg_d.get("n_seq_known", True),
            working_set=(self.oom_event or {}).get("rule") in ("metal-status-5", "metal-iogpu-oom", "metal-nil"),
            device_total_mib=(f.devices.get(failure["failing_device"] or "") or {}).get("total_mib"),
            others_mib=getattr(self, "others_mib", None), torch_oom=getattr(self, "torch_oom", False),
            metal_plan=(self.oom_event or {}).get("metal_plan") or {}, engine_build=to_int(f.build),
            kv_estimate_mib=f.ollama.get("kv_estimate_mib"), final_error=failure.get("final_error"),
            n_expert=to_int(f.hparams.get("n_expert")))


_CONTEXT_NOT_CREATED = re.compile(r"(?i:failed to create context|unable to create context|failed to create_context|"
                                  r"failed to create llama_context)")
"""llama.cpp's end lines when llama_init_from_model returned NULL (common.cpp, the examples, llama-cpp-python)."""


LAZY_ALLOCATOR_ENGINES = ("mlx-lm",)
"""Engines whose arrays (weights, KV cache, activations) are allocated lazily while a graph is evaluated: a command
buffer that ran out of memory does not tell which of them it was for (ggml-metal allocates its weight, KV and compute
buffers up front, so there the same error is the compute graph's)."""
LAZY_ALLOCATOR_RULES = ("metal-iogpu-oom", "metal-status-5")
"""The failure-layer formats (kvreport.logs.oom) of a Metal command buffer that failed for memory."""


def _first_of_burst(events: list[dict]) -> dict:
    """The last engine event, or for torch OOMs printed by several workers at once (tensor / pipeline parallel ranks,
    Ray workers: "GPU 4 ... GPU 7 ...", within a few lines) the first of them: the rank that ran out first."""
    i = len(events) - 1
    while i > 0 and events[i].get("torch_oom") and events[i - 1].get("torch_oom") \
            and events[-1]["lineno"] - events[i - 1]["lineno"] <= 20:
        i -= 1
    return events[i]


def _r2(x) -> float | None:
    """MiB to 2 decimals; under 0.01 MiB three significant digits, so a request of 12 bytes (mlx's "[malloc_or_wait]
    Unable to allocate 12 bytes") is not written as 0."""
    if x is None:
        return None
    x = float(x)
    return float(f"{x:.3g}") if 0 < abs(x) < 0.01 else round(x, 2)


def _fmt(x) -> str:
    return fmt_mib(x)
