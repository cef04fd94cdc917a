"""Ollama server logs, three eras (kv-facts.md §5.1): the bundled runner with Ollama's own
estimate (``msg="offload to cuda"`` / ``msg=offload library=cuda``), the memory-layout logs
(``msg="kv cache" device=CUDA0 size=...``), and the llama-server subprocess (v0.30+).
The llama.cpp lines Ollama copies into its log are read by :mod:`kvreport.logs.llamacpp`.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from kvreport.logs.common import size_to_mib, to_float, to_int
from kvreport.logs.facts import LogFacts

# llm/server.go (0.1.3x-0.5): "model requires more system memory (164.8 GiB) than is available (13.4 GiB)"
_SYSMEM = re.compile(r"model requires more system memory \(([\d.]+)\s*([KMGT]i?B)\) than is available \(([\d.]+)\s*([KMGT]i?B)\)")

_WORD = re.compile(r"(?i)(?<![\w-])ollama(?![\w-])")
_ATTR = re.compile(r'([\w.]+)=("(?:[^"\\]|\\.)*"|\[[^\]]*\]|\S+)')
_SIZE = re.compile(r"([\d.]+)\s*(B|KiB|MiB|GiB|TiB)")
_VERSION = re.compile(r"(?:ollama version is|\(version|version=)\s*\"?v?(\d+\.\d+\.\d+[\w.\-+]*)")
_LOAD_REQ = re.compile(r"KvSize:(\d+)")
_PARALLEL = re.compile(r"Parallel:(\d+)")
_KVTYPE = re.compile(r"KvCacheType:(\w*)")
_FA = re.compile(r"FlashAttention:(\w+)")
_NUM_GPU = re.compile(r"with num_gpu = (\d+)")
_OOM_WORDS = ("out of memory", "out of device memory", "cudaMalloc failed", "hipMalloc failed", "failed to allocate",
              "allocation failed", "not enough memory", "insufficient memory", "vk_error_out_of_device_memory",
              "erroroutofmemory")


def _attrs(line: str) -> dict:
    return {k: v.strip('"') for k, v in _ATTR.findall(line)}


def _mib(text: str | None) -> float | None:
    """A size as Ollama logs it: "9.3 GiB" (HumanBytes), or a bare number of bytes (0.2.2-0.11's
    ``available=9985720320`` in "model request too large for system")."""
    if not text:
        return None
    m = _SIZE.search(text)
    if m:
        return size_to_mib(float(m.group(1)), m.group(2))
    return int(text) / 1048576.0 if text.isdigit() and len(text) > 6 else None


_GO_SOURCE = re.compile(r"\blevel=(?:INFO|WARN|ERROR|DEBUG) source=\w+\.go:\d+|\bsource=\w+\.go:\d+ msg=")
_UNIT = re.compile(r"\bollama\[\d+\]: ")
"""journald's prefix of the Ollama unit's lines ("Jan 28 10:14:55 host ollama[2231]: ...")."""


def _hints(f: LogFacts, line: str, lineno: int) -> bool:
    if "source=" in line and (("level=" in line and "msg=" in line) or _GO_SOURCE.search(line)):
        # (Go's slog record; "source=llama_server.go:611" alone when a paste split it, or a record whose "level="
        # was dropped: "ERROR source=runner.go:426 msg=...", ollama#7545)
        f.engine_hints["ollama"] += 3
    # "llama runner process has terminated" (2024-25) and "llama-server process has terminated" (2026,
    # llm/llama_server.go): Ollama's words for its runner subprocess
    if "llama runner" in line or "llama-server process" in line or "OLLAMA_" in line or _WORD.search(line):
        f.engine_hints["ollama"] += 2
    if not f.ollama.get("systemd") and ("ollama.service" in line or ("ollama[" in line and _UNIT.search(line))):
        f.ollama["systemd"] = True  # journald: the server runs as the systemd unit
    m = _VERSION.search(line) if "version" in line else None
    if m and ("ollama" in line.lower() or "Listening on" in line or "msg=" in line):
        f.ollama["version"] = m.group(1)
    return False


def _load_request(f: LogFacts, line: str, lineno: int) -> bool:
    o = f.ollama
    m = _LOAD_REQ.search(line)
    if m:
        o["kv_size"] = int(m.group(1))
        f.note_line("ctx:ollama_kv_size", lineno, line)
    m = _PARALLEL.search(line)
    if m:
        o["parallel"] = int(m.group(1))
    m = _KVTYPE.search(line)
    if m and m.group(1):
        o["kv_cache_type"] = m.group(1)
    m = _FA.search(line)
    if m:
        o["flash_attention"] = m.group(1)
    return False


_RUNNER_CTX = re.compile(r"--ctx-size (\d+)")
_RUNNER_PARALLEL = re.compile(r"--parallel (\d+)")


def _runner_cmd(f: LogFacts, line: str, lineno: int) -> None:
    """llm/server.go's 'msg="starting llama server" cmd="... runner --model ... --ctx-size 40960 ... --parallel 1"'
    (2024-25): the runner's whole context (num_ctx x parallel, as KvSize) and its slots, when no load request says."""
    o = f.ollama
    m = _RUNNER_CTX.search(line)
    if m and "kv_size" not in o:
        o["kv_size"] = int(m.group(1))
        f.note_line("ctx:ollama_kv_size", lineno, line)
    m = _RUNNER_PARALLEL.search(line)
    if m and "parallel" not in o:
        o["parallel"] = int(m.group(1))


def _inference_compute(f: LogFacts, a: dict, line: str, lineno: int) -> None:
    """'msg="inference compute" id=GPU-... library=cuda compute=8.9 name="..." total="11.6 GiB" available="11.1 GiB"':
    a device, under ggml's name (the runner numbers a library's devices in the order Ollama lists them)."""
    o = f.ollama
    lib = str(a.get("library", "")).lower()
    prefix = {"cuda": "CUDA", "rocm": "ROCm"}.get(lib)
    if prefix:
        o[lib + "_seen"] = o.get(lib + "_seen", 0) + 1
        name = f"{prefix}{o[lib + '_seen'] - 1}"
    else:
        name = a.get("name") or (a.get("library", "GPU") + a.get("id", "?"))
    f.note_line("device:" + str(name), lineno, line)
    f.set_device(name, "ollama", description=a.get("description") or a.get("name"), total_mib=_mib(a.get("total")),
                 free_mib=_mib(a.get("available")))
    cc = to_float(a.get("compute")) if lib == "cuda" else None
    if cc is not None:  # "compute=6.1": the lowest CUDA compute capability (flash attention needs 7.0+)
        o["min_cuda_compute"] = min(cc, o.get("min_cuda_compute", cc))


_DETECTED = {"Radeon GPU detected": "rocm", "Nvidia GPU detected": "cuda", "Nvidia GPU detected via cudart": "cuda",
             "Nvidia GPU detected via nvcuda": "cuda"}
"""Ollama 0.1.2x's GPU discovery lines (gpu/gpu.go) and the library each one means."""


def _offload_record(f: LogFacts, a: dict, msg: str, line: str, lineno: int) -> None:
    """Ollama's offload plan (``msg=offload library=cuda layers.offload=44 memory.required.kv=...``): its estimate,
    the library it plans for, the free memory it saw per GPU and the layers it planned on the GPU."""
    o = f.ollama
    o["estimate"] = {k: v for k, v in a.items() if k.startswith(("memory.", "layers.", "library"))}
    if "memory.required.kv" in a:
        o["kv_estimate_mib"] = _mib(a["memory.required.kv"])
    # the library it plans for: "msg=offload library=cuda" (0.5+) or 'msg="offload to cuda"' (0.1-0.4)
    lib = a.get("library") or (msg.split(" to ", 1)[1] if " to " in msg else None)
    if lib:
        o.setdefault("gpu_library", lib.strip().lower())
    # its scheduler's view of each GPU's free memory ("[15.4 GiB]", one entry a GPU, before anything is loaded)
    # and the layers it planned on the GPU ("layers.offload=32 layers.model=33", the -ngl of the run that
    # follows when no "offloaded N/M layers" line gives it)
    avail = [size_to_mib(float(v), u) for v, u in _SIZE.findall(a.get("memory.available", ""))]
    if avail:
        o["offload_available_mib"] = avail  # before the weights were loaded: an upper bound on free at failure
        f.note_line("free:ollama_offload", lineno, line)
    off, total = to_int(a.get("layers.offload")), to_int(a.get("layers.model"))
    if off is not None and total:
        f.ctx.setdefault("offloaded_layers", f"{off}/{total}")


_SERVER_ENV = re.compile(r"\b(OLLAMA_[A-Z_]+):([^\s\]]*)")


def _msg_record(f: LogFacts, line: str, lineno: int) -> bool:
    """Ollama's structured records (``msg="offload to cuda"``, ``msg="kv cache"``, ``msg="inference compute"``...)."""
    o = f.ollama
    a = _attrs(line)
    msg = a.get("msg", "")
    if a.get("library") and a["library"].lower() not in ("cpu", ""):
        # the GPU library a record names ('msg=evaluating library=vulkan gpu_count=1', 'msg="gpu has too little memory
        # to allocate any layers" library=vulkan'): the backend the scheduler planned for, until a record says more
        o.setdefault("gpu_library", a["library"].strip().lower())
    if msg.startswith("offload"):
        _offload_record(f, a, msg, line, lineno)
    elif msg in ("kv cache", "model weights", "compute graph", "total memory"):
        # (0.10: device=CUDA0; 0.11+ new engine: buffer=CUDA0 for weights, backend=CUDA0 buffer_type=CUDA0 for graphs)
        device = a.get("device") or a.get("buffer_type") or a.get("buffer") or a.get("backend")
        o.setdefault("layout", []).append({"what": msg, "device": device, "mib": _mib(a.get("size"))})
    elif msg == "gpu memory":
        o.setdefault("gpu_available_mib", []).append(_mib(a.get("available")))
        f.note_line("free:ollama_gpu", lineno, line)
        o["gpu_library"] = a.get("library")
    elif msg in _DETECTED:  # Ollama 0.1.2x gpu.go: 'msg="Radeon GPU detected"', 'msg="Nvidia GPU detected via cudart"'
        o.setdefault("gpu_library", _DETECTED[msg])
    elif msg == "server config":
        # routes.go at start-up: every OLLAMA_* setting in effect ('env="map[OLLAMA_CONTEXT_LENGTH:65536
        # OLLAMA_NUM_PARALLEL:4 OLLAMA_KV_CACHE_TYPE:q8_0 ...]"'), the server's own command line
        o["server_env"] = dict(_SERVER_ENV.findall(line))
    elif msg == "system memory":
        o["host_free_mib"] = _mib(a.get("free"))
    elif msg == "starting llama server":
        _runner_cmd(f, line, lineno)
    elif msg == "inference compute":
        _inference_compute(f, a, line, lineno)
    elif msg == "model request too large for system":
        # llm/server.go's WARN before its "model requires more system memory" error (a journal filtered to WARN
        # keeps only this): the same refusal, with requested / available; the error line, when the log has it too
        # (before it, as a client relays it), is the one read
        if any(e["kind"] == "engine" and e.get("phase") == "memory_budget" for e in f.events):
            return False
        return _fail(f, line, lineno, "memory_budget", 3, backend="cpu", device="CPU",
                     requested_mib=_mib(a.get("requested")), free_mib=_mib(a.get("available")))
    elif msg == "truncating input prompt":
        # runner.go: a prompt longer than the context is cut to it (limit=2048 prompt=3940), silently for the client:
        # not a failure, a finding (ollama#8099)
        o["truncated"] = {"prompt": to_int(a.get("prompt")), "limit": to_int(a.get("limit")), "line": line[:300]}
    elif "vram-based default context" in msg:
        o["default_num_ctx"] = to_int(a.get("default_num_ctx"))
    elif "requested context size too large" in msg:
        f.warnings.append(line[:500])
    return False


def _fail(f: LogFacts, line: str, lineno: int, phase: str, hint: int, **data) -> bool:
    f.engine_hints["ollama"] += hint
    f.add_event("engine", lineno, line, engine="ollama", phase=phase, **{"backend": None, **data})
    f.final_error = line
    f.add_error(line)
    return True


_LAYOUT_LIST = re.compile(r'memory\.(\w+)\.(Weights|Cache)="\[([\d ]*)\]"')
_LAYOUT_GRAPH = re.compile(r"memory\.(\w+)\.Graph=(\d+)")


def _layout(f: LogFacts, line: str, lineno: int) -> bool:
    # Ollama's own layout step (ml backend, 0.12+): specific to Ollama even when the log is this one line
    m = _NUM_GPU.search(line)
    if m:
        f.ollama["num_gpu"] = int(m.group(1))
    # server.go's WARN lists what it tried per device: 'memory.CUDA0.Weights="[402653184 ...]" memory.CUDA0.Cache=
    # "[67108864 ...]" memory.CUDA0.Graph=1107296256' (bytes; one entry a layer): the per-layer cost on that device
    lists: dict = {}
    for dev, kind, values in _LAYOUT_LIST.findall(line):
        sizes = [int(v) for v in values.split() if v.isdigit() and int(v) > 0]
        if dev != "CPU" and sizes:
            lists.setdefault(dev, {})[kind] = sizes
    for dev, graph in _LAYOUT_GRAPH.findall(line):
        if dev in lists:
            lists[dev]["Graph"] = int(graph)
    for dev, d in lists.items():
        layers = len(d.get("Weights") or [])
        if layers:
            f.ollama.setdefault("layout_layers", {})[dev] = {
                "layers": layers, "per_layer_mib": (sum(d["Weights"]) + sum(d.get("Cache") or [])) / layers / 1048576.0,
                "graph_mib": d.get("Graph", 0) / 1048576.0}
    return _fail(f, line, lineno, "context", 3)


def _system_memory(f: LogFacts, line: str, lineno: int) -> bool:
    # llm/server.go: Ollama's own check before it starts a runner: the model does not fit the free RAM (+ free VRAM)
    if "evicting a model" in line:
        return False  # llm/server.go (2025-26) INFO: the check only evicts another loaded model to make room
    m = _SYSMEM.search(line)
    if not m:
        # the check's words quoted without its numbers ("model requires more system memory" while ...): the same
        # refusal, sizes unknown
        return _fail(f, line, lineno, "memory_budget", 2, backend="cpu", device="CPU") \
            if "model requires more system memory" in line else False
    return _fail(f, line, lineno, "memory_budget", 3, backend="cpu", device="CPU",
                 requested_mib=size_to_mib(float(m.group(1)), m.group(2)),
                 free_mib=size_to_mib(float(m.group(3)), m.group(4)))


def _runner_ended(f: LogFacts, line: str, lineno: int) -> bool:
    if "reported out-of-memory" in line:
        f.engine_hints["ollama"] += 3  # llm/llama_server.go (2026): the llama-server subprocess died of OOM
    if "failed to create context" in line and ("llama runner process" in line or "llama-server process" in line):
        # runner (2024): "error:failed to create context with model '...'" (llama_new_context_with_model returned
        # NULL): the context could not be created; the buffer is not named
        return _fail(f, line, lineno, "context", 2)
    if not ("process has terminated" in line or "reported out-of-memory" in line or "no longer running" in line):
        return False
    low = line.lower()
    if "retrying" in low:
        # server/sched.go (2026): "llama-server load failed; reducing automatic context and retrying once" quotes the
        # runner's out-of-memory and loads again with a smaller context: a retry, failed only if the retry fails too
        f.add_event("retry", lineno, line)
        f.warnings.append(line[:500])
        return True
    backend = "cuda" if "cuda" in low else "rocm" if "hip" in low else "vulkan" if "vk_" in low or "vulkan" in low else None
    return _fail(f, line, lineno, "unknown", 0, backend=backend, oom=any(w in low for w in _OOM_WORDS), weak=True)


def _predict_failed(f: LogFacts, line: str, lineno: int) -> bool:
    # llm/server.go Completion (2024-2025): the runner's HTTP server did not answer a request ("POST predict: Post
    # \"http://127.0.0.1:PORT/completion\": EOF"): the runner process died while serving; why is not in this line
    if "POST predict:" not in line:
        return False
    low = line.lower()
    return _fail(f, line, lineno, "unknown", 3, oom=any(w in low for w in _OOM_WORDS), weak=True)


def _no_context(f: LogFacts, line: str, lineno: int) -> bool:
    # runner (llama.go NewContextWithModel returned nil): llama_init_from_model failed, the buffer is not named
    return _fail(f, line, lineno, "context", 2)


def _final(f: LogFacts, line: str, lineno: int) -> bool:
    if not ("model failed to load" in line or ("Error:" in line and "500 Internal Server Error" in line)):
        return False
    f.engine_hints["ollama"] += 2
    # weak: the failure layer still reads the reason the relayed error carries ("...: unable to load full model on GPU")
    f.add_event("final", lineno, line, weak=True)
    f.final_error = line
    f.add_error(line)
    return True


def _started(f: LogFacts, line: str, lineno: int) -> bool:
    if "msg=" in line:
        f.add_event("success", lineno, line)
    return True


SECTIONS: tuple[tuple[str, tuple[str, ...], Callable[[LogFacts, str, int], bool]], ...] = (
    ("engine hints and version", ("msg=", "Listening on", "ollama", "Ollama", "llama runner", "llama-server process",
                                  "OLLAMA_", "runner.go", "version", "source="), _hints),
    ("load request (KvSize, Parallel, KvCacheType)", ("KvSize",), _load_request),
    ("structured records (msg=...)", ("msg=",), _msg_record),
    ("memory layout refused", ("memory layout cannot be allocated",), _layout),
    ("system memory check", ("more system memory",), _system_memory),
    ("runner / llama-server ended", ("process has terminated", "reported out-of-memory", "no longer running",
                                     "llama runner process", "llama-server process"), _runner_ended),
    ("runner could not create the context", ("unable to create llama context",), _no_context),
    ("runner stopped answering a request", ("POST predict:",), _predict_failed),
    ("load failed / HTTP 500", ("model failed to load", "500 Internal Server Error"), _final),
    ("runner started", ("llama runner started", "llama-server started"), _started),
)
"""(name, keywords, reader) in order; a reader returning True ends the line."""

KEYWORDS: tuple[str, ...] = tuple(sorted({k for _n, kws, _r in SECTIONS for k in kws}))
"""Derived from :data:`SECTIONS`."""


def feed(f: LogFacts, line: str, lineno: int) -> None:
    """Read one cleaned Ollama line into ``f``. Never raises on text."""
    for _name, keywords, read in SECTIONS:
        if any(k in line for k in keywords) and read(f, line, lineno):
            return


def num(text) -> float | None:
    return to_float(text)
