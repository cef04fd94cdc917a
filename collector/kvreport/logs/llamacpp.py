"""llama.cpp log lines of every era (kv-facts.md §1), also as copied by Ollama, koboldcpp,
llama-cpp-python and ik_llama.cpp.

Every pattern searches inside the line (no ``^``): timestamps, level letters and tool prefixes
(``srv    load_model:``, ``cmn  common_init_:``) may come first. Function-name prefixes are
matched loosely because they changed with refactors (kv-facts.md §1.14).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from kvreport.logs.common import MIB, KeywordSet, to_float, to_int
from kvreport.logs.facts import LogFacts
from kvreport.vocab import backend_of_device

_PRINT_INFO = re.compile(r"(?<!\w)(?:print_info|llm_load_print_meta):\s+(.+?)\s*=\s?(.*?)\s*$")
_OLD_HPARAM_KEYS = {"model ftype": "file type", "model size": "file size", "format": "file format",
                    "n_ctx_orig_yarn": "n_ctx_orig_yarn", "n_swa_pattern": "n_swa_pattern"}
_GGUF_KV = re.compile(r"llama_model_loader: - kv\s+\d+:\s+(\S+)\s+(\S+)\s+=\s(.*?)\s*$")
_CTX = re.compile(
    r"(?:llama_context|llama_new_context_with_model|llama_init_from_model|llama_context_\w*):\s+"
    r"(n_ctx_per_seq|n_ctx_pre_seq|n_ctx_seq|n_ctx|n_seq_max|n_batch|n_ubatch|flash_attn|kv_unified|causal_attn|"
    r"type_k|type_v|n_rs_seq|n_outputs_max)\s*=\s*'?([\w.]+)'?")
_CTX_WARN = re.compile(r"n_ctx_(?:per_seq|seq|pre_seq)\s*\((\d+)\)\s*([<>])\s*n_ctx_train\s*\((\d+)\)")
_ROUNDING = re.compile(r"n_ctx is not divisible by n_seq_max - rounding down to (\d+)")
_OLD_KV_INIT = re.compile(
    r"kv_size\s*=\s*(\d+),(?:\s*offload\s*=\s*\d+,)?\s*type_k\s*=\s*'([\w.]+)',\s*type_v\s*=\s*'([\w.]+)',\s*n_layer\s*=\s*(\d+)")
_KV_SIZE = re.compile(
    r"(llama_kv_cache\w*|kv_cache\w*):\s+size\s*=\s*([\d.]+)\s*MiB\s*\(\s*(\d+)\s+cells,\s*(\d+)\s+layers"
    r"(?:,\s*(\d+)(?:/\s*(\d+))?\s+seqs)?\),\s*K\s*\(([\w.]+)\):\s*([\d.]+)\s*MiB,\s*V\s*\(([\w.]+)\):\s*([\d.]+)\s*MiB")
# (2023 builds: "llama_new_context_with_model: kv self size  = 3200.00 MB", MB meaning MiB)
_KV_SELF = re.compile(r"(?:KV|kv) self size\s*=\s*([\d.]+)\s*Mi?B(?:,\s*\S+\s*\(([\w.]+)\):\s*([\d.]+)\s*MiB,\s*\S+\s*\(([\w.]+)\):\s*([\d.]+)\s*MiB)?")
_RS_SIZE = re.compile(r"llama_(?:memory|kv_cache)_recurrent\w*:\s+size\s*=\s*([\d.]+)\s*MiB\s*\(\s*(\d+)\s+cells,\s*(\d+)\s+layers,\s*(\d+)\s+seqs")
_ISWA = re.compile(r"creating\s+(non-SWA|SWA|main|indexer)\s+KV cache,\s*size\s*=\s*(\d+)\s+cells")
_BUF = re.compile(r"(\w+):\s+(\S+)\s+(model|KV|RS|compute|output)\s+buffer size\s*=\s*([\d.]+)\s*MiB")
_OLD_BUF = re.compile(r"llm_load_tensors:\s+(\S+)\s+buffer size\s*=\s*([\d.]+)\s*MiB")
_USING_DEV = re.compile(r"using device (\S+) \((.*?)\)(?: \((.*?)\))? - (\d+) MiB free")
_LIST_DEV = re.compile(r"(?:^|\s|-\s)([A-Za-z_]+\d*)\s*:\s+([^:]+?)\s+\((\d+)\s+MiB,\s+(\d+)\s+MiB\s+free\)")
_CUDA_INIT = re.compile(r"ggml_cuda_init: found (\d+) (CUDA|ROCm|MUSA) devices")
_CUDA_DEV = re.compile(r"Device (\d+): ([^,]+),.*?(?:VRAM: (\d+) MiB)?\s*$")
_VK_DEV = re.compile(r"ggml_vulkan: (\d+) = (.+?) \(")
_VK_DEV_2024 = re.compile(r"(?:^|\s)Vulkan(\d+): (.+?) \| uma: \d")  # mid-2024 ggml_vk_print_gpu_info
_BUILD = (
    re.compile(r"build(?:_info)?:\s*(?:b)?(\d+)[ -]\(?([0-9a-f]{6,40}|unknown)\)?"),
    re.compile(r"version:\s*(\d+)\s*\(([0-9a-f]{6,40}|unknown)\)"),
    re.compile(r"version:\s*([\w.\-]+)\s*\(build (\d+), commit (\w+)\)"),
    re.compile(r"build\s*=\s*(\d+)\s*\(([0-9a-f]{6,40}|unknown)\)"),
    re.compile(r"\bbuild (\d+) \(([0-9a-f]{6,40}|unknown)\)"),
    # the 2024 server's JSON-style log ("INFO [ main] build info | tid=... build=3549 commit=\"b7a08fd5\"")
    re.compile(r"build info \|.*?\bbuild=(\d+) commit=\"?([0-9a-f]{6,40}|unknown)"),
)
_FIT_PROJ = re.compile(r"projected to use (\d+) MiB of (device|host) memory vs\. (\d+) MiB of (?:free device|total host|free) memory")
_FIT_CTX = re.compile(r"context size reduced from (\d+) to (\d+)")
_FIT_LAYERS = re.compile(r"-\s+(\S+?):\s+(\d+) layers\s+\(\s*(\d+) overflowing\)")
_FIT_DEV = re.compile(r"-\s+(\S+?):\s+(\d+) total,\s+(\d+) used,\s+(-?\d+) free vs\. target of\s+(\d+)")
_FIT_WORDS = ("projected", "reduced from", "overflowing", "free vs.", "no changes", "set by user", "requested full")
_SLOTS = re.compile(r"n_slots\s*=\s*(\d+)(?:,\s*n_ctx_slot\s*=\s*(\d+))?(?:,\s*kv_unified\s*=\s*'?(\w+)'?)?")
_AUTO_PAR = re.compile(r"using n_parallel = (\d+) and kv_unified = (\w+)")
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_BREAKDOWN = re.compile(r"\|\s+-\s+(\S+)\s+\(.*?\)\s+\|\s+(\d+)\s+=\s+(\d+)\s+\+")
_PROGRAM = re.compile(r"\b(llama-server|llama-cli|llama-completion|llama-bench|llama-fit-params|koboldcpp|llama-cpp-python)\b")

# failure chain
_CUDA_OOM = re.compile(r"allocating ([\d.]+) MiB on device (\d+): (cuda|hip|musa)Malloc failed:?\s*(.*)", re.I)
# ggml-cuda ggml_cuda_host_malloc: "failed to allocate N MiB of pinned memory: <why>" (2024+, "warning: " before it in
# some builds); 2023 builds printed "WARNING: failed to allocate N MB of pinned memory: out of memory"
# (%.2f under a locale with a decimal comma prints "1900,00": llama.cpp#9629)
_PINNED = re.compile(r"(?:ggml_cuda_host_malloc: )?(?:warning: |WARNING: )?failed to allocate (\d+(?:[.,]\d+)?) (?:MiB|MB) "
                     r"of pinned memory(?::\s*(.*))?")
# ggml-vulkan: "Device memory allocation of size N failed" (ggml_vk_create_buffer) and, from ggml_vk_create_buffer_check,
# "ggml_vulkan: Memory allocation of size N failed"
_VK_ALLOC = re.compile(r"(?:Device m|ggml_vulkan: M)emory allocation of size (\d+) failed")
# (the allocation errors of Vulkan's VkResult: out of device / host / pool memory, a failed map; a pipeline that did not
# compile, "ErrorUnknown", a lost device are not allocations and stay with the failure layer)
_VK_ERR = re.compile(r"ggml_vulkan:\s*(.*(?:Error(?:OutOf\w+|FragmentedPool|MemoryMapFailed)|exceeds|No suitable memory).*)")
_VK_PINNED = re.compile(r"ggml_vulkan: Failed to allocate pinned memory")
# ggml-metal: "ggml_backend_metal_buffer_type_alloc_buffer: error: failed to allocate buffer, size = %8.2f MiB"
# (old) and "ggml_metal_buffer_init: error: ..." (new); Ollama forwards it as "error:failed to allocate buffer, size = ..."
# Only the Metal backend prints "failed to allocate buffer, size =".
_METAL = re.compile(r"(?:metal\w*: )?error: ?failed to allocate buffer, size =\s*([\d.]+) MiB", re.I)
# ggml-sycl: "can't allocate %lu Bytes of memory on device" (new) and "can't malloc %lu Bytes memory on device" (old);
# the old message has no newline, so the next log line is glued to it.
_SYCL = re.compile(r"can't (?:allocate|malloc) (\d+) Bytes (?:of )?memory on (device|host)")
# OpenVINO intel_gpu plugin (an exception text llama.cpp prints after "failed to initialize the context: ")
_OV_LIMIT = re.compile(r"\[GPU\] Exceeded max size of memory object allocation: requested (\d+) bytes, but max alloc size "
                       r"supported by device is (\d+) bytes")
# ggml-backend <name>_buffer_type_alloc_buffer: "failed to allocate buffer of size N" (bytes; older builds print no
# size), OpenCL's "failed to allocate N MiB"; the backend is in the function's name
# sizes as people retype them into issues, their digits grouped by spaces ("108 000 000 000"): read whole
_N = r"\d+(?:[ \u00a0\u202f]\d{3})*"
_BACKEND_ALLOC = re.compile(r"backend_(cpu|opencl|cann|musa|sycl|vk|metal|rpc)_buffer_type_alloc_buffer: failed to allocate "
                            r"(?:buffer(?: of size (" + _N + r"))?|([\d.]+) MiB)")
_ALIGNED = re.compile(r"ggml_aligned_malloc: insufficient memory \(attempted to allocate\s*(" + _N + r"(?:\.\d+)?) MB\)")
_OPENVINO = re.compile(r"openvino\w*: failed to allocate (?:buffer of size |)(\d+)", re.I)
_CANN = re.compile(r"cann\w*: .*?(?:alloc|malloc)\w* failed.*?(\d+)", re.I)
_GGML = re.compile(r"(?:(\w+):\s+)?failed to allocate (\S+) buffer of size (" + _N + r")(?![\d.,])")
# llama-context.cpp output_reserve (2024+): "failed to allocate output buffer of size %.2f MiB" (the logits /
# embeddings buffer, n_vocab x n_outputs floats, on the host buffer type): a compute-side buffer, its size in MiB
_OUTPUT = re.compile(r"failed to allocate output buffer of size ([\d.]+) MiB")
# ggml-alloc.c's two allocators, in every era (checked in ggml-org/ggml and llama.cpp's copies):
#   graph (compute) allocator: 2023-24 ggml_tallocr/ggml_allocr "not enough space in the buffer (needed N, largest
#   block available M)"; 2024+ ggml_dyn_tallocr "not enough space in the buffer to allocate N bytes, largest block
#   available M bytes" (then "graph allocation: failed to reserve memory");
#   static tensor allocator (weights, KV): ggml_tallocr_alloc "not enough space in the buffer to allocate NAME
#   (needed N, available M)".
_NOT_ENOUGH = re.compile(r"not enough space in the buffer (?:to allocate (?P<dyn>\d+) bytes|\(needed (?P<old>\d+), "
                         r"largest block|to allocate (?P<name>\S+) \(needed (?P<static>\d+), available)")
_REASONS = (
    (re.compile(r"failed to allocate buffer for (?:the )?kv cache|llama_kv_cache_init\(\) failed|failed to initialize self-attention cache"), "kv_cache"),
    (re.compile(r"failed to allocate buffer for (?:the )?rs cache|failed to initialize (?:the )?recurrent"), "kv_cache"),
    # (llama-context.cpp process_ubatch, 2025+: "failed to allocate graph" when the scheduler cannot allocate a
    # batch's graph; the server then answers "Compute error.")
    (re.compile(r"failed to allocate compute (?:pp |tg )?buf|failed to reserve compute|failed to allocate the compute buffer|"
                r"process_ubatch: failed to allocate graph"), "compute_buffer"),
    # (llama-mmap.cpp maps the model file: POSIX "mmap failed: <strerror>", Windows "MapViewOfFile failed: <system
    # message>", ERROR_NOT_ENOUGH_MEMORY "Not enough memory resources are available..." or the commit limit)
    (re.compile(r"unable to allocate (?:\S+ )?buffer|unable to allocate backend buffer|mmap failed: Cannot allocate memory|"
                r"MapViewOfFile failed: (?:Not enough memory resources|The paging file is too small)|"
                r"error loading model: .*(?:out of (?:device |host )?memory|Cannot allocate memory|failed to allocate|"
                r"OutOf(?:Device|Host)Memory|OUT_OF_(?:DEVICE|HOST)_MEMORY)"), "model_weights"),
    (re.compile(r"memory layout cannot be allocated"), "context"),
)
_CTX_FAIL = re.compile(r"failed to initialize the context: (.*)")
_CTX_EXC = re.compile(r"failed to initialize the context: Exception from")
_CONFIG = re.compile(
    r"n_seq_max must be|requires flash_attn|requires Flash Attention|does not support different K|does not divide n_embd_head|"
    r"unknown model architecture|error loading model|GGML_ASSERT|invalid magic|not within the file bounds|"
    r"failed to read|tensor '.*' has|error: invalid argument|unknown argument|"
    # common/arg.cpp: a flag's value refused ('error while handling argument "--flash-attn": error: unknown value ...')
    r"error while handling argument \"|"
    r"SPLIT_MODE_TENSOR requires|is not a GGUF file|failed to open|"
    # a backend that could not start, not memory: 2023-24 ggml-metal.m ggml_metal_init's shader library or pipeline
    # ("ggml_metal_init: error: load pipeline error(2, CompilerError)", then "ggml_metal_init() failed"); 2026
    # ggml-sycl.cpp ggml_backend_sycl_device_get_memory's GGML_ABORT "failed to get device memory size" (llama.cpp#28515)
    r"ggml_metal_init\(\) failed|load pipeline error|failed to get device memory size|"
    # 2025-26 ggml-metal: the shader library did not compile ("ggml_metal_init: error: failed to initialize the Metal
    # library", then llama-context's "failed to initialize Metal backend"); llama-server's port already taken
    # (server.cpp "couldn't bind HTTP server socket, hostname: H, port: P")
    r"failed to initialize the Metal library|failed to initialize Metal backend|couldn't bind HTTP server socket|"
    # ggml-metal's backend init when ggml_metal_init returned NULL (no device, no library): its context object, not memory
    r"ggml_backend_metal\w*_init: error: failed to allocate context")
_FINAL = re.compile(
    r"failed to create context|failed to create_context|exiting due to model loading error|unable to create context|"
    r"[Uu]nable to load model|failed to load model|server exited before becoming ready|llama_server exited with code|"
    r"Load Text Model OK: False|error: failed to create context|"
    # llama-cpp-python's _internals.py LlamaContext: ValueError("Failed to create llama_context")
    r"Failed to create llama_context")
_SUCCESS = re.compile(
    r"listening on http|server is listening|model loaded|initializing slots|load_model: initializing, n_slots|"
    r"all slots are idle|main: server is listening|starting the main loop|llama runner started|"
    r"llama-server started in")
_RETRY = re.compile(r"retrying without pipeline parallelism")
_WORST_CASE = re.compile(r"worst-case: n_tokens = (\d+)")
_DXGI = re.compile(r"free:\s*(\d+)\s+total:\s*(\d+)")


def cuda_device_name(f: LogFacts, index: int) -> str:
    """``device N`` of the CUDA code -> its ggml name (``CUDA0``, ``ROCm0`` on HIP builds, ``MUSA0``)."""
    return f"{f.cuda_name or 'CUDA'}{index}"


def _hint_words(f: LogFacts, line: str, lineno: int) -> bool:
    f.engine_hints["llama.cpp"] += 1
    return False


def _hparams(f: LogFacts, line: str, lineno: int) -> bool:
    m = _PRINT_INFO.search(line)
    if not m:
        return False
    key = m.group(1).strip()
    key = _OLD_HPARAM_KEYS.get(key, key)
    if key not in f.hparams or not f.in_fit:
        f.hparams[key] = m.group(2).strip()
        f.note_line("hparams:" + key, lineno, line)
    f.engine_hints["llama.cpp"] += 1
    return True


def _gguf_kv(f: LogFacts, line: str, lineno: int) -> bool:
    if "llama_model_loader" not in line:
        return False
    m = _GGUF_KV.search(line)
    if m:
        f.gguf_kv[m.group(1)] = m.group(3)
    return True


_CONTEXT_STAGE = ("llama_context", "llama_new_context", "llama_init_from_model", "kv_cache", "sched_reserve",
                  "graph_reserve")


def _sycl_free(f: LogFacts, line: str, lineno: int) -> bool:
    # ggml-sycl get_memory_info: "[warning] ext_intel_free_memory is not supported (export/set ZES_ENABLE_SYSMAN=1 to
    # support), use total memory as free memory"
    f.ctx["sycl_free_is_total"] = True
    return True


def _stage(f: LogFacts, line: str, lineno: int) -> bool:
    if "draft model '" in line or "MTP draft context" in line:
        # llama-server loading its speculative-decoding draft ("srv load_model: loading draft model '...'", 2024-26;
        # "creating MTP draft context against the target model", 2026): what fails after it is the draft's
        f.ctx["draft_from_line"] = lineno
        return False
    if "offloading k cache to GPU" in line or "offloading v cache to GPU" in line:
        # 2023 llama_kv_cache_init announced each half before allocating it: an error now is the KV cache's
        f.stage = "kv"
    elif "load_tensors" in line or "llm_load_tensors" in line:
        f.stage = "weights"
        f.engine_hints["llama.cpp"] += 1
    elif "llama_model_loader" in line or "done_getting_tensors" in line:  # llama_model_loader::done_getting_tensors
        f.stage = "weights"
    elif any(k in line for k in _CONTEXT_STAGE):
        f.stage = "context"
    return False


def _fit(f: LogFacts, line: str, lineno: int) -> bool:
    if "fitting params" in line or "fit params" in line or "fit_params" in line:
        _feed_fit(f, line)
    if (f.fit is not None or "projected to use" in line) and any(k in line for k in _FIT_WORDS):
        return _feed_fit_detail(f, line, lineno)
    return False


def _ctx_params(f: LogFacts, line: str, lineno: int) -> bool:
    target = f.dry_ctx if f.in_fit else f.ctx
    for m in _CTX.finditer(line):
        key = m.group(1)
        if key in ("n_ctx_per_seq", "n_ctx_pre_seq"):
            key = "n_ctx_seq"
        target[key] = m.group(2)
        if not f.in_fit:
            f.note_line("ctx:" + key, lineno, line)
    m = _CTX_WARN.search(line)
    if m:
        target.setdefault("n_ctx_seq", m.group(1))
        if m.group(2) == ">":
            f.warnings.append(line[:500])
    m = _ROUNDING.search(line)
    if m:
        target["n_ctx"] = m.group(1)
        f.warnings.append(line[:500])
    m = _OLD_KV_INIT.search(line)
    if m:
        target["kv_size"] = m.group(1)
        f.note_line("ctx:kv_size", lineno, line)
        target["type_k"], target["type_v"] = m.group(2), m.group(3)
    _slots_and_parallel(f, line, target)
    return False


def _slots_and_parallel(f: LogFacts, line: str, target: dict) -> None:
    m = _SLOTS.search(line) if "n_slots" in line else None
    if m:
        target["n_slots"] = m.group(1)
        if m.group(2):
            target["n_ctx_slot"] = m.group(2)
        if m.group(3):
            target.setdefault("kv_unified", m.group(3))
    m = _AUTO_PAR.search(line)
    if m:
        f.ctx["n_parallel_auto"] = m.group(1)
        f.ctx.setdefault("kv_unified", m.group(2))
    m = _WORST_CASE.search(line) if "worst-case" in line else None
    if m:
        target.setdefault("n_ubatch", m.group(1))
    if "enabling flash_attn" in line:
        target["flash_attn"] = "enabled"


def _flash_swa(f: LogFacts, line: str, lineno: int) -> bool:
    if "Flash Attention" in line:
        if "set to enabled" in line or "Flash Attention enabled" in line:
            f.ctx["flash_attn_resolved"] = "enabled"
        elif "set to disabled" in line or "not supported" in line:
            f.ctx["flash_attn_resolved"] = "disabled"
    if "using full-size SWA cache" in line:
        f.ctx["swa_full"] = "true"
    return False


def _kv_sizes(f: LogFacts, line: str, lineno: int) -> bool:
    m = _ISWA.search(line)
    if m:
        f.kv_section = m.group(1)
        return True
    m = _KV_SIZE.search(line)
    if m:
        f.kv_caches.append({
            "mib": float(m.group(2)), "cells": int(m.group(3)), "layers": int(m.group(4)),
            "n_seq": to_int(m.group(5)), "n_stream": to_int(m.group(6)) or 1,
            "type_k": m.group(7), "k_mib": float(m.group(8)), "type_v": m.group(9), "v_mib": float(m.group(10)),
            "section": f.kv_section, "dry_run": f.in_fit, "lineno": lineno})
        f.engine_hints["llama.cpp"] += 1
        f.kv_section = ""
        if not f.in_fit:
            f.add_event("alloc_ok", lineno, line, what="kv")
            f.note_line("kv", lineno, line)
        return True
    m = _RS_SIZE.search(line)
    if m:
        f.rs_caches.append({"mib": float(m.group(1)), "cells": int(m.group(2)), "layers": int(m.group(3)),
                            "n_seq": int(m.group(4)), "dry_run": f.in_fit, "lineno": lineno})
        return True
    return False


def _kv_self(f: LogFacts, line: str, lineno: int) -> bool:
    m = _KV_SELF.search(line)
    if not m:
        return False
    f.kv_caches.append({
        "mib": float(m.group(1)), "cells": to_int(f.ctx.get("kv_size")), "layers": None,
        "n_seq": None, "n_stream": 1, "type_k": m.group(2) or f.ctx.get("type_k"),
        "k_mib": to_float(m.group(3)), "type_v": m.group(4) or f.ctx.get("type_v"), "v_mib": to_float(m.group(5)),
        "section": "", "dry_run": f.in_fit, "lineno": lineno, "old": True})
    f.add_event("alloc_ok", lineno, line, what="kv")
    f.note_line("kv", lineno, line)
    return True


def _buffers(f: LogFacts, line: str, lineno: int) -> bool:
    m = _BUF.search(line)
    if m:
        dev, kind, mib = m.group(2), m.group(3), float(m.group(4))
        _note_device_name(f, dev)
        f.buffers.append({"fn": m.group(1), "device": dev, "kind": kind, "mib": mib, "dry_run": f.in_fit,
                          "lineno": lineno})
        if kind == "KV":
            f.kv_buffers.append({"device": dev, "mib": mib, "dry_run": f.in_fit, "section": f.kv_section})
        if not f.in_fit:
            f.add_event("alloc_ok", lineno, line, what=kind)
        return True
    m = _OLD_BUF.search(line)
    if m:
        _note_device_name(f, m.group(1))
        f.buffers.append({"fn": "llm_load_tensors", "device": m.group(1), "kind": "model",
                          "mib": float(m.group(2)), "dry_run": f.in_fit})
        if not f.in_fit:  # a buffer the 2024 loader did allocate (after a pinned refusal: it fell back)
            f.add_event("alloc_ok", lineno, line, what="model")
        return True
    return False


def _device_free(f: LogFacts, line: str, lineno: int) -> bool:
    m = _USING_DEV.search(line)
    if m:
        f.note_line("device:" + str(m.group(1)), lineno, line)
        f.set_device(m.group(1), "using_device", description=m.group(2), free_mib=float(m.group(4)))
        _note_device_name(f, m.group(1))
        return True
    m = _LIST_DEV.search(line)
    if m:
        name = m.group(1)
        f.note_line("device:" + str(name), lineno, line)
        f.set_device(name, "list_devices", description=m.group(2), total_mib=float(m.group(3)),
                     free_mib=float(m.group(4)))
        _note_device_name(f, name)
        return True
    return False


_METAL_NAME = re.compile(r"ggml_metal_\w*: (?:GPU name|found device):\s+(.+?)\s*$")
_SYCL_DEV = re.compile(r"\|\s*(\d+)\|\s*\[(?:level_zero|opencl|ext_oneapi_level_zero|cuda|hip):gpu:\d+\]\|\s*([^|]+?)\s*\|"
                       r"(?:[^|]*\|){3}[^|]*\|\s*(\d+)M\|")


def _device_names(f: LogFacts, line: str, lineno: int) -> bool:
    """Device names from the backends' own start-up lines: Vulkan ``ggml_vulkan: 0 = AMD Radeon ... (driver)``,
    Metal ``ggml_metal_init: GPU name:   Apple M1 Max``, SYCL's device table ``|  0| [level_zero:gpu:0]| Intel(R)
    Arc(TM) A770 Graphics| ... | 16225M|``."""
    m = _VK_DEV.search(line) or _VK_DEV_2024.search(line)
    if m:
        f.set_device(f"Vulkan{m.group(1)}", "vulkan_init", description=m.group(2).strip())
        f.engine_hints["llama.cpp"] += 1
        return True
    m = _METAL_NAME.search(line)
    if m:
        f.set_device("Metal", "metal_init", description=m.group(1).strip())
        return True
    m = _SYCL_DEV.search(line)
    if m:
        f.set_device(f"SYCL{m.group(1)}", "sycl_init", description=m.group(2).strip(),
                     total_mib=float(m.group(3)) if m.group(3) else None)
        return True
    return False


_SCHED_DEV = re.compile(r"\bis assigned to device ((?:CUDA|ROCm|MUSA|Vulkan|SYCL|CANN|Metal|MTL)\d*)\b")
_SLOT_TASK = re.compile(r"\bid\s+\d+ \| task -?\d+ \|")


def _sched_reserve(f: LogFacts, line: str, lineno: int) -> bool:
    """llama-context.cpp's graph reservation (2026): "sched_reserve: layer 0 is assigned to device CUDA0 but the Flash
    Attention tensor is assigned to device CPU", "sched_reserve: Flash Attention was auto, set to disabled": llama.cpp,
    and the device it placed layers on."""
    f.engine_hints["llama.cpp"] += 1
    m = _SCHED_DEV.search(line)
    if m:
        f.set_device(m.group(1), "sched_reserve")
    return False


def _slot_task(f: LogFacts, line: str, lineno: int) -> bool:
    """llama-server's context checkpoint lines (2025-26, server-context.cpp: "slot create_check: id  0 | task 300 |
    created context checkpoint ...", "I slot   operator(): id  3 | task 154 | checking checkpoint ..."): llama.cpp
    (its other slot lines, progress and timings, are not key lines)."""
    if _SLOT_TASK.search(line):
        f.engine_hints["llama.cpp"] += 1
    return False


_SYCL_INIT = re.compile(r"ggml_sycl_init: found (\d+) SYCL devices")
_DEV_LINE = re.compile(r"^((?:CUDA|ROCm|MUSA|Vulkan|SYCL|CANN|MTL)\d+): (\S.*?)\s*$")
_DEV_PREFIXES = tuple(f"{p}{i}: " for p in ("CUDA", "ROCm", "MUSA", "Vulkan", "SYCL", "CANN", "MTL") for i in range(8))
"""``--list-devices``' lines ("Available devices:" then "  Vulkan0: AMD Radeon AI PRO R9700", indented, with "(N MiB,
M MiB free)" after the name in builds that can ask the device; common/arg.cpp), device 0 to 7 of each backend: a
cleaned line (no indent) that starts with the device's name."""


def _sycl_init(f: LogFacts, line: str, lineno: int) -> bool:
    """ggml-sycl's "ggml_sycl_init: found 2 SYCL devices": the devices ggml names SYCL0, SYCL1, ..."""
    m = _SYCL_INIT.search(line)
    if m:
        for i in range(min(int(m.group(1)), 16)):
            f.set_device(f"SYCL{i}", "sycl_init")
        f.engine_hints["llama.cpp"] += 1
    return True


def _listed_device(f: LogFacts, line: str, lineno: int) -> bool:
    m = _DEV_LINE.search(line)
    if m and "MiB free" not in line:  # (the sized form is read by _device_free)
        f.set_device(m.group(1), "list_devices", description=m.group(2))
    return False


def _cuda_init(f: LogFacts, line: str, lineno: int) -> bool:
    m = _CUDA_INIT.search(line)
    if m:
        f.cuda_name = m.group(2)
        f.engine_hints["llama.cpp"] += 1
    return True


def _cuda_device(f: LogFacts, line: str, lineno: int) -> bool:
    if not ("compute capability" in line or "VMM" in line or "Wave Size" in line):
        return False
    m = _CUDA_DEV.search(line)
    if m:
        name = cuda_device_name(f, int(m.group(1)))
        f.set_device(name, "ggml_cuda_init", description=m.group(2).strip(), total_mib=to_float(m.group(3)))
    return True


def _dxgi(f: LogFacts, line: str, lineno: int) -> bool:
    if "free:" not in line:
        return False
    m = _DXGI.search(line)
    if m:
        f.ctx["vk_free_mib"] = int(m.group(1)) / MIB
        f.note_line("free:vulkan", lineno, line)
        f.ctx["vk_total_mib"] = int(m.group(2)) / MIB
    return True


def _breakdown(f: LogFacts, line: str, lineno: int) -> bool:
    m = _BREAKDOWN.search(line)
    if m and not m.group(1).startswith("Host"):
        f.set_device(m.group(1), "memory_breakdown", total_mib=float(m.group(2)))
    return True


def _offloaded(f: LogFacts, line: str, lineno: int) -> bool:
    """``load_tensors: offloaded N/M layers to GPU``. Since 2024 llama-model.cpp prints it after the weight buffers were
    allocated (a refused buffer throws before it; 2023 builds printed it before load_all_data allocated anything): after
    a refused allocation of the same run it says the load went on with another placement (Ollama moved the output
    layer to the CPU and retried), so that refusal was recovered."""
    m = _OFFLOADED.search(line)
    if m:
        f.ctx["offloaded_layers"] = f"{m.group(1)}/{m.group(2)}"
        if any(e["kind"] in ("ggml", "backend") and not e.get("dry_run") for e in f.events):
            f.add_event("success", lineno, line, what="weights placed after a refused allocation")
    return True


def _version_program(f: LogFacts, line: str, lineno: int) -> bool:
    if "build" in line or "version" in line:
        _feed_build(f, line)
    if f.program is None and ("llama-" in line or "koboldcpp" in line or "llama_cpp" in line):
        m = _PROGRAM.search(line)
        if m:
            f.program = m.group(1)
    if "gpttype_load_model" in line or "koboldcpp" in line.lower():
        f.program = f.program or "koboldcpp"
        f.engine_hints["llama.cpp"] += 1
    return True


@dataclass(frozen=True)
class Section:
    """One group of llama.cpp lines: ``keywords`` (any one selects the line for this section) and ``read(f, line,
    lineno) -> bool`` (True: the line is read, later sections do not see it)."""

    name: str
    keywords: tuple[str, ...]
    read: Callable[[LogFacts, str, int], bool]


FAILURE_KEYWORDS = ("fail", "Fail", "FAIL", "rror", "alloc", "exit", "unable", "Unable", "insufficient", "listening",
                    "initializing", "idle", "started", "GGML_ASSERT", "not enough", "loaded", "OK: False", "main loop",
                    "Cannot", "support", "requires", "must be", "couldn't bind")

# llamafile (llamafile/cuda.c, metal.c, vulkan.c, 2024-26): which GPU library it loaded ("Apple Metal GPU support
# successfully loaded", "NVIDIA cuBLAS GPU support successfully loaded", "cuda: AMD ROCm GPU support successfully loaded")
_LLAMAFILE_GPU = re.compile(r"(Apple Metal|NVIDIA cuBLAS|NVIDIA CUDA|AMD ROCm) GPU support successfully loaded")


def _llamafile_gpu(f: LogFacts, line: str, lineno: int) -> bool:
    m = _LLAMAFILE_GPU.search(line)
    if not m:
        return False
    if m.group(1) == "Apple Metal":
        f.set_device("Metal", "llamafile")
    else:
        f.cuda_name = "ROCm" if m.group(1) == "AMD ROCm" else "CUDA"
    f.engine_hints["llama.cpp"] += 1
    return True


_SYSINFO_BLAS = re.compile(r"system_info: n_threads = .*?\|\s*BLAS = ([01])\s*\|")


def _system_info(f: LogFacts, line: str, lineno: int) -> bool:
    """llama.cpp's 2023-24 ``system_info: n_threads = N / M | AVX = 1 | ... | BLAS = 0 | ...`` line: ggml_cpu_has_blas()
    was 1 for every GPU build of that era (cuBLAS, hipBLAS, CLBlast, Vulkan, SYCL, Kompute; Metal builds on macOS have
    Accelerate), so ``BLAS = 0`` says the build had no GPU backend (kept as ``ctx["system_blas"]``)."""
    m = _SYSINFO_BLAS.search(line)
    if not m:
        return False
    f.ctx.setdefault("system_blas", m.group(1))
    f.engine_hints["llama.cpp"] += 1
    return True


SECTIONS: tuple[Section, ...] = (
    # (llama.cpp's own prefixes: its libraries, the multimodal loader mtmd / clip, llama-server's srv / slot lines)
    Section("engine words", ("llama_", "ggml_", "mtmd_", "clip_model_load", "clip_init", "srv    load_model",
                             "exiting due to model loading error", "(env: LLAMA_ARG_", "error while handling argument"),
            _hint_words),
    Section("model hyperparameters (print_info / llm_load_print_meta)", ("print_info", "llm_load_print_meta"),
            _hparams),
    Section("GGUF key/values (llama_model_loader: - kv)", ("- kv ",), _gguf_kv),
    Section("load stage", ("load_tensors", "llama_model_loader", "done_getting_tensors", "draft model '",
                           "MTP draft context", *_CONTEXT_STAGE), _stage),
    Section("auto-fit (kv-facts.md §3)", ("fitting params", "fit params", "fit_params", "projected to use",
                                          *_FIT_WORDS), _fit),
    Section("failure chain (kv-facts.md §1.10-1.11)", FAILURE_KEYWORDS, lambda f, line, n: _feed_failure(f, line, n)),
    Section("context parameters", ("n_ctx", "n_seq_max", "n_batch", "n_ubatch", "flash_attn", "kv_unified", "type_k",
                                   "worst-case"), _ctx_params),
    Section("flash attention / SWA", ("Flash Attention", "using full-size SWA cache"), _flash_swa),
    Section("KV / RS cache sizes", ("cells",), _kv_sizes),
    Section("old KV size", ("KV self size", "kv self size"), _kv_self),
    Section("buffer sizes", ("buffer size",), _buffers),
    Section("free memory per device", ("MiB free",), _device_free),
    Section("SYCL free memory not reported", ("use total memory as free memory",), _sycl_free),
    Section("device names (Vulkan, Metal, SYCL)", ("ggml_vulkan: ", "GPU name:", "found device:", ":gpu:", "| uma: "),
            _device_names),
    Section("scheduler placement (sched_reserve, 2026)", ("sched_reserve:",), _sched_reserve),
    Section("llama-server context checkpoints", ("context checkpoint", "checking checkpoint"), _slot_task),
    Section("llamafile GPU support", ("GPU support successfully loaded",), _llamafile_gpu),
    Section("system_info (2023-24 format)", ("system_info: n_threads",), _system_info),
    Section("ggml_cuda_init", ("ggml_cuda_init",), _cuda_init),
    Section("ggml_sycl_init", ("ggml_sycl_init: found",), _sycl_init),
    Section("--list-devices", ("Available devices:",), _hint_words),
    Section("--list-devices lines", _DEV_PREFIXES, _listed_device),
    Section("CUDA device list", ("Device ",), _cuda_device),
    Section("DXGI budget (Vulkan on Windows)", ("DXGI",), _dxgi),
    Section("memory breakdown", ("memory breakdown", "| - ", "|   - "), _breakdown),
    Section("offloaded layers", ("offloaded",), _offloaded),
    Section("version / program", ("build", "version", "llama-", "koboldcpp", "llama_cpp", "gpttype_load_model",
                                  "Koboldcpp", "KoboldCpp", "KoboldCPP"), _version_program),
)


KEYWORDS: tuple[str, ...] = tuple(sorted({k for section in SECTIONS for k in section.keywords}))
"""The literals that select a line for this parser (and keep it in a bundle's excerpt), derived from
:data:`SECTIONS` so that no section can be missed by the prefilter."""


_WORDS = KeywordSet(KEYWORDS)


def feed(f: LogFacts, line: str, lineno: int) -> None:
    """Read one cleaned line into ``f`` (llama.cpp and programs built on it): each section of :data:`SECTIONS`
    whose keywords the line holds, in order, until one has read it. Never raises on text."""
    present = _WORDS.present(line)
    if not present:
        return
    for section in SECTIONS:
        if not present.isdisjoint(section.keywords) and section.read(f, line, lineno):
            return


def _note_device_name(f: LogFacts, dev: str) -> None:
    if dev.startswith("ROCm"):
        f.cuda_name = "ROCm"
    elif dev.startswith("MUSA"):
        f.cuda_name = "MUSA"


def _feed_build(f: LogFacts, line: str) -> None:
    if f.build is not None and f.commit:
        return
    for i, rx in enumerate(_BUILD):
        m = rx.search(line)
        if not m:
            continue
        if i == 2:
            f.version = m.group(1)
            f.build, f.commit = to_int(m.group(2)), m.group(3)
        else:
            f.build, f.commit = to_int(m.group(1)), m.group(2)
        if f.commit == "unknown":
            f.commit = None
        if f.version is None and f.build is not None:
            f.version = f"b{f.build}"
        f.engine_hints["llama.cpp"] += 1
        return


def _feed_fit(f: LogFacts, line: str) -> None:
    if "fitting params to device memory" in line or ("fitting params" in line and "took" not in line and f.fit is None):
        f.fit = f.fit or {"ran": True, "status": "started", "changed": {}, "projected_mib": None, "free_mib": None,
                          "lines": []}
        f.in_fit = True
    elif "fitting params to free memory took" in line:
        f.in_fit = False
    if f.fit is None:
        return
    if "successfully fit params" in line:
        # common_fit_params / llama_params_fit: the fit finished; "no changes needed" before it stays no_change
        if f.fit["status"] in ("started", "unknown"):
            f.fit["status"] = "fitted"
        f.in_fit = False  # (its dry runs are over: what loads next is the real run, "took N seconds" or not pasted)
    elif "failed to fit params" in line:
        f.fit["status"] = "failed: " + line.split("failed to fit params to free device memory:")[-1].strip()[:200]
        f.in_fit = False
    elif "encountered an error while trying to fit" in line:
        f.fit["status"] = "error"
        f.in_fit = False


def _feed_fit_detail(f: LogFacts, line: str, lineno: int = 0) -> bool:
    if f.fit is None:
        f.fit = {"ran": True, "status": "started", "changed": {}, "projected_mib": None, "free_mib": None, "lines": []}
    fit = f.fit
    hit = False
    m = _FIT_PROJ.search(line)
    if m:
        fit["projected_mib"] = float(m.group(1))
        fit["free_mib"] = float(m.group(3))
        fit["memory"] = m.group(2)
        f.note_line("fit:free", lineno, line)
        hit = True
    m = _FIT_CTX.search(line)
    if m:
        fit["changed"]["n_ctx"] = [int(m.group(1)), int(m.group(2))]
        f.note_line("fit:ctx", lineno, line)
        hit = True
    m = _FIT_LAYERS.search(line)
    if m:
        fit.setdefault("layers", {})[m.group(1)] = {"layers": int(m.group(2)), "overflowing": int(m.group(3))}
        hit = True
    m = _FIT_DEV.search(line)
    if m:
        fit.setdefault("devices", {})[m.group(1)] = {"total_mib": float(m.group(2)), "used_mib": float(m.group(3)),
                                                     "free_mib": float(m.group(4)), "target_mib": float(m.group(5))}
        f.set_device(m.group(1), "fit", total_mib=float(m.group(2)))
        hit = True
    if "no changes needed" in line:
        if fit["status"] == "started":
            fit["status"] = "no_change"
        hit = True
    elif "set by user to" in line or "requested full context size" in line:
        fit["ctx_fixed_by_user"] = True
        hit = True
    if hit and len(fit["lines"]) < 20:
        fit["lines"].append(line[:300])
    return hit


def _f_cuda_oom(f: LogFacts, m: re.Match, line: str, lineno: int) -> None:
    idx = int(m.group(2))
    if m.group(3).lower() == "hip":
        f.cuda_name = "ROCm"
    backend = {"ROCm": "rocm", "MUSA": "musa"}.get(f.cuda_name or "CUDA", "cuda")
    f.add_event("backend", lineno, line, backend=backend, device=cuda_device_name(f, idx),
                mib=float(m.group(1)), error=m.group(4).strip())
    f.engine_hints["llama.cpp"] += 1


_SAYS_FELL_BACK = re.compile(r"\b(?:fall(?:ing)?[ -]?back|fallback|using (?:pageable|regular|non-pinned)|will use)\b", re.I)
"""A pinned-memory refusal that names its own fallback on the same line (forks' expert caches: "...: out of memory;
using pageable cached fallback"): the engine carried on whatever follows."""


_PINNED_OWNER = (("cann", "cann", "CANN"), ("sycl", "sycl", "SYCL"), ("vulkan", "vulkan", "Vulkan"),
                 ("cuda", "cuda", None))
"""Whose pinned host memory a refusal was: the backend word of the line ("ggml_cann_host_malloc"), else the one GPU
backend the log has shown devices of (2023 ggml-cuda, ggml-vulkan and ggml-sycl all print the bare "WARNING: failed
to allocate N MB of pinned memory"), else CUDA's: (word, backend, device-name prefix)."""


def _pinned_backend(f: LogFacts, line: str) -> tuple[str, str]:
    low = line.lower()
    for word, backend, prefix in _PINNED_OWNER:
        if word in low:
            return backend, f"{prefix or f.cuda_name or 'CUDA'}_Host"
    seen = {backend_of_device(n) for n in f.devices} - {None, "cpu"}
    if len(seen) == 1:
        b = seen.pop()
        prefix = next((p for _w, be, p in _PINNED_OWNER if be == b), None)
        if prefix or b == "cuda":
            return b, f"{prefix or f.cuda_name or 'CUDA'}_Host"
    return "cuda", f"{f.cuda_name or 'CUDA'}_Host"


def _f_pinned(f: LogFacts, m: re.Match, line: str, lineno: int) -> None:
    backend, device = _pinned_backend(f, line)
    f.add_event("pinned", lineno, line, backend=backend, device=device,
                mib=float(m.group(1).replace(",", ".")), error=(m.group(2) or "").strip(),
                fell_back=bool(_SAYS_FELL_BACK.search(m.group(2) or "")))
    f.engine_hints["llama.cpp"] += 1  # ggml-cuda's ggml_cuda_host_malloc


def _f_vk_pinned(f: LogFacts, m: re.Match, line: str, lineno: int) -> None:
    f.add_event("pinned", lineno, line, backend="vulkan", device="Vulkan_Host", mib=None, error=line)


def _f_vk_alloc(f: LogFacts, m: re.Match, line: str, lineno: int) -> None:
    f.add_event("backend", lineno, line, backend="vulkan", device=None, bytes=int(m.group(1)),
                mib=int(m.group(1)) / MIB, error="")
    f.engine_hints["llama.cpp"] += 1


def _f_vk_err(f: LogFacts, m: re.Match, line: str, lineno: int) -> None:
    limit = "exceeds" in line and "limit" in line
    f.add_event("backend", lineno, line, backend="vulkan", device=None, mib=None, error=m.group(1).strip(),
                limit=limit, detail=True)


def _f_bytes(backend: str, device: str | None, **extra) -> Callable:
    """A backend refusal that prints its size in bytes (group 1)."""
    def handle(f: LogFacts, m: re.Match, line: str, lineno: int) -> None:
        f.add_event("backend", lineno, line, backend=backend, device=device, bytes=int(m.group(1)),
                    mib=int(m.group(1)) / MIB, error="", **extra)
    return handle


_BACKEND_OF_BUFTYPE = {"cpu": "cpu", "opencl": "opencl", "cann": "cann", "musa": "musa", "sycl": "sycl", "vk": "vulkan",
                      "metal": "metal", "rpc": "unknown"}


_DIGIT_GAP = re.compile(r"[ \u00a0\u202f]")


def _digits(text: str) -> int:
    """``"108 000 000 000"`` -> 108000000000 (a size whose digits were grouped by spaces)."""
    return int(_DIGIT_GAP.sub("", text))


def _f_backend_alloc(f: LogFacts, m: re.Match, line: str, lineno: int) -> None:
    backend = _BACKEND_OF_BUFTYPE[m.group(1)]
    nbytes = _digits(m.group(2)) if m.group(2) else None
    mib = nbytes / MIB if nbytes is not None else (float(m.group(3)) if m.group(3) else None)
    f.add_event("backend", lineno, line, backend=backend, device="CPU" if backend == "cpu" else None, bytes=nbytes,
                mib=mib, error="")


def _f_aligned(f: LogFacts, m: re.Match, line: str, lineno: int) -> None:
    f.add_event("backend", lineno, line, backend="cpu", device="CPU", mib=float(_DIGIT_GAP.sub("", m.group(1))),
                error="", detail=True)


def _f_metal(f: LogFacts, m: re.Match, line: str, lineno: int) -> None:
    f.add_event("backend", lineno, line, backend="metal", device=None, mib=float(m.group(1)), error="")


def _f_sycl(f: LogFacts, m: re.Match, line: str, lineno: int) -> None:
    f.add_event("backend", lineno, line, backend="sycl", device=None, bytes=int(m.group(1)),
                mib=int(m.group(1)) / MIB, error="", host=m.group(2) == "host")


def _f_ov_limit(f: LogFacts, m: re.Match, line: str, lineno: int) -> None:
    f.add_event("backend", lineno, line, backend="openvino", device=None, bytes=int(m.group(1)),
                mib=int(m.group(1)) / MIB, error=line.strip()[:300], limit=True, detail=True,
                limit_mib=int(m.group(2)) / MIB)


_CPU_EXTRA = re.compile(r"CPU_(?:REPACK|AARCH64|KLEIDIAI|AMX)$")


def _f_ggml(f: LogFacts, m: re.Match, line: str, lineno: int) -> None:
    fn = m.group(1) or ""
    dev = m.group(2)
    if dev.startswith("RPC") and "[" in dev:
        dev = dev[:dev.index("[")]  # ggml-rpc names its device "RPC0[host:port]": the device is RPC0
    elif _CPU_EXTRA.match(dev):
        dev = "CPU"  # the CPU's extra buffer types (repacked weights, AMX, KleidiAI) are host memory
    _note_device_name(f, dev)
    kind = "compute" if "gallocr" in fn or "gallocr" in line else "tensor"
    nbytes = _digits(m.group(3))
    f.add_event("ggml", lineno, line, device=dev, bytes=nbytes, mib=nbytes / MIB, fn=fn, buffer=kind)
    f.engine_hints["llama.cpp"] += 1


# the static allocator names the tensor it could not place: a weight ("blk.17.ffn_down.weight", "token_embd.weight")
# or a KV cache tensor ("cache_k_l0", "k_l12", "v_l3")
_TENSOR_KIND = ((re.compile(r"\.(?:weight|bias)$|^(?:token_embd|output|output_norm)\b"), "weights"),
                (re.compile(r"^(?:cache_)?[kv](?:_cache)?_l\d+$|^cache_[kv]\b"), "kv"))


def _f_not_enough(f: LogFacts, m: re.Match, line: str, lineno: int) -> None:
    size = int(m.group("dyn") or m.group("old") or m.group("static"))
    name = m.group("name") or ""
    kind = next((k for rx, k in _TENSOR_KIND if rx.search(name)), "tensor") if m.group("static") else "compute"
    f.add_event("ggml", lineno, line, device=None, bytes=size, mib=size / MIB, fn="ggml_tallocr", buffer=kind)
    f.engine_hints["llama.cpp"] += 1


def _f_output(f: LogFacts, m: re.Match, line: str, lineno: int) -> None:
    mib = float(m.group(1))
    f.add_event("ggml", lineno, line, device=None, bytes=int(mib * MIB), mib=mib, fn="output_reserve", buffer="compute")
    f.engine_hints["llama.cpp"] += 1


def _f_retry(f: LogFacts, m: re.Match, line: str, lineno: int) -> None:
    f.add_event("retry", lineno, line)
    f.warnings.append(line[:500])


# llama_model_load's "unable to allocate <buffer type> buffer" names the buffer type, i.e. the device ("CUDA0",
# "ROCm1", "Vulkan0"; llama-model.cpp load_tensors), also when a program relays only that line
_REASON_DEVICE = re.compile(r"unable to allocate ((?:CUDA|ROCm|MUSA|Vulkan|SYCL|CANN)(?:\d+|_Host)|RPC\d+)(?:\[[^\]]*\])? buffer")


def _f_reason(f: LogFacts, m: re.Match, line: str, lineno: int) -> None:
    phase = next(p for rx, p in _REASONS if rx.search(line))
    dev = _REASON_DEVICE.search(line)
    f.add_event("reason", lineno, line, phase=phase, kv_update="kv_cache_update" in line,
                **({"device": dev.group(1)} if dev else {}))
    f.engine_hints["llama.cpp"] += 1  # llama.cpp's own exception texts (llama-context.cpp, llama-kv-cache.cpp)
    f.add_error(line)
    f.final_error = line


def _f_ctx_exception(f: LogFacts, m: re.Match, line: str, lineno: int) -> None:
    # an exception text follows on the next lines (OpenVINO): the allocator lines there belong to this failure
    f.add_event("reason", lineno, line, phase="context", kv_update=False, open=True)
    f.add_error(line)
    f.final_error = line


_CONFIG_OWN = re.compile(r"unknown model architecture|error loading model|n_seq_max must be|is not a GGUF file|"
                         r"error while handling argument \"|ggml_metal_init|SPLIT_MODE_TENSOR requires|"
                         # llama-context.cpp's refusal of a quantized V cache without flash attention (2024: "V cache
                         # quantization requires flash_attn"; 2025-26: "quantized V cache was requested, but this
                         # requires Flash Attention"), as LM Studio relays it too
                         r"V cache quantization requires flash_attn|quantized V cache was requested")
"""The refusals of :data:`_CONFIG` in words only llama.cpp prints (its loader, its context, its argument parser): the
engine too, when nothing else in the log names it (LM Studio's relay of a load error)."""


_LOAD_NO_REASON = re.compile(r"error loading model:\s*$")


def _f_config(f: LogFacts, m: re.Match, line: str, lineno: int) -> None:
    if _LOAD_NO_REASON.search(line) and any(e["kind"] == "backend" and lineno - e["lineno"] <= 3 for e in f.events[-3:]):
        # "llama_model_load: error loading model:" with its reason cut off (a paste, a relay), right after a backend's
        # refused allocation: the loader's exception was that allocation (its reason reads "unable to allocate
        # <buffer type> buffer"), so the weights did not fit
        f.add_event("reason", lineno, line, phase="model_weights", kv_update=False)
        f.add_error(line)
        f.final_error = line
        return
    # an assert is read as a refusal, but weakly: when its condition is about memory ("out of free blocks", "not
    # enough space") the failure layer reads the same line as the memory failure it is
    f.add_event("config", lineno, line, what=(m.group(1) if m.re is _CTX_FAIL else line).strip()[-200:],
                **({"weak": True} if "GGML_ASSERT" in line else {}))
    if _CONFIG_OWN.search(line):
        f.engine_hints["llama.cpp"] += 1
    f.add_error(line)
    f.final_error = line
    f.cause_error = line[:2000]


# the end of a run whose model (weights) did not load: llama.cpp's loader (llama_model_load_from_file_impl /
# llama_load_model_from_file, common_init_from_params "failed to load model '...'") and bindings that relay it (Tabby's
# "Unable to load model: <path>"); llama-server's own "srv load_model: failed to load model" follows a context
# failure too, so it is not one of these
_LOAD_FAILED = re.compile(r"(?:llama_model_load_from_file\w*|llama_load_model_from_file|common_init_from_params): "
                          r"failed to load model|Unable to load model: ")


def _f_final(f: LogFacts, m: re.Match, line: str, lineno: int) -> None:
    f.add_event("final", lineno, line, **({"load_failed": True} if _LOAD_FAILED.search(line) else {}))
    f.add_error(line)
    f.final_error = line


_REASON_ANY = re.compile("|".join(f"(?:{rx.pattern})" for rx, _p in _REASONS))

# (name, literal that must be in the line or None, pattern, handler); the first that matches reads the line
FAILURE_RULES: tuple[tuple[str, str | None, re.Pattern, Callable], ...] = (
    ("CUDA/HIP/MUSA malloc refused", "Malloc", _CUDA_OOM, _f_cuda_oom),
    ("pinned host memory (recoverable)", "pinned memory", _PINNED, _f_pinned),
    ("Vulkan pinned memory (recoverable)", "pinned memory", _VK_PINNED, _f_vk_pinned),
    ("Vulkan device allocation", "emory allocation of size", _VK_ALLOC, _f_vk_alloc),
    ("Vulkan error", "ggml_vulkan", _VK_ERR, _f_vk_err),
    ("backend buffer type refused", "alloc_buffer", _BACKEND_ALLOC, _f_backend_alloc),
    ("CPU aligned malloc", "ggml_aligned_malloc", _ALIGNED, _f_aligned),
    ("Metal buffer", None, _METAL, _f_metal),
    ("SYCL malloc", "can't", _SYCL, _f_sycl),
    ("OpenVINO max alloc size", "Exceeded max size of memory object", _OV_LIMIT, _f_ov_limit),
    ("OpenVINO buffer", None, _OPENVINO, _f_bytes("openvino", None)),
    ("output buffer (logits)", "output buffer of size", _OUTPUT, _f_output),
    ("ggml buffer of size", "buffer of size", _GGML, _f_ggml),
    ("ggml tallocr", "not enough space in the buffer", _NOT_ENOUGH, _f_not_enough),
    ("retry without pipeline parallelism", "retrying", _RETRY, _f_retry),
    ("reason (what the buffer was for)", None, _REASON_ANY, _f_reason),
    ("context exception follows", "Exception from", _CTX_EXC, _f_ctx_exception),
    ("context refused (not memory)", "failed to initialize the context", _CTX_FAIL, _f_config),
    ("refused configuration / bad file", None, _CONFIG, _f_config),
    ("end of the run", None, _FINAL, _f_final),
)


def _feed_failure(f: LogFacts, line: str, lineno: int) -> bool:
    """Failure-chain lines (kv-facts.md §1.10–1.11), read by :data:`FAILURE_RULES`. True when the line was one."""
    if "trying to fit" in line:
        return True
    low = line.lower()
    for _name, literal, rx, handle in FAILURE_RULES:
        if (literal is not None and literal not in line) or (rx is _OPENVINO and "openvino" not in low):
            continue
        m = rx.search(line)
        if m is None:
            continue
        if rx is _CONFIG and (" W " in line[:20] or "warning" in low[:40]):
            return False  # a warning that names a refusal is not one
        handle(f, m, line, lineno)
        return True
    if _SUCCESS.search(line):
        f.add_event("success", lineno, line)
        f.stage = "serving"  # the model and its context are up: a later error came while serving, not loading
    return False
