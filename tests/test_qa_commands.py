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


def test_the_settings_a_python_engine_printed_are_the_current_values():
    """Without a command line, vLLM's own args / engine config lines give the values in effect: no fix 'raises' the
    fraction to the 0.95 it already runs with, more tensor parallelism doubles the logged 2, a batched-token limit
    below max_model_len with chunked prefill off turns it on, and V0's device_config names the backend."""
    v6 = analyze_text((QA / "v6-vllm-v0-ray-tp2-noblocks.log").read_text())
    assert next(s for s in v6["suggestions"] if s["id"] == "more-devices")["change"] == {"--tensor-parallel-size": 4}
    v6b = analyze_text((QA / "v6b-vllm-v0-util095.log").read_text())
    assert not any(s["id"] == "raise-gpu-memory-utilization" and s["change"].get("--gpu-memory-utilization") == 0.95
                   for s in v6b["suggestions"]), v6b["suggestions"]
    v11 = analyze_text((QA / "v11-vllm-rocm-hip-profile.log").read_text())
    batch = [s for s in v11["suggestions"] if "--max-num-batched-tokens" in s["change"]]
    assert batch and all(s["change"].get("--enable-chunked-prefill") is True for s in batch), batch
    assert analyze_text((QA / "v1-vllm05-v0-maxlen.log").read_text())["failure"]["backend"] == "cuda"


def test_py_args_reads_the_three_argument_lines_typed():
    from kvreport.logs.common import py_args

    assert py_args("non-default args: {'model_tag': 'm', 'max_model_len': 32768, 'gpu_memory_utilization': 0.95}") \
        == {"max_model_len": 32768, "gpu_memory_utilization": 0.95}
    assert py_args("args: Namespace(host=None, tensor_parallel_size=2, max_model_len=None, enable_chunked_prefill="
                   "False)") == {"tensor_parallel_size": 2, "enable_chunked_prefill": False}
    assert py_args('server_args=ServerArgs(model_path="x", mem_fraction_static=0.88, tp_size=1, context_length=None)') \
        == {"mem_fraction_static": 0.88, "tp_size": 1}


def test_ollamas_layout_gives_the_kv_cost_and_the_graph_it_must_leave_room_for():
    """No model parameters in the log, but Ollama's layout gives the KV of 131,072 tokens (24,576 MiB) and a 2,150 MiB
    compute graph on CUDA0 with 5,734 MiB left: the context that fits is computed from those, not halved."""
    d = analyze_text((QA / "o4-ollama012-layout-journal.log").read_text())
    assert d["memory"]["max_ctx_fit"]["f16"] == 18944
    ctx = next(s for s in d["suggestions"] if s["id"] == "reduce-ctx")
    assert ctx["change"] == {"OLLAMA_CONTEXT_LENGTH": 18944}, ctx


def test_ollamas_server_config_gives_its_slots_and_context():
    """The "server config" record is Ollama's command line: 4 slots of 65,536 tokens, so one slot comes first and a
    smaller context is a per-request value of a runner context of 262,144."""
    d = analyze_text((QA / "o9-ollama013-docker-sysmem-parallel.log").read_text())
    assert [s["id"] for s in d["suggestions"]][:2] == ["reduce-parallel", "reduce-ctx"], d["suggestions"]
    assert d["suggestions"][0]["change"] == {"OLLAMA_NUM_PARALLEL": 1}


def test_an_old_ollama_gets_no_setting_it_does_not_have():
    """Ollama 0.1.25 has no OLLAMA_KV_CACHE_TYPE (0.5.0+) and no Ollama has a per-GPU split: neither is offered."""
    ids = [s["id"] for s in analyze_text((QA / "o6-ollama01-rocm-kv.log").read_text())["suggestions"]]
    assert "quantize-kv-cache" not in ids and "rebalance-devices" not in ids, ids
