"""Fix rules: the right first suggestion, exact flag changes per engine, numbers that justify them."""

from __future__ import annotations

from kvreport.analyze import analyze, analyze_text
from kvreport.cmdline import parse_command
from kvreport.fixes import Situation, suggest

KV_FAIL = """llama_prepare_model_devices: using device CUDA0 (NVIDIA GeForce RTX 4060 Ti) (0000:01:00.0) - 15221 MiB free
print_info: arch                  = llama
print_info: n_ctx_train           = 131072
print_info: n_layer               = 32
print_info: n_head                = 32
print_info: n_head_kv             = 8
print_info: n_embd_head_k         = 128
print_info: n_embd_head_v         = 128
print_info: n_embd                = 4096
load_tensors:        CUDA0 model buffer size =  4403.49 MiB
llama_context: n_seq_max     = 1
llama_context: n_ctx         = 131072
llama_context: n_ctx_seq     = 131072
llama_context: kv_unified    = true
ggml_backend_cuda_buffer_type_alloc_buffer: allocating 16384.00 MiB on device 0: cudaMalloc failed: out of memory
alloc_tensor_range: failed to allocate CUDA0 buffer of size 17179869184
llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache
"""


def test_kv_failure_reduce_ctx_first_with_exact_numbers():
    d = analyze_text(KV_FAIL, "llama-server -m model.gguf -c 131072 -ngl 99")
    f = d["failure"]
    assert (f["phase"], f["backend"], f["failing_device"], f["verdict"]) == ("kv_cache", "cuda", "CUDA0", "exceeds_free")
    assert f["requested_mib"] == 16384.0 and f["free_mib"] == 15221.0
    assert d["memory"]["kv_required_mib"] == 16384.0
    assert d["memory"]["kv_mib_per_1k_tokens"] == 128.0
    # 15221 - 4403.49 MiB of weights = 10817.51 MiB left, minus llama.cpp's 1024 MiB --fit margin for the compute
    # buffer (the log printed none) = 9793.51 MiB; 128 KiB per token -> 78348 -> 78336 (multiple of 256)
    assert d["memory"]["max_ctx_fit"]["f16"] == 78336
    assert any(x["kind"] == "kv_headroom" and "1,024 MiB" in x["text"] for x in d["findings"])
    top = d["suggestions"][0]
    assert top["id"] == "reduce-ctx"
    assert top["change"] == {"--ctx-size": 78336}
    assert top["command"] == "llama-server -m model.gguf -c 78336 -ngl 99"
    assert "9,794 MiB available for the KV" in top["expected"]
    assert "compute buffer" in top["why"] and "-fitt" in top["why"]
    ids = [s["id"] for s in d["suggestions"]]
    assert ids.index("quantize-kv-cache") > 0 and "kv-cache-on-host" in ids


def test_reduce_ctx_keeps_the_compute_buffer_the_log_printed():
    log = KV_FAIL.replace("load_tensors:        CUDA0 model buffer size =  4403.49 MiB",
                          "load_tensors:        CUDA0 model buffer size =  4403.49 MiB\n"
                          "llama_context:      CUDA0 compute buffer size =   300.00 MiB")
    d = analyze_text(log, "llama-server -m model.gguf -c 131072 -ngl 99")
    top = d["suggestions"][0]
    assert top["id"] == "reduce-ctx"
    assert "300 MiB compute buffer the log printed for CUDA0" in top["why"]


def test_fits_but_failed_points_at_regression():
    # the log's own "MiB free" figure wins over memory_before_launch; without one, kvreport run's figure is used
    lines = [t for t in KV_FAIL.splitlines() if "MiB free" not in t]
    d = analyze({"log": {"lines": [[i, t] for i, t in enumerate(lines, 1)]},
                 "memory_before_launch": [{"device": "CUDA0", "free_mib": 40000}]})
    assert d["failure"]["verdict"] == "fits_but_failed"
    assert "bisect-regression" in [s["id"] for s in d["suggestions"]]


def test_ollama_gets_env_vars_not_flags():
    s = Situation(engine="ollama", phase="kv_cache", backend="cuda", n_ctx=32768, kv_mib=4096.0,
                  cache_type_k="f16", cache_type_v="f16", kv_at=lambda **kw: 1024.0)
    out = suggest(s)
    assert out[0]["change"] == {"OLLAMA_CONTEXT_LENGTH": 16384}
    q = next(x for x in out if x["id"] == "quantize-kv-cache")
    assert q["change"] == {"OLLAMA_KV_CACHE_TYPE": "q8_0", "OLLAMA_FLASH_ATTENTION": 1}


def test_no_memory_suggestion_for_non_memory_failures():
    d = analyze_text("llama_model_load: error loading model: unknown model architecture: 'tinyfoo'\n"
                     "llama_model_load_from_file_impl: failed to load model\n")
    assert d["failure"]["phase"] == "unknown"
    # (no memory fix: only a build that knows the architecture)
    assert [x["id"] for x in d["suggestions"]] == ["bisect-regression"]
    assert "'tinyfoo'" in d["suggestions"][0]["expected"] and d["suggestions"][0]["change"] == {}


def test_a_crash_that_is_not_memory_gets_a_known_good_build_only():
    # an assert in a new build (ggml-cuda.cu), as Ollama's journal shows it: not memory, not a setting
    d = analyze_text("Jun 27 22:57:42 <host> systemd-ollama[44353]: /build/ggml/src/ggml-cuda/ggml-cuda.cu:813: "
                     "GGML_ASSERT(tensor->nb[0] == ggml_element_size(tensor)) failed\n")
    assert d["failure"]["phase"] == "unknown"
    assert [x["id"] for x in d["suggestions"]] == ["bisect-regression"]
    assert d["suggestions"][0]["change"] == {} and "GGML_ASSERT" in d["suggestions"][0]["expected"]


def test_qa_pasted_commands_go_the_right_way():
    # SGLang's KV pool whose own allocation failed: a smaller fraction, not a larger one
    d = analyze_text('  File "/sgl/srt/mem_cache/memory_pool.py", line 607, in _create_buffers\n'
                     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 108.00 MiB. GPU 0 has a total "
                     "capacity of 23.54 GiB of which 52.44 MiB is free.",
                     "python -m sglang.launch_server --model-path M --mem-fraction-static 0.88")
    top = d["suggestions"][0]
    assert top["id"] == "lower-gpu-memory-utilization" and top["change"]["--mem-fraction-static"] < 0.88
    # "lower" never raises what the command set
    d = analyze_text("torch.OutOfMemoryError: CUDA out of memory occurred when warming up sampler with 32 dummy "
                     "requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization`",
                     "vllm serve M --max-num-seqs 32")
    seqs = [x for x in d["suggestions"] if x["id"] == "reduce-max-num-seqs"]
    assert all(x["change"]["--max-num-seqs"] < 32 for x in seqs)
    # TGI's own flags, never vLLM's
    d = analyze_text("tgi-1  | Error: Backend(NotEnoughMemory(32768))",
                     "text-generation-launcher --model-id M --max-total-tokens 32768 --cuda-memory-fraction 0.9")
    flags = {k for x in d["suggestions"] for k in x["change"]}
    assert flags and not flags & {"--gpu-memory-utilization", "--max-model-len", "--max-num-seqs"}
    # Ollama's server settings go on "ollama serve", not on the client command
    d = analyze_text('time=2025-01-01T00:00:00Z level=ERROR source=server.go:1 msg="x" error="could not find a kv '
                     'cache slot"', "ollama run qwen3:32b")
    assert all("ollama run" not in (x.get("command") or "") for x in d["suggestions"])


def test_a_lower_vllm_fraction_leaves_room_for_the_weights_it_printed():
    gate = ("(EngineCore_DP0 pid=1) ValueError: Free memory on device cuda:0 (5.2/79.19 GiB) on startup is less than "
            "desired GPU memory utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used "
            "by other processes.")
    ids = [x["id"] for x in analyze_text(gate)["suggestions"]]
    assert "lower-gpu-memory-utilization" in ids  # 0.04 of 79 GiB: 3.2 GiB, said to need the weights too
    d = analyze_text("INFO Model loading took 18.12 GiB and 9.1 seconds\n" + gate)
    assert "lower-gpu-memory-utilization" not in [x["id"] for x in d["suggestions"]]


def test_free_before_load_with_unsized_weights_is_not_a_fit():
    d = analyze_text("llama_model_load_from_file_impl: using device Vulkan0 (AMD Radeon RX 6800 XT) - 16112 MiB free\n"
                     "load_tensors: offloaded 37/37 layers to GPU\n"
                     "ggml_vulkan: Device memory allocation of size 4294967296 failed.\n"
                     "alloc_tensor_range: failed to allocate Vulkan0 buffer of size 4294967296\n"
                     "llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache")
    assert d["failure"]["verdict"] == "unknown"
    assert "bisect-regression" not in [x["id"] for x in d["suggestions"]]


def test_vllm_capacity_and_negative_pool():
    d = analyze_text("ERROR ValueError: To serve at least one request with the models's max seq len (32768), "
                     "(4.00 GiB KV cache is needed, which is larger than the available KV cache memory (2.00 GiB). "
                     "Based on the available memory, the estimated maximum model length is 16384. Try increasing "
                     "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
                     "vllm serve m --max-model-len 32768")
    assert d["engine"] == "vllm" and d["failure"]["phase"] == "kv_capacity"
    top = d["suggestions"][0]
    assert top["id"] == "reduce-max-model-len" and top["change"] == {"--max-model-len": 16384}
    assert top["command"] == "vllm serve m --max-model-len 16384"
    d = analyze_text("(EngineCore_0 pid=1) INFO [gpu_worker.py:276] Available KV cache memory: -2.14 GiB\n")
    assert d["suggestions"][0]["id"] == "raise-gpu-memory-utilization"


def test_vllm_memory_budget():
    d = analyze_text("ValueError: Free memory on device (31.44/47.38 GiB) on startup is less than desired GPU memory "
                     "utilization (0.95, 45.01 GiB). Decrease GPU memory utilization or reduce GPU memory used by "
                     "other processes.")
    assert d["failure"]["verdict"] == "exceeds_free"
    ids = [s["id"] for s in d["suggestions"]]
    assert ids[:2] == ["free-device-memory", "lower-gpu-memory-utilization"]
    assert d["suggestions"][1]["change"] == {"--gpu-memory-utilization": 0.64}


def test_swa_full_is_dropped_first():
    s = Situation(engine="llama.cpp", phase="kv_cache", backend="cuda", n_ctx=131072, swa_full=True, kv_mib=63488.0,
                  kv_at=lambda **kw: 10864.0 if kw.get("swa_full") is False else 5000.0,
                  command=parse_command("llama-server -m g.gguf -c 131072 --swa-full"))
    out = suggest(s)
    assert out[0]["id"] == "disable-swa-full"
    assert out[0]["command"] == "llama-server -m g.gguf -c 131072"


def test_alloc_limit_first_for_vulkan_limit():
    s = Situation(engine="llama.cpp", phase="compute_buffer", backend="vulkan", failing_device="Vulkan0",
                  verdict="exceeds_alloc_limit", requested_mib=4536.75, alloc_limit=True, n_ubatch=512)
    assert suggest(s)[0]["id"] == "work-around-alloc-limit"


def test_compute_on_secondary_gpu_rebalances():
    s = Situation(engine="llama.cpp", phase="compute_buffer", backend="cuda", failing_device="CUDA2", n_devices=4,
                  requested_mib=3076.72)
    top = suggest(s)[0]
    assert top["id"] == "rebalance-devices" and top["change"] == {"--tensor-split": "1,1,0.5,1"}


def test_other_backends_and_engines_are_placed():
    metal = analyze_text(
        "llama_model_load_from_file_impl: using device Metal (Apple M2) - 10922 MiB free\n"
        "ggml_backend_metal_buffer_type_alloc_buffer: error: failed to allocate buffer, size = 16384.00 MiB\n"
        "alloc_tensor_range: failed to allocate Metal buffer of size 17179869184\n"
        "llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache\n")
    f = metal["failure"]
    assert (f["phase"], f["backend"], f["failing_device"], f["verdict"]) == ("kv_cache", "metal", "Metal", "exceeds_free")
    sycl = analyze_text(
        "ggml_backend_sycl_buffer_type_alloc_buffer: can't allocate 5368709120 Bytes of memory on device\n"
        "ggml_gallocr_reserve_n: failed to allocate SYCL0 buffer of size 5368709120\n"
        "llama_init_from_model: failed to allocate compute buffers\n")
    assert (sycl["failure"]["phase"], sycl["failure"]["backend"], sycl["failure"]["requested_mib"]) == \
        ("compute_buffer", "sycl", 5120.0)
    ollama = analyze_text(
        'time=2025-09-01T10:00:00Z level=INFO source=server.go:1 msg="gpu memory" id=GPU-1 library=CUDA available="9.8 GiB"\n'
        'time=2025-09-01T10:00:00Z level=INFO source=server.go:1 msg="kv cache" device=CUDA0 size="12.0 GiB"\n'
        'time=2025-09-01T10:00:00Z level=ERROR source=server.go:1 msg="memory layout cannot be allocated"\n')
    assert (ollama["engine"], ollama["failure"]["phase"], ollama["failure"]["backend"]) == ("ollama", "context", "cuda")
    assert ollama["memory"]["kv_required_mib"] == 12288.0
    # no context size and no model parameters in the log: no invented number (design.md, "the number that justifies it")
    top = ollama["suggestions"][0]
    assert top["id"] == "reduce-ctx" and top["change"] == {} and top["command"] is None
    assert "no value can be computed" in top["expected"] and "OLLAMA_CONTEXT_LENGTH" in top["expected"]
    torch = analyze_text(
        "INFO 05-01 [gpu_model_runner.py:1] Model loading took 14.99 GiB and 5.1 seconds\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "23.58 GiB of which 1.05 GiB is free.\n")
    f = torch["failure"]
    assert (torch["engine"], f["phase"], f["failing_device"], f["requested_mib"], f["verdict"]) == \
        ("vllm", "compute_buffer", "CUDA0", 2048.0, "exceeds_free")


def test_fit_dry_run_that_never_finished_is_the_failure():
    d = analyze_text("0.00.006.400 I cmn  common_init_: fitting params to device memory ...\n"
                     "/src/ggml/src/ggml.c:1644: GGML_ASSERT(ctx->mem_buffer != NULL) failed\n"
                     "0.00.006.500 E ggml_aligned_malloc: insufficient memory (attempted to allocate  19.73 MB)\n")
    assert d["failure"]["phase"] == "unknown" and d["failure"]["backend"] == "cpu"
    assert d["failure"]["requested_mib"] == 19.73


def test_reduce_ctx_from_the_failed_kv_buffer_fits_the_free_memory():
    """No model parameters, but the failed KV buffer (131072 MiB) and n_ctx (1048576) give 128 KiB per token; with
    100000 MiB free, less llama.cpp's 1024 MiB --fit margin for the compute buffer, the largest multiple of 256 that
    fits is (100000 - 1024) * 8 = 791808 (pub-001's log)."""
    from kvreport.analyze import analyze
    from tests.paths import CASE_DIR

    text = next(CASE_DIR.glob("pub-001-*")).joinpath("log.txt").read_text()
    bundle = {"log": {"lines": text.splitlines()}, "memory_before_launch": [{"device": "CPU", "free_mib": 100000}]}
    d = analyze(bundle)
    assert d["memory"]["kv_mib_per_1k_tokens"] == 128.0
    assert d["memory"]["max_ctx_fit"]["f16"] == 791808
    top = d["suggestions"][0]
    assert top["id"] == "reduce-ctx" and top["change"] == {"--ctx-size": 791808}
    assert "derived from the failed KV buffer" in top["expected"] and "100,000 MiB free less 1,024 MiB" in top["expected"]
    # without the free memory: half the context, said to be a starting point, with the KV it would need
    d = analyze({"log": {"lines": text.splitlines()}})
    top = d["suggestions"][0]
    assert top["change"] == {"--ctx-size": 524288} and top["expected"].startswith("KV 65,536 MiB")
    assert "starting point" in top["why"]


def test_bare_flags_render_as_flags():
    from kvreport.render import format_change, render_text

    assert format_change({"--no-kv-offload": True}) == "--no-kv-offload"
    assert format_change({"--swa-full": None}) == "--swa-full (remove)"
    assert format_change({"OLLAMA_KV_CACHE_TYPE": "q8_0", "num_gpu": 20}) == "OLLAMA_KV_CACHE_TYPE=q8_0 num_gpu 20"
    d = {"failure": {"phase": "kv_cache"}, "memory": {}, "signature": {"title": "t"},
         "suggestions": [{"id": "kv-cache-on-host", "title": "x", "change": {"--no-kv-offload": True}, "command": None,
                          "expected": "", "why": ""}]}
    out = render_text(d)
    assert "change: --no-kv-offload\n" in out and "True" not in out


def test_every_suggestion_id_is_in_the_vocabulary():
    import re

    from kvreport import fixes

    src = open(fixes.__file__).read()
    used = set(re.findall(r'"([a-z]+(?:-[a-z0-9]+)+)"', src)) & set(re.findall(r'add\(\s*[\w.]+,\s*"([a-z0-9-]+)"', src))
    assert used and used <= set(fixes.SUGGESTION_IDS), used - set(fixes.SUGGESTION_IDS)


def test_context_above_the_training_context_is_capped_there_and_the_text_says_so():
    """loc-54's shape: the fit allows millions of tokens, but n_ctx_train is 8192; the text must not call 8192 the
    largest context that fits."""
    s = Situation(engine="llama.cpp", phase="kv_cache", backend="cpu", verdict="exceeds_free", failing_device="CPU",
                  requested_mib=49152.0, free_mib=24105.0, free_at_failure_mib=24105.0, kv_budget_mib=24105.0,
                  n_ctx=16777216, n_ctx_train=8192, kv_mib=49159.5, cache_type_k="f16", cache_type_v="f16",
                  max_ctx_fit={"f16": 8225280, "q8_0": 15484928, "q4_0": 29251840},
                  kv_at=lambda n_ctx=None, **kw: 31.5 if n_ctx == 8192 else 26116.0)
    top = suggest(s)[0]
    assert top["id"] == "reduce-ctx" and top["change"] == {"--ctx-size": 8192}
    assert "8,192 is the model's training context (n_ctx_train)" in top["why"]
    assert "up to 8,225,280 tokens would fit in memory" in top["why"] and "largest -c" not in top["why"]
    assert top["expected"].endswith("up to 8,225,280 tokens would fit")
    # q8_0 at 16,777,216 tokens would still not fit (issue 12 item 6: no suggestion predicted to fail): it comes with
    # the context that fits at q8_0, capped at n_ctx_train
    q = next(x for x in suggest(s) if x["id"] == "quantize-kv-cache")
    assert q["change"]["--ctx-size"] == 8192 and q["change"]["--cache-type-k"] == "q8_0"
    assert "at n_ctx 8,192" in q["expected"] and "would still not fit" in q["why"]


def test_fit_below_the_training_context_is_the_fit():
    s = Situation(engine="llama.cpp", phase="kv_cache", backend="cuda", verdict="exceeds_free", failing_device="CUDA0",
                  requested_mib=16384.0, free_at_failure_mib=10817.5, kv_budget_mib=10817.5, n_ctx=262144,
                  n_ctx_train=131072, kv_mib=32768.0, cache_type_k="f16", max_ctx_fit={"f16": 86528, "q8_0": 1, "q4_0": 1},
                  kv_at=lambda n_ctx=262144, **kw: n_ctx / 8 / 1024 * 1024 / 1024)
    top = suggest(s)[0]
    assert top["change"] == {"--ctx-size": 86528} and "the largest -c" in top["why"]


def test_no_context_fits_means_no_reduce_ctx():
    s = Situation(engine="llama.cpp", phase="kv_cache", backend="cpu", verdict="exceeds_free", failing_device="CPU",
                  n_ctx=65536, n_ctx_requested=4096, n_seq=256, kv_unified=False, kv_mib=32768.0,
                  free_at_failure_mib=24105.0, max_ctx_fit={"f16": 0, "q8_0": 65536, "q4_0": 131072},
                  kv_at=lambda **kw: 2048.0)
    assert "reduce-ctx" not in [x["id"] for x in suggest(s)]


def test_host_buffer_that_fits_suggests_raising_the_memory_limit_first():
    s = Situation(engine="llama.cpp", phase="kv_cache", backend="cpu", verdict="fits_but_failed", failing_device="CPU",
                  requested_mib=512.0, free_mib=24105.0, free_at_failure_mib=24105.0, n_ctx=65536, kv_mib=512.0,
                  command=parse_command("docker run --memory 1g img llama-server -m m.gguf -c 65536"))
    out = suggest(s)
    assert out[0]["id"] == "raise-memory-limit" and out[0]["change"] == {} and out[0]["command"] is None
    assert "512 MiB requested on CPU; the log reported 24,105 MiB of host memory free" in out[0]["expected"]
    for check in ("ulimit -v", "/sys/fs/cgroup/memory.max", "docker --memory"):
        assert check in out[0]["why"]
    ids = [x["id"] for x in out]
    assert "bisect-regression" not in ids and "free-device-memory" not in ids


def test_gpu_buffer_that_fits_keeps_bisect_regression_and_no_memory_limit():
    s = Situation(engine="llama.cpp", phase="compute_buffer", backend="cuda", verdict="fits_but_failed",
                  failing_device="CUDA0", requested_mib=512.0, free_mib=20000.0, free_at_failure_mib=20000.0)
    ids = [x["id"] for x in suggest(s, limit=8)]
    assert "bisect-regression" in ids and "raise-memory-limit" not in ids
    fd = next(x for x in suggest(s, limit=8) if x["id"] == "free-device-memory")
    assert "were free when measured" in fd["expected"]


def test_reduce_parallel_without_the_requested_ctx_gives_the_bound_from_the_rounding_warning():
    """QA #9: loc-29 from the log alone (-c unknown; the log shows n_ctx 65536 after 'rounding down to 65536'):
    the KV at one slot is a range, not the current 32,768 MiB."""
    from tests.paths import CASE_DIR

    text = next(CASE_DIR.glob("loc-29-*")).joinpath("log.txt").read_text()
    d = analyze_text(text)
    s = next(x for x in d["suggestions"] if x["id"] == "reduce-parallel")
    assert s["expected"].startswith("KV between 128 and 32,768 MiB with 1 slot")
    assert "-c 65536" not in s["why"] and "between 1 and 65536 tokens" in s["why"]


def test_reduce_parallel_that_saves_nothing_is_dropped():
    s = Situation(engine="llama.cpp", phase="kv_cache", backend="cuda", n_ctx=8192, n_seq=4, kv_mib=1024.0,
                  cache_type_k="f16", cache_type_v="f16", kv_at=lambda **kw: 1024.0)
    assert "reduce-parallel" not in [x["id"] for x in suggest(s)]


def _gguf(n_head_kv: int) -> dict:
    return {"general.architecture": "llama", "llama.block_count": 32, "llama.context_length": 131072,
            "llama.embedding_length": 4096, "llama.attention.head_count": 32,
            "llama.attention.head_count_kv": n_head_kv}


def test_a_gguf_that_disagrees_with_the_log_does_not_override_it():
    """QA #10: the engine's printed geometry (32 x 8 x 128) wins over a --model GGUF of another shape."""
    lines = [[i, t] for i, t in enumerate(KV_FAIL.splitlines(), 1)]
    bare = analyze({"log": {"lines": lines}})
    d = analyze({"log": {"lines": lines}, "model": {"gguf": _gguf(32)}})
    assert d["memory"]["kv_mib_per_1k_tokens"] == bare["memory"]["kv_mib_per_1k_tokens"] == 128.0
    assert d["memory"]["max_ctx_fit"] == bare["memory"]["max_ctx_fit"]
    assert any(x["kind"] == "gguf_log_mismatch" for x in d["findings"])
    same = analyze({"log": {"lines": lines}, "model": {"gguf": _gguf(8)}})
    assert same["memory"]["inputs"]["source"] == "gguf"
    assert not any(x["kind"] == "gguf_log_mismatch" for x in same["findings"])


def _kv_linear(per_token_mib: float):
    """A KV model for Situation: per_token x n_ctx (x n_seq only through n_ctx, as llama.cpp sizes it)."""
    def kv_at(n_ctx=None, n_seq=None, cache_type=None, **kw):
        return per_token_mib * float(n_ctx or 32768) * (0.53 if cache_type == "q8_0" else 1.0)
    return kv_at


def test_ollama_context_is_per_request_and_one_slot_comes_first():
    """Ollama's runner context is num_ctx x OLLAMA_NUM_PARALLEL: the context to paste is per request, and one slot
    keeps the user's context at a quarter of the KV."""
    s = Situation(engine="ollama", phase="kv_cache", backend="cuda", n_ctx=32768, n_seq=4, n_seq_known=True,
                  kv_mib=6144.0, cache_type_k="f16", cache_type_v="f16", kv_at=_kv_linear(6144.0 / 32768),
                  max_ctx_fit={"f16": 14336, "q8_0": 27648, "q4_0": 52224}, kv_budget_mib=2756.0)
    out = suggest(s)
    assert out[0]["id"] == "reduce-parallel" and out[0]["change"] == {"OLLAMA_NUM_PARALLEL": 1}
    ctx = next(x for x in out if x["id"] == "reduce-ctx")
    assert ctx["change"] == {"OLLAMA_CONTEXT_LENGTH": 14336 // 4}
    q = next(x for x in out if x["id"] == "quantize-kv-cache")
    assert q["change"]["OLLAMA_CONTEXT_LENGTH"] == 27648 // 4


def test_reduce_parallel_that_saves_nothing_is_not_offered():
    """A unified cache of -c 131072 shared by 4 slots is sized by -c alone: one slot would be a no-op."""
    s = Situation(engine="llama.cpp", phase="kv_cache", backend="cuda", n_ctx=131072, n_ctx_requested=131072,
                  n_seq=4, kv_unified=False, kv_mib=16384.0, cache_type_k="f16", cache_type_v="f16",
                  kv_at=_kv_linear(0.125))
    assert "reduce-parallel" not in [x["id"] for x in suggest(s)]


def test_flash_attention_in_the_form_the_build_reads():
    """llama.cpp's -fa took no value before about b6300; a bare -fa already given means it is on."""
    old = Situation(engine="llama.cpp", phase="kv_cache", backend="cuda", n_ctx=131072, kv_mib=16384.0,
                    cache_type_k="f16", cache_type_v="f16", kv_at=_kv_linear(0.125), engine_build=4589,
                    command=parse_command("llama-server -m m.gguf -c 131072 -ngl 99"))
    q = next(x for x in suggest(old) if x["id"] == "quantize-kv-cache")
    assert q["change"]["--flash-attn"] is True and q["command"].split()[-1] == "--flash-attn"
    on = Situation(**{**old.__dict__, "flash_attn": True,
                      "command": parse_command("llama-server -m m.gguf -c 131072 -ngl 99 -fa")})
    q = next(x for x in suggest(on) if x["id"] == "quantize-kv-cache")
    assert "--flash-attn" not in q["change"] and " -fa " in q["command"] + " " and "-fa on" not in q["command"]
    new = Situation(**{**old.__dict__, "engine_build": 7000})
    assert next(x for x in suggest(new) if x["id"] == "quantize-kv-cache")["change"]["--flash-attn"] == "on"


VLLM_V1_POOL = """INFO 04-15 10:12:03 [__init__.py:239] Automatically detected platform cuda.
INFO 04-15 10:12:14 [config.py:1901] Chunked prefill is enabled with max_num_batched_tokens=2048.
INFO 04-15 10:12:30 [gpu_model_runner.py:1291] Model loading took 14.9889 GiB and 8.123 seconds
ERROR 04-15 10:12:50 [core.py:390] ValueError: To serve at least one request with the models's max seq len (131072), \
(16.00 GiB KV cache is needed, which is larger than the available KV cache memory (4.41 GiB). Based on the available \
memory,  the estimated maximum model length is 36112. Try increasing `gpu_memory_utilization` or decreasing \
`max_model_len` when initializing the engine.
CRITICAL 04-15 10:12:50 [core_client.py:361] Got fatal signal from worker processes, shutting down. See stack trace above for root cause issue.
Killed
"""
"""vLLM V1 start-up lines in their real formats (platform detection, scheduler config, the KV capacity check), ending
with the shell's "Killed" as the engine's processes are torn down."""


def test_vllm_pool_on_cuda_and_no_utilization_raise_that_cannot_close_the_gap():
    d = analyze_text(VLLM_V1_POOL)
    f = d["failure"]
    assert (d["engine"], f["phase"], f["backend"]) == ("vllm", "kv_capacity", "cuda")
    assert f["allocator_error"] != "Killed"
    ids = [x["id"] for x in d["suggestions"]]
    assert ids[0] == "reduce-max-model-len" and d["suggestions"][0]["change"] == {"--max-model-len": 36112}
    # 11.6 GiB missing; 0.05 more of a GPU whose budget held 15 GiB of weights and a 4.4 GiB pool cannot give it
    assert "raise-gpu-memory-utilization" not in ids


def test_python_reduce_batch_starts_from_the_logged_batch():
    log = VLLM_V1_POOL.split("ERROR")[0] + ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
                                           "GPU 0 has a total capacity of 23.57 GiB of which 1.10 GiB is free.\n")
    batch = next(x for x in analyze_text(log)["suggestions"] if x["id"] == "reduce-batch")
    assert batch["change"] == {"--max-num-batched-tokens": 1024}


METAL_KV = """llama_model_load_from_file_impl: using device Metal (Apple M2 Pro) - 21845 MiB free
print_info: n_ctx_train      = 131072
print_info: n_embd           = 4096
print_info: n_layer          = 32
print_info: n_head           = 32
print_info: n_head_kv        = 8
print_info: n_embd_head_k    = 128
print_info: n_embd_head_v    = 128
load_tensors: Metal_Mapped model buffer size =  7605.34 MiB
load_tensors:   CPU_Mapped model buffer size =   532.31 MiB
llama_context: n_ctx         = 131072
llama_kv_cache_unified: kv_size = 131072, type_k = 'f16', type_v = 'f16', n_layer = 32, can_shift = 1, padding = 32
ggml_backend_metal_buffer_type_alloc_buffer: error: failed to allocate buffer, size = 16384.00 MiB
llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache
"""
"""llama.cpp on Metal (2025 line formats): ggml-metal's refusal names no device; the log shows one Metal device."""


def test_metal_failure_is_placed_on_the_only_metal_device_with_its_mapped_weights():
    f = analyze_text(METAL_KV)["failure"]
    assert (f["failing_device"], f["free_mib"], f["verdict"]) == ("Metal", 21845.0, "exceeds_free")
    fit = analyze_text(METAL_KV)["memory"]["max_ctx_fit"]["f16"]
    assert fit < (21845 - 7605) / 128 * 1024  # the mapped weights are taken off the free memory first


def test_fewer_gpu_layers_counts_from_the_layers_really_offloaded():
    """-ngl 99 is the "all layers" idiom: three quarters of 99 would change nothing for a 33-layer model."""
    base = dict(engine="llama.cpp", phase="compute_buffer", backend="cuda", failing_device="CUDA0",
                command=parse_command("llama-server -m m.gguf -ngl 99"), flags={"n_gpu_layers": 99})
    by_log = next(x for x in suggest(Situation(**base, offloaded_layers=33)) if x["id"] == "reduce-gpu-layers")
    assert by_log["change"] == {"--n-gpu-layers": 24}
    unknown = next(x for x in suggest(Situation(**base)) if x["id"] == "reduce-gpu-layers")
    assert unknown["change"] == {}


def test_a_gate_missed_by_a_little_lowers_utilization_first():
    """Free 30.12 GiB of 31.84 against 0.95 x 31.84 = 30.25: a slightly lower fraction is the fix that pastes."""
    d = analyze_text("Free memory on device cuda:0 (30.12/31.84 GiB) on startup is less than desired GPU memory "
                     "utilization (0.95, 30.25 GiB). Decrease GPU memory utilization or reduce GPU memory used by "
                     "other processes.\n")
    first = d["suggestions"][0]
    assert first["id"] == "lower-gpu-memory-utilization" and first["change"]["--gpu-memory-utilization"] < 0.95


# --- from the QA session of 2026-12-02 ------------------------------------------------------------------------------

def test_q8_0_kv_with_flash_attention_off_turns_it_on():
    """A quantized V cache needs flash attention: a command that says -fa off gets -fa on with q8_0 (pasted as it
    was, llama.cpp would refuse "V cache quantization requires flash_attn")."""
    d = analyze_text(KV_FAIL, "llama-server -m model.gguf -c 131072 -ngl 99 -fa off")
    q8 = next(s for s in d["suggestions"] if s["id"] == "quantize-kv-cache")
    assert "-fa on" in q8["command"] and "-fa off" not in q8["command"], q8["command"]


def test_a_refused_quantized_v_cache_gets_flash_attention():
    log = ("llama_init_from_model: failed to initialize the context: quantized V cache was requested, but this "
           "requires Flash Attention\n")
    d = analyze_text(log, "llama-server -m m.gguf -ctk q8_0 -ctv q8_0 -fa off")
    assert [s["id"] for s in d["suggestions"]] == ["enable-flash-attn"]
    assert "-fa on" in d["suggestions"][0]["command"]


def test_placeholders_in_pasted_commands_are_quoted():
    """A bare <token> is a shell redirection: the printed command quotes it."""
    cmd = parse_command("llama-server -m /m.gguf -c 131072 -ngl 99 --api-key SECRET")
    cmd["argv"] = [("<token>" if w == "SECRET" else w) for w in cmd["argv"]]
    d = analyze({"schema": "kvreport/bundle@1", "log": {"lines": [[i + 1, x] for i, x in
                                                                   enumerate(KV_FAIL.splitlines())]},
                 "command": cmd})
    commands = [s["command"] for s in d["suggestions"] if s.get("command")]
    assert commands and all("'<token>'" in c for c in commands), d["suggestions"]


TWO_GPUS = """llama_model_load_from_file_impl: using device CUDA0 (NVIDIA GeForce RTX 3090) - 23817 MiB free
llama_model_load_from_file_impl: using device CUDA1 (NVIDIA GeForce RTX 3090) - 23817 MiB free
print_info: n_ctx_train      = 131072
print_info: n_layer          = 80
print_info: n_head           = 64
print_info: n_head_kv        = 8
print_info: n_embd_head_k    = 128
print_info: n_embd_head_v    = 128
print_info: n_embd           = 8192
load_tensors:        CUDA0 model buffer size = 17534.00 MiB
load_tensors:        CUDA1 model buffer size = 21902.00 MiB
load_tensors:          CPU model buffer size =   564.00 MiB
llama_context: n_seq_max     = 1
llama_context: n_ctx         = 32768
llama_context: kv_unified    = true
ggml_backend_cuda_buffer_type_alloc_buffer: allocating 5120.00 MiB on device 1: cudaMalloc failed: out of memory
alloc_tensor_range: failed to allocate CUDA1 buffer of size 5368709120
llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache
"""


def test_a_split_kv_counts_only_the_failing_devices_share():
    """Layers split over two GPUs: CUDA1 holds half the KV (5120 of 10240 MiB), so the context that fits on it is
    twice what the whole KV against its budget would say; and no --tensor-split is offered when the two GPUs
    together cannot hold weights, KV and their compute margins (47,634 MiB free < 39,436 + 10,240 + 2 x 1,024)."""
    d = analyze_text(TWO_GPUS, "llama-server -m m.gguf -c 32768 -ngl 99 -ts 1,1")
    assert d["failure"]["failing_device"] == "CUDA1" and d["memory"]["kv_required_mib"] == 10240.0
    left = 23817 - 21902  # CUDA1's free less its weights; half kept for the compute buffer (below the 1 GiB margin)
    per_1k_on_cuda1 = 320 / 2
    assert d["memory"]["max_ctx_fit"]["f16"] == int(left / 2 / per_1k_on_cuda1 * 1024) // 256 * 256
    assert "rebalance-devices" not in [s["id"] for s in d["suggestions"]]


def test_the_headline_says_what_was_left_at_the_failure():
    from kvreport.render import render_text

    text = render_text(analyze_text(TWO_GPUS))
    assert "23,817 MiB free at load, 1,915 MiB left when it failed" in text


# --- from the second QA session of 2026-12-02 (Ollama, vLLM, SGLang, TGI, LMDeploy) ----------------------------------

def test_words_the_shell_was_to_expand_stay_expandable():
    cmd = parse_command("docker run --gpus all -v $PWD/data:/data -v ~/.cache/hf:/root/.cache/hf --env HF=$HF_TOKEN "
                        "vllm/vllm-openai:v0.10.1.1 --model m --max-model-len 131072")
    from kvreport.cmdline import with_changes

    line = with_changes(cmd, {"--max-model-len": 8192})
    assert "-v $PWD/data:/data" in line and "-v ~/.cache/hf:/root/.cache/hf" in line and "HF=$HF_TOKEN" in line, line


def test_a_version_field_is_not_an_address():
    from kvreport.redact import Redactor

    r = Redactor()
    assert r.redact_obj({"engine": {"name": "vllm", "version": "0.10.1.1"}})["engine"]["version"] == "0.10.1.1"
    assert r.redact_text("vllm 0.9.0.1 on 10.1.2.3") == "vllm 0.9.0.1 on <ip-1>"


SAMPLER = ("ERROR 06-02 16:21:31 [core.py:500] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. "
           "GPU 0 has a total capacity of 39.38 GiB of which 612.00 MiB is free.\n"
           "ERROR 06-02 16:21:31 [core.py:500] RuntimeError: CUDA out of memory occurred when warming up sampler with "
           "1024 dummy requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the "
           "engine.\n")


def test_a_sampler_warmup_oom_lowers_the_sequences_first():
    """The sampler's batch is max_num_seqs (the line's dummy requests): fewer sequences first, and no tokens-per-step
    change (it does not touch that batch, and vLLM refuses max_num_batched_tokens below max_num_seqs)."""
    d = analyze_text(SAMPLER, "vllm serve m --max-num-batched-tokens 1024")
    ids = [s["id"] for s in d["suggestions"]]
    assert ids[0] == "reduce-max-num-seqs" and "reduce-batch" not in ids, ids
    assert d["suggestions"][0]["change"] == {"--max-num-seqs": 512}


def test_tgi_prefill_batch_below_the_input_limit_lowers_the_input_limit_too():
    log = ("2024-11-05T09:12:29.118374Z ERROR warmup{max_input_length=Some(16000) max_prefill_tokens=16384 "
           "max_total_tokens=Some(16384) max_batch_size=None}:warmup: text_generation_router_v3::client: "
           "backends/v3/src/client/mod.rs:45: Server error: Not enough memory to handle 16384 prefill tokens. You need "
           "to decrease `--max-batch-prefill-tokens`\n")
    batch = next(s for s in analyze_text(log)["suggestions"] if s["id"] == "reduce-batch")
    assert batch["change"] == {"--max-batch-prefill-tokens": 8192, "--max-input-tokens": 8192,
                               "--max-total-tokens": 8576}, batch


def test_tgi_kv_smaller_than_one_request_after_warmup_is_kv_capacity():
    log = ("2023-10-06T09:14:05.902240Z  WARN text_generation_router: router/src/main.rs:235: Inferred max batch total "
           "tokens: 6336\nError: ArgumentValidation(\"`max_total_tokens` must be <= `max_batch_total_tokens`. Given: "
           "8192 and 6336\")\n")
    assert analyze_text(log)["failure"]["phase"] == "kv_capacity"


def test_graph_capture_oom_offers_fewer_graphs():
    log = ("INFO 08-01 10:00:00 [gpu_model_runner.py:2000] Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 40%\n"
           "ERROR 08-01 10:00:05 [core.py:700]   File \"/v/vllm/v1/worker/gpu_model_runner.py\", line 2100, in "
           "capture_model\n"
           "ERROR 08-01 10:00:05 [core.py:700] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 "
           "MiB. GPU 0 has a total capacity of 23.54 GiB of which 120.00 MiB is free.\n")
    ids = [s["id"] for s in analyze_text(log, "vllm serve m --gpu-memory-utilization 0.97")["suggestions"]]
    assert "shrink-cuda-graphs" in ids[:2] and "reduce-batch" not in ids, ids


def test_sglang_fraction_computed_from_its_avail_mem_lines():
    """rest = avail after weights - avail before x (1 - fraction) (profile_max_num_token): the fraction that leaves
    the pool 1 GiB, not a fixed step that leaves it nothing; and no fp8 KV when the rest is not positive."""
    log = ("[2025-01-10 10:00:00 TP0] Load weight begin. avail mem=23.20 GB\n"
           "[2025-01-10 10:00:20 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=8.12 GB, "
           "mem usage=15.08 GB.\n"
           "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n")
    d = analyze_text(log, "python3 -m sglang.launch_server --model-path m --mem-fraction-static 0.6")
    first = d["suggestions"][0]
    assert first["change"] == {"--mem-fraction-static": 0.7}, first
    assert "quantize-kv-cache" not in [s["id"] for s in d["suggestions"]]


def test_ollama_journal_settings_go_to_the_unit_and_old_servers_get_num_ctx():
    log = ("Jan 28 10:14:55 gpubox systemd[1]: Started ollama.service - Ollama Service.\n"
           "Jan 28 10:14:55 gpubox ollama[2231]: time=2025-01-28T10:14:55.413Z level=INFO source=routes.go:1238 "
           "msg=\"Listening on [::]:11434 (version 0.5.7)\"\n" + KV_FAIL)
    d = analyze_text(log)
    assert all(s["command"].startswith("sudo mkdir -p /etc/systemd/system/ollama.service.d") for s in d["suggestions"]
               if s.get("command")), d["suggestions"]
    ctx = [s for s in d["suggestions"] if s["id"] == "reduce-ctx"]
    assert ctx and "num_ctx" in ctx[0]["change"], ctx


def test_without_flash_attention_the_margin_covers_the_attention_scores():
    """flash_attn = 0: the compute buffer after the KV holds n_kv x n_ubatch x n_head f32 scores and the logits, more
    than the 1 GiB margin at the context that fits; the context is computed with that buffer kept out."""
    log = KV_FAIL.replace("llama_context: n_ctx         = 131072\n",
                          "llama_context: n_ctx         = 131072\nllama_context: flash_attn    = 0\n"
                          "llama_context: n_ubatch      = 512\n") + "print_info: n_vocab          = 128256\n"
    d = analyze_text(log)
    fit = d["memory"]["max_ctx_fit"]["f16"]
    free_left = 15221 - 4403.49
    scores = (fit * 512 * 32 + 512 * 128256) * 4 / 2**20
    assert fit * 128 / 1024 + scores <= free_left, (fit, scores)
    assert any(x["kind"] == "kv_headroom_no_fa" for x in d["findings"])


def test_ollama_refused_layout_gives_the_layers_that_fit():
    log = ('time=2025-10-11T20:54:58.880+02:00 level=INFO source=types.go:112 msg="inference compute" id=GPU-97 '
           'library=CUDA compute=8.6 name=CUDA0 description="NVIDIA GeForce RTX 3080" total="10.0 GiB" '
           'available="9.2 GiB"\n'
           'time=2025-10-11T20:55:04.020+02:00 level=WARN source=server.go:908 msg="memory layout cannot be allocated" '
           'memory.CUDA0.Weights="[' + " ".join(["402653184"] * 26) + ']" memory.CUDA0.Cache="['
           + " ".join(["67108864"] * 26) + ']" memory.CUDA0.Graph=1107296256\n'
           'time=2025-10-11T20:55:04.021+02:00 level=INFO source=sched.go:511 msg="Load failed" model=m '
           'error="memory layout cannot be allocated with num_gpu = 26"\n')
    d = analyze_text(log)
    layers = next(s for s in d["suggestions"] if s["id"] == "reduce-gpu-layers")
    # (9.2 GiB - 1056 MiB graph) / (384 + 64 MiB a layer) = 18.67
    assert layers["change"] == {"num_gpu": 18}, layers


def test_ollama_errnomem_sums_the_failed_entries_and_names_the_whole_kv():
    log = ("panic: insufficient memory - required allocations: {InputWeights:437452800A CPU:{Name:CPU ID: Weights:[0U] "
           "Cache:[0U] Graph:0U} GPUs:[{Name:CUDA0 ID:GPU-0f Weights:[231735296A 231735296A] Cache:[167772160A "
           "167772160A 167772160F 167772160F] Graph:671088640A}]}\n")
    d = analyze_text(log)
    assert (d["failure"]["phase"], d["failure"]["failing_device"]) == ("kv_cache", "CUDA0")
    assert d["failure"]["requested_mib"] == 320.0 and d["memory"]["kv_required_mib"] == 640.0


def test_ollama_on_a_gpu_under_compute_7_gets_no_q8_0_cache():
    log = ('time=2025-01-28T10:14:55.800Z level=INFO source=types.go:131 msg="inference compute" id=GPU-1 '
           'library=cuda variant=v12 compute=6.1 driver=12.4 name="NVIDIA GeForce GTX 1080 Ti" total="11.0 GiB" '
           'available="10.8 GiB"\n' + KV_FAIL)
    assert "quantize-kv-cache" not in [s["id"] for s in analyze_text(log)["suggestions"]]


def test_lmdeploy_turbomind_oom_lowers_the_cache_share_first():
    log = "[TM][ERROR] CUDA runtime error: out of memory /opt/lmdeploy/src/turbomind/utils/allocator.h:231\n"
    d = analyze_text(log, "lmdeploy serve api_server m --session-len 32768 --cache-max-entry-count 0.8")
    assert d["suggestions"][0]["change"] == {"--cache-max-entry-count": 0.5}
    assert "reduce-max-model-len" not in [s["id"] for s in d["suggestions"]]


# --- from the third QA session of 2026-12-02 (llama.cpp's newest builds, other backends, programs on llama.cpp) -------

DRAFT = KV_FAIL.replace("ggml_backend_cuda_buffer_type_alloc_buffer", "srv    load_model: loading draft model "
                        "'/models/draft.gguf'\nggml_backend_cuda_buffer_type_alloc_buffer", 1) \
    + "common_speculative_init: failed to create draft context\nsrv    load_model: failed to create speculator\n"


def test_a_draft_models_failure_gets_the_drafts_own_settings():
    d = analyze_text(DRAFT, "llama-server -m main.gguf -md draft.gguf -c 131072 -ngl 99")
    ids = [s["id"] for s in d["suggestions"]]
    assert ids[:3] == ["reduce-ctx", "quantize-kv-cache", "reduce-gpu-layers"], ids
    assert "--ctx-size-draft" in d["suggestions"][0]["change"] and "--ctx-size-draft" in d["suggestions"][0]["command"]
    assert d["suggestions"][1]["change"]["--cache-type-k-draft"] == "q8_0"
    assert d["suggestions"][2]["change"] == {"--n-gpu-layers-draft": 0}


def test_sycl_free_that_is_the_total_is_not_free():
    log = ("get_memory_info: [warning] ext_intel_free_memory is not supported (export/set ZES_ENABLE_SYSMAN=1 to "
           "support), use total memory as free memory\n"
           + KV_FAIL.replace("CUDA0 (NVIDIA GeForce RTX 4060 Ti) (0000:01:00.0)", "SYCL0 (Intel(R) Arc(TM) A770 "
                             "Graphics)").replace("CUDA0", "SYCL0")
           .replace("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 16384.00 MiB on device 0: cudaMalloc "
                    "failed: out of memory\n", ""))
    d = analyze_text(log)
    assert d["failure"]["backend"] == "sycl" and d["failure"]["free_mib"] is None, d["failure"]
    assert any(x["kind"] == "free_is_total" for x in d["findings"])


def test_the_2024_servers_json_build_line_gives_the_build():
    log = ('INFO [                    main] build info | tid="140225379411776" timestamp=1723110001 build=3549 '
           'commit="b7a08fd5"\n' + KV_FAIL)
    q8 = next(s for s in analyze_text(log, "./llama-server -m m.gguf -c 131072 -ngl 99")["suggestions"]
              if s["id"] == "quantize-kv-cache")
    assert q8["command"].endswith("--flash-attn"), q8["command"]  # a switch before build 6300, no value


def test_llama_cpp_python_server_gets_its_own_option_names():
    d = analyze_text(KV_FAIL, "python3 -m llama_cpp.server --model /m.gguf --n_gpu_layers -1 --n_ctx 131072")
    changes = {k for s in d["suggestions"] for k in s["change"]}
    assert "--n_ctx" in changes and not any(k in changes for k in ("--ctx-size", "--cache-type-k", "--no-kv-offload"))


def test_koboldcpp_gets_no_option_it_lacks():
    d = analyze_text(KV_FAIL, "./koboldcpp-linux-x64 --model m.gguf --contextsize 131072 --gpulayers 99 --usecuda")
    assert not any("--no-kv-offload" in (s.get("command") or "") for s in d["suggestions"])


def test_vllm_prompt_limit_below_the_context_raises_the_batched_tokens():
    log = "WARNING 02-16 15:37:32 scheduler.py:947] Input prompt (2501 tokens) is too long and exceeds limit of 2048\n"
    first = analyze_text(log, "vllm serve m --max-model-len 128000")["suggestions"][0]
    assert first["change"] == {"--max-num-batched-tokens": 2560}, first


def test_a_fit_that_gave_up_ends_its_dry_run_without_its_took_line():
    """Pasted excerpts often lack "fitting params to free memory took N seconds": the real load after the fit's
    "failed to fit params ... abort" still places the weights (free at the failure is known)."""
    log = KV_FAIL.replace("load_tensors:", "common_fit_params: fitting params to device memory ...\n"
                          "common_fit_params: failed to fit params to free device memory: n_gpu_layers already set by "
                          "user to 99, abort\nload_tensors:", 1)
    d = analyze_text(log)
    assert d["failure"]["verdict"] == "exceeds_free" and d["memory"]["max_ctx_fit"]["f16"] == 78336, d["failure"]


MOE_WEIGHTS_FAIL = """print_info: arch                  = qwen3moe
print_info: n_layer               = 48
print_info: n_head                = 32
print_info: n_head_kv             = 4
print_info: n_embd_head_k         = 128
print_info: n_embd_head_v         = 128
print_info: n_embd                = 2048
print_info: n_expert              = 128
print_info: n_expert_used         = 8
ggml_backend_cuda_buffer_type_alloc_buffer: allocating 17408.00 MiB on device 0: cudaMalloc failed: out of memory
alloc_tensor_range: failed to allocate CUDA0 buffer of size 18253611008
llama_model_load: error loading model: unable to allocate CUDA0 buffer
"""


def test_moe_weights_keep_experts_on_the_host_with_n_cpu_moe():
    """A mixture-of-experts model (print_info n_expert > 1) that did not fit: llama.cpp's --n-cpu-moe (b6089+) moves the
    expert weights of the first N layers to host memory and keeps attention and KV on the GPU."""
    d = analyze_text(MOE_WEIGHTS_FAIL, "llama-server -m qwen3-30b-a3b.gguf -ngl 99 -c 8192")
    layers = next(s for s in d["suggestions"] if s["id"] == "reduce-gpu-layers")
    assert "--n-cpu-moe" in layers["change"] and 0 < layers["change"]["--n-cpu-moe"] <= 48
    assert "--n-cpu-moe" in layers["command"] and "-ngl 99" in layers["command"]
    # an older build than b6089 has no such flag: the layer count goes down instead
    old = analyze_text("build: 5000 (abcdef12) with cc\n" + MOE_WEIGHTS_FAIL, "llama-server -m m.gguf -ngl 99")
    assert "--n-gpu-layers" in next(s for s in old["suggestions"] if s["id"] == "reduce-gpu-layers")["change"]
    # a dense model keeps -ngl
    dense = analyze_text(MOE_WEIGHTS_FAIL.replace("n_expert              = 128", "n_expert              = 0"),
                         "llama-server -m m.gguf -ngl 99")
    assert "--n-gpu-layers" in next(s for s in dense["suggestions"] if s["id"] == "reduce-gpu-layers")["change"]


def test_ollama_compute_buffer_with_slots_goes_to_one_slot_first():
    """Ollama's runner context is num_ctx x OLLAMA_NUM_PARALLEL: its compute graph (attention scores) grows with it."""
    log = ("ggml_vulkan: Device memory allocation of size 5553262592 failed.\n"
           "ggml_vulkan: Requested buffer size exceeds device memory allocation limit: ErrorOutOfDeviceMemory\n"
           "ggml_gallocr_reserve_n: failed to allocate Vulkan0 buffer of size 5553262592\n"
           "llama_init_from_model: failed to allocate compute buffers\n"
           "panic: unable to create llama context\n")
    d = analyze_text(log, "OLLAMA_NUM_PARALLEL=4 OLLAMA_CONTEXT_LENGTH=20480 ollama serve")
    assert d["engine"] == "ollama" and d["failure"]["phase"] == "compute_buffer"
    first = d["suggestions"][0]
    assert first["id"] == "reduce-parallel" and first["change"] == {"OLLAMA_NUM_PARALLEL": 1}
    assert "OLLAMA_NUM_PARALLEL=1" in first["command"]
    # the per-allocation work-around speaks Ollama's knob, not llama-server's
    limit = next(s for s in d["suggestions"] if s["id"] == "work-around-alloc-limit")
    assert limit["change"] == {"num_batch": 256}


def test_sglang_oom_at_an_unnamed_step_lowers_the_static_fraction_first():
    """SGLang's troubleshooting page: a smaller --mem-fraction-static helps with OOM in prefill and decoding alike."""
    log = ("HSA_STATUS_ERROR_OUT_OF_RESOURCES: The runtime failed to allocate the necessary resources.\n"
           "Available Free mem: 30 MB\nFatal Python error: Aborted\n")
    d = analyze_text(log, "python3 -m sglang.launch_server --model-path m --tp 8 --mem-fraction-static 0.9")
    assert (d["engine"], d["failure"]["backend"], d["failure"]["free_mib"]) == ("sglang", "rocm", 30.0)
    assert d["suggestions"][0]["id"] == "lower-gpu-memory-utilization"
    assert d["suggestions"][0]["change"]["--mem-fraction-static"] < 0.9
    # without the fraction in the command (SGLang computed its own) the direction is given, not a made-up number
    d = analyze_text(log, "python3 -m sglang.launch_server --model-path m --tp 8")
    assert d["suggestions"][0]["id"] == "lower-gpu-memory-utilization" and d["suggestions"][0]["change"] == {}


def test_an_unknown_engine_gets_the_idea_not_vllm_flags_on_its_command():
    log = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of " \
          "23.64 GiB of which 1.02 GiB is free.\n"
    d = analyze_text(log, "python my_infer.py --batch 8")
    assert d["engine"] == "unknown"
    for s in d["suggestions"]:
        if any(k.startswith("--") for k in s["change"]):
            assert s["command"] is None and "vLLM's name for it" in s["title"]


def test_a_python_engine_on_one_of_several_visible_gpus_splits_the_model_first():
    """CUDA_VISIBLE_DEVICES lists 8 GPUs and vLLM runs the model on one (no --tensor-parallel-size): split it."""
    oom = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 384.00 MiB. GPU 0 has a total capacty of "
           "79.33 GiB of which 351.81 MiB is free.\n")
    d = analyze_text(oom, "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 python -m vllm.entrypoints.openai.api_server --model q")
    assert d["suggestions"][0]["id"] == "more-devices"
    assert d["suggestions"][0]["change"] == {"--tensor-parallel-size": 8}
    # already split over all of them, or one GPU visible: no such suggestion first
    for cmd in ("CUDA_VISIBLE_DEVICES=0,1 vllm serve q --tensor-parallel-size 2", "CUDA_VISIBLE_DEVICES=0 vllm serve q"):
        assert analyze_text(oom, cmd)["suggestions"][0]["id"] != "more-devices", cmd



# KV_FAIL from a build before b6300 (where -fa took no value) that already prints "flash_attn = auto": the log, not
# the build number, says how this build reads -fa
_FA_AUTO_LOG = "build: 6000 (abcdef12) with cc (GCC) 13.2.0 for x86_64-linux-gnu\n" + KV_FAIL.replace(
    "llama_context: kv_unified    = true\n", "llama_context: kv_unified    = true\nllama_context: flash_attn    = auto\n")


def test_flash_attention_keeps_the_value_form_the_build_reads():
    # the log's "flash_attn = auto" and the user's "-fa off" say this build reads -fa with a value, whatever its build
    # number: a bare -fa would swallow the next argument (--cache-type-k) as its value
    d = analyze_text(_FA_AUTO_LOG, "llama-server -m m.gguf -c 131072 -ngl 99 -fa off")
    quant = [s for s in d["suggestions"] if s["id"] == "quantize-kv-cache"]
    assert quant and " -fa on " in quant[0]["command"] + " ", quant
    for s in analyze_text(_FA_AUTO_LOG, "llama-server -m m.gguf -c 131072 -ngl 99")["suggestions"]:
        assert " -fa --" not in (s.get("command") or ""), s


def test_a_summary_with_the_kv_size_and_the_context_gives_the_context_that_fits():
    # "kv=4096 MiB", "4096 MiB needed", "needs 4096 MiB but only 2100 MiB free" with the context typed beside them:
    # the KV per token follows from the two, and the context that fits from the free memory (QA, issue 12 item 4)
    for line in ("llama-server OOMs with -c 32768 on my 3060 12GB, KV cache needs 4096 MiB but only 2100 MiB free",
                 "llama_kv_cache: failed to allocate KV cache: 4096 MiB needed, 2100 MiB free (n_ctx = 32768)",
                 "failed to allocate KV cache (requested ctx=32768, kv=4096 MiB, gpu memory free=2100 MiB)"):
        d = analyze_text(line + "\n")
        assert d["failure"]["requested_mib"] == 4096.0 and d["failure"]["free_mib"] == 2100.0, line
        assert d["memory"]["kv_mib_per_1k_tokens"] == 128.0, line
        assert d["suggestions"][0]["id"] == "reduce-ctx" and 0 < d["memory"]["max_ctx_fit"]["f16"] < 16384, line


def test_the_seed_line_offers_no_q8_0_at_a_context_no_example_shape_fits():
    d = analyze_text("llama-server: failed to allocate KV cache (requested ctx=262144, gpu memory free=1024 MiB)\n",
                     "llama-server -m qwen.gguf -c 262144 -ngl 99")
    ids = [s["id"] for s in d["suggestions"]]
    assert ids[0] == "reduce-ctx" and "quantize-kv-cache" not in ids, ids


def test_a_mixed_cache_pair_is_sized_as_the_pair_in_use():
    # -ctk q8_0 with the default f16 V: the context to lower to is the q8_0/f16 pair's, not the q8_0/q8_0 row's
    log = _FA_AUTO_LOG.replace("allocating 16384.00 MiB", "allocating 12544.00 MiB").replace(
        "buffer of size 17179869184", "buffer of size 13153337344")
    d = analyze_text(log, "llama-server -m m.gguf -c 131072 -ngl 99 -ctk q8_0 -fa on")
    first = d["suggestions"][0]
    fits = d["memory"]["max_ctx_fit"]
    assert first["id"] == "reduce-ctx" and fits["f16"] < first["change"]["--ctx-size"] < fits["q8_0"], (first, fits)


def test_tgi_commands_pass_the_launchers_own_checks():
    # TGI's launcher refuses max_input_tokens >= max_total_tokens and max_batch_prefill_tokens < max_input_tokens: a
    # lowered total or prefill batch lowers --max-input-tokens with it; more GPUs are --num-shard (QA)
    from kvreport.cmdline import parse_command as parse

    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 79.25 "
           "GiB of which 1.02 GiB is free.\n")
    cmd = "text-generation-launcher --model-id m --max-input-tokens 8000 --max-total-tokens 8192 --max-batch-prefill-tokens 8192"
    d = analyze_text(oom, cmd)
    assert d["engine"] == "tgi"
    for s in d["suggestions"]:
        if not s.get("command"):
            continue
        flags = parse(s["command"])["flags"]
        max_in, total, prefill = flags.get("max_input_tokens"), flags.get("max_total_tokens"), flags.get(
            "max_batch_prefill_tokens")
        assert int(max_in) < int(total) and int(prefill) >= int(max_in), s["command"]
    d = analyze_text("failed to allocate KV cache (requested ctx=131072, gpu memory free=0 GiB)\n",
                     "text-generation-launcher --model-id m")
    assert all("--tensor-parallel-size" not in (s.get("command") or "") for s in d["suggestions"])


def test_an_ollama_client_command_is_told_why_its_fix_is_a_server_command():
    # OLLAMA_* settings are the server's: the fix for `ollama run MODEL` restarts `ollama serve` with them and says so,
    # naming the user's own command to run again (QA)
    from tests.paths import CORPUS_DIR

    log = next(CORPUS_DIR.glob("cc-011-*")) / "log.txt"
    d = analyze_text(log.read_text(), "ollama run qwen2.5:14b")
    server = [s for s in d["suggestions"] if (s.get("command") or "").endswith(" ollama serve")]
    assert server and all("`ollama run qwen2.5:14b`" in s["why"] for s in server), server


def test_a_command_ending_in_an_option_without_its_value_gets_no_rewritten_commands():
    # "... -ngl 99 -c": a rewrite would hand -c the next flag as its value; the diagnosis says why there is none (QA)
    d = analyze_text(_FA_AUTO_LOG, "llama-server -m m.gguf -ngl 99 -c")
    assert d["suggestions"] and not any(s.get("command") for s in d["suggestions"])
    assert any(f["kind"] == "command_incomplete" for f in d["findings"])
