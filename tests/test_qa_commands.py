"""Suggested commands that a new user would paste (the QA session's findings, 2026-12-02): each must be a command the
engine accepts and that kvreport's own numbers say fits."""

from __future__ import annotations

from pathlib import Path

from kvreport.analyze import analyze_text

QA = Path(__file__).parent / "data" / "qa"


def _analyze(name: str, command: str) -> dict:
    return analyze_text((QA / name).read_text(), command)


def test_a_smaller_vllm_fraction_keeps_the_pool_above_the_max_model_len():
    """Lowering --gpu-memory-utilization from 0.95 to 0.9 takes 5 % of a 22 GiB GPU from a 4.12 GiB pool of 33,744
    tokens: about 24,700 are left, below --max-model-len 32768, which vLLM refuses at start-up. The length comes
    down with it."""
    d = _analyze("vllm-graph-capture-oom.log", "vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len 32768 "
                 "--gpu-memory-utilization 0.95 --max-num-seqs 512")
    util = next(s for s in d["suggestions"] if s["id"] == "lower-gpu-memory-utilization")
    assert util["change"]["--gpu-memory-utilization"] == 0.9
    assert 20000 < util["change"]["--max-model-len"] <= 24722, util
    assert "--max-model-len 24576" in util["command"]


def test_more_tensor_parallelism_makes_as_many_gpus_visible():
    d = _analyze("vllm-tp2-negative-kv.log", "CUDA_VISIBLE_DEVICES=0,1 vllm serve Qwen/Qwen2.5-72B-Instruct "
                 "--tensor-parallel-size 2 --max-model-len 32768")
    more = next(s for s in d["suggestions"] if s["id"] == "more-devices")
    assert more["change"] == {"--tensor-parallel-size": 4, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert more["command"].startswith("CUDA_VISIBLE_DEVICES=0,1,2,3 vllm serve")


def test_ollama_slots_share_the_training_context_and_q8_0_buys_context():
    """4 slots of 32768 tokens are not above Qwen2.5's 32768 training context: reduce-ctx keeps what fits at f16
    (34,816 in all) and q8_0 what fits at q8_0 (65,536), more than f16."""
    d = analyze_text((QA / "ollama-4-slots-kv-oom.log").read_text())
    by = {s["id"]: s for s in d["suggestions"]}
    assert by["reduce-ctx"]["change"] == {"OLLAMA_CONTEXT_LENGTH": 8704}
    assert by["quantize-kv-cache"]["change"]["OLLAMA_CONTEXT_LENGTH"] == 16384


def test_an_ollama_serve_line_comes_back_as_that_line_not_a_systemd_drop_in():
    d = analyze_text((QA / "ollama-4-slots-kv-oom.log").read_text(),
                     "OLLAMA_NUM_PARALLEL=4 OLLAMA_CONTEXT_LENGTH=32768 ollama serve")
    cmds = [s["command"] for s in d["suggestions"] if s["command"]]
    assert cmds and all(c.endswith("ollama serve") and "systemctl" not in c for c in cmds), cmds


def test_a_single_quoted_dollar_stays_literal():
    d = _analyze("vllm-graph-capture-oom.log", "vllm serve m --max-model-len 32768 --gpu-memory-utilization 0.95 "
                 "--api-key 'sk-abc$x'")
    assert all("'sk-abc$x'" in s["command"] for s in d["suggestions"] if s["command"])


def test_a_quoted_wrapped_multi_gpu_kv_failure_keeps_device_size_and_the_whole_kv():
    """"... on device 1: cudaMalloc" / "> failed: out of memory" is one line again; the KV of the attempt is CUDA0's
    allocated buffer plus CUDA1's failed one, and moving the KV to the host frees CUDA1's share, not the total."""
    d = analyze_text((QA / "llama-2gpu-kv-quoted-wrapped.log").read_text())
    f = d["failure"]
    assert (f["failing_device"], f["requested_mib"]) == ("CUDA1", 4992.0), f
    assert d["memory"]["kv_required_mib"] == 5248.0 + 4992.0
    host = [s for s in d["suggestions"] if s["id"] == "kv-cache-on-host"]
    assert all("4,992 MiB" in s["expected"] for s in host), host


def test_over_an_allocation_limit_neither_fewer_layers_nor_freeing_memory_is_offered():
    """A 4,160 MiB compute buffer over Vulkan's 4 GiB per-allocation limit, with 5,828 MiB free: fewer layers leave
    the compute buffer as large, and more free memory leaves it over the limit."""
    log = ("ggml_vulkan: 0 = AMD Radeon RX 7800 XT (AMD proprietary driver) | uma: 0 | fp16: 1 | warp size: 64\n"
           "llama_context: n_ctx = 32768\nllama_context: n_ubatch = 4096\n"
           "ggml_vulkan: Device memory allocation of size 4362076160 failed.\n"
           "ggml_vulkan: Requested buffer size exceeds device memory allocation limit: ErrorOutOfDeviceMemory\n"
           "ggml_gallocr_reserve_n: failed to allocate Vulkan0 buffer of size 4362076160\n"
           "graph_reserve: failed to allocate compute buffers\n")
    d = analyze_text(log)
    assert d["failure"]["verdict"] == "exceeds_alloc_limit", d["failure"]
    ids = [s["id"] for s in d["suggestions"]]
    assert "reduce-gpu-layers" not in ids and "free-device-memory" not in ids, ids


def test_fit_on_a_log_keeps_the_budget_analyze_keeps():
    """Flash attention off: analyze keeps the compute buffer at the context that fits out of the KV budget; fit --log
    on the same log gives the same budget and the same largest contexts (one copy of the arithmetic)."""
    from kvreport.fit import fit_from_options

    log = QA / "ollama-4-slots-kv-oom.log"
    d = analyze_text(log.read_text())
    rep, _shape = fit_from_options(log_path=str(log))
    assert rep["max_ctx_fit"]["f16"] == d["memory"]["max_ctx_fit"]["f16"] == 34816
    assert rep["max_ctx_fit"]["q8_0"] == d["memory"]["max_ctx_fit"]["q8_0"]
