"""Signatures: stable keys from engine/phase/backend, identical across llama.cpp eras and verbosities."""

from __future__ import annotations

import re

from kvreport.analyze import analyze_text
from kvreport.signature import SCHEME, signature

NEW = """0.00.038.391 E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 1536.00 MiB on device 0: cudaMalloc failed: out of memory
0.00.038.415 E alloc_tensor_range: failed to allocate CUDA0 buffer of size 1610612736
0.00.038.508 E llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache
0.00.038.520 E cmn  common_init_: failed to create context with model '/m/a.gguf'
"""
OLD = """ggml_backend_cuda_buffer_type_alloc_buffer: allocating 20480.00 MiB on device 1: cudaMalloc failed: out of memory
llama_kv_cache_init: failed to allocate buffer for kv cache
llama_new_context_with_model: llama_kv_cache_init() failed for self-attention cache
llama_init_from_gpt_params: error: failed to create context with model '/other/b.gguf'
"""
MID = """ggml_backend_cuda_buffer_type_alloc_buffer: allocating 900.00 MiB on device 3: cudaMalloc failed: out of memory
init: failed to allocate buffer for kv cache
llama_init_from_model: failed to initialize the context: failed to initialize self-attention cache
common_init_from_params: failed to create context with model 'c.gguf'
"""


def test_same_failure_same_key_across_spellings():
    keys = {analyze_text(t)["signature"]["key"] for t in (NEW, OLD, MID)}
    assert keys == {"llama.cpp/kv_cache/cuda"}


def test_key_has_no_numbers_paths_or_indices():
    for t in (NEW, OLD, MID):
        key = analyze_text(t)["signature"]["key"]
        assert not re.search(r"\d|/m/|gguf|CUDA0", key)


def test_id_is_stable_short_hash():
    s = signature({"engine": "llama.cpp", "phase": "kv_cache", "backend": "cuda", "verdict": "exceeds_free"})
    assert s["key"] == "llama.cpp/kv_cache/cuda"
    assert re.fullmatch(r"[0-9a-f]{12}", s["id"])
    assert s["id"] == signature({"engine": "llama.cpp", "phase": "kv_cache", "backend": "cuda",
                                 "verdict": "exceeds_free"})["id"]
    assert s["scheme"] == SCHEME
    assert s["title"] == "llama.cpp · KV cache · CUDA"
    assert len(s["notes"]) >= 4


def test_unknown_values_are_normalised():
    s = signature({"engine": "koboldcpp", "phase": "weird", "backend": None, "verdict": ""})
    assert s["key"] == "unknown/unknown/unknown"


def test_no_failure_drops_backend_and_verdict():
    s = signature({"engine": "vllm", "phase": "none", "backend": "cuda", "verdict": "exceeds_free"})
    assert s["key"] == "vllm/none/unknown"


def test_one_failure_at_two_verbosities_is_one_cluster():
    """The same CPU KV failure with (-lv 4) and without the free-memory line: one key (the verdict differs)."""
    from tests.paths import CASE_DIR

    verbose = (CASE_DIR / "loc-17-fail-huge-ctx-verbose" / "log.txt").read_text()
    default = (CASE_DIR / "loc-15-fail-huge-ctx-fit-default" / "log.txt").read_text()
    a, b = analyze_text(verbose), analyze_text(default)
    assert a["signature"]["key"] == b["signature"]["key"] == "llama.cpp/kv_cache/cpu"
    hidden = "\n".join(ln for ln in verbose.splitlines() if "MiB free" not in ln)
    c = analyze_text(hidden)
    assert c["signature"] == a["signature"]
