"""Parser tests on real lines of every era (kv-facts.md §1-§5 quote them from llama.cpp's source
history and public logs; the case logs under tests/data/cases are real runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvreport.analyze import analyze_text
from kvreport.logs import clean_pasted, is_key_line, parse_log
from kvreport.logs.common import clean_line


def facts(*lines):
    return parse_log(list(lines))


# ---------------------------------------------------------------- framing

@pytest.mark.parametrize("raw", [
    "0.00.038.415 E ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 68719476736",
    "\x1b[31mggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 68719476736\x1b[0m\r\n",
    "> ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 68719476736",
    "> > ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 68719476736",
    "deep-seek-1  | ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 68719476736",
    "ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer \x00of size 68719476736",
    '{"type":"log","time":38415,"level":"error","msg":"ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 68719476736\\n"}',
])
def test_framing_never_hides_a_line(raw):
    f = facts(raw)
    ev = [e for e in f.events if e["kind"] == "backend"]
    assert ev and ev[0]["bytes"] == 68719476736 and ev[0]["device"] == "CPU"


def test_clean_pasted_removes_fences_quotes_ansi_crlf():
    text = "> ```\r\n> \x1b[1mllama_kv_cache: size = 4.00 MiB\x1b[0m\r\n> ```\r\n"
    assert clean_pasted(text).strip() == "llama_kv_cache: size = 4.00 MiB"


def test_clean_line_accepts_bytes_and_garbage():
    assert clean_line(b"\xff\xfeabc\n") .endswith("abc")
    assert clean_line("```text") == ""


def test_two_lines_pasted_onto_one_are_both_read():
    f = facts("E alloc_tensor_range: failed to allocate SYCL_Host buffer of size 33703246400"
              "              E llama_model_load: error loading model: unable to allocate SYCL_Host buffer")
    kinds = [e["kind"] for e in f.events]
    assert "ggml" in kinds and "reason" in kinds


# ---------------------------------------------------------------- hparams

def test_print_info_new_and_old_spellings_give_the_same_keys():
    new = facts("I print_info: n_head_kv             = [0, 0, 4, 0, 0, 4]",
                "print_info: model type            = 7B", "print_info: file type   = Q4_K - Medium")
    old = facts("llm_load_print_meta: n_head_kv        = [0, 0, 4, 0, 0, 4]",
                "llm_load_print_meta: model type       = 7B", "llm_load_print_meta: model ftype      = Q4_K - Medium")
    assert new.hparams == old.hparams == {"n_head_kv": "[0, 0, 4, 0, 0, 4]", "model type": "7B",
                                          "file type": "Q4_K - Medium"}


def test_gguf_kv_lines():
    f = facts("llama_model_loader: - kv  18:             gemma3.attention.head_count_kv u32              = 16")
    assert f.gguf_kv == {"gemma3.attention.head_count_kv": "16"}


# ---------------------------------------------------------------- context

@pytest.mark.parametrize("line,key,value", [
    ("llama_context: n_ctx_seq     = 131072", "n_ctx_seq", "131072"),
    ("llama_context: n_ctx_per_seq = 4096", "n_ctx_seq", "4096"),
    ("llama_new_context_with_model: n_ctx      = 1048576", "n_ctx", "1048576"),
    ("llama_init_from_model: n_ubatch   = 512", "n_ubatch", "512"),
    ("llama_context: flash_attn    = auto", "flash_attn", "auto"),
    ("llama_new_context_with_model: flash_attn = 0", "flash_attn", "0"),
    ("llama_context: kv_unified    = false", "kv_unified", "false"),
    ("W llama_context: n_ctx is not divisible by n_seq_max - rounding down to 65536", "n_ctx", "65536"),
    ("srv    load_model: initializing, n_slots = 4, n_ctx_slot = 2048, kv_unified = 'false'", "n_slots", "4"),
])
def test_context_lines_of_every_era(line, key, value):
    assert facts(line).ctx[key] == value


def test_old_kv_init_line():
    f = facts("llama_kv_cache_init: kv_size = 23552, offload = 1, type_k = 'f16', type_v = 'f16', n_layer = 48, can_shift = 1")
    assert f.ctx["kv_size"] == "23552" and f.ctx["type_k"] == "f16"
    f = facts("init: kv_size = 4096, offload = 1, type_k = 'q8_0', type_v = 'f16', n_layer = 48, can_shift = 1")
    assert f.ctx["type_k"] == "q8_0"


# ---------------------------------------------------------------- KV sizes

@pytest.mark.parametrize("line,mib,cells,nseq,nstream", [
    ("llama_kv_cache: size = 3072.00 MiB (131072 cells,  12 layers,  1/1 seqs), K (f16): 1536.00 MiB, V (f16): 1536.00 MiB",
     3072.0, 131072, 1, 1),
    ("llama_kv_cache_unified: size = 6564.00 MiB ( 70016 cells,  48 layers,  1/ 1 seqs), K (f16): 3282.00 MiB, V (f16): 3282.00 MiB",
     6564.0, 70016, 1, 1),
    ("llama_kv_cache_unified: size =  512.00 MiB (  4096 cells,  32 layers,  2 seqs), K (f16):  256.00 MiB, V (f16):  256.00 MiB",
     512.0, 4096, 2, 1),
    ("llama_kv_cache_unified: size =  256.00 MiB (  2048 cells,  32 layers), K (q8_0):  68.00 MiB, V (f16):  128.00 MiB",
     256.0, 2048, None, 1),
    ("I llama_kv_cache: size =   64.00 MiB (  2048 cells,   8 layers,  4/4 seqs), K (f16):   32.00 MiB, V (f16):   32.00 MiB",
     64.0, 2048, 4, 4),
])
def test_kv_size_lines_of_every_era(line, mib, cells, nseq, nstream):
    k = facts(line).kv_caches[0]
    assert (k["mib"], k["cells"], k["n_seq"], k["n_stream"]) == (mib, cells, nseq, nstream)


def test_old_kv_self_size_and_ik_llama_variant():
    f = facts("llama_new_context_with_model: KV self size  = 5120.00 MiB, K (f16): 2560.00 MiB, V (f16): 2560.00 MiB",
              "llama_new_context_with_model: KV self size  = 1005.79 MiB, c^KV (f16): 1005.79 MiB, kv^T (f16):    0.00 MiB")
    assert [k["mib"] for k in f.kv_caches] == [5120.0, 1005.79]


def test_iswa_sections():
    f = facts("llama_kv_cache_iswa: creating non-SWA KV cache, size = 131072 cells",
              "llama_kv_cache: size = 3072.00 MiB (131072 cells,  12 layers,  1/1 seqs), K (f16): 1536.00 MiB, V (f16): 1536.00 MiB",
              "llama_kv_cache_iswa: creating     SWA KV cache, size = 768 cells",
              "llama_kv_cache: size =   18.00 MiB (   768 cells,  12 layers,  1/1 seqs), K (f16):    9.00 MiB, V (f16):    9.00 MiB")
    assert [(k["section"], k["mib"]) for k in f.kv_caches] == [("non-SWA", 3072.0), ("SWA", 18.0)]


def test_recurrent_lines():
    f = facts("llama_memory_recurrent: size =   19.27 MiB (     1 cells,  24 layers,  1 seqs  0 rs_seq), R (f32):    1.27 MiB, S (f32):   18.00 MiB",
              "llama_memory_recurrent:        CPU RS buffer size =     0.03 MiB")
    assert f.rs_caches[0]["mib"] == 19.27
    assert f.buffers[0]["kind"] == "RS"


@pytest.mark.parametrize("line,dev,kind,mib", [
    ("load_tensors:      Vulkan0 model buffer size =  6637.63 MiB", "Vulkan0", "model", 6637.63),
    ("llama_kv_cache:      CUDA0 KV buffer size =  3072.00 MiB", "CUDA0", "KV", 3072.0),
    ("sched_reserve:      CUDA0 compute buffer size =   300.01 MiB", "CUDA0", "compute", 300.01),
    ("llama_context:  CUDA_Host  output buffer size =     0.49 MiB", "CUDA_Host", "output", 0.49),
    ("llm_load_tensors:      ROCm0 buffer size = 27846.97 MiB", "ROCm0", "model", 27846.97),
])
def test_buffer_lines(line, dev, kind, mib):
    b = facts(line).buffers[0]
    assert (b["device"], b["kind"], b["mib"]) == (dev, kind, mib)


# ---------------------------------------------------------------- devices and versions

@pytest.mark.parametrize("line,name,free", [
    ("llama_prepare_model_devices: using device CUDA0 (NVIDIA GeForce RTX 4060 Ti) (0000:01:00.0) - 15221 MiB free", "CUDA0", 15221),
    ("llama_model_load_from_file_impl: using device CUDA0 (NVIDIA GeForce RTX 4090) - 23820 MiB free", "CUDA0", 23820),
    ("  Vulkan0: NVIDIA GeForce RTX 3080 Ti (12084 MiB, 11316 MiB free)", "Vulkan0", 11316),
    ("I cmn  common_param:   - CPU     : AMD EPYC (24105 MiB, 24105 MiB free)", "CPU", 24105),
])
def test_device_free_lines(line, name, free):
    assert facts(line).devices[name]["free_mib"] == free


def test_cuda_init_names_rocm_devices():
    f = facts("ggml_cuda_init: found 2 ROCm devices:",
              "  Device 0: Radeon RX 7900 XTX, compute capability 11.0, VMM: no",
              "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 27846.97 MiB on device 0: cudaMalloc failed: out of memory")
    assert "ROCm0" in f.devices
    assert f.events[0]["device"] == "ROCm0" and f.events[0]["backend"] == "rocm"


@pytest.mark.parametrize("line,build,commit", [
    ("build: 6895 (4341dc8bc) with cc (GCC) 15.2.1 20250813 for x86_64-pc-linux-gnu", 6895, "4341dc8bc"),
    ("I cmn  common_param: common_params_print_info: build 10108 (0a50d99) with GNU 13.3.0 for Linux x86_64", 10108, "0a50d99"),
    ("version: 2999 (42b4109e)", 2999, "42b4109e"),
])
def test_build_lines(line, build, commit):
    f = facts(line)
    assert (f.build, f.commit, f.engine) == (build, commit, "llama.cpp")


# ---------------------------------------------------------------- auto-fit

def test_fit_lines_and_dry_run_marking():
    f = facts("I cmn  common_init_: fitting params to device memory ...",
              "I common_params_fit_impl: projected to use 65731 MiB of host memory vs. 24105 MiB of total host memory",
              "I llama_kv_cache: size = 65536.00 MiB (131072 cells,  32 layers,  4/1 seqs), K (f16): 32768.00 MiB, V (f16): 32768.00 MiB",
              "I common_params_fit_impl: context size reduced from 131072 to 63232 -> need 596 MiB less memory in total",
              "I common_fit_params: fitting params to free memory took 0.01 seconds",
              "I llama_kv_cache: size =  494.00 MiB ( 63232 cells,   8 layers,  4/1 seqs), K (f16):  247.00 MiB, V (f16):  247.00 MiB")
    assert f.fit["changed"]["n_ctx"] == [131072, 63232]
    assert f.fit["free_mib"] == 24105 and f.fit["memory"] == "host"
    assert [k["dry_run"] for k in f.kv_caches] == [True, False]



# every auto-fit line a parser reads, in the spellings of each era (kv-facts.md §3): b7407..b8864 prefix
# llama_params_fit(_impl), b8865+ common_fit_params / common_params_fit_impl
_FIT_ERA_LINES = {
    "new": ["I cmn  common_init_: fitting params to device memory ...",
            "I common_params_fit_impl: projected to use 9226 MiB of device memory vs. 11312 MiB of free device memory",
            "I common_params_fit_impl:   - CUDA0:  24000 total,  20000 used,   3000 free vs. target of   1024",
            "I common_params_fit_impl: context size reduced from 131072 to 63232 -> need 596 MiB less memory in total",
            "I common_params_fit_impl:   - CUDA0: 30 layers ( 2 overflowing),  20000 MiB used,   3000 MiB free",
            "I common_fit_params: successfully fit params to free device memory",
            "I common_fit_params: fitting params to free memory took 0.01 seconds"],
    "old": ["llama_params_fit: fitting params to device memory, for bugs during this step try to reproduce them with -fit off",
            "llama_params_fit_impl: projected to use 9226 MiB of device memory vs. 11312 MiB of free device memory",
            "llama_params_fit_impl:   - CUDA0:  24000 total,  20000 used,   3000 free vs. target of   1024",
            "llama_params_fit_impl: context size reduced from 131072 to 63232 -> need 596 MiB less memory in total",
            "llama_params_fit_impl:   - CUDA0: 30 layers ( 2 overflowing),  20000 MiB used,   3000 MiB free",
            "llama_params_fit: successfully fit params to free device memory",
            "llama_params_fit: fitting params to free memory took 0.01 seconds"],
}


@pytest.mark.parametrize("era", sorted(_FIT_ERA_LINES))
def test_every_fit_line_is_a_key_line_and_a_finished_fit_is_fitted(era):
    lines = _FIT_ERA_LINES[era]
    assert all(is_key_line(x) for x in lines), [x for x in lines if not is_key_line(x)]
    f = facts(*lines)
    assert f.fit["status"] == "fitted" and f.fit["changed"]["n_ctx"] == [131072, 63232]
    assert f.fit["layers"]["CUDA0"] == {"layers": 30, "overflowing": 2}
    assert f.fit["devices"]["CUDA0"]["target_mib"] == 1024
    assert f.fit["projected_mib"] == 9226 and not f.in_fit


def test_fit_without_changes_stays_no_change_after_success():
    f = facts("I common_params_fit_impl: projected to use 9226 MiB of device memory vs. 11312 MiB of free device memory",
              "I common_params_fit_impl: will leave 2086 >= 1024 MiB of free device memory, no changes needed",
              "I common_fit_params: successfully fit params to free device memory")
    assert f.fit["status"] == "no_change"


def test_failed_fit_status():
    f = facts("I cmn  common_init_: fitting params to device memory ...",
              "W common_fit_params: failed to fit params to free device memory: n_gpu_layers already set by user to 99, abort",
              "I common_fit_params: fitting params to free memory took 0.01 seconds")
    assert f.fit["status"].startswith("failed: n_gpu_layers already set by user")


# ---------------------------------------------------------------- failure chains

@pytest.mark.parametrize("line,backend,mib", [
    ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 1536.00 MiB on device 0: cudaMalloc failed: out of memory", "cuda", 1536.0),
    ("ggml_vulkan: Device memory allocation of size 2166360064 failed.", "vulkan", 2066.0),
    ("ggml_metal_buffer_init: error: failed to allocate buffer, size =  4096.00 MiB", "metal", 4096.0),
    ("ggml_backend_sycl_buffer_type_alloc_buffer: can't allocate 3221225472 Bytes of memory on device", "sycl", 3072.0),
    ("ggml_aligned_malloc: insufficient memory (attempted to allocate 65536.00 MB)", "cpu", 65536.0),
])
def test_backend_allocator_lines(line, backend, mib):
    ev = facts(line).events[0]
    assert ev["kind"] == "backend" and ev["backend"] == backend and ev["mib"] == pytest.approx(mib, rel=1e-3)


def test_vulkan_limit_line():
    f = facts("ggml_vulkan: Device memory allocation of size 4757131264 failed.",
              "ggml_vulkan: Requested buffer size exceeds device memory allocation limit: ErrorOutOfDeviceMemory")
    assert f.events[1]["limit"] is True


@pytest.mark.parametrize("line,phase", [
    ("llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache", "kv_cache"),
    ("llama_kv_cache_init: failed to allocate buffer for kv cache", "kv_cache"),
    ("llama_init_from_model: failed to initialize the context: failed to initialize self-attention cache", "kv_cache"),
    ("llama_init_from_model: failed to initialize the context: failed to allocate compute pp buffers", "compute_buffer"),
    ("llama_new_context_with_model: failed to allocate compute buffers", "compute_buffer"),
    ("llama_model_load: error loading model: unable to allocate CUDA0 buffer", "model_weights"),
    ("llama_model_load: error loading model: unable to allocate backend buffer", "model_weights"),
])
def test_reason_lines(line, phase):
    ev = [e for e in facts(line).events if e["kind"] == "reason"]
    assert ev and ev[0]["phase"] == phase


def test_pinned_and_retry_lines():
    f = facts("ggml_cuda_host_malloc: failed to allocate 2428.11 MiB of pinned memory: resource already mapped",
              "llama_context: compute buffer allocation failed, retrying without pipeline parallelism")
    assert [e["kind"] for e in f.events] == ["pinned", "retry"]


# ---------------------------------------------------------------- other engines

def test_ollama_eras():
    f = facts('time=2024-06-01T10:00:00.000Z level=INFO source=memory.go:133 msg="offload to cuda" layers.requested=-1 '
              'layers.model=33 memory.available="[23.3 GiB]" memory.required.full="5.6 GiB" memory.required.kv="1.0 GiB"',
              'time=2025-09-01T10:00:00.000Z level=INFO source=device.go:1 msg="kv cache" device=CUDA0 size="1.0 GiB"',
              'time=2025-09-01T10:00:00.000Z level=INFO source=types.go:1 msg="inference compute" id=GPU-1 library=cuda '
              'name=CUDA0 description="NVIDIA GeForce RTX 4090" total="23.6 GiB" available="22.1 GiB"')
    assert f.engine == "ollama"
    assert f.ollama["kv_estimate_mib"] == 1024.0
    assert f.ollama["layout"][0] == {"what": "kv cache", "device": "CUDA0", "mib": 1024.0}
    assert f.devices["CUDA0"]["free_mib"] == pytest.approx(22.1 * 1024)


def test_ollama_word_in_a_path_is_not_ollama():
    f = facts("llama_load_model_from_file: failed to load model '../../ollama_gguf/gguf/command-r-plus.gguf'")
    assert f.engine == "llama.cpp"


def test_vllm_lines():
    f = facts("INFO 05-01 [gpu_worker.py:276] Available KV cache memory: 12.5 GiB",
              "INFO 05-01 [kv_cache_utils.py:1] GPU KV cache size: 102,400 tokens",
              "INFO Maximum concurrency for 32,768 tokens per request: 3.12x")
    assert f.engine == "vllm"
    assert f.vllm["available_kv_mib"] == 12800.0 and f.vllm["pool_tokens"] == 102400
    assert f.vllm["max_model_len"] == 32768


def test_sglang_lines():
    f = facts("[2025-01-01 10:00:00 TP0] KV Cache is allocated. #tokens: 500000, K size: 10.00 GB, V size: 10.00 GB",
              "[2025-01-01 10:00:00 TP0] max_total_num_tokens=500000, chunked_prefill_size=8192, max_prefill_tokens=16384, "
              "max_running_requests=128, context_len=32768, available_gpu_mem=5.00 GB")
    assert f.engine == "sglang" and f.sglang["kv_mib"] == 20480.0 and f.sglang["context_len"] == 32768


def test_tgi_lines():
    f = facts("2024-04-19T11:06:25Z ERROR text_generation_launcher: Method Warmup encountered an error.",
              "2024-04-19T11:06:25Z INFO text_generation_router: Setting max batch total tokens to 16000")
    assert f.engine == "tgi" and f.tgi["warmup_failed"] and f.tgi["max_batch_total_tokens"] == 16000


def test_is_key_line_keeps_what_parsers_use_and_drops_noise():
    assert is_key_line("llama_kv_cache: size = 4.00 MiB (4096 cells, 4 layers, 4/1 seqs), K (f16): 2 MiB, V (f16): 2 MiB")
    assert is_key_line("Available KV cache memory: -2.14 GiB")
    assert not is_key_line("slot update_slots: id  0 | task 5 | prompt processing progress, n_past = 10")
    assert not is_key_line(".......................")


def test_parse_file_grep_and_python_paths_agree_with_parse_log():
    from kvreport.logs import parse_file
    from tests.paths import case_dirs

    for case in case_dirs():
        p = case / "log.txt"
        whole = parse_log(p.read_bytes().decode("utf-8", "replace").splitlines())
        for use_grep in (True, False):
            got = parse_file(p, use_grep=use_grep)
            assert got.events == whole.events, (case.name, use_grep)
            assert got.hparams == whole.hparams and got.kv_caches == whole.kv_caches
            assert got.line_count == whole.line_count


def test_parse_file_in_parallel_ranges_keeps_order_and_line_numbers(tmp_path):
    """The grep prefilter cut into byte ranges (one grep per range) gives exactly parse_log's facts."""
    from kvreport.logs import parse_file
    from tests.paths import case_dirs

    blob = b"".join((c / "log.txt").read_bytes().rstrip(b"\n") + b"\n" for c in case_dirs()[:12])
    for tail in (b"", b"no newline at the end"):
        p = tmp_path / "big.log"
        p.write_bytes(blob + tail)
        whole = parse_log(p.read_bytes().decode("utf-8", "replace").splitlines())
        for workers in (1, 2, 3, 7):
            got = parse_file(p, workers=workers)
            assert got.events == whole.events and got.kv_caches == whole.kv_caches, workers
            assert got.hparams == whole.hparams and got.line_count == whole.line_count, workers


# ---- lines of public reports added with tests/data/cases/pub-1xx (sources in each case.json)

def test_old_sycl_message_glued_to_the_next_line_is_split():
    """llama.cpp#10421: the old SYCL allocator message has no newline; the gallocr line follows on the same line."""
    f = parse_log([
        "ggml_backend_sycl_buffer_type_alloc_buffer: can't malloc 3278637056 Bytes memory on device"
        "ggml_gallocr_reserve_n: failed to allocate SYCL0 buffer of size 7573604352",
        "llama_new_context_with_model: failed to allocate compute buffers"])
    kinds = [(e["kind"], e.get("backend"), e.get("device")) for e in f.events]
    assert ("backend", "sycl", None) in kinds and ("ggml", None, "SYCL0") in kinds
    d = analyze_text("\n".join(["ggml_backend_sycl_buffer_type_alloc_buffer: can't malloc 3278637056 Bytes memory on "
                                "deviceggml_gallocr_reserve_n: failed to allocate SYCL0 buffer of size 7573604352",
                                "llama_new_context_with_model: failed to allocate compute buffers"]))
    assert d["failure"]["allocator_error"].startswith("ggml_backend_sycl_buffer_type_alloc_buffer: can't malloc")


def test_openvino_max_alloc_exception_after_context_failure():
    """llama.cpp#29087: the OpenVINO exception text follows 'failed to initialize the context: Exception from'."""
    d = analyze_text(
        "0.05.416.282 E llama_init_from_model: failed to initialize the context: Exception from src/inference/src/cpp/"
        "remote_context.cpp:73:\n"
        "Check '!exceed_allocatable_mem_size' failed at src/plugins/intel_gpu/src/runtime/engine.cpp:324:\n"
        "[GPU] Exceeded max size of memory object allocation: requested 7516192768 bytes, but max alloc size supported "
        "by device is 4294959104 bytes. Please try to reduce batch size, use lower precision, or set "
        "ov::intel_gpu::hint::enable_large_allocations config property to true.\n")
    f = d["failure"]
    assert (f["phase"], f["backend"], f["requested_mib"], f["verdict"]) == \
        ("context", "openvino", 7168.0, "exceeds_alloc_limit")
    assert f["allocator_error"].startswith("[GPU] Exceeded max size")


def test_metal_message_as_ollama_forwards_it():
    """ollama#11733: Ollama strips the function name: 'error:failed to allocate buffer, size = N MiB'."""
    d = analyze_text("Error: 500 Internal Server Error: llama runner process has terminated: error:failed to allocate "
                     "buffer, size = 33074.89 MiB\n"
                     "ggml_gallocr_reserve_n: failed to allocate Metal buffer of size 34681522080\n")
    f = d["failure"]
    assert (d["engine"], f["phase"], f["backend"], f["failing_device"]) == ("ollama", "compute_buffer", "metal", "Metal")
    assert "failed to allocate buffer, size = 33074.89 MiB" in f["allocator_error"]


def test_vllm_gate_names_the_torch_device():
    d = analyze_text("(EngineCore pid=79) ValueError: Free memory on device cuda:0 (22.76/24.0 GiB) on startup is less "
                     "than desired GPU memory utilization (0.97, 23.28 GiB). Decrease GPU memory utilization\n")
    f = d["failure"]
    assert (f["phase"], f["backend"], f["failing_device"], f["verdict"]) == \
        ("memory_budget", "cuda", "CUDA0", "exceeds_free")
    assert f["free_mib"] == pytest.approx(22.76 * 1024)


def test_vllm_raise_source_line_is_not_the_error_and_empty_pool_raises_utilization():
    f = parse_log(['vllm-1  | ERROR 11-18 18:07:28 engine.py:366]     raise ValueError("No available memory for the '
                   'cache blocks. "'])
    assert not f.events
    d = analyze_text("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                     "when initializing the engine.\n")
    assert d["failure"]["phase"] == "kv_capacity"
    assert d["suggestions"][0]["id"] == "raise-gpu-memory-utilization"


def test_tgi_prefill_failure_names_no_backend_and_halves_the_printed_tokens():
    d = analyze_text("RuntimeError: Not enough memory to handle 4096 prefill tokens. You need to decrease "
                     "`--max-batch-prefill-tokens`\n"
                     "2023-09-26T21:48:00.969072Z ERROR text_generation_launcher: Method Warmup encountered an error.\n")
    assert (d["engine"], d["failure"]["phase"], d["failure"]["backend"]) == ("tgi", "compute_buffer", "unknown")
    # (with --max-input-tokens beside it: TGI's launcher refuses a prefill batch below the longest prompt, whose default
    # comes from the model's positions)
    assert d["suggestions"][0]["change"] == {"--max-batch-prefill-tokens": 2048, "--max-input-tokens": 2048}


def test_ollama_layout_line_alone_is_ollama_and_names_the_layer_count():
    d = analyze_text("memory layout cannot be allocated with num_gpu = 26\n")
    assert (d["engine"], d["failure"]["phase"]) == ("ollama", "context")
    assert d["suggestions"][0]["id"] == "reduce-gpu-layers" and d["suggestions"][0]["change"] == {"num_gpu": 19}


def test_ollama_runner_error_with_escaped_newline_keeps_the_allocator_chain():
    d = analyze_text('time=2025-04-29T12:31:28.521+02:00 level=ERROR source=sched.go:457 msg="error loading llama '
                     'server" error="llama runner process has terminated: cudaMalloc failed: out of memory\\n'
                     'ggml_gallocr_reserve_n: failed to allocate CUDA0 buffer of size 838447104"\n')
    f = d["failure"]
    assert (d["engine"], f["phase"], f["failing_device"], f["requested_mib"]) == \
        ("ollama", "compute_buffer", "CUDA0", 799.61)


def _lines_parsers_used(text: str) -> set[int]:
    """Line numbers (1-based) whose feeding changed the facts (a parser read something from them), with the
    engine_hints counters and key_line_count left out."""
    import pickle

    from kvreport.logs import LogFacts, _feed_one

    def snap(f):
        d = dict(f.__dict__)
        d.pop("key_line_count", None)
        d.pop("engine_hints", None)
        return pickle.dumps(d)

    f = LogFacts()
    used = set()
    for n, raw in enumerate(text.split("\n"), 1):  # numbered as grep numbers lines (\n only)
        before = snap(f)
        _feed_one(f, raw, n)
        if snap(f) != before:
            used.add(n)
    return used


def test_every_line_a_parser_used_in_the_real_corpus_passes_the_grep_prefilter():
    """Each line of the real case logs that changed the facts is selected by the grep prefilter in both modes
    (``-E`` alternation and ``-F -f`` literals), and both modes select the same lines."""
    import os
    import shutil
    import subprocess
    import tempfile

    from kvreport.logs import KEYWORDS, grep_ere
    from tests.paths import case_dirs

    grep = shutil.which("grep")
    if grep is None:
        pytest.skip("no grep")
    with tempfile.TemporaryDirectory() as tmp:
        ere = os.path.join(tmp, "kw.ere")
        lit = os.path.join(tmp, "kw.txt")
        with open(ere, "w") as fh:
            fh.write(grep_ere() + "\n")
        with open(lit, "w") as fh:
            fh.write("\n".join(KEYWORDS))
        env = {**os.environ, "LC_ALL": "C"}
        n_used = 0
        for case in case_dirs():
            data = (case / "log.txt").read_bytes()
            sel = {}
            for mode, path in (("-E", ere), ("-F", lit)):
                out = subprocess.run([grep, "-a", "-n", mode, "-f", path], input=data, capture_output=True, env=env,
                                     check=False).stdout
                sel[mode] = {int(x.split(b":", 1)[0]) for x in out.splitlines() if x.split(b":", 1)[0].isdigit()}
            assert sel["-E"] == sel["-F"], case.name
            used = _lines_parsers_used(data.decode("utf-8", "replace"))
            n_used += len(used)
            assert used <= sel["-E"], (case.name, sorted(used - sel["-E"])[:5])
        assert n_used > 1000


def test_a_pinned_refusal_that_names_its_fallback_is_recovered_and_names_the_backend():
    d = analyze_text("0.05.025.382 W ggml_cuda_moe_cached_pinned_malloc: failed to allocate 24000.00 MiB of pinned "
                     "memory: out of memory; using pageable cached fallback\n")
    assert d["failure"]["phase"] == "none" and d["failure"]["backend"] == "cuda"
    assert any(x["kind"] == "recovered_allocation" for x in d["findings"])
    # the same refusal without a word of fallback, as the log's last line, is not known to have recovered
    d = analyze_text("ggml_cuda_host_malloc: failed to allocate 24000.00 MiB of pinned memory: out of memory\n")
    assert d["failure"]["phase"] != "none"


def test_system_info_without_blas_is_a_cpu_build():
    line = ("system_info: n_threads = 8 / 16 | AVX = 1 | AVX2 = 1 | AVX512 = 0 | FMA = 1 | NEON = 0 | ARM_FMA = 0 | "
            "F16C = 1 | FP16_VA = 0 | WASM_SIMD = 0 | BLAS = {} | SSE3 = 1 | VSX = 0 | \n"
            "llama_generate: error: prompt is too long (2249 tokens, max 1996)\n")
    assert analyze_text(line.format(0))["failure"]["backend"] == "cpu"
    assert analyze_text(line.format(1))["failure"]["backend"] == "unknown"  # (cuBLAS, CLBlast, Accelerate...)


def test_ollama_offload_line_names_the_library():
    d = analyze_text('time=2025-02-18T02:29:51.627Z level=INFO source=server.go:130 msg=offload library=cuda '
                     'layers.requested=-1 layers.model=81 layers.offload=44 memory.available="[22.0 GiB]"\n')
    assert (d["engine"], d["failure"]["phase"], d["failure"]["backend"]) == ("ollama", "none", "cuda")


def test_crash_words_of_ggml_glibc_and_go_are_crashes():
    for line in ("llama.cpp\\ggml\\src\\ggml-backend.cpp:941: pre-allocated tensor (cache_k_l0) in a buffer (Vulkan1) "
                 "that cannot run the operation (NONE)",
                 "double free or corruption (out)", "free(): invalid pointer",
                 "Error: 500 Internal Server Error: llama runner process has terminated: error:fault",
                 "Error: llama runner process has terminated: exit status 0xc000001d"):
        d = analyze_text(line + "\n")
        assert d["failure"]["phase"] == "unknown", line
        assert [s["id"] for s in d["suggestions"]] == ["bisect-regression"], line


def test_ollama_escaped_newlines_in_an_error_attribute_are_lines():
    line = ('time=2024-11-30T09:22:41.377Z level=ERROR source=sched.go:455 msg="error loading llama server" '
            'error="llama runner process no longer running: -1 CUDA error: out of memory\\n  current device: 0, in '
            'function alloc at /go/src/github.com/ollama/ollama/llama/ggml-cuda.cu:375\\n  cuMemCreate(&handle, '
            'reserve_size, &prop, 0)"\n')
    f = analyze_text(line)["failure"]
    assert (f["phase"], f["backend"], f["failing_device"]) == ("compute_buffer", "cuda", "CUDA0")


def test_a_memory_error_that_names_its_own_way_out_is_a_warning():
    ok = analyze_text("llama_context:      SYCL0 compute buffer size =   560.00 MiB\n"
                      "reorder_qw_q4_0: failed to allocate 268435456 bytes for reorder temp buffer, skipping reorder\n")
    assert ok["failure"]["phase"] == "none"


def test_an_allocation_refused_while_serving_is_the_compute_scratch():
    d = analyze_text("llama_new_context_with_model: kv self size  = 4096.00 MB\nall slots are idle and system prompt is "
                     "empty, clear the KV cache\nslot 0 is processing [task id: 0]\n"
                     "CUDA error 2 at /home/user/llama.cpp/ggml-cuda.cu:7183: out of memory\ncurrent device: 0\n")
    assert d["failure"]["phase"] == "compute_buffer"


def test_a_pinned_refusal_is_the_backend_that_printed_it():
    for line, backend in (("ggml_cann_host_malloc: failed to allocate 2048.00 MiB of pinned memory: EL0004", "cann"),
                          ("WARNING: failed to allocate 1024.00 MB of pinned memory: syclGetErrorString is not supported",
                           "sycl")):
        d = analyze_text(line + "\nload_tensors: offloaded 33/33 layers to GPU\n")
        assert (d["failure"]["phase"], d["failure"]["backend"]) == ("none", backend), line


def test_a_prompt_that_quotes_an_oom_is_no_failure_and_never_kept():
    """llama-server at -lv 4 logs each request's body: a user asking about a CUDA OOM is neither the server's failure
    nor a key line (the prompt must not reach a bundle's excerpt or its error line)."""
    body = ('srv  log_server_r: request:  {"messages":[{"role":"user","content":"My job says: RuntimeError: CUDA out '
            'of memory. Tried to allocate 2.00 GiB; also cudaMalloc failed: out of memory"}]}')
    log = "main: server is listening on http://127.0.0.1:8080 - starting the main loop\n" + body + "\n"
    assert analyze_text(log)["failure"]["phase"] == "none"
    assert not is_key_line(body)
    assert not is_key_line("INFO 01-01 00:00:00 [logger.py:43] Received request chatcmpl-1: prompt: 'out of memory?'")


def test_a_log_of_carriage_returns_is_read_without_re2_noise():
    """A log whose lines end in CR alone (an old Mac editor, a progress bar) reaches the keyword search as a few very
    long lines: RE2 must not run out of DFA memory and write its own errors into the user's terminal."""
    import subprocess
    import sys

    cases = Path(__file__).parent / "data" / "cases"
    src = next(p for p in sorted(cases.glob("loc-*/log.txt")) if "failed to allocate" in p.read_text())
    text = src.read_text().replace("\n", "\r") * 20
    run = subprocess.run([sys.executable, "-m", "kvreport.cli", "analyze", "-"], input=text, capture_output=True,
                         text=True, timeout=120)
    assert "re2.cc" not in run.stderr and "DFA out of memory" not in run.stderr, run.stderr[:500]
