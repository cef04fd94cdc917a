"""vLLM logs (kv-facts.md §5.2): KV pool size, the start-up memory gate, KV capacity errors,
the auto-fit of ``max_model_len``, and torch CUDA OOM messages."""

from __future__ import annotations

import re

from kvreport.logs.common import py_args, to_float, to_int
from kvreport.logs.facts import LogFacts
from kvreport.logs.oom import stage_of, torch_oom

KEYWORDS = ("vLLM", "vllm", "KV cache", "max seq len", "gpu_memory_utilization", "GPU blocks", "blocks:",
            "Free memory on", "Model loading took", "model weights took", "Maximum concurrency",
            "EngineCore", "out of memory", "max_model_len", "Memory profiling", "cache blocks", "KVCache",
            "Required:", "Auto-fit", "Application startup complete", "Starting vLLM", "reserved for KV Cache",
            # halves of messages pasted re-wrapped (kvreport.logs.WRAP_PHRASES)
            "memory utilization", "KV cache memory", "is needed", "Tried to allocate",
            "max_num_batched_tokens=", "detected platform",
            # V1's GPU worker and model runner records, and its sleep mode (RL trainers' colocated rollouts:
            # "[gpu_worker.py:81] Sleep mode freed 42.16 GiB memory, 16.79 GiB memory is still in use.")
            "[gpu_worker.py:", "[gpu_model_runner.py:", "Sleep mode freed",
            # the settings it runs with: V0's api_server "args: Namespace(...)", V1's "non-default args: {...}"
            "args: Namespace(", "non-default args:",
            # its engine config ("Initializing an LLM engine (v0.5.3) with config: ... device_config=cuda ...", V1:
            # "Initializing a V1 LLM engine (v0.10.1) with config: ...")
            "LLM engine (v",
            # V0's scheduler (core/scheduler.py _preempt): "Sequence group 221 is preempted by
            # PreemptionMode.RECOMPUTE mode because there is not enough KV cache space" (a warning; it carries on)
            "PreemptionMode.",
            # V0's model runner on a forward-pass error (worker/model_runner_base.py): "Error in model execution (input
            # dumped to /tmp/err_execute_model_input_20241119-...pkl): CUDA out of memory. ..."
            "input dumped to",
            "Vllm")  # worker prefixes: "(RayWorkerVllm pid=...)", "(VllmWorkerProcess pid=...)"

# vllm/logger.py: "%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s" with "%m-%d %H:%M:%S" (2024+;
# 2023: "%(filename)s:%(lineno)d]" without the bracket): "ERROR 03-13 09:00:43 [core.py:330] ..."
_LOGGER = re.compile(r"\b(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[?[\w./-]+\.py:\d+\]")
_PLATFORM = re.compile(r"Automatically detected platform (\w+)\.")
_CHUNKED = re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)")
_AVAIL = re.compile(r"Available KV cache memory:\s*(-?[\d.]+)\s*GiB|"
                    # V0 worker.py (0.6-0.8): "...; the rest of the memory reserved for KV Cache is -1.05GiB."
                    r"the rest of the memory reserved for KV Cache is\s*(-?[\d.]+)\s*GiB")
_POOL = re.compile(r"GPU KV cache size:\s*([\d,]+)\s*tokens")
_BLOCKS = re.compile(r"# (?:GPU|cuda|rocm|\w+) blocks:\s*(\d+)")
_CONC = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request:\s*([\d.]+)x")
# (the words before the number are sometimes retyped -- "max sew len" -- the rest of the sentence is distinctive)
_V0_CAP = re.compile(r"max \w{2,4} len \((\d+)\) is larger than the maximum number of tokens that can be stored in KV cache "
                     r"\((\d+)\)")
# (the "max seq len " words may be on the line before when the message was wrapped; the line may be cut after "is
# needed", then only the need is known)
_V1_CAP = re.compile(r"(?:max seq len )?\((\d+)\),\s*\(?([\d.]+) Gi?B KV cache is needed(?:, which is larger than the "
                     r"available KV cache memory \(([-\d.]+) Gi?B\))?")
_EST = re.compile(r"estimated maximum model length is (\d+)", re.I)
_NO_MEM = re.compile(r"No available memory for the cache blocks")
# worker startup check (V1, 2025+): "Free memory on device cuda:0 (38.74/121.63 GiB) on startup is less than desired
# GPU memory utilization (0.35, 42.57 GiB)", and the short form people quote ("Free memory on cuda:0 (a/b GiB) <
# desired utilization (0.35, 42.57 GiB)")
_GATE = re.compile(r"Free memory on (?:device\s*)?(\S+)?\s*\(([\d.]+)/([\d.]+) GiB\)\s*(?:on startup is less than|<)\s*"
                   r"(?:desired (?:GPU memory )?utilization|the engine's budget after excluding external process's "
                   r"weights) \(([\d.]+),\s*([\d.]+) GiB\)")
# (2026, v1/worker/utils.py: "... is less than the engine's budget after excluding external process's weights (0.9,
# 41.27 GiB)": the same gate, with the weights another process holds left out of the budget)
_WEIGHTS = re.compile(r"(?:Model loading|Loading model weights) took ([\d.]+)\s*(GiB|GB)")
_VERSION = re.compile(r"(?:vLLM API server version|vLLM server version|LLM engine \(v)\s*v?([\d][\w.\-+]*)")
_AUTOFIT = re.compile(r"Auto-fit max_model_len: reduced from (\d+) to (\d+)")
_CONFIG = re.compile(r"(max_seq_len|kv_cache_dtype|tensor_parallel_size|gpu_memory_utilization|max_model_len|"
                     r"chunked_prefill_enabled|device_config)=([\w.\-]+)")
_PROFILE = re.compile(r"total_gpu_memory=([\d.]+)GiB")


def torch_device(name: str | None) -> tuple[str | None, str | None]:
    """A torch device name as vLLM prints it (``cuda:0``, ``cuda``, ``xpu:1``) -> (ggml-style device name, backend):
    ``("CUDA0", "cuda")``; ``(None, None)`` when there is none. A ROCm build of torch also says ``cuda``."""
    if not name:
        return None, None
    kind, _, idx = name.strip().rstrip(",").partition(":")
    if kind == "cuda":
        return (f"CUDA{idx}" if idx.isdigit() else None), "cuda"
    return None, None


def _msg_backend(line: str) -> str | None:
    """vLLM's capacity errors on its CPU backend name that backend's knob ("Try increasing `VLLM_CPU_KVCACHE_SPACE`",
    2025+); the GPU wording names gpu_memory_utilization and says nothing of the backend."""
    return "cpu" if "VLLM_CPU_KVCACHE_SPACE" in line else None


def _settings(f: LogFacts, line: str) -> None:
    """The settings vLLM prints for itself: its args line (V0 "args: Namespace(...)", V1 "non-default args: {...}";
    the values in effect when no command line is given), its engine config (``_CONFIG``) and the profiler's total."""
    v = f.vllm
    if "args: Namespace(" in line or "non-default args:" in line:
        v.setdefault("args", {}).update(py_args(line))
    if "=" in line and ("engine" in line.lower() or "Memory profiling" in line):
        for k, val in _CONFIG.findall(line):
            v.setdefault("config", {})[k] = val
        m = _PROFILE.search(line)
        if m:
            v["total_gpu_gib"] = float(m.group(1))
            f.engine_hints["vllm"] += 1


def feed(f: LogFacts, line: str, lineno: int) -> None:
    """Read one cleaned vLLM line into ``f``. Never raises on text."""
    v = f.vllm
    if "vllm_rs" in line or "vllm-rs" in line or "KVCache" in line or ("Available:" in line and "Required:" in line):
        _feed_vllm_rs(f, line, lineno)
        return
    if "vllm" in line.lower() or "EngineCore" in line or "PreemptionMode." in line or "input dumped to" in line or ".py:" in line and _LOGGER.search(line):
        f.engine_hints["vllm"] += 2
    m = _PLATFORM.search(line) if "detected platform" in line else None
    if m:  # vllm/platforms/__init__.py (0.7+): "Automatically detected platform cuda."
        v["platform"] = m.group(1)
        f.engine_hints["vllm"] += 2
    if "[gpu_worker.py:" in line or "[gpu_model_runner.py:" in line:
        # V1's GPU worker (v1/worker/gpu_worker.py, gpu_model_runner.py): CUDA unless a platform line says otherwise
        # (ROCm's "Automatically detected platform rocm."; XPU, TPU and CPU have workers of their own names)
        v.setdefault("gpu_worker", True)
    m = _CHUNKED.search(line) if "max_num_batched_tokens=" in line else None
    if m:  # scheduler config (0.6+): "Chunked prefill is enabled with max_num_batched_tokens=2048."
        v["max_num_batched_tokens"] = int(m.group(1))
        f.engine_hints["vllm"] += 2
    m = _VERSION.search(line)
    if m:
        v["version"] = m.group(1)
        f.engine_hints["vllm"] += 3
    if "=" in line or "args:" in line:
        _settings(f, line)
    m = _WEIGHTS.search(line)
    if m:
        v["weights_mib"] = float(m.group(1)) * 1024.0
        f.stage = "profile"
        f.engine_hints["vllm"] += 2
    m = _AVAIL.search(line)
    if m:
        v["available_kv_mib"] = float(m.group(1) or m.group(2)) * 1024.0
        f.engine_hints["vllm"] += 2
        if v["available_kv_mib"] <= 0:
            # vLLM raises "No available memory for the cache blocks" right after this line
            f.add_event("engine", lineno, line, engine="vllm", phase="kv_capacity", backend=_msg_backend(line), negative=True)
            f.final_error = line
            f.add_error(line)
        return
    _pool_lines(f, line)
    if _failure(f, line, lineno):
        return
    if "Starting vLLM API server" in line or ("Application startup complete" in line and f.engine_hints.get("vllm")):
        # (uvicorn's "Application startup complete." is every FastAPI server's -- Lemonade, TGI's, an app's --: it is
        # vLLM's success only in a log that is vLLM's)
        f.add_event("success", lineno, line)


def _pool_lines(f: LogFacts, line: str) -> None:
    """The KV pool's size (tokens, blocks), the concurrency line and the auto-fit of max_model_len."""
    v = f.vllm
    m = _POOL.search(line)
    if m:
        v["pool_tokens"] = to_int(m.group(1))
    m = _BLOCKS.search(line)
    if m and "CPU blocks" in line:
        v["gpu_blocks"] = int(m.group(1))
        f.engine_hints["vllm"] += 1
    m = _CONC.search(line)
    if m:
        v["max_model_len"] = to_int(m.group(1))
        v["concurrency"] = float(m.group(2))
        f.engine_hints["vllm"] += 1
    m = _AUTOFIT.search(line)
    if m:
        f.fit = {"ran": True, "status": "fitted", "changed": {"max_model_len": [int(m.group(1)), int(m.group(2))]},
                 "projected_mib": None, "free_mib": None, "lines": [line[:300]]}


def _v1_capacity(f: LogFacts, m: re.Match, line: str, lineno: int) -> None:
    """V1's KV check: the engine's own numbers, the KV one max-length request needs against the KV memory it has."""
    v = f.vllm
    v["max_model_len"] = int(m.group(1))
    v["kv_needed_mib"] = float(m.group(2)) * 1024.0
    if m.group(3) is not None:
        v["available_kv_mib"] = float(m.group(3)) * 1024.0
    m2 = _EST.search(line)
    if m2:
        v["estimated_max_len"] = int(m2.group(1))
    f.engine_hints["vllm"] += 3
    f.add_event("engine", lineno, line, engine="vllm", phase="kv_capacity", backend=_msg_backend(line),
                requested_mib=v["kv_needed_mib"], free_mib=v.get("available_kv_mib"), refused=True)
    f.final_error = line
    f.add_error(line)


def _failure(f: LogFacts, line: str, lineno: int) -> bool:
    """vLLM's own refusals (KV capacity V0/V1, no memory for the cache blocks, the start-up gate) and torch OOMs."""
    v = f.vllm
    m = _V0_CAP.search(line)
    if m:
        v["max_model_len"], v["pool_tokens"] = int(m.group(1)), int(m.group(2))
        f.engine_hints["vllm"] += 3
        f.add_event("engine", lineno, line, engine="vllm", phase="kv_capacity", backend=_msg_backend(line))
        f.final_error = line
        f.add_error(line)
        return True
    m = _V1_CAP.search(line)
    if m:
        _v1_capacity(f, m, line, lineno)
        return True
    if _NO_MEM.search(line) or "Cannot auto-fit max_model_len" in line:
        if ('"No available memory' in line or "raise ValueError(" in line) and "ValueError: No available" not in line:
            return True  # the source line of the raise in a traceback, not the error itself (unless a paste glued both)
        if _NO_MEM.search(line):
            # vLLM raises this when the profiled budget leaves nothing (V0: "# GPU blocks: 0") for the KV cache
            v.setdefault("available_kv_mib", 0.0)
        f.engine_hints["vllm"] += 3
        f.add_event("engine", lineno, line, engine="vllm", phase="kv_capacity", backend=_msg_backend(line))
        f.final_error = line
        f.add_error(line)
        return True
    m = _GATE.search(line)
    if m:
        free, total, util, want = (float(m.group(i)) for i in (2, 3, 4, 5))
        v["gate"] = {"free_mib": free * 1024.0, "total_mib": total * 1024.0, "utilization": util,
                     "requested_mib": want * 1024.0}
        f.engine_hints["vllm"] += 3
        dev, backend = torch_device(m.group(1))
        if dev:
            f.note_line("device:" + str(dev), lineno, line)
            f.set_device(dev, "vllm_gate", total_mib=total * 1024.0, free_mib=free * 1024.0)
        f.add_event("engine", lineno, line, engine="vllm", phase="memory_budget", backend=backend, device=dev,
                    requested_mib=want * 1024.0, free_mib=free * 1024.0)
        f.final_error = line
        f.add_error(line)
        return True
    t = torch_oom(line) if "Tried to allocate" in line else None
    if t and t["backend"] == "cuda":
        req, free, total = t["mib"], t.get("free_mib"), t.get("total_mib")
        dev = f"CUDA{t['device_index']}" if t.get("device_index") is not None else None
        if dev and total:
            f.set_device(dev, "torch_oom", total_mib=total)
        # the step it was raised in (traceback frames, kvreport.logs.oom.STAGES), else: after the weights were
        # loaded it is the profiling / graph capture (compute); before, with vLLM's start-up lines seen, the weights
        stage = stage_of(line) or f.py_stage
        if stage:
            phase = stage
        elif f.stage == "profile" or "weights_mib" in v:
            phase = "compute_buffer"
        elif v.get("version") or v.get("config"):
            phase = "model_weights"
        else:
            phase = "unknown"
        f.add_event("engine", lineno, line, engine=None, phase=phase, backend="cuda", device=dev,
                    requested_mib=req, free_mib=free, torch_oom=True, others_mib=t.get("others_mib"))
        f.final_error = line
        f.add_error(line)
        return True
    if "EngineCore failed to start" in line or "Engine core initialization failed" in line:
        f.engine_hints["vllm"] += 2
        f.add_event("final", lineno, line)
        f.final_error = f.final_error or line
        f.add_error(line)
        return True
    return False




_RS_NEED = re.compile(r"Available:\s*([\d.]+)\s*MB,\s*Required:\s*([\d.]+)\s*MB")
_RS_GPU = re.compile(r"GPU (\d+): total ([\d.]+) GB, free ([\d.]+) GB")


def _feed_vllm_rs(f: LogFacts, line: str, lineno: int) -> None:
    """vllm.rs (a Rust engine with vLLM-like flags, not vLLM): its KV-cache planner refusal.
    Its "MB" are MiB (the planner divides by 2**20)."""
    f.engine_hints["other"] += 5
    m = _RS_GPU.search(line)
    if m:
        f.vllm.setdefault("rs", {})["gpu"] = int(m.group(1))
    m = _RS_NEED.search(line)
    if m and not any(e.get("rs_plan") for e in f.events):
        f.add_event("engine", lineno, line, engine=None, phase="kv_cache", backend=None,
                    requested_mib=float(m.group(2)), free_mib=float(m.group(1)), rs_plan=True)
        f.final_error = line
        f.add_error(line)
    elif "allocation failed" in line or "Failed to allocate" in line:
        f.final_error = line
        f.add_error(line)


def pool_mib(text) -> float | None:
    return to_float(text)
