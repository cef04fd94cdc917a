"""The failure layer under every engine: lines that say memory could not be had, in any runtime's words.

Each rule of :data:`RULES` names the output it reads (the runtime and the message format), where that
format was checked, the literal keywords that select its lines (the prefilter is derived from them,
see :data:`KEYWORDS`), and what the line tells: backend, device, requested size, free memory or a
limit, and a phase when the message itself places the failure. A line matched here becomes an
``oom`` event; :mod:`kvreport.analyze` uses it when no engine-specific rule placed the failure, and
to name the backend and device that an engine's own message leaves out.

The last rule, ``memory-words``, is the net under everything: any other line with the words of a
memory failure (``out of memory``, ``insufficient memory``, ``cannot allocate memory``...) is an
``oom`` event marked ``generic``: its format is not fully understood, the diagnosis says so and
quotes it, and it is never answered with "no failure found".

Units: ``mib`` / ``free_mib`` / ``limit_mib`` are MiB (2**20 bytes).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from kvreport.logs.common import KeywordSet, case_variants, size_to_mib, to_float
from kvreport.logs.facts import LogFacts


def _mib(value: str | None, unit: str | None) -> float | None:
    """``("12.5", "GiB")`` -> 12800.0 MiB; no unit means bytes (:func:`kvreport.logs.common.size_to_mib`)."""
    number = to_float(value) if value is not None else None
    return None if number is None else size_to_mib(number, unit or "B")


@dataclass(frozen=True)
class OomRule:
    """One memory-error line format.

    ``read(match) -> dict`` turns the match into event fields (``mib``, ``free_mib``, ``limit_mib``,
    ``device_index``...); ``backend`` / ``engine`` / ``phase`` are what the format alone says (None: not
    said). ``source`` is where the format was checked.
    """

    id: str
    keywords: tuple[str, ...]
    pattern: re.Pattern
    backend: str | None
    source: str
    phase: str | None = None
    engine: str | None = None
    read: Callable[[re.Match], dict] | None = None
    generic: bool = False
    memory: bool = True
    warn: bool = False
    """A warning the engine may carry on after: the failure only when a failure line follows it in the log."""


def _size(m: re.Match, g: int = 1, u: int | None = 2) -> dict:
    return {"mib": _mib(m.group(g), m.group(u) if u else None)}


def _torch(m: re.Match) -> dict:
    d = m.groupdict()
    out = {"mib": _mib(d.get("req"), d.get("ru"))}
    dev = d.get("dev") or d.get("dev2")
    if dev is not None:
        out["device_index"] = int(dev)
    free, fu = (d.get("free"), d.get("fu")) if d.get("free") is not None else (d.get("free2"), d.get("fu2"))
    if free is not None:
        out["free_mib"] = _mib(free, fu)
    total, tu = (d.get("total"), d.get("tu")) if d.get("total") is not None else (d.get("total2"), d.get("tu2"))
    if total is not None:
        out["total_mib"] = _mib(total, tu)
    others = _torch_others(m.string)
    if others:
        out["others_mib"] = others
    cap = _TORCH_MPS_MAX.search(m.string)
    if cap:
        out["limit_mib"] = _mib(cap.group(1), cap.group(2))
    return out


# torch's MPS allocator (Apple GPUs): "MPS backend out of memory (MPS allocated: 17.80 GB, other allocations: 380.20 MB,
# max allowed: 18.13 GB). Tried to allocate 64.00 MB on private pool." (MPSAllocator.mm; its GB/MB are 1024-based): the
# cap is PYTORCH_MPS_HIGH_WATERMARK_RATIO x the device's recommended working set
_TORCH_MPS_MAX = re.compile(r"max allowed: ([\d.]+) ?([KMGT]i?B)\)")


_TORCH_PROC = re.compile(r"Process \d+ has ([\d.]+) ?([KMGT]i?B) memory in use")
_TORCH_SELF = re.compile(r"this process has ([\d.]+) ?([KMGT]i?B) memory in use")


def _torch_others(text: str) -> float | None:
    """MiB held by other processes on the device, from torch >= 2.1's list ("Process 4683 has 11.05 GiB memory in
    use. ... Including non-PyTorch memory, this process has 66.97 GiB memory in use"): every listed process less
    this one; None when the message lists no process or only this one."""
    procs = [_mib(v, u) for v, u in _TORCH_PROC.findall(text)]
    me = _TORCH_SELF.search(text)
    if not procs or me is None:
        return None
    mine = _mib(me.group(1), me.group(2))
    others = sum(procs) - (mine if any(abs(p - mine) < 1.0 for p in procs) else 0.0)
    return round(others, 2) if others >= 1.0 else None


def torch_oom(line: str) -> dict | None:
    """torch's OutOfMemoryError text -> ``{"backend", "mib", "free_mib"?, "total_mib"?, "device_index"?}`` (MiB),
    or None. Both eras of the CUDACachingAllocator message: torch >= 2.1 "Tried to allocate X. GPU N has a total
    capacity of T of which F is free", torch < 2.1 "Tried to allocate X (GPU N; T total capacity; A already
    allocated; F free; R reserved in total by PyTorch)"."""
    m = _TORCH_RX.search(line)
    if not m:
        return None
    out = _torch(m)
    out["backend"] = {"CUDA": "cuda", "HIP": "rocm", "XPU": "sycl", "MPS": "metal", "NPU": "cann"}.get(
        m.group("be") or "CUDA")  # the message without its first sentence (pasted from the middle) is CUDA's
    return out


_METAL_PLAN = re.compile(r"\b(metal_limit|fraction|usable_metal|model_memory|overhead|kv_budget)=(-?[\d.]+)(GB)?")


def _metal_plan(text: str) -> dict:
    """vllm-metal's budget breakdown ("metal_limit=26.80GB, fraction=0.98, ..., kv_budget=-12.05GB"; GB = 1e9 bytes,
    as its f"{x / 1e9:.2f}GB") -> {"metal_plan": {name: MiB, "fraction": float}}; {} when the line holds none."""
    plan = {}
    for name, value, unit in _METAL_PLAN.findall(text):
        plan[name] = float(value) if not unit else float(value) * 1e9 / 1048576.0
    return {"metal_plan": plan} if plan else {}


def _need_have(m: re.Match) -> dict:
    """A summary that states both sides: the request and what there was (a KV cache when the line says so)."""
    out = {"mib": _mib(m.group("need"), m.group("nu")), "free_mib": _mib(m.group("have"), m.group("hu")),
           "summary": True}
    if "n_ctx" in (nums := summary_numbers(m.string)):
        out["n_ctx"] = nums["n_ctx"]  # ("... with -c 32768 ..., KV cache needs 4096 MiB but only 2100 MiB free")
    if m.group("kv") or "kv cache" in m.group(0).lower() or "kv-cache" in m.group(0).lower():
        out["phase_hint"] = "kv_cache"
    return out


def _tokens(m: re.Match) -> dict:
    """A refused request's size and the limit it met, in tokens (the groups ``n``/``n2``/``n3`` and ``m``/``m2``)."""
    d = m.groupdict()
    n = next((d[k] for k in ("n", "n2", "n3", "n4", "n5") if d.get(k)), None)
    if n is None and d.get("given") and d.get("new"):  # TGI: the prompt and max_new_tokens both count
        n = str(int(d["given"]) + int(d["new"]))
    lim = next((d[k] for k in ("m", "m2", "m3") if d.get(k)), None)
    return {**({"request_tokens": int(n)} if n else {}), **({"limit_tokens": int(lim)} if lim else {})}


_JSON_TOKENS = re.compile(r'["\']n_prompt_tokens["\']\s*:\s*(\d+)\s*,\s*["\']n_ctx["\']\s*:\s*(\d+)')
"""llama-server's error body as JSON, or as a Python client prints it (openai.BadRequestError: {'n_prompt_tokens': ...})."""


def _tokens_json(m: re.Match) -> dict:
    """llama-server's refusal: its message's numbers, else the error body's ``n_prompt_tokens`` / ``n_ctx``."""
    out = _tokens(m)
    j = _JSON_TOKENS.search(m.string)
    if j:
        out.setdefault("request_tokens", int(j.group(1)))
        out.setdefault("limit_tokens", int(j.group(2)))
    return out


_XLA_USED = re.compile(r"Used ([\d.]+)([KMGT])i?B? of ([\d.]+)([KMGT])i?B? (\w+)")
_XLA_RESERVE = re.compile(r"Attempting to (?:reserve|allocate) ([\d.]+)([KMGT])i?B?\b.{0,120}?There are ([\d.]+)([KMGT])i?B? "
                          r"free")


def _xla(text: str) -> dict:
    """XLA's sizes: "Used 21.95G of 15.48G hbm" (the program's need and the memory space's size) or "Attempting to
    reserve 10.51G ... There are 8.97G free" / "Attempting to allocate 896.00M. That was not possible. There are
    295.08M free." (MiB out)."""
    m = _XLA_USED.search(text)
    if m:
        return {"mib": _mib(m.group(1), m.group(2) + "iB"), "limit_mib": _mib(m.group(3), m.group(4) + "iB")}
    m = _XLA_RESERVE.search(text)
    if m:
        return {"mib": _mib(m.group(1), m.group(2) + "iB"), "free_mib": _mib(m.group(3), m.group(4) + "iB")}
    return {}


_NOMEM_TOKEN = re.compile(r"Name:(?P<name>[^\s}]*)|(?P<kind>InputWeights|Weights|Cache|Graph):|(?P<size>\d+)(?P<st>[AFU])\b")
_NOMEM_KIND = {"InputWeights": "model_weights", "Weights": "model_weights", "Cache": "kv_cache", "Graph": "compute_buffer"}


def ollama_nomem_cache_mib(text: str) -> float | None:
    """The whole KV cache of Ollama's ErrNoMem table: every Cache entry of every device, allocated or failed (MiB)."""
    kind, total = None, 0
    for t in _NOMEM_TOKEN.finditer(text):
        if t.group("kind"):
            kind = t.group("kind")
        elif t.group("size") is not None and kind == "Cache":
            total += int(t.group("size"))
    return total / 1048576.0 if total else None


def _ollama_nomem(text: str) -> dict:
    """The failed (``F``) entry of Ollama's ErrNoMem: its size (bytes -> MiB), the phase of its kind and the device
    (ggml's name, "CPU" for the host block); {} when no entry failed."""
    name = kind = None
    out: dict = {}
    for t in _NOMEM_TOKEN.finditer(text):
        if t.group("name") is not None:
            if out:
                break  # (the failed list is done: another device's block)
            name = t.group("name") or None
        elif t.group("kind"):
            if out:
                break  # (the failed list is done: the same device's next kind)
            kind = t.group("kind")
        elif t.group("st") == "F":
            # every failed entry of that list (one per layer for Weights and Cache): together, what could not be had
            out["mib"] = out.get("mib", 0.0) + int(t.group("size")) / 1048576.0
            if kind in _NOMEM_KIND:
                out["phase_hint"] = _NOMEM_KIND[kind]
            if name and kind != "InputWeights":
                out["device_name"] = name
    return out


def _over_max(m: re.Match) -> dict:
    out = {"mib": _mib(m.group("n"), None), "limit_mib": _mib(m.group("lim"), None)}
    if m.group("dev"):
        out["device_name"] = m.group("dev")
    return out


def _pool(m: re.Match) -> dict:
    return {"mib": _mib(m.group("need"), None), "limit_mib": _mib(m.group("avail"), None)}  # None when not printed


def _mlx_limit(m: re.Match) -> dict:
    return {"mib": _mib(m.group(1), None), "limit_mib": _mib(m.group(2), None) if m.group(2) else None}


def _mlx_buffer(m: re.Match) -> dict:
    """mlx's one-buffer limit: with no step named, a single buffer above maxBufferLength is an activation (attention
    scores of a long prompt: mlx's KV cache grows in 256-token steps, its weights are one buffer a tensor)."""
    out = _mlx_limit(m) if m.group(1) else {"mib": _mib(m.group(3), None), "limit_mib": _mib(m.group(4), None)}
    return {**out, "fallback_phase": "compute_buffer"} if out.get("limit_mib") else out


def _cuda_block(m: re.Match) -> dict:
    return {"cuda_name": {"hip": "ROCm", "rocm": "ROCm", "musa": "MUSA"}.get(m.group(1).lower(), "CUDA")}


_METAL_BUFFERS = (("data", "model_weights"), ("kv", "kv_cache"), ("eval", "compute_buffer"), ("scr", "compute_buffer"),
                  ("alloc", "compute_buffer"), ("compute", "compute_buffer"))
"""ggml-metal.m (2023-2024) names its buffers: 'data' the weights, 'kv' the KV cache, 'eval' / 'scr0' / 'scr1' /
'alloc' the compute (graph) memory."""


def _metal_buf(m: re.Match) -> dict:
    name = m.group("name").strip().lower()
    phase = next((p for prefix, p in _METAL_BUFFERS if name.startswith(prefix)), None)
    unit = m.groupdict().get("unit")
    return {"mib": _mib(m.group("size"), unit), **({"phase_hint": phase} if phase else {})}


# the numbers of a typed summary, in the forms people write them: a context ("ctx=262144", "n_ctx 131072", "-c 65536",
# "num_ctx 8192", "ctx=128k", "32k ctx", "128K context"), the free memory ("gpu memory free=1024 MiB", "free VRAM 6144
# MiB", "2.5 GiB free", "only 6 GB free", "6 GB available"), the request ("16 GiB requested", "requested 16 GiB",
# "needs 20 GB") and the K cache type ("-ctk q8_0", "type_k=q8_0", "--cache-type-k q4_0")
_SUM_CTX = re.compile(r"(?i:(?:\bn_ctx|\bctx|\bcontext(?: size| length)?|\bnum_ctx|(?<![\w-])-c|--ctx-size)\s*[=:]?\s*"
                      r"(?P<n>\d[\d,]*)(?P<k>\s?k\b)?|\b(?P<n2>\d+)\s?k\s*(?:ctx|context)\b)")
_SUM_FREE = re.compile(r"(?i:\bfree(?: vram| memory| mem| gpu memory)?\s*[=:]?\s*(?P<a>[\d.,]+)\s*(?P<au>[KMGT]i?B)\b|"
                       r"(?P<b>[\d.,]+)\s*(?P<bu>[KMGT]i?B)\s+(?:of (?:\w+ ){0,2})?(?:is |are )?(?:free|available|left)\b)")
_SUM_REQ = re.compile(r"(?i:(?P<a>[\d.,]+)\s*(?P<au>[KMGT]i?B)\s+(?:requested|needed|required)|\brequest(?:ed)?\s*[=:]?\s*"
                      r"(?P<b>[\d.,]+)\s*(?P<bu>[KMGT]i?B)|\b(?:need(?:s|ed)?|requires?)\s+(?P<c>[\d.,]+)\s*(?P<cu>[KMGT]i?B)|"
                      # the KV size itself: "kv=4096 MiB", "KV cache: 4096 MiB", "kv size = 4 GiB"
                      r"\bkv(?:[ _-]?cache)?(?:[ _]size)?\s*[=:]\s*(?P<d>[\d.,]+)\s*(?P<du>[KMGT]i?B))")
_SUM_TYPE = re.compile(r"(?i:(?:-ctk|--cache-type-k|type_k|cache_type_k)[ =:]+(?P<t>f16|f32|bf16|q8_0|q4_0|q4_1|q5_0|"
                       r"q5_1|iq4_nl))")


def summary_numbers(text: str) -> dict:
    """What a typed summary line states (see the patterns above): n_ctx in tokens ("128k" is 131072), free_mib and mib
    (the request) in MiB, cache_type_k; only what the line says."""
    out: dict = {}
    m = _SUM_CTX.search(text)
    if m:
        n = int((m.group("n") or m.group("n2")).replace(",", ""))
        out["n_ctx"] = n * 1024 if (m.group("k") or m.group("n2")) else n
    m = _SUM_FREE.search(text)
    if m:
        v, u = (m.group("a"), m.group("au")) if m.group("a") else (m.group("b"), m.group("bu"))
        out["free_mib"] = _mib(v.replace(",", ""), u)
    m = _SUM_REQ.search(text)
    if m:
        v, u = next((m.group(k), m.group(k + "u")) for k in ("a", "b", "c", "d") if m.group(k))
        out["mib"] = _mib(v.replace(",", ""), u)
    m = _SUM_TYPE.search(text)
    if m:
        out["cache_type_k"] = m.group("t").lower()
    return out


def _summary(m: re.Match) -> dict:
    return {"summary": True, **summary_numbers(m.string)}


_TORCH = (r"(?:(?P<be>CUDA|HIP|XPU|MPS|NPU) (?:backend )?out of memory(?: \([^)]{0,200}\))?\.\s*(?:NPUWorkspaceAllocator )?)?"
          r"[Tt]ried to allocate (?P<req>[\d.]+) ?(?P<ru>[KMGT]i?B|bytes)"
          r"(?:\.?\s*GPU (?:(?P<dev>\d+) )? ?has a total capac(?:ity|ty) of\s+(?P<total>[\d.]+) ?(?P<tu>[KMGT]i?B) of\s+which\s+"
          r"(?P<free>[\d.]+) ?(?P<fu>[KMGT]i?B|bytes) is free"
          r"|\s*\((?:GPU|NPU) (?P<dev2>\d+); (?P<total2>[\d.]+) ?(?P<tu2>[KMGT]i?B) total(?: capacity)?;"
          r"(?: [\d.]+ ?(?:[KMGT]i?B|bytes) (?:already allocated|current active);)* (?P<free2>[\d.]+) ?(?P<fu2>[KMGT]i?B|bytes) free)?")
_TORCH_RX = re.compile(_TORCH)

RULES: tuple[OomRule, ...] = (
    # -- (first: a typed line's own words win over a runtime's, whose message it quotes) typed summaries that name a context and say it did not fit, in any order: "n_ctx 131072 doesn't fit, only 6
    #    GB free", "OOM at 32k ctx on a 24GB 4090", "CUDA out of memory with -c 65536" (short lines, as typed)
    OomRule("ctx-summary", ("OOM", "oom", "out of memory", "Out of memory", "fit", "llocation failed", "to allocate",
                            "too big", "too large"),
            # (an engine's own exception line, "Error: InsufficientMemoryError: A context size of 4096 ...", or a
            # structured log record, 'level=WARN ... msg="requested context size too large"', is read by its own rule)
            re.compile(r"(?i:^(?!.{0,200}?(?:error|exception):|.{0,80}?\blevel=).{0,160}?(?:(?:\bn_ctx|\bctx|\bcontext|(?<![\w-])-c)\b"
                       r"[^\n]{0,60}?(?:does ?n[o']t fit|won'?t "
                       r"fit|\boom\b|out of memory|too (?:big|large))|(?:\boom\b|out of memory|does ?n[o']t fit|fail\w* to "
                       r"allocate|allocation failed)[^\n]{0,60}?(?:\b\d+\s?k\s*(?:ctx|context)\b|\bn?_?ctx\s*[=:]?\s*\d|(?<![\w-])-c\s+\d))"
                       r".{0,160}$)"),
            None, "users' summaries of a context that did not fit (issue texts, chats)", phase="kv_cache",
            read=_summary),
    # -- ggml CUDA/HIP/MUSA: ggml-cuda.cu CUDA_CHECK -> ggml_cuda_error(): 2023 "CUDA error 2 at ggml-cuda.cu:N: out of
    #    memory", 2024+ "CUDA error: out of memory\n  current device: N, in function F at FILE:L\n  CALL";
    #    GGML_CUDA_NAME is "ROCm" on HIP builds and "MUSA" on MUSA builds (ggml-cuda/vendors/*.h)
    OomRule("ggml-cuda-error", ("CUDA error", "ROCm error", "HIP error", "MUSA error"),
            re.compile(r"\b(CUDA|ROCm|HIP|MUSA) error(?: \d+)?(?: at \S+:\d+)?: (?:out of memory|"
                       r"(?:hipErrorOutOfMemory|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY))", re.I),
            "cuda", "ggml-cuda.cu ggml_cuda_error / CUDA_CHECK; llama.cpp#1230, #3199, ollama#3237", read=_cuda_block),
    # ggml-cuda's VMM pool on HIP builds (vendors/hip.h CU_CHECK -> GGML_ABORT("HipVMM Failure: %s"), raised in
    #    ggml_cuda_pool_vmm::alloc): the compute scratch pool; "out of memory" is memory, other reasons are not
    OomRule("hip-vmm-oom", ("HipVMM Failure",), re.compile(r"HipVMM Failure: out of memory"), "rocm",
            "ggml/src/ggml-cuda/vendors/hip.h CU_CHECK (llama.cpp#11405)", phase="compute_buffer"),
    OomRule("hip-vmm-failure", ("HipVMM Failure",), re.compile(r"HipVMM Failure: (?!out of memory)"), "rocm",
            "ggml/src/ggml-cuda/vendors/hip.h CU_CHECK ('HipVMM Failure: invalid argument')", memory=False),
    # -- the NVIDIA kernel driver (dmesg / journal): "NVRM: nvCheckOkFailedNoLog: Check failed: Out of memory
    #    [NV_ERR_NO_MEMORY]" (open-gpu-kernel-modules' status name): the driver could not get memory for the GPU (on
    #    unified-memory systems such as DGX Spark / Grace, host memory)
    OomRule("nvrm-no-memory", ("NV_ERR_NO_MEMORY",), re.compile(r"NV_ERR_NO_MEMORY"), "cuda",
            "NVIDIA open-gpu-kernel-modules nvstatus (NV_ERR_NO_MEMORY), as the driver logs it"),
    # -- OpenVINO's GPU plugin (intel_gpu engine.cpp check_allocatable): "[GPU] Exceeded max size of memory allocation:
    #    Required N bytes, already occupied : M bytes, but available memory size is T bytes" (the device's whole memory)
    OomRule("openvino-gpu-exceeded", ("Exceeded max size of memory allocation",),
            re.compile(r"Exceeded max size of memory allocation: Required (\d+) bytes, already occupied : (\d+) bytes, but "
                       r"available memory size is (\d+) bytes"), "openvino",
            "openvinotoolkit/openvino src/plugins/intel_gpu runtime engine.cpp (canonical/inference-snaps#126)",
            read=lambda m: {"mib": _mib(m.group(1), None),
                            "free_mib": max(int(m.group(3)) - int(m.group(2)), 0) / 1048576.0}),
    # -- Rockchip's RKNN runtime under RKLLM: "E RKNN: ... failed to malloc npu memory, size: N, flags: 0x2"
    OomRule("rknn-npu-malloc", ("failed to malloc npu memory",),
            re.compile(r"failed to malloc npu memory, size: (\d+)"), "unknown",
            "airockchip rknn runtime (rknn-llm#232)", read=lambda m: _size(m, 1, None)),
    OomRule("cublas-alloc", ("CUBLAS_STATUS_ALLOC_FAILED", "HIPBLAS_STATUS_ALLOC_FAILED", "ROCBLAS_STATUS_MEMORY_ERROR",
                             "CUDNN_STATUS_ALLOC_FAILED"),
            re.compile(r"(CUBLAS|HIPBLAS|CUDNN)_STATUS_ALLOC_FAILED|ROCBLAS_STATUS_MEMORY_ERROR"),
            "cuda", "cuBLAS/hipBLAS status names (CUBLAS_CHECK in ggml-cuda.cu); ollama reports 2024: the BLAS "
            "workspace of a matrix multiplication, allocated while the graph runs", phase="compute_buffer"),
    # Ollama's 2023 runner logged ggml's "CUDA error 2 at FILE:LINE: out of memory" in two chunks: "CUDA error" and
    # "2 at .../ggml-cuda.cu:7358: out of memory"
    OomRule("ggml-cuda-error-tail", ("ggml-cuda.cu:",), re.compile(r"\b\d+ at \S*ggml-cuda\.cu:\d+: out of memory"), "cuda",
            "ggml-cuda.cu CUDA_CHECK (2023) as Ollama's llama.go forwarded it"),
    OomRule("cuda-malloc-oom", ("cudaMalloc failed", "hipMalloc failed", "cuMemCreate", "cudaErrorMemoryAllocation"),
            re.compile(r"(cuda|hip)Malloc failed: out of memory|cudaErrorMemoryAllocation|hipErrorOutOfMemory"),
            "cuda", "ggml-cuda.cu ggml_backend_cuda_buffer_type_alloc_buffer; Ollama 'cudaMalloc failed: out of memory'"),
    # -- the CUDA driver and runtime APIs' own names, as libraries that call them print them ("cuMemCreate
    #    CUDA_ERROR_OUT_OF_MEMORY", "cudaError error: 2 (out of memory)": torch_memory_saver, cupy, TensorRT)
    OomRule("cuda-api-oom", ("CUDA_ERROR_OUT_OF_MEMORY", "(out of memory)"),
            re.compile(r"\bCUDA_ERROR_OUT_OF_MEMORY\b|\bcudaError\w*:? (?:error:? )?2 \(out of memory\)"), "cuda",
            "CUDA driver API CUresult CUDA_ERROR_OUT_OF_MEMORY (2); runtime cudaErrorMemoryAllocation (2) "
            "(torch_memory_saver#99)"),
    # -- torch (vLLM, SGLang, TGI, LMDeploy's PyTorch engine): torch/csrc/.../CUDACachingAllocator.cpp
    # -- vLLM gpu_model_runner._dummy_sampler_run (V1): "CUDA out of memory occurred when warming up sampler with N
    #    dummy requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization`"
    OomRule("vllm-sampler-warmup", ("when warming up sampler", "when warming up pooler"),
            re.compile(r"out of memory occurred when warming up (?:sampler|pooler)(?: \([^)]*\))?"
                       r"(?: with (\d+) dummy requests)?"), "cuda",
            "vllm/v1/worker/gpu_model_runner.py _dummy_sampler_run / _dummy_pooler_run ('... when warming up pooler "
            "(task='embed') with 256 dummy requests')", phase="compute_buffer", engine="vllm",
            read=lambda m: {"running_seqs": int(m.group(1))} if m.group(1) else {}),
    OomRule("torch-oom", ("out of memory. Tried to allocate", "has a total capac", "backend out of memory",
                          "NPUWorkspaceAllocator tried to allocate"),
            _TORCH_RX, None, "torch CUDACachingAllocator OutOfMemoryError message (all torch 2.x)",
            phase=None, read=_torch),
    # -- torch's caching allocator (2.8+) warns before it frees its cache and retries: "[rank3]:[W814 16:06:55.44
    #    CUDACachingAllocator.cpp:3933] memory allocation failed with OOM on device 3 while trying to allocate N bytes
    #    (free: F, total: T)." -- a warning: the failure only when the run then fails (a traceback, a dead worker)
    OomRule("torch-allocator-warning", ("memory allocation failed with OOM on device",),
            re.compile(r"memory allocation failed with OOM on device (\d+) while trying to allocate (\d+) bytes"
                       r"(?: \(free: (\d+))?"), "cuda", "torch c10/cuda/CUDACachingAllocator.cpp (2.8+) TORCH_WARN",
            read=lambda m: {"device_index": int(m.group(1)), "mib": int(m.group(2)) / 1048576.0,
                            **({"free_mib": int(m.group(3)) / 1048576.0} if m.group(3) else {})}, warn=True),
    OomRule("torch-exceed-allowed", ("would exceed allowed memory",),
            re.compile(r"Allocation on device (\d+) would exceed allowed memory(?:.{0,400}?Requested\s*:\s*([\d.]+) ?"
                       r"([KMGT]i?B)(?:.{0,200}?Free \(according to CUDA\):\s*([\d.]+) ?([KMGT]i?B|bytes))?)?"),
            "cuda", "torch CUDACachingAllocator under a per-process memory fraction ('Currently allocated / Requested "
            "/ Device limit / Free (according to CUDA)'); TGI warm-up panics quote it with literal \\n",
            read=lambda m: {"device_index": int(m.group(1)), **({"mib": _mib(m.group(2), m.group(3))} if m.group(2) else {}),
                            **({"free_mib": _mib(m.group(4), m.group(5))} if m.group(4) else {})}),
    OomRule("torch-oom-bare", ("OutOfMemoryError", "CUDA out of memory", "HIP out of memory", "XPU out of memory",
                               "NPU out of memory", "CUDA driver error: out of memory",
                               "Triton Error [CUDA]: out of memory"),
            re.compile(r"torch\.(?:cuda\.)?OutOfMemoryError|\b(?:CUDA|HIP|XPU|NPU) out of memory|CUDA driver error: out of "
                       r"memory|Triton Error \[CUDA\]: out of memory"), "cuda",
            "torch OutOfMemoryError without the allocator's sizes (pasted tracebacks); the CUDA driver's and Triton's "
            "own out-of-memory errors in the same Python engines"),
    # -- Metal: ggml-metal.m (2023-24) "ggml_metal_add_buffer: error: failed to allocate 'X' buffer, size = N MB",
    #    "ggml_metal_graph_compute: command buffer N failed with status 5", and the IOGPU error text; mlx:
    #    mlx/backend/metal/allocator.cpp "[metal::malloc] Attempting to allocate N bytes which is greater than the
    #    maximum allowed buffer size of M bytes." and "[malloc_or_wait] Unable to allocate N bytes."
    OomRule("metal-add-buffer", ("failed to allocate '",),
            re.compile(r"failed to allocate '(?P<name>[^']*)' buffer, size =\s*(?P<size>[\d.]+) ?(?P<unit>MB|MiB|GB|GiB)"),
            "metal", "ggml-metal.m ggml_metal_add_buffer (2023-2024 builds)", read=_metal_buf),
    OomRule("metal-buffer-max", ("larger than buffer maximum",),
            re.compile(r"buffer '?(?P<name>\w+)'? size (?P<size>\d+) is larger than buffer maximum of (?P<max>\d+)"),
            "metal", "ggml-metal.m ggml_metal_add_buffer (2023): one buffer above the device's maxBufferLength (the name "
            "quoted: \"buffer 'data' size N is larger than buffer maximum of M\", llama.cpp#1815)",
            read=lambda m: {**_metal_buf(m), "mib": _mib(m.group("size"), None), "limit_mib": _mib(m.group("max"), None)}),
    OomRule("metal-iogpu-oom", ("kIOGPUCommandBufferCallbackErrorOutOfMemory", "Insufficient Memory"),
            re.compile(r"kIOGPUCommandBufferCallbackErrorOutOfMemory|Insufficient Memory \(0+8|"
                       r"Command buffer execution failed: Insufficient Memory"),
            "metal", "Metal command buffer error (MTLCommandBufferErrorOutOfMemory); llama.cpp, mlx, Ollama reports",
            phase="compute_buffer"),
    OomRule("metal-status-5", ("failed with status 5",),
            re.compile(r"command buffer \d+ failed with status 5"), "metal",
            "ggml-metal.m ggml_metal_graph_compute: MTLCommandBufferStatusError (5) while the graph runs",
            phase="compute_buffer"),
    OomRule("metal-nil", ("buffer is nil",), re.compile(r"ggml_metal_get_buffer: error: buffer is nil"), "metal",
            "ggml-metal.m ggml_metal_get_buffer (2023-2024): a tensor outside every buffer, after a buffer could not "
            "be allocated over the working set", phase="compute_buffer"),
    OomRule("mlx-buffer-limit", ("[metal::malloc]", "greater than the maximum allowed buffer size"),
            re.compile(r"\[metal::malloc\] Attempting to allocate (\d+) bytes(?: which is greater than the maximum "
                       r"allowed buffer size of (\d+) bytes)?|Attempting to allocate (\d+) bytes which is greater than "
                       r"the maximum allowed buffer size of (\d+) bytes"),
            "metal", "mlx/backend/metal/allocator.cpp MetalAllocator::malloc (2024 builds threw the text without the "
            "'[metal::malloc]' prefix: 'std::runtime_error: Attempting to allocate N bytes which is greater than ...')",
            engine="mlx-lm", read=_mlx_buffer),
    # -- mlx's Metal allocator counts its live buffers too (mlx/backend/metal/allocator.cpp, 2025-26: "[metal::malloc]
    #    Resource limit (499000) exceeded"): a limit on how many, not on bytes (a cache that never frees, mlx-vlm#2042)
    OomRule("mlx-resource-limit", ("Resource limit (",),
            re.compile(r"\[metal::malloc\] Resource limit \((\d+)\) exceeded"), "metal",
            "mlx backend/metal/allocator.cpp (mlx-lm, mlx-vlm, 2025-26)", engine="mlx-lm",
            read=lambda m: {"count_limit": int(m.group(1))}),
    OomRule("mlx-malloc-or-wait", ("[malloc_or_wait]", "[malloc]"),
            re.compile(r"\[(?:malloc_or_wait|malloc)\] Unable to allocate (\d+) bytes"),
            "metal", "mlx/backend/metal/allocator.cpp (malloc_or_wait, 2024; malloc, 2025)", engine="mlx-lm",
            read=lambda m: {"mib": _mib(m.group(1), None)}),
    # mlx's CUDA backend (mlx/backend/cuda/allocator.cpp, 2025-26): "[malloc_async] Unable to allocate N bytes.",
    # "cudaMallocAsync(&data, size, stream) failed: out of memory"
    OomRule("mlx-cuda-malloc", ("[malloc_async]", "cudaMallocAsync("),
            re.compile(r"\[malloc_async\] Unable to allocate (\d+) bytes|cudaMallocAsync\([^)]*\) failed: out of memory"),
            "cuda", "mlx/backend/cuda/allocator.cpp CudaAllocator::malloc_async", engine="mlx-lm",
            read=lambda m: {"mib": _mib(m.group(1), None)} if m.group(1) else {}),
    # -- mlx's Metal kernels that check one buffer against maxBufferLength before they allocate (mlx/backend/metal
    #    conv.cpp, 2026): "[conv] A single unfolding row needs N bytes, which exceeds the maximum Metal buffer size of M
    #    bytes." (activations of one operation, not the device's free memory)
    OomRule("mlx-max-buffer", ("exceeds the maximum Metal buffer size",),
            re.compile(r"needs (\d+) bytes, which exceeds the maximum Metal buffer size of (\d+) bytes"), "metal",
            "mlx/backend/metal/conv.cpp (2026)", engine="mlx-lm", phase="compute_buffer", read=_mlx_limit),
    # -- WebGPU (ggml-webgpu.cpp's uncaptured-error callback aborts with Dawn's validation text): "ggml_webgpu: Device
    #    error! Reason: 2, Message: Buffer size (N) exceeds the max buffer size limit (M)." -- one buffer above the
    #    adapter's maxBufferSize
    OomRule("webgpu-buffer-limit", ("exceeds the max buffer size limit",),
            re.compile(r"Buffer size \((\d+)\) exceeds the max buffer size limit \((\d+)\)"), None,
            "ggml/src/ggml-webgpu/ggml-webgpu.cpp (2025-26) with Dawn's CreateBuffer validation message",
            engine="llama.cpp", read=_mlx_limit),
    # -- ROCm's HSA runtime (ROCR hsa_status_t, as HIP / torch / SGLang on ROCm print it when it aborts): "HSA_STATUS_ERROR
    #    _OUT_OF_RESOURCES: The runtime failed to allocate the necessary resources." (often with "Available Free mem: N
    #    MB" next); 0x1008 is its code in HCC's STATUS_CHECK lines
    OomRule("hsa-out-of-resources", ("HSA_STATUS_ERROR_OUT_OF_RESOURCES",),
            re.compile(r"HSA_STATUS_ERROR_OUT_OF_RESOURCES"), "rocm",
            "ROCR-Runtime hsa.h hsa_status_t (sglang#25797, ROCm/hip#3253, tinygrad#3608)"),
    # -- Vulkan: vulkan-hpp exception names (ggml-vulkan.cpp catches vk::SystemError)
    OomRule("vulkan-oom", ("ErrorOutOfDeviceMemory", "ErrorOutOfHostMemory", "OutOfDeviceMemoryError",
                           "VK_ERROR_OUT_OF_DEVICE_MEMORY", "VK_ERROR_OUT_OF_HOST_MEMORY"),
            re.compile(r"ErrorOutOf(?:Device|Host)Memory|OutOf(?:Device|Host)MemoryError|VK_ERROR_OUT_OF_(?:DEVICE|HOST)_MEMORY"),
            "vulkan", "vulkan-hpp vk::OutOfDeviceMemoryError; ggml-vulkan.cpp"),
    # -- Mesa's RADV Vulkan driver (src/amd/vulkan/winsys/amdgpu/radv_amdgpu_bo.c): "radv/amdgpu: Failed to
    #    allocate a buffer:" then its size / alignment / domains lines, before the application's own error
    OomRule("radv-alloc", ("radv/amdgpu: Failed to allocate",), re.compile(r"radv/amdgpu: Failed to allocate a buffer"),
            "vulkan", "Mesa RADV winsys radv_amdgpu_winsys_bo_create"),
    # -- SYCL / Level Zero / Unified Runtime (ggml-sycl.cpp catches sycl::exception: "Native API returns: -5
    #    (PI_ERROR_OUT_OF_RESOURCES)", "UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY")
    OomRule("sycl-oom", ("PI_ERROR_OUT_OF_", "UR_RESULT_ERROR_OUT_OF_", "ZE_RESULT_ERROR_OUT_OF_",
                         "CL_OUT_OF_RESOURCES", "CL_OUT_OF_HOST_MEMORY", "CL_MEM_OBJECT_ALLOCATION_FAILURE"),
            re.compile(r"(?:PI|UR_RESULT|ZE_RESULT)_ERROR_OUT_OF_(?:HOST_MEMORY|DEVICE_MEMORY|RESOURCES)|"
                       r"CL_OUT_OF_(?:RESOURCES|HOST_MEMORY)|CL_MEM_OBJECT_ALLOCATION_FAILURE"),
            "sycl", "SYCL PI / Unified Runtime / Level Zero / OpenCL error names (ggml-sycl.cpp, ggml-opencl.cpp)"),
    # -- OpenCL: ggml-opencl.cpp CL_CHECK (2023-24 CLBlast builds) "ggml_opencl: <call> error <code> at
    #    ggml-opencl.cpp:<line>": a clCreateBuffer that failed, or the OpenCL codes of memory exhaustion
    #    (-4 CL_MEM_OBJECT_ALLOCATION_FAILURE, -5 CL_OUT_OF_RESOURCES, -6 CL_OUT_OF_HOST_MEMORY, -61 CL_INVALID_BUFFER_SIZE)
    OomRule("opencl-check", ("ggml_opencl:",),
            re.compile(r"ggml_opencl: .{0,200}?(?:clCreateBuffer.{0,200}? error -?\d+|error -(?:4|5|6|61)) at \S*ggml-opencl"),
            "opencl", "ggml-opencl.cpp CL_CHECK (llama.cpp 2023-2024, koboldcpp CLBlast)", engine="llama.cpp"),
    # -- ONNX Runtime's arena (onnxruntime/core/framework/bfc_arena.cc, ORT GenAI / Foundry Local / Olive, 2023-26):
    #    "BFCArena::AllocateRawInternal Failed to allocate memory for requested buffer of size 197001216" (bytes); under
    #    "Exception during initialization:" (InferenceSession::Initialize) the session was loading its initializers,
    #    i.e. the weights (foundry-local#199)
    OomRule("ort-bfc-arena", ("BFCArena",),
            re.compile(r"BFCArena::AllocateRawInternal Failed to allocate memory for requested buffer of size (\d+)"),
            None, "onnxruntime core/framework/bfc_arena.cc",
            read=lambda m: {"mib": _mib(m.group(1), None),
                            **({"phase": "model_weights"} if "Exception during initialization" in m.string else {})}),
    # -- CLBlast's own error (ggml's CLBlast matmul in prompt processing, 2023-24 llama.cpp / koboldcpp / whisper.cpp's
    #    talk-llama): "CLBlast: OpenCL error: clEnqueueNDRangeKernel: -4" with a memory code -- the device could not
    #    hold the matmul's buffers (koboldcpp#100, whisper.cpp#1896)
    OomRule("clblast-oom", ("CLBlast: OpenCL error",),
            re.compile(r"CLBlast: OpenCL error: \w+: -(?:4|5|6|61)\b"), "opencl",
            "CLBlast's clblast::Error as ggml's CLBlast path prints it", phase="compute_buffer", engine="llama.cpp"),
    # the same check on any other code (-1001: no OpenCL platform, the ICD loader found none; -30 invalid value...):
    # the backend did not start, not a memory failure, whatever hint follows ("You may be out of VRAM")
    OomRule("opencl-check-other", ("ggml_opencl:",),
            re.compile(r"ggml_opencl: .{0,200}? error -?\d+ at \S*ggml-opencl"),
            "opencl", "ggml-opencl.cpp CL_CHECK with a code that is not memory (koboldcpp#239: -1001)",
            engine="llama.cpp", memory=False),
    # -- Metal API validation (debug builds, Xcode): "newBufferWith*:length 0x86004000 must not exceed 2048 MB."
    OomRule("metal-validation-length", ("must not exceed",),
            re.compile(r"newBuffer\w*\*?:length (?P<len>0x[0-9a-fA-F]+|\d+) must not exceed (?P<max>\d+) MB"),
            "metal", "Metal API Validation (MTLDebugDevice 'Buffer Validation' assertion): one buffer above the "
            "device's maxBufferLength", read=lambda m: {"mib": int(m.group("len"), 0) / 1048576.0,
                                                         "limit_mib": float(m.group("max"))}),
    # -- CANN (Ascend): ggml-cann aclrtMalloc / ACL_ERROR_RT_MEMORY_ALLOCATION (207001), rtMalloc failures
    OomRule("cann-oom", ("aclrtMalloc", "rtMalloc", "ACL_ERROR_RT_MEMORY_ALLOCATION", "207001"),
            # (207001 only as an error code, "runtime result = 207001", "error code 207001", "ret=207001": a bare
            # number is a PID, a task id or a vocabulary size as often)
            re.compile(r"ACL_ERROR_RT_MEMORY_ALLOCATION|(?:result|code|ret|error|errno)\W{0,3}(?:is\W{1,2})?207001\b|"
                       r"(?:acl)?rtMalloc\w*\b.{0,80}?(?:fail|error|out of memory)",
                       re.I), "cann", "ggml-cann ACL_CHECK; CANN runtime error 207001 (memory allocation)"),
    # -- 2023 ggml: ggml.c ggml_new_tensor_impl / ggml_new_object "not enough space in the context's memory pool
    #    (needed N, available M)" and the scratch pool twin: a fixed host pool that was sized too small
    # -- ggml.c ggml_new_object (2023-10+): the no_alloc context that holds the tensor and graph *objects* (metadata,
    #    sized from max_nodes x ggml_tensor_overhead()) is full: a graph with more nodes than it was sized for, a sizing
    #    bug of the program, not device or host memory running out (llama.cpp#3757, ca-018's meta backend)
    OomRule("ggml-object-pool", ("ggml_new_object",),
            re.compile(r"ggml_new_object: not enough space in the context's memory pool"), None,
            "ggml.c ggml_new_object (2023-10 onwards)", engine="llama.cpp", memory=False),
    OomRule("ggml-pool", ("memory pool (needed", "memory pool",),
            re.compile(r"not enough space in the (?:context's|scratch) memory pool(?: \(needed (?P<need>\d+), "
                       r"available (?P<avail>\d+)\))?"),
            "cpu", "ggml.c (2023) ggml_new_tensor_impl / ggml_new_object", phase="compute_buffer", read=_pool),
    # -- ggml-alloc.c (2023): the graph allocator's free-block table is full: GGML_ASSERT(alloc->n_free_blocks <
    #    MAX_FREE_BLOCKS && "out of free blocks") while the compute graph is allocated
    OomRule("ggml-alloc-free-blocks", ("out of free blocks",), re.compile(r"out of free blocks"), None,
            "ggml-alloc.c ggml_allocr_free_tensor / ggml_tallocr (2023-24)", phase="compute_buffer", engine="llama.cpp"),
    # -- host memory: C++ std::bad_alloc, errno ENOMEM, Python MemoryError, the kernel's OOM killer
    OomRule("torch-cpu-alloc", ("DefaultCPUAllocator",),
            re.compile(r"DefaultCPUAllocator: (?:not enough memory|can't allocate memory): you tried to allocate (\d+) bytes"),
            "cpu", "pytorch c10/core/impl/alloc_cpu.cpp alloc_cpu (CAFFE_ENFORCE)", read=lambda m: _size(m, 1, None)),
    OomRule("bad-alloc", ("bad_alloc",), re.compile(r"std::bad_alloc|\bbad_alloc\b"), "cpu",
            "libstdc++ 'terminate called after throwing an instance of std::bad_alloc'"),
    OomRule("enomem", ("Cannot allocate memory", "cannot allocate memory", "ENOMEM", "errno 12"),
            re.compile(r"[Cc]annot allocate memory|\bENOMEM\b|mmap failed w/ errno 12\b"), "cpu",
            "strerror(ENOMEM) (mmap, fork, malloc wrappers); llamafile's APE loader 'prog mmap failed w/ errno 12' "
            "(llamafile#152)"),
    # -- Windows' commit limit (ERROR_COMMITMENT_LIMIT, 1455) as Rust's std::io::Error prints it (safetensors loading
    #    weights: ComfyUI#8065, krita-ai-diffusion#1898): the host's RAM plus page file is spent
    OomRule("windows-commit-limit", ("paging file is too small", "os error 1455"),
            re.compile(r"paging file is too small|\(os error 1455\)"), "cpu", "Windows ERROR_COMMITMENT_LIMIT (1455)"),
    # -- Ray's memory monitor kills a worker when the node's RAM passes its threshold (vllm#15102, #2669): "Task was
    #    killed due to the node running low on memory", the raylet's "killed due to memory pressure (OOM)"
    OomRule("ray-memory-monitor", ("running low on memory", "killed due to memory pressure",
                                   "exceeds the memory usage threshold", "how to address the out of memory issue"),
            re.compile(r"killed due to the node running low on memory|killed due to memory pressure \(OOM\)|"
                       r"which exceeds the memory usage threshold of [\d.]+\. Ray killed|"
                       r"docs\.ray\.io/\S*ray-oom-prevention"), "cpu",
            "Ray memory monitor (ray.exceptions.OutOfMemoryError; raylet node_manager: 'Memory on the node ... was "
            "12.49GB / 13.15GB (0.95), which exceeds the memory usage threshold of 0.95. Ray killed this worker', then "
            "its advice line with the ray-oom-prevention link)"),
    OomRule("oom-killer", ("Out of memory: Kill", "oom-kill", "oom_kill", "OOMKilled", "signal: killed", "OOM killer",
                           "exit status 137", "exit code 137", "Killed", "killed", "SIGKILL", "lowmemorykiller: Kill",
                           "Tasks state (memory values in pages)"),
            re.compile(r"Out of memory: Kill(?:ed)? process|oom[-_]kill|OOMKilled|killed by the OOM killer|signal: killed|"
                       # the task table the OOM killer dumps before it kills (mm/oom_kill.c dump_tasks), when a paste kept
                       # the dump but not the verdict line
                       r"Tasks state \(memory values in pages\):|"
                       # Android's low-memory killer (lmkd / lowmemorykiller: "Kill 'com.app' (18770), uid ..., to free
                       # 9871232kB rss ... reason: device is low on swap"), as logcat prints it
                       r"lowmemorykiller: Kill '|"
                       r"exit (?:status|code) 137|signal 9: SIGKILL|"
                       r"^(?:\S+: )?Killed(?:\s+\S.*)?$|\bKilled\s+(?:python\S*|llama\S*|ollama\S*|vllm\S*)|"
                       # zsh's and bash's job reports: "zsh: killed     python3 ...", "[1]    12345 killed     ./llama-server"
                       r"^(?:zsh|bash|sh|fish): killed\s+\S|^\[\d+\][+-]?\s+\d+ killed\s+\S"),
            "cpu", "Linux OOM killer (dmesg), shells' 'Killed' (and zsh's / job control's 'killed'), Go's 'signal: "
            "killed', docker OOMKilled, an IDE's 'exit code 137 (interrupted by signal 9: SIGKILL)'"),
    OomRule("python-memoryerror", ("MemoryError",), re.compile(r"(?<!raise )\bMemoryError\b(?!\w)(?!\()(?!: No enough free memory blocks)"), "cpu",
            "Python MemoryError (not LMDeploy's block manager's, read by lmdeploy-no-enough: a KV pool, not the host)"),
    # -- iOS / iPadOS jetsam, as the system tells the user: "The app “X” has been killed by the operating system
    #    because it is using too much memory." (the process's memory limit, not a device allocation)
    OomRule("ios-jetsam", ("using too much memory", "RESOURCE_TYPE_MEMORY"),
            re.compile(r"killed by the operating system because it is using too much memory|"
                       # the kernel's per-process limit as Xcode's debugger reports it ("EXC_RESOURCE
                       # (RESOURCE_TYPE_MEMORY: high watermark memory limit exceeded) (limit=6144 MB)", mlx-swift-lm#209)
                       r"EXC_RESOURCE \(RESOURCE_TYPE_MEMORY: [\w ]*memory limit exceeded\)"), "cpu",
            "iOS jetsam's memory-limit notice (MLC Chat and other phone apps); xnu's EXC_RESOURCE for a process over "
            "its memory limit"),
    # -- macOS's kernel (xnu kern_memorystatus.c) when swap runs out: "low swap: killing largest compressed process
    #    with pid N (name) and size M MB" (as `log show` prints it); M is the victim's compressed size, not a request
    OomRule("macos-low-swap", ("low swap: killing",), re.compile(r"low swap: killing largest compressed process"), "cpu",
            "xnu bsd/kern/kern_memorystatus.c no_paging_space_action"),
    # -- torch's CPU allocator (c10/core/impl/alloc_cpu.cpp): "[enforce fail at alloc_cpu.cpp:117] data.
    #    DefaultCPUAllocator: not enough memory: you tried to allocate N bytes." (host RAM, loading weights on the CPU)
    # -- engines' own messages that say memory could not be had, in any wording not read by their parsers
    OomRule("turbomind-oom", ("[TM][ERROR]", "TurboMind", "turbomind"),
            re.compile(r"\[TM\]\[ERROR\].{0,200}?out of memory", re.I),
            "cuda", "lmdeploy/turbomind (src/turbomind/utils/cuda_utils.h check)", engine="lmdeploy"),
    OomRule("turbomind-blocks", ("No enough blocks", "no enough blocks"), re.compile(r"[Nn]o enough blocks"), "cuda",
            "lmdeploy/turbomind LlamaBatch / BlockManager: the KV block pool cannot hold the batch", engine="lmdeploy",
            phase="kv_capacity"),
    # -- TurboMind's warm-up (2025-26, engine/engine.cc): "[TM][ERROR] [Engine] Warm-up for N tokens failed with status
    #    S", S a Request status (engine/request.h): 6 kTooLong "history + prompt > session_len" (the session length,
    #    cut to what the KV pool holds, is below the warm-up's tokens: lmdeploy#4366), 11 kOutOfMemory
    OomRule("turbomind-warmup-too-long", ("Warm-up for",),
            re.compile(r"\[Engine\] Warm-up for (\d+) tokens failed with status 6\b"), "cuda",
            "lmdeploy src/turbomind/engine (Request::kTooLong = 6)", engine="lmdeploy", phase="kv_capacity"),
    OomRule("turbomind-warmup-oom", ("Warm-up for",),
            re.compile(r"\[Engine\] Warm-up for (\d+) tokens failed with status 11\b"), "cuda",
            "lmdeploy src/turbomind/engine (Request::kOutOfMemory = 11)", engine="lmdeploy", phase="compute_buffer"),
    # -- LMDeploy's PyTorch engine sizes its pools from free memory (executor/base.py): "No enough gpu memory for kv
    #    cache." / "... for state cache." (no block fits: the pool is too small, as vLLM's "No available memory for the
    #    cache blocks"), "No enough gpu memory for runtime." (nothing left for the prefill activations: its own budget);
    #    the paged block manager's MemoryError "No enough free memory blocks." (a sequence needs more blocks than free)
    OomRule("lmdeploy-no-enough", ("No enough gpu memory for", "No enough free memory blocks", "No enough host memory for"),
            re.compile(r"No enough (?:(?:gpu|host) memory for (?P<what>kv cache|state cache|runtime)|free memory blocks)"),
            None,
            "lmdeploy pytorch/engine/executor/base.py _get_num_gpu_blocks / _reserve_runtime_mem; "
            "pytorch/paging/block_manager (MemoryError)", engine="lmdeploy",
            read=lambda m: {"phase_hint": "memory_budget" if m.group("what") == "runtime" else "kv_capacity"}),
    # -- TGI v3's router after warm-up (backends/v3/src/lib.rs V3Error::NotEnoughMemory(max_total_tokens)): the KV
    #    blocks the shards reported cannot hold max_total_tokens (the number is tokens)
    OomRule("tgi-not-enough-memory", ("NotEnoughMemory(",), re.compile(r"NotEnoughMemory\((?P<m>\d+)\)"), None,
            "huggingface/text-generation-inference backends/v3/src/lib.rs", engine="tgi", phase="kv_capacity",
            read=lambda m: {"limit_tokens": int(m.group("m"))}),
    # -- OpenVINO GenAI's continuous-batching scheduler (utils.hpp assert_request_was_scheduled): "Request 0 was dropped
    #    by the scheduler because it did not fit in the available cache budget (out of memory)": its KV cache_size
    OomRule("openvino-genai-cache-budget", ("did not fit in the available cache budget",),
            re.compile(r"dropped by the scheduler because it did not fit in the available cache budget"), "openvino",
            "openvinotoolkit/openvino.genai src/cpp/src/utils.hpp (2026)", phase="kv_capacity"),
    # -- TurboMind's engine (2026, engine.cc): the KV block pool cannot admit even the oldest request, which is failed
    #    ("dp0 ID 17: cache out of memory, no request can be admitted; failing head-of-line request")
    OomRule("turbomind-admission", ("no request can be admitted",),
            re.compile(r"cache out of memory, no request can be admitted"), None,
            "lmdeploy src/turbomind/engine/engine.cc (TM_LOG_WARN)", engine="lmdeploy", phase="kv_capacity"),
    # -- Ollama's MLX image-generation runner (x/imagegen/imagegen.go, 0.30+): its own memory check, "insufficient memory
    #    for image generation: need 24 GB, have 16 GB" (bytes / 1024^3, so GiB)
    OomRule("ollama-imagegen-memory", ("insufficient memory for image generation",),
            re.compile(r"insufficient memory for image generation: need (?P<need>\d+) GB, have (?P<have>\d+) GB"), None,
            "ollama x/imagegen/imagegen.go CheckMemory", phase="memory_budget", engine="ollama",
            read=lambda m: {"mib": int(m.group("need")) * 1024.0, "free_mib": int(m.group("have")) * 1024.0}),
    # -- koboldcpp's legacy ggml model runners (otherarch/gpt2_v3.cpp, gptj_v3.cpp, neox_v3.cpp, mpt_v3.cpp, 2023): a
    #    host buffer for one batch ("gpt2_eval: failed to allocate N bytes. Try reducing batch size.")
    OomRule("kobold-legacy-eval", ("_eval: failed to allocate",),
            re.compile(r"\b(?:gpt2|gptj|gpt_neox|neox|mpt|rwkv|llama_v[23]|falcon)_eval: failed to allocate (\d+) bytes"),
            "cpu", "koboldcpp otherarch/*_v3.cpp *_eval (2023)", phase="compute_buffer", engine="llama.cpp",
            read=lambda m: {"mib": _mib(m.group(1), None)}),
    # koboldcpp (v1.93+, gpttype_adapter.cpp): a KV save-state slot it could not allocate is skipped, the server serves on
    OomRule("kobold-kv-save-state", ("KV Save State: Failed to allocate",),
            re.compile(r"KV Save State: Failed to allocate (\d+) bytes"), "cpu",
            "koboldcpp gpttype_adapter.cpp save-state slots (skipped, not fatal)", engine="llama.cpp", warn=True,
            read=lambda m: {"mib": _mib(m.group(1), None)}),
    # -- torch's MPS allocator (aten/src/ATen/mps/MPSAllocator.mm): one buffer above what Metal can allocate
    OomRule("mps-invalid-buffer-size", ("Invalid buffer size:",),
            re.compile(r"Invalid buffer size: (?P<size>[\d.]+) ?(?P<unit>[KMGT]i?B)"), "metal",
            "pytorch aten/src/ATen/mps/MPSAllocator.mm alloc_buffer_block", read=lambda m: _size(m, 1, 2)),
    OomRule("need-have", ("need",),
            re.compile(r"(?i:(?P<kv>kv[ -]?cache\b)?.{0,60}?(?:oom|out of memory|not enough|insufficient|too (?:large|big)|"
                       r"does ?n[o']t fit|fail\w*)\b.{0,60}?\bneed(?:s|ed)?\W{0,3}(?P<need>[\d.]+)\s*(?P<nu>[KMGT]i?B)"
                       r"\W{1,6}(?:but\s+)?(?:only|have|has|available|free)\W{0,3}(?P<have>[\d.]+)\s*(?P<hu>[KMGT]i?B))"),
            None, "users' and blogs' summaries: 'KV cache OOM (need 8.33 GiB, only 8.29 GiB)', 'not enough GPU memory "
                  "for KV cache: need 20 GiB, have 10 GiB'", read=_need_have),
    OomRule("need-but-only", ("but only",),
            re.compile(r"(?i:(?P<kv>kv[ -]?cache\b)\W{0,3}(?:is |was )?need(?:s|ed)?\W{0,3}(?P<need>[\d.]+)\s*(?P<nu>[KMGT]i?B)"
                       r"\W{1,6}but\s+only\W{0,3}(?P<have>[\d.]+)\s*(?P<hu>[KMGT]i?B))"),
            None, "users' summaries of vLLM's KV check ('says KV cache needed 16 GiB but only 9.05 GiB available')",
            read=_need_have),
    # -- paraphrased or summary lines as people type them: "failed to allocate KV cache (requested ctx=262144,
    #    gpu memory free=1024 MiB)", "n_ctx 32768 doesn't fit, only 2 GB free"
    OomRule("kv-summary", ("KV cache", "kv cache", "KV-cache", "kv-cache"),
            re.compile(r"(?i:(?:fail\w*|unable|could ?n[o']t|cannot|can't)\W+(?:\w+\W+){0,3}?(?:to\s+)?"
                       r"(?:allocate|alloc|fit|create)\w*\W+(?:\w+\W+){0,2}?kv[ -]cache)"
                       r"(?:[^\n]{0,120}?(?i:ctx|n_ctx|context)\s*[=:]?\s*(?P<ctx>\d[\d,]*))?"
                       r"(?:[^\n]{0,80}?(?i:free)\s*[=:]?\s*(?P<free>[\d.,]+)\s*(?P<fu>[KMGT]i?B))?"),
            None, "users' summaries of llama-server failures (issue texts, chats)", phase="kv_cache", read=_summary),
    # -- the KV cache is full at run time: llama.cpp llama_decode "failed to find KV cache slot for ubatch of size N"
    #    (2024), "failed to find a memory slot for batch of size N" (2025+), the server's "failed to find free space
    #    in the KV cache"; Ollama's runner "could not find a kv cache slot"
    OomRule("kv-slot", ("KV cache slot", "kv cache slot", "memory slot for", "free space in the KV cache",
                        "failed to prepare attention ubatches", "KV cache is full", "too big compared to KV size",
                        "Context size has been exceeded", "context size has been exceeded", "context size exceeded",
                        "failed to decode, ret = 1", "NoKvSlot", "llama_decode returned 1", "NoKvCacheSlot"),
            re.compile(r"(?i:failed to find (?:a )?(?:kv cache slot|memory slot for (?:u?batch)|free space in the kv cache)"
                       r"|failed to prepare attention ubatches|kv cache is full|too big compared to kv size"
                       r"|context size has been exceeded|^context size exceeded$|failed to decode, ret = 1\b)"
                       # LLamaSharp names llama_decode's return codes (DecodeResult.NoKvSlot = 1)
                       r"|llama_decode failed: '?NoKvSlot\b"
                       # llama-cpp-python's exception for it (_internals.py: RuntimeError(f"llama_decode returned {n}"))
                       r"|llama_decode returned 1\b"
                       # the Rust bindings' name for it (llama-cpp-2 DecodeError::NoKvCacheSlot: "Decode Error 1:
                       # NoKvCacheSlot", nobodywho#74)
                       r"|\bNoKvCacheSlot\b"),
            None, "llama.cpp llama_decode (llama-context.cpp), the hybrid memory's init_batch (llama-memory-hybrid.cpp), "
            "llama-server update_slots ('failed to decode the batch: KV cache is full', 'Input prompt is too big "
            "compared to KV size', 'Context size has been exceeded'); examples/simple-chat and llama-run's own check "
            "('context size exceeded' alone on its line); llama_decode's return value 1, 'could not find a KV slot for the "
            "batch' (llama.h), as the examples abort on it ('failed to decode, ret = 1') and LLamaSharp names it "
            "(LLamaDecodeError: llama_decode failed: 'NoKvSlot', LLamaSharp#660) and llama-cpp-python raises it "
            "(RuntimeError('llama_decode returned 1'), home-llm#188)", phase="kv_capacity",
            engine="llama.cpp"),
    OomRule("kv-slot-ollama", ("could not find a kv cache slot", "could not find a KV cache slot"),
            re.compile(r"(?i:could not find a kv cache slot)"), None, "Ollama runner kvcache/causal.go (2024-2026)",
            phase="kv_capacity", engine="ollama"),
    # -- llama_decode's return value 1 in llama.h's own words, as a binding relays it (Ollama 0.4's Go runner,
    #    runner.go "failed to decode batch" error="could not find a KV slot for the batch - try reducing the size of
    #    the batch or increase the context. code: 1", ollama#7545): the KV cache is full
    OomRule("kv-slot-batch", ("KV slot for the batch", "kv slot for the batch"),
            re.compile(r"(?i:could not find a kv slot for the batch)"), None,
            "llama.cpp llama.h (llama_decode return 1) as Ollama 0.4's runner.go relays it (ollama#7545)",
            phase="kv_capacity"),
    # -- on-device runtimes refusing a request longer than the KV cache they were exported or built with: ExecuTorch's
    #    runner ("assert failed (num_prompt_tokens < metadata_.at(kMaxSeqLen)): num_prompt_tokens 140 >= max_seq_len_
    #    128, Max seq length exceed", torchchat#1395), MediaPipe LLM inference ("Max number of tokens is larger than
    #    the maximum cache size supported: 32000 > 2048", flutter_gemma#62)
    OomRule("on-device-seq-over-cache", ("Max seq length exceed", "maximum cache size supported"),
            re.compile(r"num_prompt_tokens (?P<n>\d+) >= max_seq_len_? (?P<lim>\d+)|"
                       r"larger than the maximum cache size supported: (?P<n2>\d+) > (?P<lim2>\d+)"), None,
            "ExecuTorch extension/llm runner (torchchat#1395); MediaPipe LLM inference (flutter_gemma#62)",
            phase="kv_capacity",
            read=lambda m: {"tokens": int(m.group("n") or m.group("n2")),
                            "limit_tokens": int(m.group("lim") or m.group("lim2"))}),
    # -- llama-server (2025+) refuses a request longer than the slot's context: error JSON "request (N tokens) exceeds
    #    the available context size (M tokens), try increasing it", "type":"exceed_context_size_error"
    OomRule("llama-server-exceed-context", ("exceed_context_size_error", "exceeds the available context size",
                                            "is larger than the max context size"),
            re.compile(r"(?:request \((?P<n>\d+) tokens\) )?(?:exceeds the available context size(?: \((?P<m>\d+) "
                       r"tokens\))?|exceed_context_size_error)|input \((?P<n2>\d+) tokens\) is larger than the max "
                       r"context size \((?P<m2>\d+)"), None,
            "llama.cpp tools/server (ERROR_TYPE_EXCEED_CONTEXT_SIZE), as clients relay its 400 body; server-context.cpp "
            "'input (N tokens) is larger than the max context size (M tokens). skipping' (no context shift, embeddings)",
            phase="kv_capacity", engine="llama.cpp", read=_tokens_json),
    # -- a request longer than the context (or the model's maximum length) refused before any memory is asked for,
    #    in each engine's words: the context / KV pool is too small for the request (phase kv_capacity, as llama-server's
    #    exceed_context_size_error above). request_tokens / limit_tokens are tokens.
    # vLLM's SamplingParams check when the server computed max_tokens as max_model_len - prompt tokens and the prompt is
    #    longer than the context ("max_tokens must be at least 1, got -186": vllm#4667; sampling_params.py _verify_args)
    OomRule("vllm-max-tokens-negative", ("max_tokens must be at least 1, got -",),
            re.compile(r"max_tokens must be at least 1, got -(?P<over>\d+)"), None,
            "vllm sampling_params.py _verify_args with the OpenAI server's max_tokens = max_model_len - prompt tokens",
            phase="kv_capacity", engine="vllm"),
    # vLLM's CPU backend (v1/worker/cpu_worker.py determine_available_memory, 2026): the RAM of the NUMA node against the
    #    KV reservation, and the worker's own use above its reserved share ("leaving none for the KV cache")
    OomRule("vllm-cpu-kv-budget", ("on kv cache allocation is less than requested memory for kv",),
            re.compile(r"Available memory on node \d+ \((?P<free>[\d.]+)/[\d.]+ GiB\) on kv cache allocation is less than "
                       r"requested memory for kv \((?P<req>[\d.]+)/[\d.]+ GiB\)"), "cpu",
            "vllm/v1/worker/cpu_worker.py determine_available_memory", phase="memory_budget", engine="vllm",
            read=lambda m: {"mib": float(m.group("req")) * 1024.0, "free_mib": float(m.group("free")) * 1024.0}),
    OomRule("vllm-cpu-no-kv", ("leaving none for the KV cache",),
            re.compile(r"GiB of CPU memory reserved for it on node \d+, leaving none for the KV cache"), "cpu",
            "vllm/v1/worker/cpu_worker.py (the CPU backend's --gpu-memory-utilization is a share of RAM)",
            phase="kv_capacity", engine="vllm"),
    # vLLM V0's CPU swap space for preempted KV blocks (config.py verify_with_parallel_config "Too large swap space. N GiB
    #    out of the M GiB total CPU memory is allocated for the swap space."; scheduler.py _preempt_by_swap "Aborted due to
    #    the lack of CPU swap space")
    OomRule("vllm-swap-space", ("Too large swap space",),
            re.compile(r"ValueError: Too large swap space\. (?P<req>[\d.]+) GiB out of the (?P<tot>[\d.]+) GiB total CPU"),
            "cpu", "vllm/config.py CacheConfig.verify_with_parallel_config (V0)", phase="memory_budget", engine="vllm",
            read=lambda m: {"mib": float(m.group("req")) * 1024.0}),
    OomRule("vllm-swap-exhausted", ("lack of CPU swap space",),
            re.compile(r"Aborted due to the lack of CPU swap space"), None,
            "vllm/core/scheduler.py _preempt_by_swap (V0): the KV blocks of preempted requests found no swap room",
            phase="kv_capacity", engine="vllm"),
    OomRule("vllm-prompt-too-long", ("is too long and exceeds limit of", "longer than the maximum model length",
                                     "exceeds the capacity of block_manager", "exceeds the max_model_len"),
            re.compile(r"Input prompt \((?P<n>\d+) tokens\)(?: \+ lookahead slots \(\d+\))? is too long and exceeds "
                       r"limit of (?P<m>\d+)|"
                       # (V0's scheduler when the KV pool itself cannot ever hold the prompt: "Input prompt (N tokens)
                       # [+ lookahead slots (L)] is too long and exceeds the capacity of block_manager", ignored)
                       r"Input prompt \((?P<n4>\d+) tokens\)(?: \+ lookahead slots \(\d+\))? is too long and exceeds the "
                       r"capacity of block_manager|"
                       # (the Responses API, 2026: "The engine prompt length N exceeds the max_model_len M")
                       r"prompt length (?P<n5>\d+) exceeds the max_model_len (?P<m3>\d+)|"
                       r"(?:decoder prompt \(length (?P<n2>\d+)\)|Prompt length of (?P<n3>\d+)) is longer than the "
                       r"maximum model length of (?P<m2>\d+)"), None,
            "vllm core/scheduler.py (V0: 'Input prompt (N tokens) is too long and exceeds limit of M', the request is "
            "ignored, vllm#525, #10440); engine/processor _validate_model_input ('The decoder prompt (length N) is longer "
            "than the maximum model length of M', 'Prompt length of N is longer than ...', xorbitsai/inference#3785)",
            phase="kv_capacity", engine="vllm", read=_tokens),
    OomRule("openai-max-context", ("maximum context length is",),
            re.compile(r"maximum context length is (?P<m>\d+) tokens(?:\. However, you requested (?P<n>\d+) tokens|\. "
                       r"However, your request has (?P<n2>\d+) input tokens| and your request has (?P<given>\d+) input "
                       r"tokens \((?P<new>\d+) >|\. However, your prompt contains at least (?P<n3>\d+) input tokens, "
                       r"which exceeds|, however you requested (?P<n4>\d+) tokens \(\d+ in your prompt)"), None,
            "the OpenAI-compatible servers' refusal (vLLM serving_chat.py and others, vllm#20409; vLLM 2025-26 "
            "VLLMValidationError 'However, your request has N input tokens' and the max_tokens check 'your request has N "
            "input tokens (M > L - N)')", phase="kv_capacity", read=_tokens),
    # -- vLLM's own wordings of that refusal (serving_engine.py, 2025-26): "However, you requested N output tokens and
    #    your prompt contains at least M input tokens, for a total of at least T tokens" (clients and agents relay it:
    #    many public tests quote it verbatim)
    OomRule("vllm-max-context", ("output tokens and your prompt contains", "input tokens, for a total of"),
            re.compile(r"maximum context length is (?P<m>\d+) tokens\. However, you requested (?P<new>\d+) output tokens "
                       r"and your prompt contains at least (?P<given>\d+) input tokens"), None,
            "vllm entrypoints/openai serving_engine.py (2025-26)", phase="kv_capacity", engine="vllm",
            read=_tokens),
    OomRule("sglang-input-too-long", ("longer than the model's context length", "longer than the model\\'s context",
                                      "Requested token count exceeds", "model's context length ("),
            re.compile(r"The input \((?P<n>\d+) tokens\) is longer than the model\\?'s context length \((?P<m>\d+) "
                       r"tokens\)|Requested token count exceeds the model\\?'s maximum context length of (?P<m2>\d+) "
                       r"tokens\. You requested a total of (?P<n2>\d+) tokens"), None,
            "SGLang tokenizer manager's input validation (Qwen3#1321, sglang#8096; _validate_one_request's 'Requested "
            "token count exceeds the model's maximum context length of M tokens. You requested a total of N tokens')",
            phase="kv_capacity", engine="sglang", read=_tokens),
    OomRule("tgi-input-validation", ("Input validation error", "`max_new_tokens` must be <=", "`inputs` must have less than",
                                     "`inputs` tokens + `max_new_tokens`"),
            re.compile(r"(?:Input validation error: )?`inputs` (?:tokens \+ `max_new_tokens` must be <= (?P<m>\d+)(?:\. "
                       r"Given: (?P<given>\d+) `inputs` tokens and (?P<new>\d+) `max_new_tokens`)?|must have less than "
                       r"(?P<m2>\d+) tokens\. Given: (?P<n>\d+))|`max_new_tokens` must be <= (?P<m3>\d+)\b"), None,
            "TGI router validation.rs (max_total_tokens / max_input_tokens; MaxNewTokens: \"`max_new_tokens` must be <= "
            "{0}. Given: {1}\", the room max_total_tokens leaves after the input; llm-vscode#94, TGI#695)",
            phase="kv_capacity", engine="tgi",
            read=lambda m: {**_tokens(m), **({"limit_setting": "--max-input-tokens"} if m.group("m2") else {})}),
    OomRule("ollama-input-too-long", ("input length exceeds", "exceeds the context length",
                                      "exceeds maximum context length"),
            re.compile(r"input length exceeds (?:the |maximum )?context length|"
                       r"input (?:after truncation )?exceeds maximum context length"), None,
            "ollama server/routes.go EmbedHandler ('input length exceeds maximum context length', n8n#11144; 'the input "
            "length exceeds the context length', 2025; 2026: 'input exceeds maximum context length and cannot be "
            "truncated further', 'input after truncation exceeds maximum context length')", phase="kv_capacity",
            engine="ollama"),
    # -- Ollama 0.13+ (llm/server.go): the fitted layout's final allocation failed ("failed to commit memory for model"):
    #    memory that was free at the fit was gone at the commit
    OomRule("ollama-commit-failed", ("failed to commit memory for model",),
            re.compile(r"failed to commit memory for model"), None, "ollama llm/server.go (0.13+) commit step",
            engine="ollama"),
    # -- Ollama (2025-26, llm/llama_server.go completionPromptForRequest): with context shift off, a prompt that
    #    reaches num_ctx is refused with HTTP 400 "the prompt is longer than the context length currently available to
    #    the model; shorten the prompt, ..." (clients relay it: OneUptime's docs, LiteLLM and agent frameworks' tests)
    OomRule("ollama-prompt-too-long", ("longer than the context length currently available",),
            re.compile(r"the prompt is longer than the context length currently available"), None,
            "ollama llm/llama_server.go (2025-26), as relayed by API clients", phase="kv_capacity", engine="ollama"),
    # -- "input length (N tokens) exceeds the model's maximum context length (M tokens)" (Ollama's MLX runner,
    #    x/mlxrunner/pipeline.go, 2026, as its API error body)
    OomRule("input-exceeds-max-context", ("exceeds the model's maximum context length",),
            re.compile(r"input length \((?P<n>\d+) tokens\) exceeds the model's maximum context length \((?P<m>\d+) "
                       r"tokens\)"), None, "ollama x/mlxrunner/pipeline.go (2026)", phase="kv_capacity",
            read=_tokens),
    # -- ONNX Runtime GenAI (generators.cpp): "input_ids size (N) + current sequence length (0) exceeds max length (M)"
    #    and "max_length (N) cannot be greater than model context_length (M)": the search's max_length sizes its KV
    OomRule("ort-genai-max-length", ("exceeds max length (", "cannot be greater than model context_length"),
            re.compile(r"input_ids size \((?P<n>\d+)\) \+ current sequence length \(\d+\) exceeds max length \((?P<m>\d+)\)"
                       r"|max_length \((?P<n2>\d+)\) cannot be greater than model context_length \((?P<m2>\d+)\)"),
            None, "microsoft/onnxruntime-genai src/generators.cpp", phase="kv_capacity", read=_tokens),
    # -- LMDeploy's OpenAI server refusal: "Input length (N) must be smaller than the model context length (M)"
    OomRule("input-length-context", ("must be smaller than the model context length",),
            re.compile(r"Input length \((?P<n>\d+)\) must be smaller than the model context length \((?P<m>\d+)\)"), None,
            "lmdeploy serve async_engine (2026, context_length_exceeded)", phase="kv_capacity",
            read=_tokens),
    OomRule("lmstudio-context-overflow", ("which is not enough",),
            re.compile(r"Trying to keep the first (?P<n>\d+) tokens when context the overflows\. However, the model is "
                       r"loaded with context length of only (?P<m>\d+) tokens"), None,
            "LM Studio's context overflow policy refusal (lmstudio-bug-tracker#546, #237); LM Studio's runtime is "
            "llama.cpp unless its MLX engine's words say otherwise (they weigh more)", phase="kv_capacity",
            engine="llama.cpp", read=_tokens),
    # -- LM Studio (llama.cpp and MLX engines, 2024-26): "The number of tokens to keep from the initial prompt is greater
    #    than the context length. Try to load the model with a larger context length, or provide a shorter input"
    OomRule("lmstudio-tokens-to-keep", ("tokens to keep from the initial prompt",),
            re.compile(r"(?i:number of tokens to keep from the initial prompt is greater than the context length)"), None,
            "LM Studio's context refusal (lmstudio-ai/mlx-engine#366)", phase="kv_capacity"),
    OomRule("llamacpp-prompt-too-long", ("prompt is too long (", "exceed context window of"),
            re.compile(r"prompt is too long \((?P<n>\d+) tokens, max (?P<m>\d+)\)|Requested tokens (?:\((?P<n2>\d+)\) )?"
                       r"exceed context window of (?P<m2>\d+)"), None,
            "llama.cpp examples/main (2023) 'error: prompt is too long (N tokens, max M)'; llama-cpp-python "
            "'Requested tokens (N) exceed context window of M' (llama-cpp-python#416)", phase="kv_capacity",
            engine="llama.cpp", read=_tokens),
    OomRule("exllama-seq-exceeds-cache", ("exceeds cache size",), re.compile(r"Total sequence length exceeds cache size"),
            None, "exllamav2 model.forward (exllamav2#105): the cache holds fewer tokens than the sequence",
            phase="kv_capacity"),
    OomRule("kv-exhausted", ("KV cache exhausted", "kv cache exhausted", "No space left for only one request"),
            re.compile(r"(?i:kv cache exhausted)|No space left for only one request"), None,
            "engines' KV block pools out of blocks: SGLang schedule_batch.py retract_decode 'No space left for only one "
            "request' (sglang#14948), 'KV cache exhausted: no free blocks'", phase="kv_capacity"),
    # the block allocator of a paged KV pool, in the words most of them use ("Not enough free blocks: need 21, have 0":
    # vllm-metal, and the block managers of smaller engines in Python, C++, Go and Rust alike)
    OomRule("kv-blocks-need-have", ("free blocks: need",),
            re.compile(r"(?i:not enough free blocks: need (\d+),? (?:have|but only) (\d+))"), None,
            "paged-KV block allocators' refusal (vllm-metal's paged attention, gi-010; the same words in several "
            "open-source block managers)", phase="kv_capacity"),
    # -- TensorRT-LLM's KV cache manager: the pool cannot hold one sequence of the maximum length (kvCacheManager.cpp
    #    KVCacheManager: "maxTokensInPagedKvCache (128) must be large enough to process at least 1 sequence to
    #    completion"; TensorRT-LLM#494, tensorrtllm_backend#168)
    OomRule("trtllm-kv-pool-too-small", ("maxTokensInPagedKvCache",),
            re.compile(r"maxTokensInPagedKvCache(?: \((?P<n>\d+)\))? must be large enough to process at least 1 "
                       r"sequence"), None, "TensorRT-LLM kvCacheManager.cpp", phase="kv_capacity"),
    # -- vLLM (2025-26) with a hybrid model: one Mamba state block per running sequence, the block pool sized by the same
    #    budget as the KV cache (config/compilation.py resolve_cudagraph_mode_and_sizes): "ValueError: max_num_seqs
    #    (1024) exceeds available Mamba cache blocks (722)" -- the state pool cannot hold the configured sequences
    OomRule("vllm-mamba-blocks", ("exceeds available Mamba cache blocks",),
            re.compile(r"max_num_seqs \((\d+)\) exceeds available Mamba cache blocks \((\d+)\)"), None,
            "vllm config/compilation.py (2025-26)", engine="vllm", phase="kv_capacity",
            read=lambda m: {"limit_seqs": int(m.group(2))}),
    # -- TensorRT's builder and runtime (TensorRT-LLM engine builds, ONNX Runtime's TensorRT provider): "[TRT] [W]
    #    Requested amount of GPU memory (N bytes) could not be allocated. There may not be enough free memory for
    #    allocation to succeed." next to "Error Code 2: OutOfMemory (no further information)" (TensorRT-LLM#346, #772)
    OomRule("tensorrt-requested", ("Requested amount of GPU memory",),
            re.compile(r"Requested amount of GPU memory \((\d+) bytes\) could not be allocated"), "cuda",
            "TensorRT builder / runtime allocator warning (TensorRT 8-10)", read=lambda m: _size(m, 1, None)),
    # -- vLLM's start-up profiling saw free memory change under it (another process allocated or released memory):
    #    "Error in memory profiling. Initial free memory X GiB, current free memory Y GiB" (gpu_worker.py
    #    determine_available_memory; vllm#55169): its budget could not be measured, it refused to start -- a failure,
    #    not about memory running out (phase unknown, as the reports' threads establish)
    OomRule("vllm-memory-profiling", ("Error in memory profiling",),
            re.compile(r"Error in memory profiling\. Initial free memory ([\d.]+) ?GiB, current free memory ([\d.]+) ?GiB"),
            None, "vllm v1/worker/gpu_worker.py determine_available_memory (vllm#55169); a consistency check (free memory "
            "did not drop, or rose, while profiling: another process or a GPU-sharing layer), not a shortage",
            engine="vllm", memory=False),
    # -- Jetson (Tegra unified memory): the NvMap allocator's "NvMapMemAllocInternalTagged: <flags> error 12" (ENOMEM)
    #    before CUDA's own out-of-memory (llama.cpp#23732)
    OomRule("jetson-nvmap", ("NvMapMemAlloc",), re.compile(r"NvMapMemAlloc\w*: \d+ error 12\b"), "cuda",
            "Tegra NvMap allocator (L4T), quoted in llama.cpp#23732"),
    # -- Ollama's new engine (2025+): ml/backend.go ErrNoMem "insufficient memory - required allocations: {...}", every
    #    size with its status letter (A allocated, F failed, U unallocated; Memory.String()): the F entry is the buffer
    #    that failed, its kind (Weights, Cache, Graph) and its device (the Name: of its block) say where (ollama#11790)
    OomRule("ollama-errnomem", ("insufficient memory - required allocations",),
            re.compile(r"insufficient memory - required allocations: \{"), None, "ollama ml/backend.go ErrNoMem",
            engine="ollama", read=lambda m: _ollama_nomem(m.string)),
    # -- SGLang's TP worker (managers/tp_worker.py): "assert self.max_req_len > 0 and self.max_req_input_len > 0,
    #    'Memory pool size is too small'" -- the KV pool holds (almost) no token, no request could fit
    OomRule("sglang-pool-too-small", ("Memory pool size is too small",),
            re.compile(r"Memory pool size is too small"), None, "sglang srt/managers/tp_worker.py", engine="sglang",
            phase="kv_capacity"),
    # -- Ollama's scheduler (llm/server.go ErrLoadRequiredFull, 0.12+): "unable to load full model on GPU" -- its own
    #    layout could not place the whole model on the GPUs when it had to (other models loaded); clients relay it
    #    after "model requires more system memory than is currently available"
    OomRule("ollama-required-full", ("unable to load full model on GPU",),
            re.compile(r"unable to load full model on GPU"), None, "ollama llm/server.go ErrLoadRequiredFull",
            engine="ollama", phase="memory_budget"),
    # -- llama.rn (React Native binding of llama.cpp; PocketPal and other phone apps): RNLlama's completion throws
    #    "Context is full" when the context filled up
    OomRule("llama-rn-context-full", ("Context is full", "Not enough context space"),
            re.compile(r"\bContext is full\b|Not enough context space"), None,
            "mybigday/llama.rn RNLlama completion (context_full; rn-mtmd.hpp 'Not enough context space' for a prompt "
            "with images)", phase="kv_capacity", engine="llama.cpp"),
    # -- exllamav2 / exllamav3 (ExUI, tabbyAPI): the auto-split loader ran out of VRAM for the weights plus the cache
    #    sized for max_seq_len ("Insufficient VRAM for model and cache", v2 model.py load_autosplit_gen; "Insufficient
    #    VRAM in split for model and cache", v3 model_ls.py initial_split): its own budget, before any allocation
    OomRule("exllama-autosplit", ("Insufficient VRAM",), re.compile(r"Insufficient VRAM (?:in split )?for model and cache"),
            None, "exllamav2 model.py load_autosplit_gen; exllamav3 model_ls.py initial_split", phase="memory_budget"),
    # -- exllamav3's paged generator: a job needs more cache pages than the pool holds ("Job requires 485 pages (only
    #    460 available) and cannot be enqueued"; a page is 256 tokens)
    OomRule("exllamav3-pages", ("pages (only",), re.compile(r"requires (?P<need>\d+) pages \(only (?P<avail>\d+) available\)"),
            None, "exllamav3 generator job admission (quoted verbatim by applications built on it)", phase="kv_capacity"),
    # -- node-llama-cpp (withcatai): its own estimate before it creates a context (InsufficientMemoryError "A context
    #    size of 4096 with 4 sequences is too large for the available VRAM")
    OomRule("node-llama-cpp-estimate", ("InsufficientMemoryError", "too large for the available"),
            re.compile(r"(?:InsufficientMemoryError: )?A context size of (?P<ctx>\d+)(?: with (?P<seq>\d+) sequences?)? is "
                       r"too large for the available (?P<mem>VRAM|RAM)"),
            None, "withcatai/node-llama-cpp LlamaContext (InsufficientMemoryError)", phase="memory_budget",
            engine="llama.cpp"),
    # -- an engine's own memory check refused to go on, in words no parser knows ("memory guard refused ctx=32768",
    #    "memory check failed"): the engine's budget, not an allocation
    OomRule("memory-check-refused", ("memory guard", "memory check", "memory budget", "would require"),
            re.compile(r"(?i:memory (?:guard|check|budget)\w*\W{1,3}(?:\w+\W+){0,2}?(?:refused|failed|exceeded)"
                       r"|would require\W{1,3}~?[\d.]+\s*[KMGT]i?B.{0,160}?\bbut\b.{0,80}?(?:ceiling|limit|budget|available))"),
            None, "engines' own pre-allocation checks (wording varies; format not fully known)", phase="memory_budget",
            generic=True),
    # -- a loader's own size check that states both sides ("model requires 71.4 GiB but only 58.1 GiB are available
    #    (after 512.0 MiB overhead)": Ollama's MLX runner, 2026, x/mlxrunner): refused before any allocation
    OomRule("requires-but-only", ("but only",),
            re.compile(r"requires [~≈]?(?P<need>[\d.]+) ?(?P<nu>[KMGT]i?B)(?: peak)? but only (?P<have>[\d.]+) ?"
                       r"(?P<hu>[KMGT]i?B) (?:(?:are|is) )?(?:available|free)"), None,
            "ollama x/mlxrunner's pre-load check (2026), as the hunt read it; vMLX's ('model requires ≈92.5 GB peak but "
            "only 47.5 GB available on this machine', vmlx#125)", phase="memory_budget",
            read=lambda m: {"mib": _mib(m.group("need"), m.group("nu")), "free_mib": _mib(m.group("have"), m.group("hu"))}),
    # -- oMLX (jundot/omlx, an MLX server for Macs, 2026): its engine pool refuses a model above its own limits before
    #    loading: "Model 'X' (218.08GB) exceeds max-model-memory (25.00GB)" (engine_pool.py ModelTooLargeError, HTTP 507)
    #    and its memory guard's "Model 'X' (19.95GB) does not fit under the memory ceiling (17.78GB)"
    OomRule("omlx-model-too-large", ("exceeds max-model-memory", "does not fit under the memory ceiling"),
            re.compile(r"exceeds max-model-memory|does not fit under the memory ceiling"), "metal",
            "jundot/omlx engine_pool.py (ModelTooLargeError) and its memory guard", phase="memory_budget"),
    # -- FlashInfer's fixed attention workspace (vLLM, SGLang): include/flashinfer/allocator.h AlignedAllocator
    #    "Buffer overflow when allocating memory for batch_prefill_tmp_v with size N and alignment 16, but only M
    #    bytes available in AlignedAllocator": a buffer of fixed size, not the device's free memory
    OomRule("flashinfer-workspace", ("AlignedAllocator", "Buffer overflow when allocating"),
            re.compile(r"Buffer overflow when\s+allocating memory for (?P<name>\w+) with size\s+(?P<size>\d+)"
                       r"(?: and\s+alignment \d+)?,?\s+(?:but\s+)?only\s+(?P<avail>\d+) bytes|"
                       # (v0.1.x, 2024: "Failed to allocate memory for batch_prefill_tmp_v with size 553648128 and
                       # alignment 16 in AlignedAllocator")
                       r"Failed to allocate memory for (?P<name2>\w+) with size (?P<size2>\d+) and alignment \d+ in "
                       r"AlignedAllocator"),
            "cuda", "flashinfer include/flashinfer/allocator.h AlignedAllocator::aligned_alloc (2024-2026)",
            phase="compute_buffer", read=lambda m: {"mib": _mib(m.group("size") or m.group("size2"), None),
                                                    **({"limit_mib": _mib(m.group("avail"), None)}
                                                       if m.group("avail") else {})}),
    # -- vllm-metal (vLLM's Apple plugin, 2026) MetalWorker.determine_available_memory: "Paged attention: not enough
    #    Metal memory for KV cache. metal_limit=..GB, fraction=.., ..., kv_budget=-12.05GB": its own budget check
    OomRule("vllm-metal-kv-budget", ("not enough Metal memory for KV cache",),
            re.compile(r"not enough Metal memory for KV cache"), "metal",
            "vllm-project/vllm-metal worker (_validate_paged_attention_plan)", phase="memory_budget", engine="vllm",
            read=lambda m: _metal_plan(m.string)),
    # -- Habana Gaudi's PyTorch bridge (HPU): "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for
    #    size::1073741824 (1024)MB" (bytes, then MiB in parentheses; tgi-gaudi#216, optimum-habana#1708,
    #    intel/llm-on-ray#249)
    OomRule("habana-pt-devmem", ("PT_DEVMEM Allocation failed",),
            re.compile(r"PT_DEVMEM Allocation failed for size::(?P<n>\d+)"), None,
            "Habana PT bridge (tgi-gaudi#216, optimum-habana#1708)", read=lambda m: {"mib": _mib(m.group("n"), None)}),
    # -- the TPU runtime loading a compiled program: "RuntimeProgramAllocationFailure: Error loading program
    #    'jit__forward': Attempting to allocate 1.13G. That was not possible. There are 528.72M free." (tpu-inference
    #    2026) and "RESOURCE_EXHAUSTED: Error loading program: Attempting to reserve 1.04G at the bottom of memory. That
    #    was not possible." (vLLM TPU 2025): the program's own buffers (its temporaries), not weights nor KV
    OomRule("xla-program-load", ("Error loading program",),
            re.compile(r"Error loading program\b.{0,200}?Attempting to (?:reserve|allocate) [\d.]+[KMGT]"), None,
            "XLA TPU runtime (vllm#16521, vllm-project/tpu-inference#3408)", phase="compute_buffer",
            read=lambda m: _xla(m.string)),
    # -- the same runtime allocating a device buffer: "Error allocating device buffer: Attempting to allocate 896.00M.
    #    That was not possible. There are 295.08M free." (the step that asked is in the traceback, if anywhere)
    OomRule("xla-not-possible", ("That was not possible",),
            re.compile(r"Attempting to (?:reserve|allocate) [\d.]+[KMGT]i?B?\b.{0,120}?That was not possible"), None,
            "XLA TPU runtime (vllm#20644, transformers#22328)", read=lambda m: _xla(m.string)),
    # -- XLA (TPU; JAX / PyTorch-XLA under vLLM): absl status RESOURCE_EXHAUSTED with XLA's memory words
    OomRule("xla-resource-exhausted", ("RESOURCE_EXHAUSTED",),
            re.compile(r"RESOURCE_EXHAUSTED\b.{0,300}?(?:[Oo]ut of memory|Attempting to reserve|[Aa]llocat|memory space)"),
            None, "XLA / absl status RESOURCE_EXHAUSTED ('Ran out of memory in memory space hbm/smem. Used 21.95G of "
            "15.48G hbm', vllm#8318; 'Attempting to reserve 10.51G at the bottom of memory. That was not possible. "
            "There are 8.97G free', transformers#22328; XLA's sizes are 1024-based)", read=lambda m: _xla(m.string)),
    # -- MLC-LLM's own check before it allocates (mlc-llm#2791): "Insufficient GPU memory error: The available single
    #    GPU memory is 19314.976 MB, which is less than the sum of model weight size (...) and temporary buffer size"
    OomRule("mlc-insufficient-gpu-memory", ("Insufficient GPU memory error",),
            re.compile(r"Insufficient GPU memory error: The available single GPU memory is (?P<free>[\d.]+) ?MB"
                       r"(?:, which is less than the sum of model weight size \((?P<w>[\d.]+) ?MB\) and temporary buffer "
                       r"size \((?P<t>[\d.]+) ?MB\))?"),
            None, "mlc-llm serve engine's memory estimate (mlc-llm#2791, #3024; its MB are MiB: the available figure is "
            "gpu_memory_utilization x the card's MiB)", phase="memory_budget",
            read=lambda m: {"free_mib": float(m.group("free")),
                            **({"mib": float(m.group("w")) + float(m.group("t"))} if m.group("w") else {})}),
    # -- LM Studio's model-loading guardrails refuse a load from their own estimate (lmstudio-bug-tracker#484, #1038,
    #    #1202, #1562): "Model loading aborted due to insufficient system resources" (2025, from
    #    guardrailHasEnoughResourcesForModelOrThrow), "Model loading was stopped due to insufficient system resources.
    #    Under the current settings, this model requires approximately 273.25 GB of memory" (2025), "Not enough
    #    resources to load the model with the current settings" (2026): the app's budget, before any allocation
    OomRule("lmstudio-guardrail", ("insufficient system resources", "enough resources to load the model",
                                   "enough resources to run model", "guardrailHasEnoughResources"),
            re.compile(r"(?i:(?:aborted|stopped) due to insufficient system resources|not enough resources to "
                       r"(?:load|run) (?:the )?model|guardrailHasEnoughResources)"
                       r"(?:.{0,200}?requires approximately (?P<need>[\d.]+) ?(?P<nu>[KMGT]i?B))?"),
            None, "LM Studio model loading guardrails (lmstudio-bug-tracker#484, #1038, #1202, #1562)",
            phase="memory_budget", engine="llama.cpp",
            read=lambda m: {"mib": _mib(m.group("need"), m.group("nu"))} if m.group("need") else {}),
    # -- failures that are not about memory, in formats no engine parser reads (phase unknown, no memory fix)
    OomRule("lmdeploy-session-len", ("run out of tokens", "exceed session max length"),
            re.compile(r"run out of tokens\. session(?:_id)?=|exceed session max length"), None,
            "lmdeploy serve/async_engine.py generate() 'run out of tokens. session_id=' (2024) / 'session=' (2025, "
            "lmdeploy#4147); its chat client's 'exceed session max length' (lmdeploy#732): the prompt plus "
            "max_new_tokens exceed --session-len (a refused request)", engine="lmdeploy", memory=False),
    OomRule("lmstudio-load-failed", ('"title": "Failed to load model"',),
            re.compile(r'"title": "Failed to load model"'), None,
            "LM Studio's load error JSON (title / cause / errorData / data.memory): the load failed, the cause is in "
            "the fields that follow", engine="llama.cpp", memory=False),
    # -- llama.cpp's RPC backend: the remote rpc-server died or answered nonsense ("Remote RPC server crashed or returned
    #    malformed response", ggml-rpc.cpp RPC_STATUS_ASSERT, 2025-26): the remote side may have been killed for memory,
    #    but this line does not say so
    OomRule("rpc-server-crashed", ("Remote RPC server crashed",), re.compile(r"Remote RPC server crashed"), None,
            "ggml/src/ggml-rpc/ggml-rpc.cpp (2025-26)", engine="llama.cpp", memory=False),
    # -- llama-server refuses an embedding / rerank input longer than one physical batch: "input (N tokens) is too large
    #    to process. increase the physical batch size (current batch size: M)" (server-context.cpp): -ub, not memory
    OomRule("llama-server-ubatch", ("is too large to process",),
            re.compile(r"input \((?P<n>\d+) tokens\) is too large to process\. increase the physical batch size"), None,
            "llama.cpp tools/server/server-context.cpp (2025-26)", engine="llama.cpp", memory=False,
            read=_tokens),
    # -- exllamav2's manual split (model.py load_gen): the gpu_split list has no room for the next module ("Insufficient
    #    space in device allocation"): its own plan, before any allocation
    OomRule("exllama-split-space", ("Insufficient space in device allocation",),
            re.compile(r"Insufficient space in device allocation"), None, "exllamav2 model.py (manual gpu_split)",
            phase="memory_budget"),
    # -- cuBLAS could not allocate its own resources (CUBLAS_STATUS_ALLOC_FAILED, "the resource allocation failed", as
    #    ggml-cuda's CUBLAS_CHECK and Ollama's runner print it; cublasCreate on a GPU the build does not fit, or with the
    #    memory gone: ollama#5493-era Jetson reports, llama.cpp installer reports)
    OomRule("cublas-alloc-failed", ("resource allocation failed",),
            re.compile(r"CUDA error: the resource allocation failed"), "cuda",
            "ggml-cuda CUBLAS_CHECK / cublasGetStatusString (Jetson and installer reports, 2024-26)",
            # (cuBLAS's own handle and workspace, none of the engine's buffers: not placed by the step it came in)
            phase="unknown"),
    # -- TensorRT's builder and TensorRT-LLM's runtime buffers: "[TRT] [E] 2: [virtualMemoryBuffer.cpp::resizePhysical::
    #    140] Error Code 2: OutOfMemory (no further information)", "Requested amount of GPU memory (20572012544 bytes)
    #    could not be allocated" (engine builds, 2023-24); "[TensorRT-LLM][ERROR] CUDA runtime error in
    #    ::cudaMallocAsync(ptr, n, ...): out of memory (.../runtime/tllmBuffers.h:112)" (its buffer manager)
    OomRule("tensorrt-oom", ("Error Code 2: OutOfMemory", "Requested amount of GPU memory", "CUDA runtime error in"),
            re.compile(r"Error Code 2: OutOfMemory|Requested amount of GPU memory \((?P<n>\d+) bytes\) could not be "
                       r"allocated|\[TensorRT-LLM\]\[ERROR\] CUDA runtime error in .{0,200}?: out of memory"), "cuda",
            "TensorRT builder (virtualMemoryBuffer.cpp, globWriter.cpp), TensorRT-LLM tllmBuffers.h (2023-24 reports)",
            read=lambda m: {"mib": _mib(m.group("n"), None)} if m.group("n") else {}),
    # -- Habana-free NPUs: Rockchip's RKNN runtime ("E RKNN: failed to malloc npu memory, size: 4022861824, flags: 0x2",
    #    "failed to allocate handle, ret: -1, errno: 14"), as rkllm prints it while it loads a model
    OomRule("rknn-npu-malloc", ("failed to malloc npu memory", "failed to allocate handle"),
            re.compile(r"RKNN: .{0,40}?failed to (?:malloc npu memory(?:, size: (?P<n>\d+))?|allocate handle)"), None,
            "Rockchip RKNN runtime (rknn-llm reports, 2025)",
            read=lambda m: {"mib": _mib(m.group("n"), None)} if m.group("n") else {}),
    # -- HAMi-core (Kubernetes vGPU sharing) refusing an allocation over the container's share: "[HAMI-core ERROR (pid:1
    #    ... allocator.c:53)]: Device 0 OOM 18446744073707737660 / 24146608128" (bytes used-or-asked / the share)
    OomRule("hami-core-oom", ("HAMI-core ERROR",),
            re.compile(r"HAMI-core ERROR .{0,80}?Device (?P<d>\d+) OOM (?P<n>\d+) / (?P<lim>\d+)"), "cuda",
            "Project-HAMi HAMi-core allocator.c (2025 reports)",
            read=lambda m: {"device_index": int(m.group("d")), "mib": _mib(m.group("n"), None),
                            "limit_mib": _mib(m.group("lim"), None)}),
    # -- EXO's placement (2026): "No cycles found with sufficient memory" -- its planner found no set of devices that
    #    holds the model, before anything was allocated
    OomRule("exo-placement", ("No cycles found with sufficient memory",),
            re.compile(r"No cycles found with sufficient memory"), None, "exo-explore/exo placement (2026 reports)",
            phase="memory_budget"),
    # -- ds4 (antirez/ds4, 2026): "ds4: ROCm model arena alloc failed for tensor-span:128 (1792.00 MiB chunk): out of
    #    memory" -- the arena that holds the model's tensors
    OomRule("ds4-model-arena", ("model arena alloc failed",),
            re.compile(r"(?P<be>ROCm|CUDA|Metal) model arena alloc failed(?: for [^()\n]{0,60})? \((?P<n>[\d.]+) ?(?P<u>[KMGT]i?B)"),
            None, "antirez/ds4 model arena (2026 reports)", phase="model_weights",
            read=lambda m: {"mib": _mib(m.group("n"), m.group("u"))}),
    # -- vllm.rs (candle): "KVCache allocation failed: Insufficient GPU memory for KVCache allocation." / "Failed to
    #    allocate KVCache: ..." (its kvcache_allocator, 2026)
    OomRule("vllm-rs-kvcache", ("KVCache allocation failed", "Failed to allocate KVCache"),
            re.compile(r"KVCache allocation failed|Failed to allocate KVCache"), None,
            "guoqingbao/vllm.rs kvcache_allocator (xinfer reports, 2026)", phase="kv_cache"),
    # -- Ollama (2026, server/sched.go) passing on its llama-server's startup failure: "llama-server reported
    #    out-of-memory during startup" (what it failed to allocate is in the llama-server lines, when they are there)
    OomRule("ollama-startup-oom", ("reported out-of-memory during startup",),
            re.compile(r"llama-server reported out-of-memory during startup"), None, "ollama server/sched.go (2026)",
            engine="ollama"),
    # -- a warm-up that names its own OOM: MindIE ("Warmup failed, because of multimodal model inference out of memory
    #    when `maxInputTokenLen` set to 8192. Please try to decrease `maxPrefillTokens`"): activations of a forward pass
    OomRule("warmup-oom", ("Warmup failed, because of",),
            re.compile(r"Warmup failed, because of .{0,80}?out of memory"), None, "MindIE service warm-up (2025 reports)",
            phase="compute_buffer"),
    # -- "<backend> OOM while allocating <size>": runtimes' and users' one-line summaries ("CUDA OOM while allocating
    #    5.16 GiB")
    OomRule("oom-while-allocating", ("OOM while allocating",),
            re.compile(r"\b(?:CUDA|HIP|ROCm|GPU|Metal|XPU|NPU) OOM while allocating (?P<n>[\d.]+) ?(?P<u>[KMGT]i?B)"), None,
            "one-line summaries in reports (sglang EAGLE draft pool, 2026)",
            read=lambda m: {"mib": _mib(m.group("n"), m.group("u"))}),
    # -- ds4's other device allocations and launches: "ds4: CUDA q8 fp16 cache alloc failed (64.00 MiB): out of memory",
    #    "ds4: ROCm tensor alloc failed: out of memory", "ds4: ROCm tensor fill f32 launch failed: out of memory"
    OomRule("ds4-device-alloc", ("ds4: ",),
            re.compile(r"ds4: (?P<be>ROCm|CUDA|Metal) [\w ]{1,40}? (?:alloc|launch) failed(?: \((?P<n>[\d.]+) ?"
                       r"(?P<u>[KMGT]i?B)\))?: out of memory"), None, "antirez/ds4 device buffers (2026 reports)",
            read=lambda m: {"mib": _mib(m.group("n"), m.group("u"))} if m.group("n") else {}),
    # -- vLLM's sleep-mode allocator (csrc/cumem_allocator.cpp, 2025): "CUDA Error: out of memory at
    #    /workspace/csrc/cumem_allocator.cpp:62" when wake_up maps its pools back (RL frameworks' colocated rollouts)
    OomRule("vllm-cumem-allocator", ("cumem_allocator.cpp",),
            # (also as people retype it: "Cuda error: out of memory at /workspace/csrc/cumem_allocator.cpp: 62")
            re.compile(r"(?i:cuda error: out of memory at \S*cumem_allocator\.cpp: ?\d+)"), "cuda",
            "vLLM csrc/cumem_allocator.cpp (OpenRLHF-family reports, 2025; lmm-r1#42 retyped)", engine="vllm"),
    # -- Qualcomm's QNN runtime (ExecuTorch's QNN backend): "<E> Could not allocate persistent weights buffer!" after
    #    its fastrpc map failed
    OomRule("qnn-weights-buffer", ("allocate persistent weights buffer",),
            re.compile(r"Could not allocate persistent weights buffer"), None,
            "QNN runtime via ExecuTorch (executorch#4517)", phase="model_weights"),
    # -- the Adreno kernel driver (KGSL) refusing a GPU object: "ioctl fd 58 code 0xc0300945 (IOCTL_KGSL_GPUOBJ_ALLOC)
    #    failed: errno 12 Out of memory" (OpenCL on Android: MLC-LLM, llama.cpp's OpenCL backend)
    OomRule("kgsl-gpuobj-alloc", ("IOCTL_KGSL_GPUOBJ_ALLOC",),
            re.compile(r"IOCTL_KGSL_GPUOBJ_ALLOC\) failed: errno 12"), None, "Adreno-GSL (mlc-llm#112)"),
    # -- tt-metal's DRAM allocator (TT_FATAL): "Out of Memory: Not enough space to allocate 1879048192 B DRAM buffer
    #    across 8 banks," (the per-bank need and free follow on the next lines)
    OomRule("tt-metal-dram", ("DRAM buffer across",),
            re.compile(r"Not enough space to allocate (?P<n>\d+) B (?:DRAM|L1) buffer across \d+ banks"), None,
            "tt-metal allocator (tenstorrent/tt-inference-server#451, #989, tt-xla#5501)",
            read=lambda m: {"mib": _mib(m.group("n"), None)}),
    # -- an app's own placement check (Unsloth Studio, 2026): "Failed to load model: About 10 GB of this model does not
    #    fit in GPU memory and would run from system RAM. Only about 10 GB is available": refused before loading
    OomRule("app-fit-refusal", ("would run from system RAM",),
            re.compile(r"does not fit in GPU memory and would run from system RAM"), None,
            "Unsloth Studio (unslothai/unsloth reports, 2026)", phase="memory_budget"),
    # -- FreeToken's KV pool sizing (2026): "AssertionError: Not enough memory for KV cache, try reducing --num-pages":
    #    the pages asked for do not fit what the weights left
    OomRule("kv-pages-over-memory", ("try reducing --num-pages",),
            re.compile(r"Not enough memory for KV cache, try reducing --num-pages"), None,
            "FlashML-org/FreeToken#419", phase="kv_capacity"),
    # -- OpenVINO's GPU plugin allocating a USM buffer (2026): "[CL ext] Can not allocate 16049884928 bytes for USM
    #    Device. ptr: 0000000000000000, error: 0" (bytes; openvino.genai#4344)
    OomRule("openvino-usm-alloc", ("[CL ext] Can not allocate",),
            re.compile(r"\[CL ext\] Can not allocate (?P<n>\d+) bytes for USM"), "openvino",
            "OpenVINO intel_gpu plugin (openvino.genai#4344)", read=lambda m: {"mib": _mib(m.group("n"), None)}),
    # -- OpenCL's CL_MEM_OBJECT_ALLOCATION_FAILURE in words ("could not create a memory object"; SYCL on OpenCL and
    #    Level Zero runtimes print it when a buffer cannot be made)
    OomRule("memory-object", ("create a memory object", "create memory object"),
            re.compile(r"(?i:(?:could not|failed to|unable to) create (?:a )?memory object)"), None,
            "OpenCL / SYCL runtimes (llama.cpp SYCL reports, 2026)"),
    # -- one buffer over a backend's per-buffer cap, in the words of a size check: ggml-hexagon ("HTP0:0 buffer size
    #    556236800 exceeds max_bufsize 268435456", llama.cpp#29123), wgpu ("Buffer size 1073741824 is greater than the
    #    maximum buffer size (268435456)"): bytes, the device name first when the backend prints one
    OomRule("buffer-over-max-size", ("exceeds max", "than the maximum buffer size", "exceeds the maximum"),
            re.compile(r"(?i:(?:(?P<dev>\b[A-Z][\w]*\d(?::\d+)?) )?buffer size (?P<n>\d+) (?:exceeds|is (?:greater|larger) "
                       r"than) (?:the )?max(?:imum)?[ _]?(?:buf(?:fer)?[ _]?size|alloc(?:ation)?[ _]?size|buffer length)"
                       r"\W{0,3}(?P<lim>\d+))"), None,
            "ggml-hexagon (llama.cpp#29123); wgpu Device::create_buffer", read=_over_max),
    # -- tt-metal (Tenstorrent) placing a program's circular buffers in a core's L1 SRAM (program.cpp): "Statically
    #    allocated circular buffers on core range [...] grow to 2292704 B which is beyond max L1 size of 1499136 B":
    #    a kernel's working buffers over the fixed per-core size (tt-inference-server#225)
    OomRule("tt-metal-l1-circular-buffers", ("which is beyond max",),
            re.compile(r"grow to (?P<n>\d+) B which is beyond max \w+ size of (?P<lim>\d+) B"), None,
            "tt-metal program.cpp (tenstorrent/tt-inference-server#225)", phase="compute_buffer",
            read=lambda m: {"mib": _mib(m.group("n"), None), "limit_mib": _mib(m.group("lim"), None)}),
    # -- a planner's own budget check before it allocates: FreeToken (2026) "AssertionError: cache budget too small:
    #    minimum plan (moe=1024 slots, kv=128 pages) needs 3046637568 B > budget -1868787708 B (raise memory_ratio,
    #    lower kv_reserve_tokens, or free GPU memory)" (bytes; the budget is what is left after the weights)
    OomRule("plan-over-budget", ("> budget",),
            re.compile(r"(?i:\bneeds? (?P<n>-?\d+) ?(?:B|bytes) ?> ?budget (?P<b>-?\d+) ?(?:B|bytes)\b)"), None,
            "FlashML-org/FreeToken#409 (its cache planner)", phase="memory_budget",
            read=lambda m: {"mib": _mib(m.group("n"), None), "free_mib": _mib(m.group("b"), None)}),
    # -- the second net: a request or a sequence that outgrew the context, in words no rule above knows (format not
    #    fully understood). Read in real reports: ctransformers' "Number of tokens (757) exceeded maximum context
    #    length (512)." (llm.py, via LangChain), GPT4All's backend "GPT-J ERROR: The prompt is2614tokens and the context
    #    window is2048!" (llmodel_shared.cpp, via privateGPT), LocalAI's llama.cpp backend "Context exhausted. Slot 5
    #    released"; the context (the KV window) is too small for the request, not the memory for the context.
    #    llama.cpp's own "n_ctx_per_seq > n_ctx_train -- possible training context overflow" is a warning
    #    (:data:`_NOT_FAILURES`).
    OomRule("context-words", (*case_variants("context length", "context window", "context size", "maximum context",
                                             "context limit", "context exhausted", "context exceeded",
                                             "context is full", "context full", "context overflow"), "n_ctx"),
            re.compile(r"(?i:\b(?:prompt|input|request|tokens?|sequence|message)s?\b[^\n]{0,60}?\b(?:exceed(?:s|ed|ing)?|"
                       r"(?:is |are )?(?:longer|larger|greater|more) than|too (?:long|large|big) for)\b[^\n]{0,40}?"
                       r"\b(?:context(?: window| length| size| limit)?|n_ctx)\b|"
                       r"\bprompt is\s*\d+\s*tokens and the context (?:window|size|length) is\s*\d+|"
                       r"\bcontext (?:window |length |size )?(?:exhausted|exceeded|(?:is )?full|overflow(?:ed|s)?)\b)"),
            None, "the request-length net (kvreport's failure layer): ctransformers, GPT4All, LocalAI as their reports show",
            phase="kv_capacity", generic=True),
    # -- the net: any other line in the words of a memory failure (format not fully understood)
    OomRule("memory-words", (*case_variants("out of memory", "out-of-memory", "insufficient memory", "not enough memory",
                                            *(f"not enough {w} memory" for w in ("free", "gpu", "GPU", "device",
                                                                                 "system", "host", "video", "unified")),
                                            "failed to allocate", "unable to allocate", "could not allocate",
                                            "cannot allocate", "can not allocate", "couldn't allocate",
                                            "can't allocate",
                                            "allocation failed", "memory allocation",
                                            "not enough space to allocate", "memory limit exceeded",
                                            "memory limit exceeds"),
                             "OutOfMemory", "OUT_OF_MEMORY", "out_of_memory", "more system memory", "requires more memory",
                             "memory object", "Malloc failed", "GPU resources", "sufficient memory", "not fit in",
                             "OOM", "oom"),
            re.compile(r"(?i:out[ _-]?of[ _-]?memory|insufficient[ _]memory|not enough (?:(?:free|gpu|device|system|host|"
                       r"video|unified) )?memory|"
                       # a guard's own limit ("Request aborted: process memory limit exceeded (usage 26.7 GB ...)",
                       # oMLX; "Memory limit exceeded during prefill")
                       r"memory limit exceed(?:ed|s)\b|"
                       r"(?:could not|failed to|unable to) create (?:a )?memory object|"
                       r"(?:failed|unable) to allocate|(?:could ?not|couldn't|can ?not|can't) allocate|(?:memory )?allocation failed|"
                       # tt-metal's allocator (TT_FATAL: "Out of Memory: Not enough space to allocate 1879048192 B DRAM
                       # buffer across 8 banks")
                       r"not enough space to allocate|"
                       r"memory allocation (?:of \d+ bytes )?failed|requires more (?:system )?memory|"
                       r"(?:cuda|hip)Malloc failed|out of (?:gpu|device) resources|"
                       # a planner that found no place ("No cycles found with sufficient memory", EXO's placement)
                       r"\bno \w+(?: \w+){0,3} with (?:sufficient|enough) memory|"
                       # an app's own check ("About 10 GB of this model does not fit in GPU memory and would run from
                       # system RAM. Only about 10 GB is available", Unsloth Studio)
                       r"does ?n[o']t fit in(?:to)? (?:the )?(?:gpu |system |device |available )?(?:memory|vram|ram)\b.{0,80}?"
                       r"(?:only|available))|\bOOM\b"),
            None, "catch-all for memory-error words (kvreport's failure layer)", generic=True),
)

_KV_POOL_WORDS = ("bytes for k/v cache", "for max tokens in paged KV cache")
"""TensorRT-LLM's KV pool lines (kvCacheManager.cpp), read into ``LogFacts.kv_pool_mib``."""

STAGES = (
    # vLLM (gpu_model_runner.py / worker.py / model_runner.py), SGLang (model_runner.py, cuda_graph_runner.py), TGI
    # (flash_causal_lm.py warmup): the function or log words of each start-up step, and the buffer that step allocates
    (("capture_model", "cuda_graph", "cudagraph", "CUDA graph", "CUDAGraph", "CudaGraph", "graph capture",
      "Capturing", "Capture cuda graph"), "compute_buffer"),
    (("profile_run", "profile_num_available_blocks", "_dummy_run", "_dummy_sampler_run", "when warming up sampler", "determine_num_available_blocks",
      "determine_available_memory", "warmup", "warm_up", "Warming up", "def warmup", "Warmup failed"), "compute_buffer"),
    # (SGLang's KV pools: mem_cache/memory_pool.py _create_buffers "self.kv_buffer = torch.zeros(", "self.k_buffer = [",
    # the NPU one too; LightLLM's mem manager "self.key_buffer = [torch.empty(...", "self.value_buffer = [...")
    (("initialize_kv_cache", "_allocate_kv_cache", "allocate_kv_cache", "init_memory_pool", "_init_cache_engine",
      "CacheEngine(", "_create_buffers", "kv_buffer = ", "k_buffer = ", "v_buffer = ", "key_buffer = ",
      "value_buffer = ", "allocate_gpu_cache",
      # exllamav2's cache (cache.py ExLlamaV2Cache.create_state_tensors: "p_key_states = torch.zeros(...)")
      "create_state_tensors", "p_key_states",
      # candle-based engines (vllm.rs runner.rs ModelRunner::init_kv_cache; a Rust backtrace frame)
      "::init_kv_cache"), "kv_cache"),
    # (TurboMind's create_model_instance allocates its KV block pool and more buffers besides: the corpus's labellers
    # leave an OOM there unplaced, ce-007 / go-003, so it is not a stage here)
    # transformers' from_pretrained (_load_pretrained_model) and safetensors' loader (safetensors/torch.py load_file,
    # get_tensor) read the weights
    (("load_model", "load_weights", "weight_loader", "Loading weights", "Loading model weights",
      # vLLM V1 (2026) wraps a weight-load OOM: "Failed to load model - not enough GPU memory. ... (original error: CUDA
      # out of memory. Tried to allocate ...)"
      "Failed to load model - not enough GPU memory",
      "Loading safetensors", "model_loader", "_load_pretrained_model", "safetensors",
      # TGI's shard loading its weights (models/__init__.py get_model, layers' weights.get_multi_weights_col/_sharded)
      "in get_model", "get_multi_weights", "get_sharded",
      # ds4 (2026): "ROCm preparing model tensor mappings", "failed to prepare model tensor span"
      "preparing model tensor", "prepare model tensor",
      # TensorRT's builder writing the engine's weights to device memory ("[globWriter.cpp::makeResizableGpuMemory::
      # 423] Error Code 2: OutOfMemory", TensorRT-LLM engine builds)
      "globWriter.cpp",
      # TurboMind's weights (lmdeploy/turbomind/turbomind.py _create_weight_func: model_comm.create_shared_weights)
      "create_shared_weights", "_create_weight_func",
      # vLLM's layers allocate their weight parameters at model init (model_executor/layers/linear.py create_weights:
      # "Failed to create unquantized linear weights: CUDA out of memory", 2025+, and the traceback frame)
      "in create_weights", "linear weights:",
      # mistral.rs quantizes the weights in place as it loads them (ISQ: "Applying in-situ quantization into Some(HQQ8)
      # to 449 tensors"; mistralrs-quant's QuantMethod::apply_isq in the panic's backtrace)
      "apply_isq", "Applying in-situ quantization"), "model_weights"),
    # mlx-lm / mlx-vlm / LM Studio's mlx_engine (generate.py, server.py): evaluating the prompt cache's state is the
    # KV cache; prefill steps and generation are activations
    (("prompt_cache", "prompt cache"), "kv_cache"),
    (("Prefill failed", "prompt_step", "_prefill", "stream_generate", "stream generation", "generate_step"),
     "compute_buffer"),
    # a model's forward pass (traceback frame "in forward") and TGI's serving steps: the router's tracing spans
    # ("batch{batch_size=1}:prefill:prefill{id=9 size=1}", "decode{"), the server's generate_token, the Python
    # client's "Request failed during generation": activations, after start-up
    ((", in forward", "generate_token", "Request failed during generation", ":prefill", "prefill{", "decode{",
      # vLLM's serving loop (V0 worker start_worker_execution_loop, V1 execute_model): a request's forward pass
      "start_worker_execution_loop", "in execute_model", "async_llm_engine", "Engine loop is not running",
      # V0's model runner wraps a forward-pass error ("Error in model execution (input dumped to /tmp/err_...pkl)",
      # worker/model_runner_base.py dump_input_when_exception)
      "Error in model execution",
      # uvicorn's "Application startup complete." / "Uvicorn running on": a Python server (vLLM, SGLang, LightLLM,
      # llama-cpp-python) loads its model and pools before it serves; an OOM after it came in serving
      "Application startup complete", "Uvicorn running on",
      # vLLM V1's engine core and workers serving requests (v1/engine/core.py run_busy_loop, multiproc_executor.py
      # worker_busy_loop)
      "run_busy_loop", "worker_busy_loop",
      # vLLM V0's engine loop (engine/multiprocessing/engine.py MQLLMEngine.run_engine_loop -> engine_step)
      "run_engine_loop", "in engine_step",
      # the sampler's logits and logprobs of a step (vLLM model_executor/layers/sampler.py get_logprobs, logits
      # processor compute_logits): activations of that step
      ", in get_logprobs", ", in compute_logits", "/layers/sampler.py"),
     "compute_buffer"),
)
"""Python engines' start-up steps (traceback frames and log words) -> the phase of an OOM raised inside them."""

_CAPTURE_DONE_WORDS = ("capturing finished", "cuda graph end", "CUDA graph end", "Capturing CUDA graph", "capturing CUDA")
_CAPTURE_DONE = re.compile(r"(?i:graph capturing finished|capture cuda graph end|capturing cuda graphs? .{0,40}"
                           r"(?:took|finished|done))")
"""The end of CUDA graph capture (vLLM "Graph capturing finished in 5 secs", SGLang "Capture cuda graph end")."""

ENGINE_WORDS = (("lmdeploy", "lmdeploy"), ("turbomind", "lmdeploy"), ("TurboMind", "lmdeploy"), ("[TM]", "lmdeploy"),
                ("mlx_lm", "mlx-lm"), ("mlx-lm", "mlx-lm"), ("mlx_vlm", "mlx-lm"), ("mlx-vlm", "mlx-lm"),
                ("mlx.core", "mlx-lm"), ("[metal::", "mlx-lm"), ("mlx_engine", "mlx-lm"),
                # mlx's own Metal error text (mlx/backend/metal: "[METAL] Command buffer execution failed: ...")
                ("[METAL] Command buffer execution failed", "mlx-lm"),
                # ggml-cuda's own allocation message ("allocating N MiB on device D: cudaMalloc failed: out of memory")
                ("cudaMalloc failed: out of memory", "llama.cpp"), ("hipMalloc failed: out of memory", "llama.cpp"),
                ("llama-server", "llama.cpp"), ("llama-cli", "llama.cpp"), ("ggml_", "llama.cpp"), ("ggml-", "llama.cpp"),
                ("llama_", "llama.cpp"), ("llm_load", "llama.cpp"),
                # vLLM's process titles (V1 sets "VLLM::EngineCore", "VLLM::Worker_TP0"), as the kernel's OOM killer names them
                ("VLLM::", "vllm"),
                # vLLM V0's AsyncLLMEngine when its loop died ("Engine loop is not running. Inspect the stacktrace ...")
                ("Engine loop is not running", "vllm"),
                # vLLM's config check (config.py _get_and_verify_max_len: "User-specified max_model_len (N) is greater
                # than the derived max_model_len (...)"); SGLang's kernel package in a path or frame
                ("derived max_model_len", "vllm"), ("/sgl-kernel/", "sglang"), ("sgl_kernel", "sglang"),
                # sgl-project's torch_memory_saver (SGLang's --enable-memory-saver: pauses and resumes its weights and
                # KV cache for RL trainers), whose C++ lines start "[torch_memory_saver.cpp]"
                ("[torch_memory_saver", "sglang"),
                # LMDeploy's own name for its context ("total sequence length (A + B) exceeds `session_len` (N),
                # `max_new_tokens` is truncated to M": lmdeploy/serve/async_engine.py)
                ("exceeds `session_len`", "lmdeploy"),
                # llama-cpp-python's exception when llama.cpp's loader returned NULL (llama_cpp/_internals.py LlamaModel:
                # "ValueError: Failed to load model from file: <path>")
                ("Failed to load model from file: ", "llama.cpp"),
                # Ollama's client error for a runner that died while generating (llm/server.go, 2025-26)
                ("an error was encountered while running the model", "ollama"),
                # ggml's own names in upper case and its C sources (GGML_ASSERT, "GGML backend", ggml.c, ggml-alloc.c)
                ("GGML", "llama.cpp"), ("ggml.c", "llama.cpp"), ("common_fit_params", "llama.cpp"),
                # llama.cpp's refusal of a quantized V cache without flash attention (llama-context.cpp, 2025-26:
                # "quantized V cache was requested, but this requires Flash Attention")
                ("quantized V cache was requested", "llama.cpp"),
                # llama.cpp's server JSON log (2023-24, examples/server utils.hpp server_log: {"timestamp":N,
                # "level":"INFO","function":"update_slots","line":N,"message":"slot released",...}), also as LocalAI's
                # llama backend (a fork of that server) relays it
                ('","function":"', "llama.cpp"),
                # koboldcpp's console (gpttype_adapter.cpp: "Processing Prompt [BLAS] (3695 / 3695 tokens)",
                # "ContextLimit: 3713/4096, Processing:436.85s ..."), a program built on llama.cpp
                ("Processing Prompt [BLAS]", "llama.cpp"), ("ContextLimit: ", "llama.cpp"),
                ("common_params_fit", "llama.cpp"),
                # llama.cpp's common loader and llama-server's exit on a load error (common.cpp, server.cpp); its
                # loader's own refusal (llama-model-loader / llama.cpp llama_model_load: "error loading model: ...",
                # "unknown model architecture: '...'"), as bindings and apps relay it
                ("common_init_from_params", "llama.cpp"), ("exiting due to model loading error", "llama.cpp"),
                ("error loading model: ", "llama.cpp"), ("unknown model architecture: '", "llama.cpp"))
"""Words that name an engine this layer knows only through its memory errors (module names, log prefixes)."""

WINDOWS_CRASH = ("0xc0000409", "0xc0000005", "0xc000001d", "-1073740791", "-1073741819", "-1073741795", "3221226505",
                 "3221225477", "3221225501")
"""Windows' crash statuses (fail-fast abort, access violation, illegal instruction) in hex and as signed / unsigned
exit codes."""
_WINDOWS_CRASH_RX = r"(?<!\w)(?i:" + "|".join(map(re.escape, WINDOWS_CRASH)) + r")(?!\w)"

GLIBC_HEAP_ABORT = r"double free or corruption|\b(?:free|malloc|realloc|munmap_chunk)\(\): (?:invalid|corrupted|unaligned)|corrupted size vs\. prev_size|corrupted double-linked list"
"""glibc malloc's own aborts (malloc/malloc.c malloc_printerr): a corrupted heap, a bug, never a shortage of memory."""

GGML_ABORT_AT = r"(?<![\w.-])(?:ggml|llama)[\w.-]*\.(?:c|cpp|cu|m):\d+: "
"""ggml_abort's first words (ggml.c: ``fprintf(stderr, "%s:%d: ", file, line)``, then the message): the file is one of
ggml's or llama.cpp's own sources ("ggml-backend.cpp:941: pre-allocated tensor ... cannot run the operation")."""

_GGML_ABORT_RX = re.compile(GGML_ABORT_AT)
_DEVICE_LOST = re.compile(r"\bdevice lost on ((?:Vulkan|CUDA|ROCm|SYCL)\d+)\b")
"""ggml-vulkan's "device lost on Vulkan0": the device a lost-device failure names."""

FATAL = OomRule(
    "fatal-words", ("panic: ", "Traceback", "terminate called", "Segmentation fault", "core dumped", "Aborted", "FATAL",
                    "atal error", "GGML_ASSERT", "ggml_abort", "exit status", "exited with", "level=ERROR",
                    "ShardCannotStart", "failed to start", "Error: ", "Exception: ", "error: ", "CUDA error",
                    "SYCL error", "CANN error", "HIP error", "ROCm error", "MUSA error", "cuBLAS error", "illegal memory access", "has crashed", "Exit code:",
                    ")[0x", *WINDOWS_CRASH, *(c.upper().replace("0X", "0x") for c in WINDOWS_CRASH if c.startswith("0x")),
                    # DirectX's device removed / hung (a GPU reset: TDR), NVIDIA's Xid reports, amdgpu's VM faults
                    "887A0005", "887A0006", "DXGI_ERROR_DEVICE_", "NVRM: Xid", "[gfxhub", "VM_L2_PROTECTION_FAULT",
                    # an app's or Ollama's words for a load or runner that died
                    "Failed to load LLM", "runner crashed",
                    # a wrapper's own words for a load that failed (GenieX "Oops. Model failed to load.", Ollama 2026
                    # "model failed to load, this may be due to resource limitations")
                    "odel failed to load",
                    # a wrapper whose engine process died (text-generation-webui: "Error loading the model with
                    # llama.cpp: Server process terminated unexpectedly with exit code: -4")
                    "terminated unexpectedly",
                    # the JVM's uncaught exception (a Java binding: 'Exception in thread "main" java.lang.Error:
                    # Invalid memory access', java-llama.cpp#8) and an IDE's run console's end ("Process finished with
                    # exit code 1")
                    "Exception in thread \"", "Process finished with exit code",
                    # Go's runtime on a fatal signal in cgo code ("SIGABRT: abort", "SIGSEGV: segmentation violation"),
                    # Apple's Metal API validation ("failed assertion `computeFunction must not be nil.'"), Triton's
                    # compile-time check of a kernel's on-chip shared memory ("triton.runtime.errors.OutOfResources:
                    # out of resource: shared memory, Required: 106496, Hardware limit: 101376": not device memory)
                    "SIGABRT: ", "SIGSEGV: ", "SIGBUS: ", "failed assertion `", "OutOfResources: out of resource",
                    # Rust's panics (TGI's router, mistral.rs, candle), a missing library, a driver older than the runtime
                    "panicked at", "error while loading shared libraries", "driver version is insufficient",
                    # an HTTP 500 as a client relays it (Open WebUI: "500: Ollama: 500, message='Internal Server
                    # Error'"); llama.cpp's fit step whose probe load failed
                    "Internal Server Error", "error while trying to fit params",
                    # ggml-metal (2026): after one command buffer failed, every later graph is refused
                    "backend is in error state",
                    # Kubernetes: a container that keeps exiting (kubectl describe / get pods, kubelet's event)
                    "CrashLoopBackOff", "Back-off restarting failed container",
                    # LM Studio's load dialog, its engine runtime's exit before its health check (0.4.x)
                    "Failed to load the model", "exited before becoming healthy",
                    # ggml_abort / GGML_ABORT: "<path>/ggml-backend.cpp:941: <message>" (ggml.c prints file:line first;
                    # the file is one of ggml's or llama.cpp's, see GGML_ABORT_AT)
                    "ggml-", "ggml.c:", "llama-", "llama.cpp:",
                    # ggml-sycl's handler of a caught sycl::exception ("Exception caught at file:.../ggml-sycl.cpp,
                    # line:4199", then exit): its memory words are read by sycl-oom, anything else is no memory failure
                    "Exception caught at file:",
                    # libc++abi (macOS) on an uncaught C++ exception: "libc++abi: terminating due to uncaught exception
                    # of type std::runtime_error: ..." (mlx's Metal errors that are not memory: "Impacting Interactivity")
                    "terminating due to uncaught exception",
                    # Ollama's scheduler gave up on a runner that did not come up in OLLAMA_LOAD_TIMEOUT (llm/server.go)
                    "timed out waiting for llama runner to start",
                    # glibc malloc's aborts on a corrupted heap (malloc/malloc.c malloc_printerr)
                    "double free", "free(): ", "malloc(): ", "realloc(): ", "munmap_chunk(): ", "corrupted size",
                    "corrupted double-linked",
                    # a lost GPU (Vulkan's VK_ERROR_DEVICE_LOST as vulkan-hpp throws it, "vk::Queue::submit:
                    # ErrorDeviceLost"; ggml-vulkan's "device lost on Vulkan0"), llama-server's failed request
                    # ("srv update_slots: decode() failed: ...", "send_error: task id = 0, error: ..."), a gRPC call
                    # that failed (LocalAI's and Ollama's runners: "rpc error: code = Unavailable desc = error reading
                    # from server: EOF"), vLLM's ERROR records (logger.py: "ERROR 01-06 06:43:02 [file.py:419] Failed to ..."; a
                    # message, not a traceback's indented frames)
                    "ErrorDeviceLost", "DeviceLostError", "device lost on ", "decode() failed: ", "send_error: ",
                    "rpc error: code = ", "ERROR ",
                    # ROCr's GPU page fault (a kernel touched memory it does not own: a crash, not an allocation);
                    # mlx's Metal backend errors that are not memory ("[metal::Device] Unable to load function ...",
                    # "Failed to load the default metallib"), and a server that died before it was ready
                    "Memory access fault by GPU", "[metal::", "default metallib", "exited before becoming ready"),
    re.compile(r"panic: |Traceback \(most recent call last\)|terminate called after throwing|Segmentation fault|"
               r"core dumped|\bAborted\b|\bFATAL\b|[Ff]atal error|GGML_ASSERT|ggml_abort|exit status -?\d|"
               r"exited with (?:code|status) -?[1-9]|level=ERROR|ShardCannotStart|failed to start|"
               r"(?:^(?:\S+ ){0,3}?|\] )\w*(?:Error|Exception): |^\W{0,3}error: |\b(?:CUDA|SYCL|CANN|HIP|ROCm|MUSA) error\b|"
               + _WINDOWS_CRASH_RX + r"|"
               r"\b887A000[56]\b|DXGI_ERROR_DEVICE_(?:REMOVED|HUNG|RESET)|NVRM: Xid \(|amdgpu[ :][^\[\n]{0,40}\[gfxhub\S*\] page fault|"
               r"Failed to load LLM\b|\brunner crashed\b|\b[Mm]odel failed to load\b|\bterminated unexpectedly\b|"
               r'Exception in thread "[^"]*" [\w.$]+: |Process finished with exit code [1-9]|\bpanicked at\b|'
               r"error while loading shared libraries|\bSIG(?:ABRT|SEGV|BUS): [a-z]|failed assertion `|"
               r"OutOfResources: out of resource: shared memory|"
               r"driver version is insufficient|Internal Server Error|encountered an error while trying to fit params|"
               r"VM_L2_PROTECTION_FAULT|backend is in error state|\bCrashLoopBackOff\b|Back-off restarting failed container|"
               r"\bFailed to load the model\b|exited before becoming healthy|"
               r"\bcuBLAS error \d+|"
               r"illegal memory access|\bhas crashed\b|\(Exit code: -?\d+\)|Exception caught at file:|"
               r"terminating due to uncaught exception|"
               r"timed out waiting for llama runner to start|" + GGML_ABORT_AT
               + "|" + GLIBC_HEAP_ABORT +
               # glibc backtrace_symbols: "/usr/lib/libllama.so(llama_decode+0xc)[0x7f15...]"
               r"|\(\S*\+0x[0-9a-f]+\)\[0x[0-9a-f]+\]"
               r"|ErrorDeviceLost|DeviceLostError|\bdevice lost on \w|\bdecode\(\) failed: |\bsend_error: task id = \d+, error: |"
               r"\bMemory access fault by GPU node|\[metal::\w+\] |Failed to load the default metallib|"
               r"exited before becoming ready|"
               r"\brpc error: code = \w+ desc = |^(?:\([^()\n]{1,40} pid=\d+\) )?ERROR \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]\n]{1,80}\] [A-Z]"),
    None, "the last line of a failure that is not (or not recognisably) about memory: panics, tracebacks, "
          "asserts, aborts, exit statuses", memory=False)
"""Not a memory rule: a failure line kvreport cannot tie to memory (phase ``unknown``, no memory fix)."""

CRASH = re.compile(GGML_ABORT_AT + "|" + GLIBC_HEAP_ABORT + r"|GGML_ASSERT|ggml_abort|Segmentation fault|SIGSEGV|SIGABRT|core dumped|\bAborted\b|panic: |"
                   r"terminate called|illegal memory access|ErrorDeviceLost|DEVICE_REMOVED|has crashed|"
                   r"Memory access fault by GPU node|"
                   # an engine's own assertion (Python's AssertionError, a Metal shader's static_assert at library
                   # build), ggml's fixed metadata pool sized too small by the engine itself (ggml_new_object)
                   r"\bAssertionError\b|static_assert failed|ggml_new_object: not enough space|"
                   # Go's runtime on a fault in cgo code ("unexpected fault address", "fatal error: fault"), which
                   # Ollama relays as "llama runner process has terminated: error:fault"
                   r"unexpected fault address|\berror: ?fault\b|"
                   # a GPU build without kernels for this GPU, or a kernel that died (ggml-cuda's error block: "CUDA
                   # error: no kernel image is available for execution on the device", "invalid device function",
                   # "unspecified launch failure"; mmq.cuh "has no device code compatible with CUDA arch 700")
                   r"no kernel image is available|no device code compatible with|invalid device function|"
                   r"unspecified launch failure|compiled without support for the current GPU|"
                   # a broken install or build: the runner's binary does not link
                   r"undefined symbol: |error while loading shared libraries|"
                   # a GPU backend that could not start on this OS or driver (ggml-metal's shader library or pipelines,
                   # ggml-sycl's device query): a build that starts there is the fix, not a setting
                   r"failed to initialize the Metal library|ggml_metal_init\(\) failed|load pipeline error|"
                   r"failed to get device memory size|" + _WINDOWS_CRASH_RX)
"""The :data:`FATAL` lines that are a crash: an assert, a fatal signal, a lost device -- the engine's own bug or the
driver's, not the configuration (kvreport.fixes.crashed)."""

KEYWORDS: tuple[str, ...] = tuple(sorted({k for r in (*RULES, FATAL) for k in r.keywords}
                                         | {w for w, _ in ENGINE_WORDS} | {w for ws, _ in STAGES for w in ws}
                                         | {"current device:", "hipMalloc(", "metal_limit=", "kv_budget=",
                                            "direct cause of the following exception", *_CAPTURE_DONE_WORDS,
                                            "model_memory=", '"n_ctx": ', "radv/amdgpu:", "Available Free mem", "Requested  ", "Free (according to CUDA)", *_KV_POOL_WORDS}))
"""Every literal that selects a line for this layer (derived from :data:`RULES`, never kept by hand)."""

_LOG_LEVEL_WARN = re.compile(r"(?:^|[\s\[\]|)])(?:WARNING|WARN|level=WARN)\b")
"""A logger's WARNING record: the program said it and carried on (LMCache's "[2025-08-09 17:55:57,778] LMCache WARNING:
Failed to allocate memory for the KV cache." when its CPU buffer is full; vLLM goes on serving)."""
SUMMARY_RULES = ("kv-summary", "need-have", "need-but-only")
"""The rules for lines as people type them (a summary in an issue); a logger's record in their words is a program's."""

_SELF_RECOVERY = re.compile(r"(?i)\b(?:skipping|falling back|fall(?:ing)? back to|fallback to|will retry|retrying)\b|"
                            # ggml-backend.cpp ggml_backend_sched_alloc_splits (debug builds): "failed to allocate graph,
                            # reserving" -- it reserves and allocates again
                            r"failed to allocate graph, reserving")
"""A memory-error line that names its own way out ("failed to allocate 268435456 bytes for reorder temp buffer,
skipping reorder", ggml-sycl): a warning the engine carries on after, a failure only if one follows."""
_HSA_FREE = re.compile(r"Available Free mem\s*:\s*(\d+(?:\.\d+)?)\s*MB\b")
_RADV_SIZE = re.compile(r"radv/amdgpu:\s+size\s*:\s*(\d+) bytes")
_ASYNC_REQ = re.compile(r"Requested\s*:\s*([\d.]+) ?([KMGT]i?B)")
_ASYNC_FREE = re.compile(r"Free \(according to CUDA\):\s*([\d.]+) ?([KMGT]i?B|bytes)")
_NEXT_LINE_NUMBERS = (
    # the size line under RADV's "Failed to allocate a buffer:" (radv_amdgpu_bo.c prints it next)
    ("radv/amdgpu:", _RADV_SIZE, "radv-alloc", "mib", lambda m: int(m.group(1)) / 1048576.0),
    # the free memory ROCm's runtime prints with its out-of-resources abort
    ("Available Free mem", _HSA_FREE, "hsa-out-of-resources", "free_mib", lambda m: float(m.group(1))),
    # torch's cudaMallocAsync backend prints its numbers one a line, padded ("Requested               : 2.00 GiB"),
    # under "would exceed allowed memory"
    ("Requested  ", _ASYNC_REQ, "torch-exceed-allowed", "mib", lambda m: _mib(m.group(1), m.group(2))),
    ("Free (according to CUDA)", _ASYNC_FREE, "torch-exceed-allowed", "free_mib", lambda m: _mib(m.group(1), m.group(2))),
)
"""(literal, pattern, rule, event field, value): a number printed on a line after a rule's own line, within 4."""
_JSON_N_CTX = re.compile(r'\s*"n_ctx": (\d+),?\s*$')
_KV_POOL = re.compile(r"Allocate (\d+) bytes for k/v cache|Allocated ([\d.]+) GiB for max tokens in paged KV cache")
_CURRENT_DEVICE = re.compile(r"current device: (\d+)(?:, in function (\w+))?")
_LOG_LEVEL_INFO = re.compile(r"(?:^|[\s\[\]|)])(?:INFO|DEBUG|level=INFO|level=DEBUG)\b")
# "allocating 5.16 GiB", "allocating 2,147,483,648 bytes" (CuPy), "trying to allocate 17179869184 bytes" (XLA),
# "allocate memory for requested buffer of size 939524096" (ONNX Runtime's arena: bytes)
_NET_SIZE_PAREN = re.compile(r"(?i)alloc\w* failed(?: for [^()\n]{0,60})? \(([\d.]+) ?([KMGT]i?B)\b")
"""ds4's "ROCm model arena alloc failed for tensor-span:128 (1792.00 MiB chunk)", "CUDA q8 fp16 cache alloc failed
(64.00 MiB): out of memory": the size in parentheses."""
_NET_SIZE = re.compile(r"(?i)allocat\w*\s+(?:(?:memory for requested buffer of size|request for)\s+)?"
                       r"(\d{1,3}(?:,\d{3})+|[\d.]+)\s*([KMGT]i?B\b|bytes\b|B\b|(?=[\s.,;)]|$))")
_NOT_FAILURES = re.compile(r"(?i)\b(?:not an? (?:oom|out[ _-]of[ _-]memory)|to avoid|avoid(?:s|ing)? (?:an? )?(?:[\w-]+ ){0,2}?(?:oom|out of memory)|may run out|might run out|"
                           r"if you (?:run|get|see)|reduce .{0,40}to prevent|--help|usage:|prevent oom|oom[ _-]?(?:score|adj)|"
                           # a request the engine cut to fit and served (SGLang's tokenizer_manager "... exceeds the
                           # model's context length (8192 tokens). Truncating max_new_tokens."; the training context)
                           r"training context|n_ctx_train|\btruncat(?:ed|ing)\b)")
_PROSE_NOT_FAILURE = re.compile(
    r"(?i:\bno (?:more )?(?:oom|out[ _-]of[ _-]memory|['\"]?failed to allocate)|\bused to (?:get|see|hit|have)\b|"
    r"\b(?:works|worked|fixed|solved|resolved|fine) now\b|\bnow (?:it )?works\b|\bno longer (?:get|see|oom|fails?)\b|"
    r"\b(?:will|would|does|could|can|do) (?:it|this|that|i|we) (?:oom|fit|run out)\b|\bhow much (?:memory|vram|ram)\b|"
    r"\b(?:going to|gonna) (?:oom|fit|run out)\b|^\W*feature request\b)")
"""Prose around an out-of-memory error that says there is none now, or asks about one: "no OOM", "I used to get OOM at
32k but -c 16384 works now", "how much memory does 128k ctx need? will it OOM?", a feature request quoting one (a
report that asks a question, "... than is available, but I have 32GB RAM?", is still a report)."""


_PROSE_GATE = ("OOM", "oom", "emory", "llocat", "fit", "eature", "EATURE", "run out")
"""Literals every :data:`_PROSE_NOT_FAILURE` match of interest holds (a line without any skips the regex)."""


def prose_not_failure(line: str) -> bool:
    """A typed line that mentions memory errors without reporting one (:data:`_PROSE_NOT_FAILURE`); no parser reads
    such a line (kvreport.logs._feed_one), and the failure layer skips such a joined or split part (:func:`feed`)."""
    return any(w in line for w in _PROSE_GATE) and bool(_PROSE_NOT_FAILURE.search(line))


REQUEST_RULES = ("vllm-prompt-too-long", "vllm-max-tokens-negative", "openai-max-context", "sglang-input-too-long", "tgi-input-validation",
                 "ollama-input-too-long", "lmstudio-context-overflow", "llamacpp-prompt-too-long",
                 "llama-server-exceed-context", "exllama-seq-exceeds-cache", "llama-rn-context-full",
                 "ollama-prompt-too-long", "input-length-context", "input-exceeds-max-context", "ort-genai-max-length",
                 "vllm-max-context", "lmstudio-tokens-to-keep", "context-words")
"""The rules whose line says a request did not fit the context (refused, or the context filled up): the context is
too small for the request, not the memory for the context."""
HOST_RULES = ("oom-killer", "enomem", "bad-alloc", "python-memoryerror", "ios-jetsam", "windows-commit-limit",
              "ray-memory-monitor", "macos-low-swap", "torch-cpu-alloc")
"""The rules whose line says the host itself ran out (the OOM killer, ENOMEM, std::bad_alloc, MemoryError)."""

_BACKEND_WORDS = (("hip", "rocm"), ("rocm", "rocm"), ("rocblas", "rocm"), ("cuda", "cuda"), ("cublas", "cuda"),
                  ("musa", "musa"), ("vulkan", "vulkan"), ("vk", "vulkan"), ("metal", "metal"), ("mtl", "metal"),
                  ("sycl", "sycl"), ("xpu", "sycl"), ("opencl", "opencl"), ("cann", "cann"), ("npu", "cann"),
                  ("openvino", "openvino"), ("mindie", "cann"),
                  # ROCr's GPU page-fault report ("Memory access fault by GPU node-2 (Agent handle: ...) on address ...
                  # Reason: Page not present"), mlx's compiled Metal kernels ("Failed to load the default metallib")
                  ("memory access fault by gpu node", "rocm"), ("metallib", "metal"))
"""Backend words in a failure line, each matched as a word or a word's prefix ("hipMalloc", "CUDA0", "ggml-cann",
"npu:0"), never inside another word ("cannot" is not CANN, "ship" not HIP)."""
_BACKEND_RX = re.compile(r"(?<![a-z])(" + "|".join(w for w, _ in _BACKEND_WORDS) + r")(?:malloc|blas|_|\d|(?![a-z]))")
_BACKEND_OF = dict(_BACKEND_WORDS)


_BACKEND_RANK = {w: i for i, (w, _) in enumerate(_BACKEND_WORDS)}


def backend_of_words(low: str) -> str | None:
    """The backend of the lower-cased line's backend words (:data:`_BACKEND_WORDS`; the earliest in that table wins:
    torch on ROCm says "torch.cuda.OutOfMemoryError: HIP out of memory"), or None."""
    words = {m.group(1) for m in _BACKEND_RX.finditer(low)}
    return _BACKEND_OF[min(words, key=_BACKEND_RANK.__getitem__)] if words else None


def _net_data(line: str) -> dict | None:
    """What the net reads from a line in memory-failure words: a size when it names one ("CUDA OOM while allocating
    5.16 GiB"); None for advice, usage text, or an INFO/DEBUG record that only mentions memory errors."""
    if _NOT_FAILURES.search(line) or _LOG_LEVEL_INFO.search(line[:120]):
        return None
    out = {}
    buf = _NET_BUFFER.search(line)
    if buf:
        out["phase"] = buf.lastgroup  # (the group's name is the phase)
    size = _NET_SIZE.search(line) or _NET_SIZE_PAREN.search(line)
    if not size or (not size.group(2) and "buffer of size" not in size.group(0)):
        return out  # a bare number is bytes only after "buffer of size" (ONNX Runtime's arena)
    out["mib"] = _mib(size.group(1).replace(",", ""), size.group(2) if size.group(2) not in ("bytes", "B") else None)
    return out


_NET_BUFFER = re.compile(r"(?i)\balloc\w*\s+(?:(?:memory|space|the|a|persistent|device|host|gpu)\s+){0,3}"
                         r"(?:for\s+(?:the\s+)?)?(?:(?P<model_weights>weights?)|(?P<kv_cache>kv[ _-]?cache)|"
                         r"(?P<compute_buffer>compute|graph))\b")
"""An allocation the line itself names the buffer of ("Could not allocate persistent weights buffer!", QNN ExecuTorch;
"unable to allocate memory for the KV cache"; "failed to allocate compute buffer"): that buffer's phase."""


_WORDS = KeywordSet(KEYWORDS)
"""Every keyword of this layer's tables, found in one pass per line (:class:`kvreport.logs.common.KeywordSet`)."""


_RULES_OF: dict[str, tuple[int, ...]] = {}
for _i, _rule in enumerate(RULES):
    for _k in _rule.keywords:
        _RULES_OF[_k] = (*_RULES_OF.get(_k, ()), _i)
"""keyword -> the indexes of the :data:`RULES` rows it selects."""


_CONFIG_DUMP = re.compile(r"(?:\b\w+=[^,=]{0,200}?,\s*){3}")
"""A settings dump names settings, not a step: vLLM's "Initializing a V1 LLM engine (v0.x) with config: model=...,
compilation_config={... cudagraph_capture_sizes ...}", LMDeploy's "TurbomindEngineConfig(..., max_prefill_token_num=
8192, ...)", SGLang's "server_args=ServerArgs(...)" (three or more ``key=value,`` in a row)."""


def stage_of(line: str, present: frozenset[str] | None = None) -> str | None:
    """The phase of the start-up or serving step a line names (:data:`STAGES`), or None. ``present``: the line's
    keywords when the caller has them (:data:`_WORDS`)."""
    present = _WORDS.present(line) if present is None else present
    if present and not _CONFIG_DUMP.search(line):
        for words, phase in STAGES:
            if not present.isdisjoint(words):
                # a step reported as finished ("Loading model weights took 16.96 GB", "Model loading took ...") is
                # not the step an error after it came in
                # (nor is a progress bar at its end: "Loading weights: 100%|██████████| 206/206")
                return None if (phase == "model_weights" and " took " in line) or "100%|" in line else phase
    return None


_NOT_A_FAILURE = re.compile(r"(?:warning|arning): failed to (?:mlock|VirtualLock) \d+-byte buffer|"
                             r"failed to munlock buffer")
"""Lines in memory words that are warnings the engine carries on after: llama-mmap.cpp llama_mlock::raw_lock
("warning: failed to mlock N-byte buffer ...: Cannot allocate memory", llama.cpp#6261: the pages are just not pinned;
on Windows "warning: failed to VirtualLock N-byte buffer (after previously locking M bytes): The paging file is too
small ...", llama-mmap.cpp's Windows twin)."""


def _mark_chained(f: LogFacts, lineno: int) -> None:
    """Python's chained traceback ("The above exception was the direct cause of the following exception"): the OOM
    just above is the cause, and the frames that follow name the step it came in (see :func:`_stage_after`)."""
    for ev in reversed(f.events[-3:]):
        if lineno - ev["lineno"] <= 3 and (ev["kind"] == "oom" or ev.get("torch_oom")):
            ev["chained"] = True
            return


def _next_line_number(f: LogFacts, line: str, lineno: int) -> bool:
    """A number an error prints on a line of its own (:data:`_NEXT_LINE_NUMBERS`) -> the field of that error's event,
    when the error came at most 4 lines before; True when the line was read so."""
    for word, rx, rule, key, value in _NEXT_LINE_NUMBERS:
        m = rx.search(line) if word in line else None
        if m:
            for ev in reversed(f.events[-3:]):
                if ev["kind"] == "oom" and ev.get("rule") == rule and 0 < lineno - ev["lineno"] <= 4:
                    if ev.get(key) is None:
                        ev[key] = value(m)
                    return True
            return False  # (no such error just before: the line is read as any other)
    return False


def _side_line(f: LogFacts, line: str, lineno: int) -> bool:
    """Lines that are not failures of their own: warnings the engine carries on after, the continuation lines of an
    error block, a KV pool size. True when the line was one of them (read)."""
    if ("failed to mlock" in line or "failed to VirtualLock" in line or "failed to munlock" in line) \
            and _NOT_A_FAILURE.search(line):
        f.warnings.append(line[:500])
        f.engine_hints["llama.cpp"] += 1  # (llama-mmap.cpp's own warning)
        return True
    if "current device:" in line:
        _attach_device(f, line, lineno)
        return True
    if "direct cause of the following exception" in line:
        _mark_chained(f, lineno)
        return True
    if ("metal_limit=" in line or "kv_budget=" in line or "model_memory=" in line) and _attach_metal_plan(f, line, lineno):
        return True
    if "for k/v cache" in line or "paged KV cache (" in line:
        m = _KV_POOL.search(line)
        if m:
            f.kv_pool_mib = int(m.group(1)) / 1048576.0 if m.group(1) else float(m.group(2)) * 1024.0
            return True
    if "hipMalloc(" in line or "hipMallocManaged(" in line:
        _attach_call(f, line, lineno)
        return True
    if _next_line_number(f, line, lineno):
        return True
    if '"n_ctx": ' in line:
        m = _JSON_N_CTX.match(line)
        if m:  # LM Studio's load error JSON ("errorData": {"n_ctx": 1048576, ...}): the context it tried
            if "n_ctx" not in f.ctx:
                f.ctx["n_ctx"] = m.group(1)
                f.note_line("ctx:n_ctx", lineno, line)
            return True
    return False


def feed(f: LogFacts, line: str, lineno: int) -> None:
    """Read one cleaned line: an ``oom`` event for the first rule that matches (at most one per line)."""
    if _side_line(f, line, lineno):
        return
    present = _WORDS.present(line)
    if not present or prose_not_failure(line):
        return  # (a joined or split part is read here, not in _feed_one: prose is no event of this layer)
    for word, engine in ENGINE_WORDS:
        if word in present:
            f.engine_hints[engine] += 2 if engine != "llama.cpp" else 1
            break
    stage = stage_of(line, present)
    if stage:
        _stage_after(f, stage, lineno, 40 if _RUST_FRAME.search(line) else None)
        f.py_stage = stage
        if not present.isdisjoint(STAGES[0][0]):
            f.graph_capture = True
    if f.graph_capture and not present.isdisjoint(_CAPTURE_DONE_WORDS) and _CAPTURE_DONE.search(line):
        f.graph_capture = False
    for i in sorted({i for k in present for i in _RULES_OF.get(k, ())}):  # table order, only rows whose words occur
        rule = RULES[i]
        m = rule.pattern.search(line)
        if m is None:
            continue
        data = _net_data(line) if rule.generic else (rule.read(m) if rule.read else {})
        if data is None:
            return  # advice, usage text, or an INFO/DEBUG record that mentions memory errors
        if rule.id == "ollama-errnomem":
            f.ollama["nomem_cache_mib"] = ollama_nomem_cache_mib(line)
        backend = _rule_backend(rule, m, data, line)
        if rule.engine:  # a format only one engine prints names it
            f.engine_hints[rule.engine] += 2 if rule.engine != "llama.cpp" else 1
        f.add_event("oom", lineno, line, rule=rule.id, backend=backend, phase=data.pop("phase", rule.phase), engine=rule.engine,
                    generic=rule.generic, memory=rule.memory, py_stage=f.py_stage or None,
                    **({"warn": True} if rule.warn or (rule.generic and _SELF_RECOVERY.search(line))
                       or ((rule.generic or rule.id in SUMMARY_RULES) and _LOG_LEVEL_WARN.search(line[:120])) else {}),
                    **data)
        return
    if not present.isdisjoint(FATAL.keywords) and FATAL.pattern.search(line):
        lost = _DEVICE_LOST.search(line)
        f.add_event("oom", lineno, line, rule=FATAL.id, backend=backend_of_words(line.lower()), phase=None,
                    engine=None, generic=True, memory=False, **({"device_name": lost.group(1)} if lost else {}))
        if _GGML_ABORT_RX.search(line):
            f.engine_hints["llama.cpp"] += 1  # ggml_abort names one of ggml's or llama.cpp's own source files


_RUST_FRAME = re.compile(r"(?:^|\| )\s{0,8}\d{1,3}: <?[A-Za-z_]\w*::")
"""A frame of a Rust backtrace (std's or color-eyre's: "   4: vllm_rs::core::runner::ModelRunner::init_kv_cache"),
printed innermost first AFTER the error line (candle's "Error: DriverError(CUDA_ERROR_OUT_OF_MEMORY, ...)"): the first
frame that names a step places the error, however deep the frames above it."""


def _stage_after(f: LogFacts, stage: str, lineno: int, window: int | None = None) -> None:
    """A step named just after an OOM that no step placed: multi-process engines print one worker's exception and
    then another's "Exception in worker ... while processing method start_worker_execution_loop" (vLLM V0) or its
    traceback frames, so the step comes after the OOM line: at most 3 lines after, or 10 when the OOM was raised
    first and its chained traceback follows ("The above exception was the direct cause of the following exception"),
    or ``window`` lines (a Rust backtrace's frames, :data:`_RUST_FRAME`)."""
    recent = [ev for ev in f.events[-12:] if ev.get("rule") != FATAL.id]  # (a traceback's own lines are no step)
    for ev in reversed(recent[-3:]):
        if lineno - ev["lineno"] > (window or (10 if ev.get("chained") else 3)):
            return
        if ev["kind"] == "engine" and ev.get("torch_oom") and ev.get("phase") == "unknown":
            ev["phase"] = stage
            return
        if ev["kind"] == "oom" and ev.get("memory", True) and not ev.get("phase") and not ev.get("py_stage"):
            ev["py_stage"] = stage
            return


def _rule_backend(rule: OomRule, m: re.Match, data: dict, line: str) -> str | None:
    """The backend of a rule's line: what the format says (ggml's CUDA block names its build's vendor, torch names its
    device type), else the rule's own, else the line's backend words."""
    if rule.id == "ggml-cuda-error":
        return {"ROCm": "rocm", "MUSA": "musa"}.get(data.get("cuda_name", "CUDA"), "cuda")
    if rule.id == "torch-oom":
        return {"CUDA": "cuda", "HIP": "rocm", "XPU": "sycl", "MPS": "metal", "NPU": "cann"}.get(m.group("be") or "CUDA")
    if rule.id == "torch-oom-bare":
        # (torch.OutOfMemoryError is every device's: "NPU out of memory" is torch_npu's, "HIP out of memory" ROCm's)
        return backend_of_words(line.lower()) or rule.backend
    if data.get("device_name"):
        from kvreport.vocab import backend_of_device

        return backend_of_device(data["device_name"]) or rule.backend
    return rule.backend or backend_of_words(line.lower())


def _attach_metal_plan(f: LogFacts, line: str, lineno: int) -> bool:
    """The continuation lines of vllm-metal's budget error (printed wrapped) -> the fields of its ``oom`` event."""
    for ev in reversed(f.events[-3:]):
        if ev["kind"] == "oom" and ev.get("rule") == "vllm-metal-kv-budget" and lineno - ev["lineno"] <= 6:
            ev.setdefault("metal_plan", {}).update(_metal_plan(line).get("metal_plan", {}))
            return True
    return False


def _attach_call(f: LogFacts, line: str, lineno: int) -> None:
    """The third line of ggml's CUDA error block names the call that failed (``hipMalloc(...)`` on a HIP build)."""
    for ev in reversed(f.events[-3:]):
        if ev["kind"] == "oom" and lineno - ev["lineno"] <= 3:
            ev["hip"] = True
            return


def _attach_device(f: LogFacts, line: str, lineno: int) -> None:
    """``current device: N, in function F at ...`` (the second line of ggml's CUDA error block; ggml-cann prints the
    runtime's message and its "Solution:" lines in between) -> the device and the function of the ``oom`` event just
    before it, at most 4 lines up."""
    m = _CURRENT_DEVICE.search(line)
    if not m:
        return
    for ev in reversed(f.events[-3:]):
        if ev["kind"] == "oom" and lineno - ev["lineno"] <= 4:
            ev["device_index"] = int(m.group(1))
            if m.group(2):
                ev["function"] = m.group(2)
            return
    if m.group(2) and " at " in line:
        # the block's first line ("CUDA error: <reason>") is not in the log (a paste that kept only this one): the
        # block still says the backend failed in that function, a failure whose reason is not known
        f.add_event("oom", lineno, line, rule=FATAL.id, backend=backend_of_words(line.lower()), phase=None, engine=None,
                    generic=True, memory=False, device_index=int(m.group(1)), function=m.group(2))
