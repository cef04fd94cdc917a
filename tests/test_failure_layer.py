"""The failure layer (kvreport.logs.oom): memory-error lines of every runtime make a failure, never "no failure".

Each rule of the table has a real line of its format (from the public reports named beside it) and must read it;
the typed summary line of issue 12 reads as a KV-cache failure with reduce-ctx first, with and without the model.
"""

from __future__ import annotations

import re

import pytest

from kvreport.analyze import analyze_text
from kvreport.logs import is_key_line, parse_log
from kvreport.logs.oom import FATAL, RULES
from tests.paths import CASE_DIR, CORPUS_DIR
from tests.tinygguf import dense

# (rule id, a line of that format as real reports print it, backend, phase placed by the line alone)
EXAMPLES = [
    ("ggml-cuda-error", "CUDA error 2 at /data/llama.cpp/ggml-cuda.cu:5509: out of memory", "cuda", "unknown"),
    ("ggml-cuda-error", "CUDA error: out of memory", "cuda", "unknown"),
    ("ggml-cuda-error", "ROCm error: out of memory", "rocm", "unknown"),
    ("cuda-malloc-oom", "cudaMalloc failed: out of memory", "cuda", "unknown"),
    ("ggml-cuda-error-tail", "2023/11/22 11:37:21 llama.go:430: 2 at /go/src/github.com/jmorganca/ollama/llm/llama.cpp/"
                             "gguf/ggml-cuda.cu:7358: out of memory", "cuda", "unknown"),
    ("need-have", "262,144 | x | - | KV cache OOM (need 8.33 GiB, only 8.29 GiB) |", None, "kv_cache"),
    ("need-have", "vllm: not enough GPU memory for KV cache: need 20 GiB, have 10 GiB", None, "kv_cache"),
    ("metal-buffer-max", "ggml_metal_add_buffer: buffer data size 18300780544 is larger than buffer maximum of "
                         "17179869184", "metal", "model_weights"),
    # ggml-opencl.cpp CL_CHECK as koboldcpp/llama.cpp 2023 CLBlast builds print it (error -5 CL_OUT_OF_RESOURCES)
    ("opencl-check", "ggml_opencl: (mem = clCreateBuffer(context, CL_MEM_READ_WRITE, size, NULL, &err), err) error -5 "
                     "at ggml-opencl.cpp:1312", "opencl", "unknown"),
    ("opencl-check", "ggml_opencl: clEnqueueNDRangeKernel(queue, kernel, 1, NULL, &global, NULL, 0, NULL, NULL) "
                     "error -4 at ggml-opencl.cpp:1780", "opencl", "unknown"),
    # Metal API validation (Xcode debug device)
    ("metal-validation-length", "newBufferWith*:length 0x86004000 must not exceed 2048 MB.", "metal", "unknown"),
    # ggml-alloc.c (2023) graph allocator's free-block table
    ("ggml-alloc-free-blocks", 'GGML_ASSERT: ggml-alloc.c:216: alloc->n_free_blocks < MAX_FREE_BLOCKS && "out of free '
                               'blocks"', None, "compute_buffer"),
    ("kv-slot-ollama", 'time=2024-11-02T10:00:00.000Z level=ERROR source=runner.go:300 msg="failed to decode batch" '
                       'error="could not find a kv cache slot"', None, "kv_capacity"),
    ("node-llama-cpp-estimate", "Error: InsufficientMemoryError: A context size of 4096 with 4 sequences is too large "
                                "for the available VRAM", None, "memory_budget"),
    ("flashinfer-workspace", "RuntimeError: Error in function 'aligned_alloc' at /workspace/include/flashinfer/allocator"
                             ".h:49: Buffer overflow when allocating memory for batch_prefill_tmp_v with size 536346624 "
                             "and alignment 16, but only 413138944 bytes available in AlignedAllocator. Increase the "
                             "workspace buffer size.", "cuda", "compute_buffer"),
    ("vllm-metal-kv-budget", "ValueError: Paged attention: not enough Metal memory for KV cache. metal_limit=19.07GB, "
                             "fraction=0.92, usable_metal=17.54GB, model_memory=16.38GB, overhead=1.30GB, "
                             "kv_budget=-0.13GB.", "metal", "memory_budget"),
    ("vllm-sampler-warmup", "RuntimeError: CUDA out of memory occurred when warming up sampler with 256 dummy requests. "
                            "Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the "
                            "engine.", "cuda", "compute_buffer"),
    ("lmdeploy-session-len", "2024-08-27 01:34:56,929 - lmdeploy - ERROR - run out of tokens. session_id=0.", None,
     "unknown"),
    ("lmstudio-load-failed", '"title": "Failed to load model",', None, "unknown"),
    ("radv-alloc", "radv/amdgpu: Failed to allocate a buffer:", "vulkan", "unknown"),
    ("hsa-out-of-resources", "HSA_STATUS_ERROR_OUT_OF_RESOURCES: The runtime failed to allocate the necessary "
                             "resources.", "rocm", "unknown"),
    ("cuda-api-oom", "[torch_memory_saver.cpp] cuMemCreate CUDA_ERROR_OUT_OF_MEMORY (may not be an issue e.g. torch "
                     "allocator will free cache and retry)", "cuda", "unknown"),
    ("cuda-api-oom", "[torch_memory_saver.cpp] cudaError error: 2 (out of memory)  file=csrc/core.cpp func=resume "
                     "line=172", "cuda", "unknown"),
    ("xla-resource-exhausted", "RuntimeError: Bad StatusOr access: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. "
                               "Ran out of memory in memory space smem.", None, "unknown"),
    # the net, in any capitalisation (tt-metal's TT_FATAL "Out of Memory"), and an allocation that names its buffer
    # (QNN ExecuTorch's "Could not allocate persistent weights buffer!")
    ("memory-words", "TT_FATAL: Out of Memory while placing the buffer", None, "unknown"),
    ("memory-words", "[ERROR] [Runtime]:  <E> Could not allocate the weights buffer!", None, "model_weights"),
    ("memory-words", "couldn't allocate memory for the KV cache", None, "kv_cache"),
    # the formats the corpus's net used to catch, each read by a rule of its own now (rounds 13-20)
    ("cublas-alloc-failed", "Error: llama runner process has terminated: CUDA error: the resource allocation failed",
     "cuda", "unknown"),
    ("tensorrt-oom", "[12/29/2023-05:24:11] [TRT] [E] 2: [virtualMemoryBuffer.cpp::resizePhysical::140] Error Code 2: "
                     "OutOfMemory (no further information)", "cuda", "unknown"),
    ("tensorrt-oom", "[TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMallocAsync(ptr, n, mCudaStream->get()): out of "
                     "memory (/app/tensorrt_llm/cpp/tensorrt_llm/runtime/tllmBuffers.h:112)", "cuda", "unknown"),
    ("rknn-npu-malloc", "E RKNN: [19:58:54.142] failed to malloc npu memory, size: 4022861824, flags: 0x2", None,
     "unknown"),
    ("hami-core-oom", "[HAMI-core ERROR (pid:1 thread=140160828682240 allocator.c:53)]: Device 0 OOM 25769803776 / "
                      "24146608128", "cuda", "unknown"),
    ("exo-placement", '"message": "No cycles found with sufficient memory",', None, "memory_budget"),
    ("ds4-model-arena", "ds4: ROCm model arena alloc failed for tensor-span:128 (1792.00 MiB chunk): out of memory",
     None, "model_weights"),
    ("ds4-device-alloc", "ds4: CUDA q8 fp16 cache alloc failed (64.00 MiB): out of memory", None, "unknown"),
    ("vllm-rs-kvcache", "ERROR vllm_rs::utils::kvcache_allocator: KVCache allocation failed: Insufficient GPU memory "
                        "for KVCache allocation.", None, "kv_cache"),
    ("ollama-startup-oom", "Streamed agent error: llama-server reported out-of-memory during startup", None, "unknown"),
    ("warmup-oom", "[llm] [ERROR] [logging.py-348] : Warmup failed, because of multimodal model inference out of "
                   "memory when `maxInputTokenLen` set to 8192.", None, "compute_buffer"),
    ("oom-while-allocating", "eighth draft pool: CUDA OOM while allocating 5.16 GiB", None, "unknown"),
    ("memory-object", "could not create a memory object", None, "unknown"),
    ("vllm-cumem-allocator", "(LLMRayActor pid=347860) CUDA Error: out of memory at /workspace/csrc/cumem_allocator."
                             "cpp:62", "cuda", "unknown"),
    ("qnn-weights-buffer", "[ERROR] [Qnn ExecuTorch]:  <E> Could not allocate persistent weights buffer!", None,
     "model_weights"),
    ("kgsl-gpuobj-alloc", "W Adreno-GSL: <gsl_ldd_control:549>: ioctl fd 58 code 0xc0300945 (IOCTL_KGSL_GPUOBJ_ALLOC) "
                          "failed: errno 12 Out of memory", None, "unknown"),
    ("tt-metal-dram", "TT_FATAL: Out of Memory: Not enough space to allocate 1879048192 B DRAM buffer across 8 banks,",
     None, "unknown"),
    ("app-fit-refusal", "Failed to load model: About 10 GB of this model does not fit in GPU memory and would run from "
                        "system RAM. Only about 10 GB is available", None, "memory_budget"),
    ("kv-pages-over-memory", "AssertionError: Not enough memory for KV cache, try reducing --num-pages", None,
     "kv_capacity"),
    ("openvino-usm-alloc", "[CL ext] Can not allocate 16049884928 bytes for USM Device. ptr: 0000000000000000, error: 0",
     "openvino", "unknown"),
    # Habana's PT bridge (tgi-gaudi#216); llama.h's KV-slot text as Ollama 0.4 relays it (ollama#7545); on-device
    # runtimes refusing a request over their KV cache (torchchat#1395, flutter_gemma#62)
    ("habana-pt-devmem", "[Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::1073741824 (1024)MB",
     None, "unknown"),
    ("kv-slot-batch", 'ERROR source=runner.go:426 msg="failed to decode batch" error="could not find a KV slot for the '
                      'batch - try reducing the size of the batch or increase the context. code: 1"', None,
     "kv_capacity"),
    ("on-device-seq-over-cache", "In function generate(), assert failed (num_prompt_tokens < metadata_.at(kMaxSeqLen)):"
                                 " num_prompt_tokens 140 >= max_seq_len_ 128, Max seq length exceed", None, "kv_capacity"),
    ("on-device-seq-over-cache", "Max number of tokens is larger than the maximum cache size supported: 32000 > 2048",
     None, "kv_capacity"),
    # the TPU runtime (vllm#16521, vllm-project/tpu-inference#3408, vllm#20644)
    ("xla-program-load", "RuntimeProgramAllocationFailure: Error loading program 'jit__forward': Attempting to "
                         "allocate 1.13G. That was not possible. There are 528.72M free.", None, "compute_buffer"),
    ("xla-not-possible", "Error allocating device buffer: Attempting to allocate 896.00M. That was not possible. There "
                         "are 295.08M free.; (0x0x0_HBM0)", None, "unknown"),
    # ggml-hexagon (llama.cpp#29123); tt-metal (tt-inference-server#225); FreeToken's planner (FreeToken#409)
    ("buffer-over-max-size", "HTP0:0 buffer size 556236800 exceeds max_bufsize 268435456", None, "unknown"),
    ("tt-metal-l1-circular-buffers", "Statically allocated circular buffers on core range [(x=0,y=0) - (x=3,y=0)] grow "
                                     "to 2292704 B which is beyond max L1 size of 1499136 B", None, "compute_buffer"),
    ("plan-over-budget", "AssertionError: cache budget too small: minimum plan (moe=1024 slots, kv=128 pages) needs "
                         "3046637568 B > budget -1868787708 B (raise memory_ratio, lower kv_reserve_tokens, or free GPU "
                         "memory)", None, "memory_budget"),
    ("memory-check-refused", "Prefill would require ~237.30 GB peak (current 156.05 GB + KV+SDPA 81.25 GB) but dynamic "
                             "ceiling is 235.96 GB.", None, "memory_budget"),
    ("kv-slot", "srv  update_slots: failed to decode the batch: KV cache is full - try increasing it via the context size, "
                "i = 0, n_batch = 512, ret = 1", None, "kv_capacity"),
    ("kv-slot", "init_batch: failed to prepare attention ubatches", None, "kv_capacity"),
    ("memory-check-refused", "ds4: GLM memory guard refused ctx=32768 compact_cap=32768 before GLM graph allocation",
     None, "memory_budget"),
    ("torch-oom-bare", "RuntimeError: CUDA driver error: out of memory", "cuda", "unknown"),
    ("metal-iogpu-oom", "libc++abi: terminating due to uncaught exception of type std::runtime_error: [METAL] Command "
                        "buffer execution failed: Insufficient Memory", "metal", "unknown"),  # (mlx's words: MLX
    # allocates weights, KV and activations lazily, so its command buffer does not say which; ggml-metal's does, below)
    ("oom-killer", "A process of this unit has been killed by the OOM killer.", "cpu", "unknown"),
    ("engine:llama.cpp", "ggml_backend_opencl_buffer_type_alloc_buffer: failed to allocate 1048.51 MiB", "opencl",
     "unknown"),
    ("metal-nil", "ggml_metal_get_buffer: error: buffer is nil", "metal", "compute_buffer"),
    ("python-memoryerror", "MemoryError: Unable to allocate 1.21 GiB for an array with shape (4096, 79104)", "cpu",
     "unknown"),
    ("turbomind-oom", "[TM][ERROR] CUDA runtime error: out of memory /lmdeploy/src/turbomind/utils/allocator.h:246",
     "cuda", "unknown"),
    ("cublas-alloc", "CUDA error: CUBLAS_STATUS_ALLOC_FAILED", "cuda", "compute_buffer"),
    ("engine:vllm", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                    "capacity of 23.58 GiB of which 1.06 GiB is free.", "cuda", "unknown"),
    ("torch-oom", "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                  "capacity of 191.98 GiB of which 1.06 GiB is free.", "rocm", "unknown"),
    ("torch-exceed-allowed", 'thread \'main\' panicked at \'Unable to warmup model: Generation("Allocation on device 0 '
                             'would exceed allowed memory. (out of memory)\\nCurrently allocated     : 16.08 GiB\\n'
                             'Requested               : 4.83 GiB\\nDevice limit            : 22.20 GiB\\nFree '
                             '(according to CUDA): 11.12 MiB', "cuda", "compute_buffer"),  # raised in the warm-up
    ("engine:vllm", "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 23.69 GiB "
                  "total capacity; 22.34 GiB already allocated; 3.81 MiB free; 22.56 GiB reserved in total by "
                  "PyTorch)", "cuda", "unknown"),
    ("torch-oom-bare", "RuntimeError: CUDA out of memory", "cuda", "unknown"),
    ("metal-add-buffer", "ggml_metal_add_buffer: error: failed to allocate 'data            ' buffer, size = "
                         "17408.00 MB", "metal", "model_weights"),  # 'data' is ggml-metal's weights buffer
    ("metal-add-buffer", "ggml_metal_add_buffer: error: failed to allocate 'kv              ' buffer, size = "
                         "4096.00 MB", "metal", "kv_cache"),
    ("metal-iogpu-oom", "ggml_metal_graph_compute: command buffer 0 failed with status 5 error: Insufficient Memory "
                        "(00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)", "metal", "compute_buffer"),
    ("metal-status-5", "ggml_metal_graph_compute: command buffer 1 failed with status 5", "metal", "compute_buffer"),
    ("mlx-buffer-limit", "[metal::malloc] Attempting to allocate 447143641344 bytes which is greater than the "
                         "maximum allowed buffer size of 28991029248 bytes.", "metal", "compute_buffer"),
    # mlx 2024 threw the same text without its "[metal::malloc]" prefix (ml-explore/mlx-examples reports)
    ("mlx-buffer-limit", "libc++abi: terminating due to uncaught exception of type std::runtime_error: Attempting to "
                         "allocate 19081554496 bytes which is greater than the maximum allowed buffer size of "
                         "17179869184 bytes.", "metal", "compute_buffer"),
    ("omlx-model-too-large", 'Error: {"error":{"message":"Model \'Qwen3.5-397B-A17B-nvfp4\' (218.08GB) exceeds '
                             'max-model-memory (25.00GB)","type":"server_error","param":null,"code":null}}', "metal",
     "memory_budget"),
    ("omlx-model-too-large", "Model 'Qwen3.6-35B-A3B-4bit' (19.95GB) does not fit under the memory ceiling (17.78GB). "
                             "Free system memory or lower memory_guard_tier.", "metal", "memory_budget"),
    ("mlx-malloc-or-wait", "[malloc_or_wait] Unable to allocate 4194304 bytes.", "metal", "unknown"),
    ("vulkan-oom", "terminate called after throwing an instance of 'vk::OutOfDeviceMemoryError'", "vulkan", "unknown"),
    ("sycl-oom", "Native API failed. Native API returns: -5 (PI_ERROR_OUT_OF_RESOURCES) -5 "
                 "(PI_ERROR_OUT_OF_RESOURCES)", "sycl", "unknown"),
    ("sycl-oom", "UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY", "sycl", "unknown"),
    ("cann-oom", "aclrtMalloc failed, error code 207001", "cann", "unknown"),
    ("turbomind-blocks", "No enough blocks. Assertion fail: /root/lmdeploy/src/turbomind/models/llama/LlamaBatch.cc:358",
     "cuda", "kv_capacity"),
    ("ggml-pool", "ggml_new_tensor_impl: not enough space in the context's memory pool (needed 268697600, available "
                  "268435456)", "cpu", "compute_buffer"),
    ("bad-alloc", "terminate called after throwing an instance of 'std::bad_alloc'", "cpu", "unknown"),
    ("engine:llama.cpp", "llama_model_load: error loading model: mmap failed: Cannot allocate memory", None,
     "model_weights"),
    ("enomem", "fork: Cannot allocate memory", "cpu", "unknown"),
    ("oom-killer", "Out of memory: Killed process 4242 (llama-server) total-vm:52428800kB", "cpu", "unknown"),
    ("kv-slot", "decode: failed to find a memory slot for batch of size 512", None, "kv_capacity"),
    ("ctx-summary", "n_ctx 131072 doesn't fit, only 6 GB free", None, "kv_cache"),
    ("ctx-summary", "llama-server: failed to allocate KV cache (requested ctx=262144, gpu memory free=1024 MiB)",
     None, "kv_cache"),  # (the seed line of issue 12: a context and a free figure)
    ("kv-summary", "llama-server: failed to allocate KV cache, gpu memory free=1024 MiB", None, "kv_cache"),
    ("memory-words", "mystery-engine: allocation failed: insufficient memory on accelerator", None, "unknown"),
    # llama.cpp#1815 (2023): the buffer name quoted
    ("metal-buffer-max", "ggml_metal_add_buffer: buffer 'data' size 18300780544 is larger than buffer maximum of "
                         "17179869184", "metal", "model_weights"),
    # llama-server's 400 body as a client relayed it (tools/server exceed_context_size_error)
    ("llama-server-exceed-context", '{"error":{"code":400,"message":"request (124315 tokens) exceeds the available '
                                    'context size (123904 tokens), try increasing it","type":"exceed_context_size_error"'
                                    '}}', None, "kv_capacity"),
    ("llama-rn-context-full", "Completion failed: Context is full", None, "kv_capacity"),  # llama.rn (PocketPal)
    # exllamav2 model.py load_autosplit_gen / exllamav3 model_ls.py initial_split (ExUI, tabbyAPI)
    ("exllama-autosplit", "RuntimeError: Insufficient VRAM for model and cache", None, "memory_budget"),
    ("exllama-autosplit", "RuntimeError: Insufficient VRAM in split for model and cache", None, "memory_budget"),
    # LM Studio's loading guardrails, 2025 and 2026 wordings (lmstudio-bug-tracker#484, #1202, #1562)
    ("lmstudio-guardrail", "[2025-03-07 01:45:37.078] [error] [LMSInternal][Client=LM Studio][Endpoint=loadModel] Error "
                           "in channel handler: Error: Model loading aborted due to insufficient system resources. "
                           "Overloading the system will likely cause it to freeze.", None, "memory_budget"),
    ("lmstudio-guardrail", "Model loading was stopped due to insufficient system resources. Under the current "
                           "settings, this model requires approximately 273.25 GB of memory, and continuing to load it "
                           "would likely overload your system and cause it to freeze.", None, "memory_budget"),
    ("lmstudio-guardrail", "Not enough resources to load the model with the current settings", None, "memory_budget"),
    # torch's MPS allocator (mlx-free Python stacks on Apple GPUs): its own cap, the high watermark
    ("torch-oom", "RuntimeError: MPS backend out of memory (MPS allocated: 17.80 GB, other allocations: 380.20 MB, max "
                  "allowed: 18.13 GB). Tried to allocate 64.00 MB on private pool. Use "
                  "PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for memory allocations (may cause "
                  "system failure).", "metal", "unknown"),
    # requests longer than the context, each engine's refusal (lines from the reports named)
    ("vllm-prompt-too-long", "WARNING 07-28 03:23:18 scheduler.py:196] Input prompt (2716 tokens) is too long and "
                             "exceeds limit of 2048", None, "kv_capacity"),  # vllm#525 (limit as that era printed it)
    ("vllm-prompt-too-long", "ValueError: The decoder prompt (length 17772) is longer than the maximum model length of "
                             "16384.", None, "kv_capacity"),  # xorbitsai/inference#3785
    ("vllm-prompt-too-long", "ValueError: Prompt length of 5016 is longer than the maximum model length of 4096.",
     None, "kv_capacity"),  # lmms-eval#711
    ("openai-max-context", "ValueError: This model's maximum context length is 16384 tokens. However, you requested "
                           "122946 tokens (112946 in the messages, 10000 in the completion).", None,
     "kv_capacity"),  # vllm#20409
    ("sglang-input-too-long", "ValueError: The input (85050 tokens) is longer than the model's context length (32768 "
                              "tokens).", None, "kv_capacity"),  # sglang#8096
    ("tgi-input-validation", "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 2048. Given: 3474 "
                             "`inputs` tokens and 60 `max_new_tokens`", None, "kv_capacity"),  # llm-vscode#94
    ("ollama-input-too-long", '{ "error": "input length exceeds maximum context length", "status_code": 400 }', None,
     "kv_capacity"),  # n8n#11144
    ("lmstudio-tokens-to-keep", "The number of tokens to keep from the initial prompt is greater than the context "
                                "length. Try to load the model with a larger context length", None, "kv_capacity"),
    ("lmstudio-context-overflow", "Trying to keep the first 111490 tokens when context the overflows. However, the "
                                  "model is loaded with context length of only 32768 tokens, which is not enough.",
     None, "kv_capacity"),  # lmstudio-bug-tracker#546
    ("llamacpp-prompt-too-long", "llama_generate: error: prompt is too long (2249 tokens, max 1996)", None,
     "kv_capacity"),  # AGiXT#76 (examples/main)
    ("llamacpp-prompt-too-long", "Exception: Requested tokens (2285) exceed context window of 2048", None,
     "kv_capacity"),  # llama-cpp-python
    ("exllama-seq-exceeds-cache", "AssertionError: Total sequence length exceeds cache size in model.forward", None,
     "kv_capacity"),  # exllamav2#105
    ("kv-exhausted", "AssertionError: No space left for only one request, "
                     "self.token_to_kv_pool_allocator.available_size()=0", None, "kv_capacity"),  # sglang#14948
    ("lmdeploy-session-len", "2025-11-24 15:34:49,757 - lmdeploy - ERROR - async_engine.py:806 - run out of tokens. "
                             "session=119.", None, "unknown"),  # lmdeploy#4147
    ("mlc-insufficient-gpu-memory", "TVMError: Check failed: (output_res.IsOk()) is false: Insufficient GPU memory "
                                    "error: The available single GPU memory is 19314.976 MB, which is less than the "
                                    "sum of model weight size (51.083 MB) and temporary buffer size (106.819 MB).",
     None, "memory_budget"),  # mlc-llm#2791
    # second format hunt (sources named)
    ("trtllm-kv-pool-too-small", "[TensorRT-LLM][ERROR] Assertion failed: maxTokensInPagedKvCache (128) must be large "
                                 "enough to process at least 1 sequence to completion (i.e. must be larger than "
                                 "beam_width (1) * tokensPerBlock (64) * maxBlocksPerSeq (16))", None,
     "kv_capacity"),  # cortex.cpp#981
    ("vllm-memory-profiling", "AssertionError: Error in memory profiling. Initial free memory 8.46 GiB, current free "
                              "memory 12.98 GiB.", None, "unknown"),  # ms-swift#3241: a check, not a shortage
    ("jetson-nvmap", "NvMapMemAllocInternalTagged: 1075072515 error 12", "cuda", "unknown"),  # llama.cpp#23732
    ("windows-commit-limit", "OSError: The paging file is too small for this operation to complete. (os error 1455)",
     "cpu", "unknown"),  # ComfyUI#8065
    ("ray-memory-monitor", "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
     "cpu", "unknown"),  # vllm#15102
    ("enomem", "ape error: ./phi-2.Q3_K_L.llamafile: prog mmap failed w/ errno 12", "cpu", "unknown"),  # llamafile#152
    ("ollama-errnomem", "panic: insufficient memory - required allocations: {InputWeights:550502400A CPU:{Name:CPU ID: "
                        "Weights:[60561408A] Cache:[0A] Graph:0A} GPUs:[{Name:SYCL0 ID: Weights:[60561408A 1390948480A] "
                        "Cache:[0A] Graph:1212612608F}]}", "sycl", "compute_buffer"),  # ipex-llm's Ollama
    ("exllamav3-pages", "Job requires 485 pages (only 460 available) and cannot be enqueued. Total cache allocated is "
                        "460 * 256 = 117760 tokens", None, "kv_capacity"),
    ("ios-jetsam", "The app \u201cMLCChat\u201d has been killed by the operating system because it is using too much "
                   "memory.", "cpu", "unknown"),
    # examples/simple-chat, llama-run: their own context check, and llama_decode's 1 (no KV slot) as they abort on it
    ("kv-slot", "context size exceeded", None, "kv_capacity"),
    ("kv-slot", "/llama.cpp/examples/simple-chat/simple-chat.cpp:133: failed to decode, ret = 1", None, "kv_capacity"),
    # torch_npu (vllm-ascend): the pre-2.1 form with a "current active" field and "NPU N"
    ("torch-oom", "RuntimeError: NPU out of memory. Tried to allocate 3.47 GiB (NPU 0; 60.97 GiB total capacity; 58.92 "
                  "GiB already allocated; 58.92 GiB current active; 1.66 GiB free; 58.95 GiB reserved in total by "
                  "PyTorch)", "cann", "unknown"),
    # ggml-cuda's VMM pool on HIP (llama.cpp#11405; "invalid argument" from a Strix Halo write-up)
    ("hip-vmm-oom", "/home/<user>/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu:359: HipVMM Failure: out of memory", "rocm",
     "compute_buffer"),
    ("hip-vmm-failure", "ggml/src/ggml-cuda/ggml-cuda.cu:669: HipVMM Failure: invalid argument", "rocm", "unknown"),
    ("ray-memory-monitor", "Memory on the node (IP: <ip>, ID: 708c) where the task (actor ID: 0dab, "
                           "name=RayWorkerVllm.__init__, pid=308, memory used=11.15GB) was running was 12.49GB / 13.15GB "
                           "(0.950003), which exceeds the memory usage threshold of 0.95. Ray killed this worker (ID: "
                           "79a5) because it was the most recently scheduled task", "cpu", "unknown"),
    ("vllm-max-tokens-negative", "openai.BadRequestError: Error code: 400 - {'object': 'error', 'message': "
                                 "'max_tokens must be at least 1, got -186.', 'type': 'BadRequestError'}", None,
     "kv_capacity"),
    # (vLLM 0.33 cpu_worker.py, 0.6.6 config.py / scheduler.py; Ollama 0.13 llm/server.go, 0.30 x/imagegen: the source
    # audit of 2026-12-02)
    ("vllm-cpu-kv-budget", "ValueError: Available memory on node 0 (12.5/62.7 GiB) on kv cache allocation is less than "
                           "requested memory for kv (40.0/56.43 GiB). Reduce CPU memory used by other processes.", "cpu",
     "memory_budget"),
    ("vllm-cpu-no-kv", "ValueError: The worker already uses 30.12 GiB (model weights and runtime), more than the 28.22 GiB "
                       "of CPU memory reserved for it on node 0, leaving none for the KV cache.", "cpu", "kv_capacity"),
    ("vllm-swap-space", "ValueError: Too large swap space. 48.00 GiB out of the 62.70 GiB total CPU memory is allocated "
                        "for the swap space.", "cpu", "memory_budget"),
    ("vllm-swap-exhausted", "RuntimeError: Aborted due to the lack of CPU swap space. Please increase the swap space to "
                            "avoid this error.", None, "kv_capacity"),
    ("ollama-commit-failed", 'time=2025-12-03T22:01:47.560+01:00 level=INFO source=sched.go:470 msg="Load failed" '
                             'model=/root/.ollama/models/blobs/sha256-aeda error="failed to commit memory for model"',
     None, "unknown"),
    ("ollama-imagegen-memory", "Error: 500 Internal Server Error: insufficient memory for image generation: need 24 GB, "
                               "have 16 GB", None, "memory_budget"),
    ("mlx-cuda-malloc", "RuntimeError: [malloc_async] Unable to allocate 4294967296 bytes.", "cuda", "unknown"),
    ("kobold-legacy-eval", "gpt2_eval: failed to allocate 1610612736 bytes. Try reducing batch size.", "cpu",
     "compute_buffer"),
    ("kobold-kv-save-state", "KV Save State: Failed to allocate 8589935104 bytes.", "cpu", "unknown"),
    ("mps-invalid-buffer-size", "RuntimeError: Invalid buffer size: 96.00 GiB", "metal", "unknown"),
    ("kv-blocks-need-have", "RuntimeError: Not enough free blocks: need 21, have 0", None, "kv_capacity"),
    ("opencl-check-other", "ggml_opencl: clGetPlatformIDs(NPLAT, platform_ids, &n_platforms) error -1001 at "
                           "ggml-opencl.cpp:782", "opencl", "unknown"),
    # NVIDIA's kernel driver on a DGX Spark (a 2026 blog's dmesg)
    ("nvrm-no-memory", "NVRM: nvCheckOkFailedNoLog: Check failed: Out of memory [NV_ERR_NO_MEMORY]", "cuda", "unknown"),
    # shells' and IDEs' words for a process killed with SIGKILL (the OOM killer's signal)
    ("oom-killer", "zsh: killed     python3 -m mlx_lm.server --model m", "cpu", "unknown"),
    ("oom-killer", "[1]    12345 killed     ./llama-server -m m.gguf", "cpu", "unknown"),
    ("oom-killer", "Process finished with exit code 137 (interrupted by signal 9: SIGKILL)", "cpu", "unknown"),
    # Rust's error names in CamelCase (candle's Cuda(OutOfMemory))
    ("memory-words", "called `Result::unwrap()` on an `Err` value: Cuda(OutOfMemory)", None, "unknown"),
    # round 10-11 tuning shares (each a format; sources in each rule)
    ("vllm-max-context", "Error code: 400 - {'error': {'message': \"This model's maximum context length is 196608 "
                         "tokens. However, you requested 16384 output tokens and your prompt contains at least 180225 "
                         "input tokens, for a total of at least 196609 tokens.", None, "kv_capacity"),
    ("openvino-gpu-exceeded", "2025-07-07T11:59:48Z deepseek-r1.server[17974]: [GPU] Exceeded max size of memory "
                              "allocation: Required 8257536 bytes, already occupied : 7927400508 bytes, but available "
                              "memory size is 7927406592 bytes", "openvino", "unknown"),
    ("rknn-npu-malloc", "E RKNN: [19:58:54.142] failed to malloc npu memory, size: 4022861824, flags: 0x2", "unknown",
     "unknown"),
    ("ggml-object-pool", "ggml_new_object: not enough space in the context's memory pool (needed 29377280, available "
                         "29376864)", None, "unknown"),
    # round-9 format hunts, second wave (pasted forms and engines at the edge; sources in each rule)
    ("llama-rn-context-full", "Completion failed: Not enough context space", None, "kv_capacity"),
    ("input-exceeds-max-context", '{"error":"input length (40312 tokens) exceeds the model\'s maximum context length '
                                  '(32768 tokens)"}', None, "kv_capacity"),
    ("ort-genai-max-length", "RuntimeError: input_ids size (9216) + current sequence length (0) exceeds max length "
                             "(8192)", None, "kv_capacity"),
    ("ort-genai-max-length", "onnxruntime_genai.onnxruntime_genai.OrtException: max_length (12288) cannot be greater "
                             "than model context_length (4096)", None, "kv_capacity"),
    ("tgi-not-enough-memory", "tgi-1  | Error: Backend(NotEnoughMemory(32768))", None, "kv_capacity"),
    ("openvino-genai-cache-budget", "Request 0 was dropped by the scheduler because it did not fit in the available "
                                    "cache budget (out of memory). Increase cache_size / num_kv_blocks", "openvino",
     "kv_capacity"),
    ("need-but-only", "vllm won't start with max-model-len 131072 on 2x A6000, says KV cache needed 16 GiB but only "
                      "9.05 GiB available. tp=2, gpu-memory-utilization 0.9", None, "kv_cache"),
    ("memory-words", "it says cudaMalloc failed 12 GB?? I have a 3060 12GB so it should fit.", None, "unknown"),
    ("memory-words", "[GPU] out of GPU resources", None, "unknown"),  # OpenVINO intel_gpu ocl_engine.cpp
    # round-9 format hunt (each read in the engine's source named in its rule; the hunt's realistic values)
    ("openai-max-context", "vllm.exceptions.VLLMValidationError: This model's maximum context length is 32768 tokens. "
                           "However, your request has 40211 input tokens. Please reduce the length of the input "
                           "messages.", None, "kv_capacity"),
    ("openai-max-context", "'max_tokens' or 'max_completion_tokens' is too large: 8192. This model's maximum context "
                           "length is 16384 tokens and your request has 9000 input tokens (8192 > 16384 - 9000).",
     None, "kv_capacity"),
    ("sglang-input-too-long", "Requested token count exceeds the model's maximum context length of 64000 tokens. You "
                              "requested a total of 71897 tokens: 7897 tokens from the input messages and 64000 tokens "
                              "for the completion.", None, "kv_capacity"),
    ("tgi-input-validation", "ERROR chat_completions: text_generation_router::infer: router/src/infer/mod.rs:126: "
                             "`inputs` tokens + `max_new_tokens` must be <= 8192. Given: 8000 `inputs` tokens and 512 "
                             "`max_new_tokens`", None, "kv_capacity"),
    ("llama-server-exceed-context", "E srv    send_error: task id = 5977, input (526 tokens) is larger than the max "
                                    "context size (512). skipping", None, "kv_capacity"),
    ("ollama-prompt-too-long", '{"error":"the prompt is longer than the context length currently available to the '
                               'model; shorten the prompt, adjust the context length in settings, or use a model with '
                               'a longer context length"}', None, "kv_capacity"),
    ("input-length-context", '{"error":"The request exceeds the model context length.","message":"Input length (40000) '
                             'must be smaller than the model context length (32768)."}', None, "kv_capacity"),
    ("lmdeploy-no-enough", "2026-08-21 15:40:12,406 - lmdeploy - ERROR - engine.py:231 - RuntimeError: No enough gpu "
                           "memory for kv cache.", None, "kv_capacity"),
    ("lmdeploy-no-enough", "2026-08-22 08:15:40,006 - lmdeploy - ERROR - engine.py:231 - RuntimeError: No enough gpu "
                           "memory for runtime.", None, "memory_budget"),
    ("lmdeploy-no-enough", "2026-08-22 09:01:33,550 - lmdeploy - ERROR - engine_loop.py:412 - MemoryError: No enough "
                           "free memory blocks.", None, "kv_capacity"),
    ("turbomind-admission", "[TM][WARN][0821.15:31:54.123456][engine.cc:605] dp0 ID 17: cache out of memory, no request "
                            "can be admitted; failing head-of-line request", None, "kv_capacity"),
    ("macos-low-swap", "2026-07-12 23:10:44.118201+0200 0x1b2     Default     0x0                  0      0    kernel: "
                       "low swap: killing largest compressed process with pid 812 (ollama) and size 39874 MB", "cpu",
     "unknown"),
    ("torch-cpu-alloc", "RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough "
                        "memory: you tried to allocate 28991029248 bytes.", "cpu", "unknown"),
    ("mlx-max-buffer", "RuntimeError: [conv] A single unfolding row needs 4294967296 bytes, which exceeds the maximum "
                       "Metal buffer size of 3758096384 bytes.", "metal", "compute_buffer"),
    ("webgpu-buffer-limit", "/llama.cpp/ggml/src/ggml-webgpu/ggml-webgpu.cpp:4098: ggml_webgpu: Device error! Reason: "
                            "2, Message: Buffer size (3221225472) exceeds the max buffer size limit (2147483648).",
     None, "unknown"),
    ("rpc-server-crashed", "/src/llama.cpp/ggml/src/ggml-rpc/ggml-rpc.cpp:576: Remote RPC server crashed or returned "
                           "malformed response", None, "unknown"),
    ("llama-server-ubatch", "srv    send_error: task id = 22, error: input (1024 tokens) is too large to process. "
                            "increase the physical batch size (current batch size: 512)", None, "unknown"),
    ("exllama-split-space", "AssertionError: Insufficient space in device allocation", None, "memory_budget"),
    ("requires-but-only", 'time=2026-06-30T15:20:44.102+09:00 level=INFO source=sched.go:598 msg="failed to create '
                          'server" model=gpt-oss-mlx:120b error="model requires 71.4 GiB but only 58.1 GiB are '
                          'available (after 512.0 MiB overhead)"', None, "memory_budget"),
    ("turbomind-warmup-too-long", "[TM][ERROR] [Engine] Warm-up for 6144 tokens failed with status 6", "cuda",
     "kv_capacity"),  # lmdeploy#4366 (Request::kTooLong)
    ("turbomind-warmup-oom", "[TM][ERROR] [Engine] Warm-up for 8192 tokens failed with status 11", "cuda",
     "compute_buffer"),  # Request::kOutOfMemory
    ("vllm-mamba-blocks", "ValueError: max_num_seqs (1024) exceeds available Mamba cache blocks (722).", None,
     "kv_capacity"),
    ("tensorrt-requested", "[11/10/2023-06:30:40] [TRT] [W] Requested amount of GPU memory (24793579520 bytes) could "
                           "not be allocated. There may not be enough free memory for allocation to succeed.", "cuda",
     "unknown"),  # TensorRT-LLM#346
    ("sglang-pool-too-small", "AssertionError: Memory pool size is too small", None, "kv_capacity"),
    ("engine:llama.cpp", "llama_model_load: error loading model: MapViewOfFile failed: Not enough memory resources "
                         "are available to process this command.", None, "model_weights"),
    ("ollama-required-full", 'Error: 500 Internal Server Error: unable to load full model on GPU', None,
     "memory_budget"),
    ("oom-killer", "09-04 12:44:09.871  1402  1591 I lowmemorykiller: Kill 'com.Vali98.ChatterUI' (18770), uid 10412, "
                   "oom_score_adj 0 to free 9871232kB rss, 0kB swap; reason: device is low on swap", "cpu", "unknown"),
    # the request-length net (ctransformers via LangChain, GPT4All's backend via privateGPT, LocalAI's llama backend)
    ("context-words", "Number of tokens (757) exceeded maximum context length (512).", None, "kv_capacity"),
    ("context-words", "ERROR: The prompt size exceeds the context window size and cannot be processed.GPT-J ERROR: The "
                      "prompt is2614tokens and the context window is2048!", None, "kv_capacity"),
    ("context-words", "1:45PM DBG GRPC(qwen2.5-coder-32b-instruct-127.0.0.1:39337): stdout Context exhausted. Slot 5 "
                      "released (0 tokens in cache)", None, "kv_capacity"),
    ("kv-slot", "Sorry, there was a problem talking to the backend: RuntimeError('llama_decode returned 1')", None,
     "kv_capacity"),
    ("engine:sglang", "AssertionError: Not enough space for mamba ping pong idx, try to increase "
                      "--mamba-full-memory-ratio.", None, "kv_capacity"),
    # ONNX Runtime's arena while a session initializes (foundry-local#199); CLBlast's memory codes (koboldcpp#100)
    ("ort-bfc-arena", "Exception during initialization: D:\\a\\_work\\1\\s\\onnxruntime\\core\\framework\\bfc_arena.cc:376 "
                      "onnxruntime::BFCArena::AllocateRawInternal Failed to allocate memory for requested buffer of size "
                      "197001216", None, "model_weights"),
    ("clblast-oom", "CLBlast: OpenCL error: clEnqueueNDRangeKernel: -4", "opencl", "compute_buffer"),
    ("kv-slot", "ERROR: Model worker crashed: Llama.cpp failed decoding: Decode Error 1: NoKvCacheSlot", None,
     "kv_capacity"),
    ("vllm-cumem-allocator", "Runtime Error: Cuda error: out of memory at /workspace/csrc/cumem_allocator.cpp: 62", "cuda",
     "unknown"),
    ("ios-jetsam", "Task 1: EXC_RESOURCE (RESOURCE_TYPE_MEMORY: high watermark memory limit exceeded) (limit=6144 MB)",
     "cpu", "unknown"),
    ("mlx-resource-limit", "RuntimeError: [metal::malloc] Resource limit (499000) exceeded", "metal", "unknown"),
    ("torch-allocator-warning", "[rank0]:[W922 05:15:28] memory allocation failed with OOM on device 0 while trying to "
                                "allocate 3630170112 bytes (free: 202833920, total: 25250627584).", "cuda", "unknown"),
]


@pytest.mark.parametrize(("rule", "line", "backend", "phase"), EXAMPLES, ids=[f"{e[0]}-{i}" for i, e in enumerate(EXAMPLES)])
def test_each_format_makes_a_failure(rule, line, backend, phase):
    assert is_key_line(line)
    # (a warning the engine may carry on after is the failure when the run then fails)
    warn = any(r.warn for r in RULES if r.id == rule)
    d = analyze_text(line + "\n" + ("Traceback (most recent call last):\n" if warn else ""))
    assert d["failure"]["phase"] != "none", d["failure"]
    evs = [e for e in parse_log([line]).events if e["kind"] == "oom"]
    assert d["failure"]["phase"] == phase
    if rule.startswith("engine:"):  # an engine rule reads it; the failure layer leaves it alone
        assert not evs
        return
    assert evs and evs[0]["rule"] == rule, evs
    if backend:
        assert d["failure"]["backend"] == backend
    if evs[0].get("memory", True):
        assert d["failure"]["allocator_error"] == line
    else:  # a failure that is not about memory: its line ends the run, no allocator error is claimed
        assert d["failure"]["allocator_error"] is None and d["failure"]["final_error"] == line


def test_every_rule_has_an_example():
    assert {r.id for r in RULES} <= {e[0] for e in EXAMPLES}, {r.id for r in RULES} - {e[0] for e in EXAMPLES}


def test_cuda_error_block_names_device_and_pool():
    log = ("CUDA error: out of memory\n  current device: 1, in function ggml_cuda_pool_malloc_vmm at "
           "ggml-cuda.cu:8583\n  cuMemCreate(&handle, reserve_size, &prop, 0)\n"
           "GGML_ASSERT: ggml-cuda.cu:256: !\"CUDA error\"\n")
    f = analyze_text(log)["failure"]
    assert (f["phase"], f["backend"], f["failing_device"]) == ("compute_buffer", "cuda", "CUDA1")


def test_a_failure_line_that_is_not_memory_is_unknown_not_none():
    d = analyze_text("CUDA error: an illegal memory access was encountered\nggml-cuda.cu:106: CUDA error\n")
    # (ggml's abort line ends a crash: a known-good build is the one fix, never a memory one)
    assert d["failure"]["phase"] == "unknown" and [x["id"] for x in d["suggestions"]] == ["bisect-regression"]


@pytest.mark.parametrize("line", [
    "radv/amdgpu: The CS has been cancelled because the context is lost.\n"
    "terminate called after throwing an instance of 'vk::DeviceLostError'\n  what():  vk::Queue::submit: ErrorDeviceLost",
    "ollama: srv update_slots: decode() failed: vk::Queue::submit: ErrorDeviceLost",
    "4.45.745.058 E ggml_vulkan: device lost on Vulkan0",
    "srv    send_error: task id = 0, error: decode() failed",
    '7:23PM ERR Server error error="rpc error: code = Unavailable desc = error reading from server: EOF"',
    "(EngineCore_DP0 pid=5704) ERROR 01-06 06:43:02 [mooncake_connector.py:330] Failed to transfer KV cache for request "
    "cmpl-1: Mooncake transfer failed, ret: -1",
])
def test_failures_that_are_not_memory_are_unknown_never_none(line):
    """A lost GPU, a request llama-server failed, a gRPC call to a dead runner, a vLLM ERROR record: failures whose
    cause the log does not tie to memory (phase unknown), never "no failure"."""
    f = analyze_text(line + "\n")["failure"]
    assert f["phase"] == "unknown" and f["allocator_error"] is None, f


def test_a_traceback_of_error_records_does_not_hide_the_step_after_the_oom():
    """vLLM V1 prints the OOM first and its chained traceback after, every line an ERROR record: the step its frames
    name (run_busy_loop: serving) still places the OOM."""
    pre = "(EngineCore_DP0 pid=8402) ERROR 10-24 01:26:57 [core.py:710] "
    log = "".join(pre + x + "\n" for x in (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 960.00 MiB. GPU 0 has a total capacity of "
        "79.14 GiB of which 712.75 MiB is free.", "", "The above exception was the direct cause of the following "
        "exception:", "", "Traceback (most recent call last):",
        '  File "/usr/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 701, in run_engine_core',
        "    engine_core.run_busy_loop()"))
    f = analyze_text(log)["failure"]
    assert (f["phase"], f["requested_mib"]) == ("compute_buffer", 960.0), f


def test_recovered_memory_error_is_a_finding():
    d = analyze_text("CUDA error: out of memory\nmain: server is listening on http://127.0.0.1:8080\n")
    assert d["failure"]["phase"] == "none"
    assert any(x["kind"] == "recovered_allocation" for x in d["findings"])


def test_warnings_about_memory_are_not_failures():
    assert analyze_text("use --no-kv-offload to avoid out of memory on small GPUs\n")["failure"]["phase"] == "none"


SEED = "llama-server: failed to allocate KV cache (requested ctx=262144, gpu memory free=1024 MiB)\n"


def test_seed_summary_line_without_model():
    d = analyze_text(SEED)
    assert d["engine"] == "llama.cpp"
    assert d["failure"]["phase"] == "kv_cache" and d["failure"]["free_mib"] == 1024.0
    assert d["memory"]["inputs"]["n_ctx"] == 262144
    assert d["suggestions"][0]["id"] == "reduce-ctx"
    ex = [x for x in d["findings"] if x["kind"] == "kv_examples"]
    assert ex and "not your model" in ex[0]["text"] and "32,768 MiB" in ex[0]["text"]


def test_seed_summary_line_with_the_model(tmp_path):
    from kvreport.analyze import analyze
    from kvreport.collect import model_section
    from kvreport.excerpt import Excerpt

    gguf = dense(tmp_path / "m.gguf", n_layer=32, n_head=32, n_head_kv=8, n_embd=4096, ctx=131072)
    bundle = {"log": Excerpt().feed_all(SEED.splitlines()).to_log("file"), "model": model_section(str(gguf), {})}
    d = analyze(bundle)
    f, m = d["failure"], d["memory"]
    assert m["inputs"]["source"] == "gguf" and m["kv_mib_per_1k_tokens"] == pytest.approx(128.0)
    assert f["requested_mib"] == pytest.approx(32768.0) and f["verdict"] == "exceeds_free"
    first = d["suggestions"][0]
    assert first["id"] == "reduce-ctx"
    n = first["change"]["--ctx-size"]
    assert n == m["max_ctx_fit"]["f16"] and n * 128 / 1024 <= 512


def _cases():
    for base in (CASE_DIR, CORPUS_DIR):
        yield from sorted(p for p in base.iterdir() if (p / "log.txt").is_file())


def test_no_memory_error_line_answers_no_failure():
    """Over every real log: a log with a memory-error line the engine did not carry on after is never "none"."""
    silent = []
    for case in _cases():
        text = (case / "log.txt").read_text(errors="replace")
        d = analyze_text(text)
        if d["failure"]["phase"] != "none":
            continue
        mem = [e for e in parse_log(text.splitlines()).events if e["kind"] == "oom" and e.get("memory")]
        recovered = any(x["kind"] == "recovered_allocation" for x in d["findings"])
        if mem and not recovered:
            silent.append(case.name)
    assert not silent


def test_failure_layer_lines_pass_the_prefilter():
    """Every line of the real logs that a failure-layer rule matches is a key line (the prefilter comes from the
    rules' keywords, so the excerpt and the grep path keep it)."""
    missed = []
    for case in _cases():
        for line in (case / "log.txt").read_text(errors="replace").splitlines():
            if not is_key_line(line) and any(r.pattern.search(line) for r in (*RULES, FATAL)):
                missed.append((case.name, line[:120]))
    assert not missed


def test_stage_places_a_bare_memory_error():
    """A memory error with no buffer named takes the step llama.cpp was in: loading weights, creating the context."""
    weights = "llm_load_tensors: ggml ctx size =    0.32 MiB\nCUDA error: out of memory\n"
    assert analyze_text(weights)["failure"]["phase"] == "model_weights"
    context = "llama_new_context_with_model: n_ctx      = 32768\nCUDA error: out of memory\n"
    assert analyze_text(context)["failure"]["phase"] == "context"


def test_quote_bars_and_glued_messages():
    quoted = ("\u258e ValueError: To serve at least one request with the model's max seq len (196608),\n"
              "\u258e 23.25 GiB KV cache is needed, which is larger than the available KV cache memory (22.5 GiB).\n")
    f = analyze_text(quoted)["failure"]
    assert (f["phase"], f["requested_mib"], f["free_mib"]) == ("kv_capacity", 23808.0, 23040.0)
    glued = ("500 Internal Server Error: llama runner process has terminated: error:failed to allocate buffer, size = "
             "16571.89 MiB ggml_gallocr_reserve_n: failed to allocate Metal buffer of size 17376872352\n")
    f = analyze_text(glued)["failure"]
    assert (f["phase"], f["backend"]) == ("compute_buffer", "metal")


def test_the_net_reads_a_size_and_skips_info_records():
    d = analyze_text("eighth draft pool: CUDA OOM while allocating 5.16 GiB\n")
    assert d["failure"]["requested_mib"] == pytest.approx(5283.84)
    info = ("(EngineCore pid=1) INFO 08-21 18:37:44 [model_runner.py:1442] Capturing cudagraphs for decoding. If "
            "out-of-memory error occurs during cudagraph capture, consider decreasing gpu_memory_utilization\n")
    assert analyze_text(info)["failure"]["phase"] == "none"


def test_a_log_that_ends_on_its_only_pinned_refusal_is_not_called_recovered():
    d = analyze_text("ggml_cuda_host_malloc: failed to allocate 4096.00 MiB of pinned memory: out of memory\n")
    assert d["failure"]["phase"] == "unknown"
    went_on = ("ggml_cuda_host_malloc: failed to allocate 4096.00 MiB of pinned memory: out of memory\n"
               "llama_kv_cache_init:        CPU KV buffer size =  4096.00 MiB\n")
    assert analyze_text(went_on)["failure"]["phase"] == "none"


def test_metal_buffer_size_and_device():
    f = analyze_text("ggml_metal_add_buffer: error: failed to allocate 'data            ' buffer, size = 19283.21 MiB\n")[
        "failure"]
    assert (f["requested_mib"], f["failing_device"], f["phase"]) == (19283.21, "Metal", "model_weights")


def test_an_engine_check_with_equal_rounded_figures_exceeds():
    line = "Error: 500 Internal Server Error: model requires more system memory (5.3 GiB) than is available (5.3 GiB)\n"
    assert analyze_text(line)["failure"]["verdict"] == "exceeds_free"


def test_backend_words_are_words_not_substrings():
    """'cannot' is not CANN and 'relationship' not HIP; torch on ROCm names both CUDA and HIP, and HIP wins."""
    from kvreport.logs.oom import backend_of_words

    assert backend_of_words("mmap failed: cannot allocate memory") is None
    assert backend_of_words("a relationship of ships") is None
    assert backend_of_words("torch.cuda.outofmemoryerror: hip out of memory.") == "rocm"
    assert backend_of_words("ggml-cann: npu:0 out of memory") == "cann"
    assert backend_of_words("vk::queue::submit: erroroutofdevicememory") == "vulkan"


def test_torch_npu_message_gives_device_and_free():
    """torch_npu's pre-2.1 form (vllm-ascend): "(NPU 1; T total capacity; A already allocated; A current active;
    F free; ...)": the request, the free memory and the NPU as CANN<n>."""
    d = analyze_text("RuntimeError: NPU out of memory. Tried to allocate 4.50 GiB (NPU 1; 60.96 GiB total capacity; "
                     "52.87 GiB already allocated; 52.87 GiB current active; 2.77 GiB free; 56.89 GiB reserved in "
                     "total by PyTorch)\n")
    f = d["failure"]
    assert (f["backend"], f["requested_mib"], f["free_mib"], f["verdict"]) == ("cann", 4608.0, 2836.48, "exceeds_free")


def test_torch_message_wrapped_with_blank_lines_is_read_whole():
    """A torch OOM pasted with its sentences on separate lines and blank lines between them (SGLang's "Capture cuda
    graph failed" as rendered in an issue): the device and free memory of the third sentence belong to it."""
    log = ("Exception: Capture cuda graph failed: CUDA out of memory.\n\nTried to allocate 672.00 MiB.\n\n"
           "GPU 0 has a total capacity of 140.06 GiB of which 200.75 MiB is free.\n")
    f = analyze_text(log)["failure"]
    assert (f["phase"], f["failing_device"], f["requested_mib"], f["free_mib"], f["verdict"]) == (
        "compute_buffer", "CUDA0", 672.0, 200.75, "exceeds_free")


def test_load_error_names_the_buffer_type_as_device():
    """llama.cpp's "unable to allocate CUDA0 buffer" relayed alone (Ollama's 500 to a client): weights on CUDA0."""
    f = analyze_text("Ollama call failed with status code 500: llama runner process has terminated: error loading "
                     "model: unable to allocate CUDA0 buffer\n")["failure"]
    assert (f["phase"], f["backend"], f["failing_device"]) == ("model_weights", "cuda", "CUDA0")


def test_backend_line_while_loading_is_the_weights_and_above_total_exceeds_free():
    """ggml-cuda's own "allocating N MiB on device D: cudaMalloc failed" during the weights' load (model loader
    lines before it), on a device whose init line prints less memory than the request: weights, exceeds_free."""
    log = ("ggml_cuda_init: found 1 ROCm devices:\n"
           "  Device 0: AMD Radeon 780M Graphics, gfx1103 (0x1103), VMM: no, Wave Size: 32, VRAM: 7882 MiB\n"
           "done_getting_tensors: tensor 'token_embd.weight' (q8_0) (and 0 others) cannot be used with preferred "
           "buffer type ROCm_Host, using CPU instead\n"
           "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 8045.05 MiB on device 0: cudaMalloc failed: out of "
           "memory\n")
    d = analyze_text(log)
    f = d["failure"]
    assert (f["phase"], f["failing_device"], f["verdict"]) == ("model_weights", "ROCm0", "exceeds_free")
    assert any(x["kind"] == "request_above_total" for x in d["findings"])


@pytest.mark.parametrize(("line", "backend"), [
    ("ROCm error: invalid device function", "rocm"),
    ("cuBLAS error 15 at /go/src/github.com/jmorganca/ollama/llm/llama.cpp/gguf/ggml-cuda.cu:7586", "cuda"),
])
def test_ggml_cuda_errors_that_are_not_memory_are_failures(line, backend):
    """ggml's CUDA error block with a reason that is not memory (ROCm builds print "ROCm error"; 2023 builds
    "cuBLAS error N at FILE:LINE"): a failure of unknown phase on that backend, never "no failure"."""
    f = analyze_text(line + "\n")["failure"]
    assert (f["phase"], f["backend"], f["allocator_error"]) == ("unknown", backend, None)


def test_exllama_budget_names_the_cache_so_the_context_comes_first():
    """exllamav2's auto-split refusal names the cache it sized for max_seq_len: reduce-ctx first, in its own words."""
    d = analyze_text("RuntimeError: Insufficient VRAM for model and cache\n")
    assert d["failure"]["phase"] == "memory_budget"
    first = d["suggestions"][0]
    assert first["id"] == "reduce-ctx" and "max_seq_len" in first["expected"], first


def test_a_host_killed_for_memory_suggests_a_smaller_model_first():
    d = analyze_text("The app \u201cMLCChat\u201d has been killed by the operating system because it is using too much "
                     "memory.\n")
    assert [s["id"] for s in d["suggestions"]][:1] == ["smaller-model-or-quant"], d["suggestions"]


def test_ollamas_own_kv_estimate_makes_the_context_the_lever():
    """Ollama's layout line estimates a 31 GiB KV (memory.required.kv) and the context could not be created: the
    context, not the layers, comes first."""
    log = ('time=2024-08-09T14:28:55.142+03:00 level=INFO source=memory.go:309 msg="offload to cuda" '
           'layers.requested=-1 layers.model=33 layers.offload=0 layers.split="" memory.available="[4.6 GiB]" '
           'memory.required.full="35.3 GiB" memory.required.partial="0 B" memory.required.kv="31.2 GiB"\n'
           "Error: llama runner process has terminated: error:failed to create context with model '/m'\n")
    d = analyze_text(log)
    assert d["engine"] == "ollama" and d["failure"]["phase"] == "context"
    assert d["suggestions"][0]["id"] == "reduce-ctx", d["suggestions"]


REFUSALS = [e for e in EXAMPLES if e[0] in __import__("kvreport.logs.oom", fromlist=["REQUEST_RULES"]).REQUEST_RULES]


@pytest.mark.parametrize("line", [e[1] for e in REFUSALS])
def test_a_request_longer_than_the_context_asks_for_a_larger_context_never_a_smaller_pool(line):
    """A refused request is no memory shortage: the first fix raises the context above the limit the line names
    (never to it or below), and no fix shrinks the pool, the batch or the maximum length."""
    d = analyze_text(line + "\n")
    ids = [s["id"] for s in d["suggestions"]]
    assert not {"reduce-max-model-len", "reduce-batch", "reduce-ctx", "quantize-kv-cache"} & set(ids), ids
    assert ids and ids[0] == "raise-ctx", ids
    change = d["suggestions"][0]["change"]
    nums = re.findall(r"\d+", line)
    if change:
        assert all(v > min(int(n) for n in nums if int(n) > 100) for v in change.values()), (change, line)


def test_a_pinned_refusal_the_2024_loader_went_on_from_is_recovered():
    """ggml_cuda_host_malloc's warning (its %.2f in a decimal-comma locale, llama.cpp#9629) followed by the 2024
    loader's buffer lines: llama.cpp fell back to plain host memory and carried on, so nothing failed."""
    log = ("llm_load_tensors: ggml ctx size =    0.37 MiB\n"
           "ggml_cuda_host_malloc: failed to allocate 1900,00 MiB of pinned memory: invalid argument\n"
           "llm_load_tensors: offloaded 40/41 layers to GPU\n"
           "llm_load_tensors:        CPU buffer size =  8694.21 MiB\n"
           "llm_load_tensors:      CUDA0 buffer size =  7883.12 MiB\n")
    d = analyze_text(log)
    assert d["failure"]["phase"] == "none", d["failure"]
    assert any(x["kind"] == "recovered_allocation" for x in d["findings"]), d["findings"]


def test_no_kv_offload_is_not_suggested_to_a_command_that_has_it():
    log = ("llama_kv_cache_init:      CUDA0 KV buffer size = 16384.00 MiB\n"
           "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 16384.00 MiB on device 0: cudaMalloc failed: out of "
           "memory\nllama_kv_cache_init: failed to allocate buffer for kv cache\n")
    ids = [s["id"] for s in analyze_text(log, "llama-server -m m.gguf -c 131072 --no-kv-offload")["suggestions"]]
    assert "kv-cache-on-host" not in ids, ids
    ids = [s["id"] for s in analyze_text(log, "llama-server -m m.gguf -c 131072")["suggestions"]]
    assert "kv-cache-on-host" in ids, ids


def test_ollamas_scheduler_view_bounds_the_free_memory_and_names_the_layers():
    """Ollama's "offload to cuda" record (ollama#8471 shape): memory.available is free memory before anything was
    loaded, an upper bound at the failure: a request above it exceeds free; layers.offload is the -ngl of the run."""
    rec = ('time=2025-01-17T16:39:27.986Z level=INFO source=memory.go:356 msg="offload to cuda" layers.requested=-1 '
           'layers.model=33 layers.offload=32 layers.split="" memory.available="[15.4 GiB]" '
           'memory.required.full="16.2 GiB" memory.required.partial="14.3 GiB" memory.required.kv="256.0 MiB"\n')
    big = rec + ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 35533.34 MiB on device 0: cudaMalloc failed: "
                 "out of memory\nggml_gallocr_reserve_n: failed to allocate CUDA0 buffer of size 37259153408\n")
    assert analyze_text(big)["failure"]["verdict"] == "exceeds_free"
    small = big.replace("35533.34", "2508.00").replace("37259153408", "2629828608")
    d = analyze_text(small)
    assert d["failure"]["verdict"] == "unknown"  # below the bound: whether it fit after the weights is not known
    layers = next(s for s in d["suggestions"] if s["id"] == "reduce-gpu-layers")
    assert 0 < layers["change"]["num_gpu"] < 32, layers


@pytest.mark.parametrize(("line", "req", "free"), [
    ("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in "
     "memory space hbm. Used 21.95G of 15.48G hbm. Exceeded hbm capacity by 6.47G.", 22476.8, None),  # vllm#8318
    ("RESOURCE_EXHAUSTED: Attempting to reserve 10.51G at the bottom of memory. That was not possible. There are "
     "8.97G free, 0B reserved, and 8.97G reservable.", 10762.24, 9185.28),  # transformers#22328
])
def test_xla_sizes_are_read(line, req, free):
    f = analyze_text(line + "\n")["failure"]
    assert f["requested_mib"] == pytest.approx(req, rel=1e-3)
    assert f["free_mib"] == (pytest.approx(free, rel=1e-3) if free else None)


def test_tgi_total_tokens_warmup_lowers_the_total_not_the_prefill():
    """TGI#710's older warm-up wording: the KV for 16000 total tokens failed with a 2-token prefill."""
    d = analyze_text('Error: Warmup(Generation("Not enough memory to handle 16000 total tokens with 2 prefill tokens. '
                     'You need to decrease `--max-batch-total-tokens` or `--max-batch-prefill-tokens`"))\n')
    assert d["engine"] == "tgi"
    assert d["suggestions"][0]["change"] == {"--max-batch-total-tokens": 8000}, d["suggestions"]


def test_the_static_allocator_names_a_weight_tensor():
    """ggml_tallocr_alloc naming blk.N...weight (llama.cpp#12197): the weights, not an unplaced failure."""
    d = analyze_text("ggml_tallocr_alloc: not enough space in the buffer to allocate blk.17.ffn_down.weight (needed "
                     "27525120, available 27521024)\n")
    assert d["failure"]["phase"] == "model_weights", d["failure"]


def test_vllm_v0_batched_tokens_below_max_len_turns_chunked_prefill_on():
    """vLLM 0.6 with chunked prefill off refuses --max-num-batched-tokens below max_model_len (vllm#9290 shape)."""
    log = ("INFO 10-11 12:20:00 llm_engine.py:237] Initializing an LLM engine (v0.6.3.post1) with config: "
           "model='m', max_seq_len=32768, chunked_prefill_enabled=False, gpu_memory_utilization=0.941\n"
           "INFO 10-11 12:21:40 model_runner.py:1067] Loading model weights took 14.9926 GB\n"
           "ERROR 10-11 12:27:29 engine.py:157] OutOfMemoryError('CUDA out of memory. Tried to allocate 138.00 MiB. "
           "GPU 0 has a total capacity of 79.15 GiB of which 2.19 MiB is free.')\n")
    d = analyze_text(log, "vllm serve m --max-model-len 32768")
    batch = next(s for s in d["suggestions"] if s["id"] == "reduce-batch")
    assert batch["change"] == {"--max-num-batched-tokens": 2048, "--enable-chunked-prefill": True}, batch


def test_ollama_errnomem_names_the_failed_buffer_and_device():
    """ollama#11790: the F entry is the CPU block's 98 GiB graph."""
    f = analyze_text("panic: insufficient memory - required allocations: {InputWeights:1158266880A CPU:{Name:CPU ID: "
                     "Weights:[477075584A 1158278400A] Cache:[26214400A 805306368A 0U] Graph:103110017024F} GPUs:[]}\n"
                     )["failure"]
    assert (f["phase"], f["backend"], f["failing_device"]) == ("compute_buffer", "cpu", "CPU")
    assert f["requested_mib"] == pytest.approx(103110017024 / 1048576, rel=1e-4)


def test_an_mlock_warning_is_no_failure():
    """llama-mmap.cpp warns and goes on when mlock cannot pin a buffer (llama.cpp#6261)."""
    d = analyze_text("llm_load_tensors:        CPU buffer size =  4165.37 MiB\nwarning: failed to mlock 74465280-byte "
                     "buffer (after previously locking 0 bytes): Cannot allocate memory\nTry increasing RLIMIT_MEMLOCK "
                     "('ulimit -l' as root).\n")
    assert d["failure"]["phase"] == "none", d["failure"]


def test_ollamas_too_large_warning_alone_is_its_memory_check():
    d = analyze_text('time=2026-03-21T23:22:17.156-05:00 level=WARN source=server.go:1044 msg="model request too large '
                     'for system" requested="615.4 MiB" available="415.9 MiB" total="916.8 MiB" free="415.9 MiB" '
                     'swap="0 B"\n')
    f = d["failure"]
    assert (d["engine"], f["phase"], f["requested_mib"], f["free_mib"], f["verdict"]) == (
        "ollama", "memory_budget", 615.4, 415.9, "exceeds_free")


def test_ollama_truncating_a_prompt_is_a_finding_not_a_failure():
    """runner.go's "truncating input prompt" (ollama#8099): nothing failed, but the prompt was cut to num_ctx."""
    d = analyze_text('time=2025-01-05T17:16:18.172-08:00 level=WARN source=runner.go:129 msg="truncating input '
                     'prompt" limit=2048 prompt=3940 keep=5 new=2048\n')
    assert d["failure"]["phase"] == "none"
    f = next(x for x in d["findings"] if x["kind"] == "prompt_truncated")
    assert "3,940" in f["text"] and "num_ctx" in f["text"]


# round-9 format hunt: whole excerpts whose facts depend on more than one line (source of each format named)
HUNT9 = [
    # llama-context.cpp output_reserve: "%.2f MiB" (not bytes)
    ("output_reserve: failed to allocate output buffer of size 1188.00 MiB\n"
     "decode: could not reserve space for batch with 2048 outputs\nllama_decode: failed to decode, ret = -2",
     {"phase": "compute_buffer", "requested_mib": 1188.0}),
    # ggml-metal.m (2023) printed the size with %8.2f: "size =  6400.00 MB"
    ("ggml_metal_add_buffer: allocated 'data            ' buffer, size = 17592.34 MB, (17592.84 / 21845.34)\n"
     "ggml_metal_add_buffer: error: failed to allocate 'kv              ' buffer, size =  6400.00 MB\n"
     "llama_new_context_with_model: ggml_metal_add_buffer failed",
     {"phase": "kv_cache", "backend": "metal", "requested_mib": 6400.0}),
    # ggml-cuda.cu: the CUDA graph's instantiate runs out (ggml_cuda_graph_evaluate_and_capture)
    ("CUDA error: out of memory\n  current device: 0, in function ggml_cuda_graph_evaluate_and_capture at "
     "ggml/src/ggml-cuda/ggml-cuda.cu:4212\n  cudaGraphInstantiate(&graph->instance, graph->graph, NULL, NULL, 0)",
     {"phase": "compute_buffer", "failing_device": "CUDA0"}),
    # Ollama llm/server.go INFO: the check only evicts another model, the load then succeeds
    ('time=2025-12-09T11:27:40.004+01:00 level=INFO source=server.go:1069 msg="model requires more system memory than '
     'is currently available, evicting a model to make space" required=40265318400 free=12884901888\n'
     'time=2025-12-09T11:27:43.918+01:00 level=INFO source=server.go:1310 msg="llama runner started in 3.91 seconds"',
     {"phase": "none"}),
    # TurboMind's scheduler INFO (scheduler.cc): admission stopped for this pass, nothing failed
    ("[TM][INFO][0821.15:31:53.998102][scheduler.cc:1186] out of memory at 3/8", {"phase": "none"}),
    # SGLang (2026) says its capture failure is not an OOM: a failure, not a memory one
    ("[2026-08-12 09:40:31 TP3] Scheduler hit an exception: Traceback (most recent call last):\n"
     "Exception: Capture cuda graph failed: CUDA error: an illegal memory access was encountered\n\n"
     "This is not an out-of-memory error, so lowering --mem-fraction-static or --cuda-graph-max-bs-decode will not "
     "help.", {"phase": "unknown"}),
    # vLLM on ROCm: torch says cuda:0, the platform line says ROCm
    ("INFO 08-11 03:12:54 [__init__.py:241] Automatically detected platform rocm.\n"
     "(EngineCore_DP0 pid=1902) ValueError: Free memory on device cuda:0 (58.33/63.98 GiB) on startup is less than "
     "desired GPU memory utilization (0.92, 58.87 GiB). Decrease GPU memory utilization or reduce GPU memory used by "
     "other processes.", {"phase": "memory_budget", "backend": "rocm", "failing_device": "ROCm0"}),
    # TGI flash_causal_lm.py warmup: "Not enough memory to handle N prefill tokens" raised from the torch OOM above it
    ("2025-11-19T08:31:02.114523Z ERROR text_generation_launcher: Method Warmup encountered an error.\n"
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 has a total capacity of 23.68 GiB "
     "of which 1.12 GiB is free. Process 41822 has 22.55 GiB memory in use.\n"
     "RuntimeError: Not enough memory to handle 16384 prefill tokens. You need to decrease `--max-batch-prefill-tokens`",
     {"phase": "compute_buffer", "requested_mib": 1996.8, "free_mib": 1146.88, "verdict": "exceeds_free"}),
]


# rounds 7-8 (read for formats after they were scored): each a format, not a case
HUNT9 += [
    # phase placement (format hunt gf): an op of the running graph (cuBLAS), llama-context's graph allocation while
    # serving, TGI's shard loading weights, LMDeploy's paged KV cache, SGLang's pool with its torch sizes
    ("slot update_slots: id  0 | task 0 | prompt processing progress, n_tokens = 2048\nCUDA error: out of memory\n"
     "  current device: 1, in function ggml_cuda_op_mul_mat_cublas at /app/ggml/src/ggml-cuda/ggml-cuda.cu:1363",
     {"phase": "compute_buffer", "failing_device": "CUDA1"}),
    ("process_ubatch: failed to allocate graph\nsrv  update_slots: Compute error. i = 0, n_batch = 4096, ret = -2",
     {"phase": "compute_buffer"}),
    ('  File "/usr/src/server/text_generation_server/models/__init__.py", line 1142, in get_model\n'
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 448.00 MiB. GPU 1 has a total capacity of 39.39 GiB "
     "of which 201.06 MiB is free.", {"phase": "model_weights", "failing_device": "CUDA1"}),
    ('  File "/opt/lmdeploy/pytorch/engine/cache_engine.py", line 205, in allocate_gpu_cache\n'
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 10.98 GiB. GPU 0 has a total capacity of 23.55 GiB "
     "of which 9.72 GiB is free.", {"phase": "kv_cache", "requested_mib": 11243.52}),
    ("[2026-03-02 10:30:42 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
     '  File "/usr/lib/python3.12/dist-packages/sglang/srt/mem_cache/memory_pool.py", line 607, in _create_buffers\n'
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 108.00 MiB. GPU 0 has a total capacity of 23.54 GiB "
     "of which 52.44 MiB is free.", {"phase": "kv_cache", "requested_mib": 108.0, "free_mib": 52.44}),
    ("ggml_metal_graph_compute: backend is in error state from a previous command buffer failure - recreate the "
     "backend to recover", {"phase": "unknown"}),
    # round 12 tuning share: LM Studio's context refusal, an app's load that died, Ollama's crashed runner beside an
    # amdgpu page fault (dmesg form), ds4's weights arena with its size in parentheses, vLLM's finished weight load
    ("[context_fit][WARNING]: Model context auto-fit calculated 0 tokens; using the 4,096 token minimum\n"
     "number of tokens to keep from the initial prompt is greater than the context length", {"phase": "kv_capacity"}),
    ("Failed to load LLM 'qwen2.5-14b-instruct': Error: Engine protocol startup was aborted.", {"phase": "unknown"}),
    ("amdgpu 0000:e5:00.0: [gfxhub] page fault at address 0x0000 from client 0x1b (UTCL2)\n"
     'error="runner crashed" detail="error: Cannot read TensileLibrary.dat: Illegal seek for GPU arch : gfx1035"',
     {"phase": "unknown"}),
    ("ds4: ROCm preparing model tensor mappings: 58.56 GiB\nds4: ROCm model arena alloc failed for tensor-span:105 "
     "(1792.00 MiB chunk): out of memory", {"phase": "model_weights", "requested_mib": 1792.0}),
    ("INFO 01-02 02:07:12 model_runner.py:1099] Loading model weights took 16.9583 GB\n"
     "ERROR 01-02 02:39:17 worker_base.py:467] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 380.00 MiB. "
     "GPU 0 has a total capacity of 23.64 GiB of which 14.81 MiB is free.", {"phase": "compute_buffer"}),
    # Ollama (2026, server/sched.go) retries a load once with a smaller context: recovered when the runner starts
    ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 8192.00 MiB on device 0: cudaMalloc failed: out of memory\n"
     "llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache\n"
     'time=2026-08-19T08:40:06.918Z level=WARN source=sched.go:652 msg="llama-server load failed; reducing automatic '
     'context and retrying once" error="llama-server reported out-of-memory during startup"\n'
     "llama_kv_cache:      CUDA0 KV buffer size =  4096.00 MiB\n"
     'time=2026-08-19T08:40:12.205Z level=INFO source=server.go:1310 msg="llama runner started in 5.29 seconds"',
     {"phase": "none"}),
    # round 20 tuning share: a Java binding's uncaught JVM error after the context was made (java-llama.cpp#8), a
    # wrapper whose server process died (text-generation-webui, wrapped), a wrapper's own load failure (GenieX)
    ('Llama: Exception in thread "main" java.lang.Error: Invalid memory access\n'
     "\tat de.kherud.llama.foreign.LlamaLibrary.llama_tokenize(Native Method)", {"phase": "unknown"}),
    ("20:53:22-829894 ERROR    Error loading the model with llama.cpp: Server process\n"
     "                         terminated unexpectedly with exit code: -4", {"phase": "unknown"}),
    ("⚠️ Oops. Model failed to load.", {"phase": "unknown"}),
    # round 21 tuning share: Go's runtime aborting in cgo after Metal's API validation (conda-forge/ollama-feedstock#71),
    # Triton's on-chip shared memory (not device memory: ktransformers#1570), ggml's scheduler reserving again
    ("-[MTLComputePipelineDescriptorInternal setComputeFunction:withType:]:800: failed assertion `computeFunction must "
     "not be nil.'\nSIGABRT: abort\nPC=0x18f6a5388 m=3 sigcode=0", {"phase": "unknown"}),
    ("triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 106496, Hardware limit: 101376. "
     "Reducing block sizes or `num_stages` may help.", {"phase": "unknown"}),
    ("ggml_backend_sched: failed to allocate graph, reserving\nggml_gallocr_needs_realloc: graph has different number "
     "of nodes", {"phase": "none"}),
    # 2023 llama.cpp printed the KV size in lower case and "MB" (MiB)
    ("llama_new_context_with_model: kv self size  = 3200.00 MB\nCUDA error 2 at ggml-cuda.cu:6301: out of memory",
     {"backend": "cuda"}),
    # RADV prints the refused size on the line after its "Failed to allocate a buffer:"
    ("radv/amdgpu: Failed to allocate a buffer:\nradv/amdgpu:    size      : 963379200 bytes\nradv/amdgpu:    alignment "
     ": 262144 bytes", {"backend": "vulkan", "requested_mib": 918.75}),
    # SGLang's KV pool buffers (mem_cache/memory_pool.py _create_buffers), here torch_npu's OOM
    ('  File "/usr/lib/python3.11/site-packages/sglang/srt/mem_cache/memory_pool.py", line 736, in __init__\n'
     "    self._create_buffers()\n    self.kv_buffer = torch.zeros(\nRuntimeError: NPU out of memory. Tried to allocate "
     "48.55 GiB (NPU 1; 60.96 GiB total capacity; 36.49 GiB already allocated; 36.49 GiB current active; 24.12 GiB free; "
     "36.49 GiB reserved in total by PyTorch)", {"phase": "kv_cache", "backend": "cann", "failing_device": "CANN1"}),
    # uvicorn's "Application startup complete." of another server does not recover a llama.cpp load failure
    ("ERROR:    llama_model_load: error loading model: unable to allocate ROCm0 buffer\n"
     "Sep 14 14:49:47 <host> lemonade-server-dev[2794]: INFO:     Application startup complete.",
     {"phase": "model_weights", "failing_device": "ROCm0"}),
    # vLLM V1's KV check cut after the need: the check's own refusal is above what it had
    ("  ValueError: To serve at least one request with the model's max seq len (1048576),\n  23.32 GiB KV cache is "
     "needed, which is larger t", {"phase": "kv_capacity", "requested_mib": 23879.68, "verdict": "exceeds_free"}),
    # vLLM V0's check retyped by hand ("sew")
    ("The model’s max sew len (32768) is larger than the maximum number of tokens that can be stored in KV cache "
     "(18896). Try increasing ‘gpu_memory_utilization’", {"phase": "kv_capacity"}),
    # vLLM V1 (2026) KV check re-wrapped over three lines, and one cut after the need
    ("Available KV cache memory: 0.24 GiB\nValueError: To serve at least one request with the model's max seq len\n"
     "(1000000), 3.09 GiB KV cache is needed, which is larger than the available\nKV cache memory (0.24 GiB). Estimated "
     "maximum model length is 57344.", {"phase": "kv_capacity", "requested_mib": 3164.16, "free_mib": 245.76}),
    ("(EngineCore pid=7579) ERROR 10-01 04:29:49 [core.py:1385] ValueError: To serve at least one request with the "
     "model's max seq len (262144), (5.84 GiB KV cache is needed, which is larger than the available KV ca",
     {"phase": "kv_capacity", "requested_mib": 5980.16}),
    # failures not about memory: Windows' crash record, a GPU reset, vllm-ascend's stream resources
    ("Faulting application name: llama-server.exe, version: 0.0.0.0\nException code: 0xc0000409",
     {"phase": "unknown"}),
    ("thread '<unnamed>' panicked at mistralrs-core/src/pipeline/mistral.rs:409:17:", {"phase": "unknown"}),
    ("llama-server: error while loading shared libraries: libcuda.so.1: cannot open shared object file",
     {"phase": "unknown"}),
    ("(EngineCore_DP0 pid=88213) ERROR 08-20 16:05:12 [core.py:935] RuntimeError: ACL graph capture failed with a known "
     "stream-resource exhaustion signature.\n(EngineCore_DP0 pid=88213) ERROR 08-20 16:05:12 [core.py:935] The stream "
     "resources are insufficient. error code is 207008", {"phase": "unknown"}),
    ("OrtException: Non-zero status code returned while running DmlFusedNode_0_3 node. Exception(3) tid(2b60) 887A0005 "
     "The GPU device instance has been suspended.", {"phase": "unknown"}),
    # llama-server (2025): a refused request, then the server idles -- the refusal is the failure, not recovered
    ("slot update_slots: id  0 | task 2119 | new prompt, n_ctx_slot = 131072, n_keep = 0, n_prompt_tokens = 8960912\n"
     "srv    send_error: task id = 2119, error: the request exceeds the available context size. try increasing the "
     "context size or enable context shift\nsrv  update_slots: all slots are idle", {"phase": "kv_capacity"}),
    # vLLM V0: one worker's torch OOM, then another's "while processing method start_worker_execution_loop"
    ("(VllmWorkerProcess pid=1) ERROR torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 128.00 MiB. GPU 2 "
     "has a total capacity of 79.33 GiB of which 16.00 MiB is free.\n(VllmWorkerProcess pid=2) ERROR Exception in worker "
     "VllmWorkerProcess while processing method start_worker_execution_loop.", {"phase": "compute_buffer"}),
    # TensorRT-LLM prints its KV pool (kvCacheManager.cpp, 2024 and 2025 wordings)
    ("[TensorRT-LLM][INFO] Allocate 956301312 bytes for k/v cache.\nE0306 backend_model.cc:691] ERROR: Failed to create "
     "instance: maxTokensInPagedKvCache (29184) must be large enough to process at least 1 sequence to completion",
     {"phase": "kv_capacity"}),
    # Windows' VirtualLock warning (llama-mmap.cpp) is not a failure; ggml-cuda's pinned refusal is CUDA's
    ("warning: failed to VirtualLock 17825792-byte buffer (after previously locking 1407303680 bytes): The paging file "
     "is too small for this operation to complete.\nWARNING: failed to allocate 258.00 MB of pinned memory: out of "
     "memory\nTraceback (most recent call last):", {"backend": "cuda"}),
    # ggml-rpc names its device "RPC0[host:port]"
    ("E alloc_tensor_range: failed to allocate RPC0[<ip>:50052] buffer of size 193608946688\nE llama_model_load: error "
     "loading model: unable to allocate RPC0[<ip>:50052] buffer", {"phase": "model_weights", "failing_device": "RPC0"}),
    # the CPU's repacked weights are host memory; sizes retyped with their digits grouped
    ("ggml_aligned_malloc: insufficient memory (attempted to allocate 103 000 MB)\n"
     "alloc_tensor_range: failed to allocate CPU_REPACK buffer of size 108 000 000 000\n"
     "llama_model_load: error loading model: unable to allocate CPU_REPACK buffer",
     {"phase": "model_weights", "failing_device": "CPU", "requested_mib": 102996.83}),
    # a binding's load failure after an unplaced allocation error (Tabby's llama-cpp-bindings)
    ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 1640.75 MiB on device 1: cudaMalloc failed: out of memory\n"
     "2024-02-20T04:43:32.423773Z ERROR llama_cpp_bindings: crates/llama-cpp-bindings/src/lib.rs:65: Unable to load "
     "model: /data/models/q8_0.v2.gguf", {"phase": "model_weights", "failing_device": "CUDA1"}),
    # Ollama's summary pasted above the runner's log: the allocation below has the numbers
    ("Error: llama runner process has terminated: signal: aborted (core dumped) error loading model: unable to allocate "
     "backend buffer\nggml_backend_cuda_buffer_type_alloc_buffer: allocating 15863.15 MiB on device 0: cudaMalloc failed: "
     "out of memory\nllama_model_load: error loading model: unable to allocate backend buffer",
     {"phase": "model_weights", "failing_device": "CUDA0", "requested_mib": 15863.15}),
    # Ollama's one-line error naming the host buffer type
    ('"llama runner process has terminated: error loading model: unable to allocate CUDA_Host buffer"',
     {"phase": "model_weights", "failing_device": "CUDA_Host"}),
]


@pytest.mark.parametrize("log,want", HUNT9)
def test_hunt9_excerpts(log, want):
    f = analyze_text(log)["failure"]
    assert {k: f[k] for k in want} == want


# --- formats read in the round-13/14 tuning (2026-12-02) -----------------------------------------------------------

def test_a_vulkan_pipeline_error_is_not_an_allocation():
    """ggml-vulkan's "vk::Device::createComputePipeline: ErrorUnknown" (a shader the driver could not build) after every
    buffer was allocated: a failure, not a memory phase (only VkResult's OutOf*Memory errors are allocations)."""
    log = ("llama_context:    Vulkan0 compute buffer size =   300.75 MiB\n"
           "ggml_vulkan: Compute pipeline creation failed for flash_attn_f32_f16_aligned_f32accD128_cm1\n"
           "ggml_vulkan: vk::Device::createComputePipeline: ErrorUnknown\n"
           "terminate called after throwing an instance of 'vk::UnknownError'\n")
    f = analyze_text(log)["failure"]
    assert f["phase"] == "unknown" and f["backend"] == "vulkan", f


def test_metal_backend_that_could_not_start_is_not_memory():
    """ggml-metal's library that did not compile, then "failed to allocate context" (its backend object) and
    llama-context's "failed to initialize Metal backend": a refused backend, phase unknown, not the context."""
    log = ("ggml_metal_init: error: failed to initialize the Metal library\n"
           "ggml_backend_metal_device_init: error: failed to allocate context\n"
           "llama_init_from_model: failed to initialize the context: failed to initialize Metal backend\n"
           "common_init_from_params: failed to create context with model 'm.gguf'\n")
    d = analyze_text(log)
    assert d["failure"]["phase"] == "unknown" and d["suggestions"] == [], d["failure"]


def test_a_crash_looping_pod_is_a_failure():
    log = "    State:          Waiting\n      Reason:       CrashLoopBackOff\n    Last State:     Terminated\n"
    assert analyze_text(log)["failure"]["phase"] == "unknown"


def test_torch_allocator_warning_is_the_failure_only_when_the_run_fails():
    warn = ("[rank3]:[W814 16:06:55.441716306 CUDACachingAllocator.cpp:3933] memory allocation failed with OOM on "
            "device 3 while trying to allocate 3177185280 bytes (free: 1243414528, total: 85094825984).\n")
    carried_on = analyze_text(warn + "INFO 08-14 16:07:00 [loggers.py:127] Engine 000: Avg prompt throughput: 9.1 "
                              "tokens/s\n")
    assert carried_on["failure"]["phase"] == "none"
    assert any(x["kind"] == "recovered_allocation" for x in carried_on["findings"])
    failed = analyze_text(warn + "(Worker_TP1 pid=1) ERROR 08-14 16:06:55 [multiproc_executor.py:1020] WorkerProc hit "
                          "an exception.\nTraceback (most recent call last):\n")["failure"]
    assert (failed["failing_device"], failed["requested_mib"], failed["free_mib"], failed["verdict"]) == \
        ("CUDA3", pytest.approx(3030.0, abs=0.01), pytest.approx(1185.81, abs=0.01), "exceeds_free")


def test_a_chained_traceback_names_the_step_after_the_oom():
    """vLLM V1: the OOM is raised first, its chained traceback then shows run_busy_loop (serving): compute."""
    log = ("(EngineCore_DP0 pid=1) ERROR 10-24 01:26:57 [core.py:710] torch.OutOfMemoryError: CUDA out of memory. Tried "
           "to allocate 960.00 MiB. GPU 0 has a total capacity of 79.14 GiB of which 712.75 MiB is free.\n"
           "(EngineCore_DP0 pid=1) ERROR 10-24 01:26:57 [core.py:710] \n"
           "(EngineCore_DP0 pid=1) ERROR 10-24 01:26:57 [core.py:710] The above exception was the direct cause of the "
           "following exception:\n"
           "(EngineCore_DP0 pid=1) ERROR 10-24 01:26:57 [core.py:710] \n"
           "(EngineCore_DP0 pid=1) ERROR 10-24 01:26:57 [core.py:710] Traceback (most recent call last):\n"
           "(EngineCore_DP0 pid=1) ERROR 10-24 01:26:57 [core.py:710]   File \"/v/vllm/v1/engine/core.py\", line 701, "
           "in run_engine_core\n"
           "(EngineCore_DP0 pid=1) ERROR 10-24 01:26:57 [core.py:710]     engine_core.run_busy_loop()\n")
    assert analyze_text(log)["failure"]["phase"] == "compute_buffer"


def test_a_settings_dump_is_not_a_step():
    """LMDeploy's "TurbomindEngineConfig(..., max_prefill_token_num=8192, ...)" names settings ("_prefill"), not the
    step of the OOM after it."""
    log = ("TurbomindEngineConfig(dtype='auto', model_format='awq', tp=1, session_len=128000, max_batch_size=1, "
           "cache_max_entry_count=0.8, max_prefill_token_num=8192, num_tokens_per_iter=0)\n"
           "[TM][ERROR] CUDA runtime error: out of memory /opt/lmdeploy/src/turbomind/core/allocator.cc:49\n")
    assert analyze_text(log)["failure"]["phase"] == "unknown"


def test_an_oom_after_a_python_server_came_up_is_serving():
    log = ("INFO:     Application startup complete.\n"
           "future: <Task finished name='Task-5' coro=<RouterManager.loop_for_fwd() done> "
           "exception=RuntimeError('Triton Error [CUDA]: out of memory')>\n")
    assert analyze_text(log)["failure"]["phase"] == "compute_buffer"


def test_ggml_cuda_error_block_names_the_device_of_any_reason():
    log = ("CUDA error: the resource allocation failed\n  current device: 1, in function cublas_handle at "
           "ggml/src/ggml-cuda/common.cuh:1500\n  cublasCreate_v2(&cublas_handles[device])\n")
    assert analyze_text(log)["failure"]["failing_device"] == "CUDA1"


def test_a_wrapped_old_torch_oom_gives_device_and_free():
    log = ("OutOfMemoryError: CUDA out of memory. Tried to allocate 136.00 MiB (GPU 0; 15.89 GiB\n"
           "total capacity; 15.53 GiB already allocated; 84.12 MiB free; 15.53 GiB reserved in\n")
    f = analyze_text(log)["failure"]
    assert (f["failing_device"], f["requested_mib"], f["free_mib"]) == ("CUDA0", 136.0, 84.12), f


def test_lm_studio_load_dialog_is_a_failure():
    log = ("\U0001f972 Failed to load the model\n\nEngine protocol runtime llama-server for mmVG exited before becoming "
           "healthy. exitCode=1, signal=null\n")
    assert analyze_text(log)["failure"]["phase"] == "unknown"


@pytest.mark.parametrize(("line", "n_ctx", "free_mib"), [
    ("llama-server: failed to allocate KV cache (requested ctx=128k, gpu memory free=6 GiB)", 131072, 6144.0),
    ("n_ctx 131072 doesn't fit, only 6 GB free", 131072, 6144.0),
    ("failed to allocate KV cache: n_ctx = 131072, free VRAM 6144 MiB", 131072, 6144.0),
    ("OOM at 32k ctx on a 24GB 4090", 32768, None),
    ("CUDA out of memory with -c 65536 on RTX 3060 12GB, 2.5 GiB free", 65536, 2560.0),
    ("kv cache allocation failed with -c 65536 -ctk q8_0 -ctv q8_0, 3 GB free on CUDA0", 65536, 3072.0),
])
def test_typed_summaries_in_the_forms_people_write_them(line, n_ctx, free_mib):
    """A context with a k suffix is thousands of tokens (x 1024), the free memory is read in any order ("free VRAM N",
    "N GiB free", "only N GB free"): a KV-cache failure with those numbers, never "no failure"."""
    d = analyze_text(line + "\n")
    assert d["failure"]["phase"] == "kv_cache", d["failure"]
    assert d["memory"]["inputs"]["n_ctx"] == n_ctx and d["failure"]["free_mib"] == free_mib, (d["memory"]["inputs"],
                                                                                             d["failure"])


def test_a_typed_cache_type_is_the_one_sized():
    d = analyze_text("kv cache allocation failed with -c 65536 -ctk q8_0 -ctv q8_0, 3 GB free on CUDA0\n")
    assert d["memory"]["inputs"]["cache_type_k"] == "q8_0"
    assert "quantize-kv-cache" not in [s["id"] for s in d["suggestions"]]


def test_an_engines_own_context_refusal_is_not_read_as_a_typed_summary():
    d = analyze_text("Error: InsufficientMemoryError: A context size of 4096 with 4 sequences is too large for the "
                     "available VRAM\n")
    assert d["failure"]["phase"] == "memory_budget"


def test_docker_and_journald_json_records_read_as_their_message():
    """docker's json-file driver and journalctl -o json wrap each line: the message inside is what is read."""
    from kvreport.logs.common import clean_line

    assert clean_line('{"log":"print_info: n_layer          = 32\\n","stream":"stderr","time":"2025-07-01T10:22:00Z"}') \
        == "print_info: n_layer          = 32"
    assert clean_line('{"_PID":"2231","MESSAGE":"llama_context: n_ctx         = 131072","PRIORITY":"6"}') \
        == "llama_context: n_ctx         = 131072"


def test_a_python_clients_exceed_context_error_gives_the_tokens():
    log = ("openai.BadRequestError: Error code: 400 - {'error': {'code': 400, 'message': 'the request exceeds the "
           "available context size, try increasing it', 'type': 'exceed_context_size_error', 'n_prompt_tokens': 9217, "
           "'n_ctx': 8192}}\n")
    first = analyze_text(log)["suggestions"][0]
    assert first["id"] == "raise-ctx" and first["change"] == {"--ctx-size": 9472}, first


@pytest.mark.parametrize("text", [
    "I used to get OOM at 32k ctx but with -c 16384 it works now\n",
    "No more 'failed to allocate buffer for kv cache' after upgrading to b5000 — -c 32768 loads fine now.\n",
    "how much memory does 128k ctx need? will it OOM on a 4090?\n",
    "Is -c 0 going to OOM on a 3090 with Qwen3-30B-A3B (262k train ctx)?\n",
    "Feature request: print the projected KV size before 'failed to allocate compute buffer' happens\n",
    "Dec 01 10:00:00 host ollama[207001]: time=2025-01-01T00:00:00Z level=INFO source=server.go:1 msg=\"llama runner "
    "started in 2.1 seconds\"\n",
    "llama_mmap: warning: failed to munlock buffer: Cannot allocate memory\n",
])
def test_prose_and_numbers_that_report_no_failure(text):
    """Prose that mentions a memory error without reporting one, a PID that happens to be CANN's error code, and
    llama.cpp's munlock warning at exit: no failure (a report that asks a question still is one)."""
    assert analyze_text(text)["failure"]["phase"] == "none"


def test_a_report_that_ends_with_a_question_is_still_a_report():
    d = analyze_text("Error: model requires more system memory (18.7 GiB) than is available (4.1 GiB), but I have 32GB "
                     "RAM?\n")
    assert d["failure"]["phase"] == "memory_budget"


def test_rust_backtrace_frames_after_the_error_place_it():
    # candle-based engines print the error, then std's backtrace innermost first (vllm.rs, guoqingbao/xinfer#182;
    # candle#2631): the first frame that names a step places the OOM, however deep
    head = 'Error: DriverError(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")\n   0: candle_core::error::Error::bt\n'
    frames = ["candle_core::device::Device::zeros", "candle_core::tensor::Tensor::zeros_impl",
              "candle_core::tensor::Tensor::zeros", "vllm_rs::core::runner::ModelRunner::init_kv_cache",
              "vllm_rs::core::runner::ModelRunner::new"]
    log = head + "".join(f"  {i + 1:>2}: {fr}\n" for i, fr in enumerate(frames))
    assert analyze_text(log)["failure"]["phase"] == "kv_cache"
    weights = head + "   1: candle_core::tensor::Tensor::from_slice\n   2: candle_core::safetensors::convert_slice\n" \
                     "   3: candle_core::safetensors::MmapedSafetensors::load\n"
    assert analyze_text(weights)["failure"]["phase"] == "model_weights"


def test_a_finished_progress_bar_is_no_step():
    # "Loading weights: 100%|...| 206/206" is done: an OOM after it is not the weights' (FreeToken#419)
    log = ("[13:32:43] stderr/INFO  Loading weights: 100%|██████████| 206/206 [00:07<00:00, 27.94it/s]\n"
           "[13:33:58] stdout/ERROR  Backend supervisor: AssertionError: Not enough memory for KV cache, try reducing "
           "--num-pages\n")
    assert analyze_text(log)["failure"]["phase"] != "model_weights"


def test_case_variants_cover_every_capitalisation():
    from kvreport.logs.common import case_variants

    v = case_variants("out of memory")
    assert {"out of memory", "Out of memory", "Out of Memory", "Out Of Memory", "OUT OF MEMORY"} <= set(v)
    assert len(v) == len(set(v)) == 9


def test_a_load_error_cut_after_its_colon_is_the_refused_allocation_before_it():
    # text-generation-webui relayed llama.cpp's loader error without its reason (oobabooga/textgen#5987): right after a
    # refused backend allocation, "error loading model:" is that allocation, i.e. the weights
    log = ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 30649.55 MiB on device 0: cudaMalloc failed: out of "
           "memory\nllama_model_load: error loading model:\n")
    f = analyze_text(log)["failure"]
    assert (f["phase"], f["failing_device"], f["requested_mib"]) == ("model_weights", "CUDA0", 30649.55)
    assert f["final_error"] == "llama_model_load: error loading model:"
    # without the refused allocation before it, a cut reason says nothing about memory
    assert analyze_text("llama_model_load: error loading model:\n")["failure"]["phase"] == "unknown"


def test_a_lost_gpu_under_a_batch_suggests_shorter_kernels_first():
    """The driver reset the GPU under a prefill (Vulkan's ErrorDeviceLost, ollama#17870): a quarter of the micro-batch
    first (Ollama: num_batch), a known-good build after it."""
    d = analyze_text('time=2026-01-01T00:00:00Z level=INFO source=server.go:1 msg="llama runner started"\n'
                     "ollama: srv update_slots: decode() failed: vk::Queue::submit: ErrorDeviceLost\n")
    ids = [s["id"] for s in d["suggestions"]]
    assert d["failure"]["phase"] == "unknown" and ids[:2] == ["reduce-batch", "bisect-regression"], ids
    assert d["suggestions"][0]["change"] == {"num_batch": 128}


def test_vllms_sleep_mode_allocator_asks_for_a_smaller_fraction_first():
    """vLLM's cumem allocator failed to map its pools back (an RL trainer on the same GPU): a smaller
    gpu_memory_utilization first, below vLLM's default when the log shows no value."""
    d = analyze_text("Runtime Error: Cuda error: out of memory at /workspace/csrc/cumem_allocator.cpp: 62\n")
    first = d["suggestions"][0]
    assert d["engine"] == "vllm" and first["id"] == "lower-gpu-memory-utilization", first
    assert all(v < 0.9 for v in first["change"].values()), first


def test_a_warning_record_in_failure_words_that_the_program_carried_on_after_is_no_failure():
    """LMCache's WARNING record when its CPU buffer is full: vLLM goes on serving (LMCache#1285); the same words with
    a failure after them are the failure."""
    line = "[2025-08-09 17:55:57,778] LMCache WARNING: Failed to allocate memory for the KV cache.\n"
    d = analyze_text(line)
    assert d["failure"]["phase"] == "none" and any(x["kind"] == "recovered_allocation" for x in d["findings"])
    assert analyze_text(line + "Traceback (most recent call last):\n")["failure"]["phase"] != "none"


def test_a_count_limit_is_an_allocation_limit():
    d = analyze_text("RuntimeError: [metal::malloc] Resource limit (499000) exceeded\n")
    assert (d["engine"], d["failure"]["backend"], d["failure"]["verdict"]) == ("mlx-lm", "metal", "exceeds_alloc_limit")
