"""Engine command lines: split a shell line, find the engine invocation, parse its flags, rewrite it.

Two functions are the module's contract (docs/architecture.md):

* :func:`parse_command` takes a line exactly as a user typed or pasted it (env prefixes,
  ``cd … &&``, ``timeout``, ``nohup``, ``sudo``, ``bash -c '…'``, ``docker run … IMAGE``,
  backslash continuations, Windows paths, shell prompts) or an argv list, and returns what the
  engine was asked to do. It never raises: a line it cannot understand gives empty flags.
* :func:`with_changes` rewrites the engine part of a parsed command with some options set,
  replaced or removed (the suggestions' "changed command line").

Flag grammars:

* llama.cpp (llama-server, llama-cli, llama-completion, llama-bench…): the alias groups, arities
  and ``LLAMA_ARG_*`` environment equivalents below were taken from ``llama-server --help`` of a
  recent build (shared/captures/llama.cpp/45-info-llama-server-help, llama.cpp ``common/arg.cpp``),
  plus the older options that recent builds dropped (``--no-mmap``, ``--mlock``, bare ``-fa``…).
  Canonical names follow the field names of ``llama_context_params`` / ``common_params``
  (``n_ctx``, ``n_parallel``, ``n_gpu_layers``, ``cache_type_k``, ``n_batch``, ``n_ubatch``…).
* vLLM, SGLang, TGI: argparse/clap style, ``--max-model-len`` and ``--max_model_len`` are the same
  option; the canonical name is the ``dest`` (dashes to underscores).
* Ollama: ``ollama serve`` has no flags; its settings are ``OLLAMA_*`` environment variables
  (ollama ``envconfig/config.go``), parsed into ``flags`` by their lower-case names without prefix.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Any

from kvreport import engines, strict
from kvreport.units import GIB, MIB

# ---------------------------------------------------------------------------------------------
# llama.cpp grammar: "aliases | arity | env".  Arity: 0 bare flag, 1 one value, n one numeric
# value, ? optional on/off/auto value, 2 two values.  Source: `llama-server --help` (see above).
_LLAMA_SPEC = """
    -h --help --usage | 0
    --version | 0
    -cl --cache-list | 0
    --completion-bash | 0
    -t --threads | n | LLAMA_ARG_THREADS
    -tb --threads-batch | n
    -C --cpu-mask | 1
    -Cr --cpu-range | 1
    --cpu-strict | n
    --prio | n
    --poll | n
    -Cb --cpu-mask-batch | 1
    -Crb --cpu-range-batch | 1
    --cpu-strict-batch | n
    --prio-batch | n
    --poll-batch | n
    -c --ctx-size | n | LLAMA_ARG_CTX_SIZE
    -n --predict --n-predict | n | LLAMA_ARG_N_PREDICT
    -b --batch-size | n | LLAMA_ARG_BATCH
    -ub --ubatch-size | n | LLAMA_ARG_UBATCH
    --keep | n
    --swa-full | 0 | LLAMA_ARG_SWA_FULL
    -fa --flash-attn | ? | LLAMA_ARG_FLASH_ATTN
    --perf --no-perf | 0 | LLAMA_ARG_PERF
    -e --escape --no-escape | 0
    --rope-scaling | 1 | LLAMA_ARG_ROPE_SCALING_TYPE
    --rope-scale | n | LLAMA_ARG_ROPE_SCALE
    --rope-freq-base | n | LLAMA_ARG_ROPE_FREQ_BASE
    --rope-freq-scale | n | LLAMA_ARG_ROPE_FREQ_SCALE
    --yarn-orig-ctx | n | LLAMA_ARG_YARN_ORIG_CTX
    --yarn-ext-factor | n | LLAMA_ARG_YARN_EXT_FACTOR
    --yarn-attn-factor | n | LLAMA_ARG_YARN_ATTN_FACTOR
    --yarn-beta-slow | n | LLAMA_ARG_YARN_BETA_SLOW
    --yarn-beta-fast | n | LLAMA_ARG_YARN_BETA_FAST
    -kvo --kv-offload -nkvo --no-kv-offload | 0 | LLAMA_ARG_KV_OFFLOAD
    --repack -nr --no-repack | 0 | LLAMA_ARG_REPACK
    --no-host | 0 | LLAMA_ARG_NO_HOST
    -ctk --cache-type-k | 1 | LLAMA_ARG_CACHE_TYPE_K
    -ctv --cache-type-v | 1 | LLAMA_ARG_CACHE_TYPE_V
    -dt --defrag-thold | n | LLAMA_ARG_DEFRAG_THOLD
    --rpc | 1 | LLAMA_ARG_RPC
    -lm --load-mode | 1 | LLAMA_ARG_LOAD_MODE
    -lzm --lazy-mode | 1 | LLAMA_ARG_LAZY_MODE
    --numa | 1 | LLAMA_ARG_NUMA
    -dev --device | 1 | LLAMA_ARG_DEVICE
    --list-devices | 0
    -ot --override-tensor | 1 | LLAMA_ARG_OVERRIDE_TENSOR
    -cmoe --cpu-moe | 0 | LLAMA_ARG_CPU_MOE
    -ncmoe --n-cpu-moe | n | LLAMA_ARG_N_CPU_MOE
    -ncffn --n-cpu-ffn | n | LLAMA_ARG_N_CPU_FFN
    -ngl --gpu-layers --n-gpu-layers | n | LLAMA_ARG_N_GPU_LAYERS
    -sm --split-mode | 1 | LLAMA_ARG_SPLIT_MODE
    -ts --tensor-split | n | LLAMA_ARG_TENSOR_SPLIT
    -mg --main-gpu | n | LLAMA_ARG_MAIN_GPU
    -fit --fit | ? | LLAMA_ARG_FIT
    -fitt --fit-target | n | LLAMA_ARG_FIT_TARGET
    -fitc --fit-ctx | n | LLAMA_ARG_FIT_CTX
    --check-tensors | 0
    --override-kv | 1
    --op-offload --no-op-offload | 0
    --lora | 1
    --lora-scaled | 1
    --control-vector | 1
    --control-vector-scaled | 1
    --control-vector-layer-range | 2
    -m --model | 1 | LLAMA_ARG_MODEL
    -mu --model-url | 1 | LLAMA_ARG_MODEL_URL
    -dr --docker-repo | ? | LLAMA_ARG_DOCKER_REPO
    -hf -hfr --hf-repo | 1 | LLAMA_ARG_HF_REPO
    -hff --hf-file | 1 | LLAMA_ARG_HF_FILE
    -hft --hf-token | 1 | HF_TOKEN
    --log-disable | 0
    --log-file | 1 | LLAMA_ARG_LOG_FILE
    --log-jsonl --no-log-jsonl | 0 | LLAMA_ARG_LOG_JSONL
    --log-colors | ? | LLAMA_ARG_LOG_COLORS
    -v --verbose --log-verbose | 0
    --offline | 0 | LLAMA_ARG_OFFLINE
    -lv --verbosity --log-verbosity | n | LLAMA_ARG_LOG_VERBOSITY
    --log-prefix --no-log-prefix | 0 | LLAMA_ARG_LOG_PREFIX
    --log-timestamps --no-log-timestamps | 0 | LLAMA_ARG_LOG_TIMESTAMPS
    --spec-draft-type-k -ctkd --cache-type-k-draft | 1 | LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K
    --spec-draft-type-v -ctvd --cache-type-v-draft | 1 | LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V
    --samplers | 1
    -s --seed | n
    --sampler-seq --sampling-seq | 1
    --ignore-eos | 0
    --temp --temperature | n | LLAMA_ARG_TEMPERATURE
    --top-k | n | LLAMA_ARG_TOP_K
    --top-p | n | LLAMA_ARG_TOP_P
    --min-p | n | LLAMA_ARG_MIN_P
    --top-nsigma --top-n-sigma | n
    --xtc-probability | n
    --xtc-threshold | n
    --typical --typical-p | n
    --repeat-last-n | n
    --repeat-penalty | n | LLAMA_ARG_REPEAT_PENALTY
    --presence-penalty | n | LLAMA_ARG_PRESENCE_PENALTY
    --frequency-penalty | n | LLAMA_ARG_FREQUENCY_PENALTY
    --dry-multiplier | n
    --dry-base | n
    --dry-allowed-length | n
    --dry-penalty-last-n | n
    --dry-sequence-breaker | 1
    --adaptive-target | n
    --adaptive-decay | n
    --dynatemp-range | n
    --dynatemp-exp | n
    --mirostat | n
    --mirostat-lr | n
    --mirostat-ent | n
    -l --logit-bias | 1
    --grammar | 1
    --grammar-file | 1
    -j --json-schema | 1
    -jf --json-schema-file | 1
    -bs --backend-sampling | 0 | LLAMA_ARG_BACKEND_SAMPLING
    --spec-draft-hf -hfd -hfrd --hf-repo-draft | 1 | LLAMA_ARG_SPEC_DRAFT_HF_REPO
    --spec-draft-threads -td --threads-draft | n
    --spec-draft-threads-batch -tbd --threads-batch-draft | n
    --spec-draft-cpu-mask -Cd --cpu-mask-draft | 1
    --spec-draft-cpu-range -Crd --cpu-range-draft | 1
    --spec-draft-cpu-strict --cpu-strict-draft | n
    --spec-draft-prio --prio-draft | n
    --spec-draft-poll --poll-draft | n
    --spec-draft-cpu-mask-batch -Cbd --cpu-mask-batch-draft | 1
    --spec-draft-cpu-strict-batch --cpu-strict-batch-draft | n
    --spec-draft-prio-batch --prio-batch-draft | n
    --spec-draft-poll-batch --poll-batch-draft | n
    --spec-draft-override-tensor -otd --override-tensor-draft | 1
    --spec-draft-cpu-moe -cmoed --cpu-moe-draft | 0 | LLAMA_ARG_SPEC_DRAFT_CPU_MOE
    --spec-draft-n-cpu-moe --spec-draft-ncmoe -ncmoed --n-cpu-moe-draft | n | LLAMA_ARG_SPEC_DRAFT_N_CPU_MOE
    --spec-draft-n-max | n | LLAMA_ARG_SPEC_DRAFT_N_MAX
    --spec-draft-n-min | n | LLAMA_ARG_SPEC_DRAFT_N_MIN
    --spec-synth-len | n | LLAMA_ARG_SPEC_SYNTH_LEN
    --spec-synth-rates | 1 | LLAMA_ARG_SPEC_SYNTH_RATES
    --spec-draft-p-split --draft-p-split | n | LLAMA_ARG_SPEC_DRAFT_P_SPLIT
    --spec-draft-p-min --draft-p-min | n | LLAMA_ARG_SPEC_DRAFT_P_MIN
    --spec-draft-backend-sampling --no-spec-draft-backend-sampling | 0 | LLAMA_ARG_SPEC_DRAFT_BACKEND_SAMPLING
    --spec-draft-sampling | 1 | LLAMA_ARG_SPEC_DRAFT_SAMPLING
    --spec-draft-device -devd --device-draft | 1
    --spec-draft-ngl -ngld --gpu-layers-draft --n-gpu-layers-draft | n | LLAMA_ARG_N_GPU_LAYERS_DRAFT
    --spec-draft-model -md --model-draft | 1 | LLAMA_ARG_SPEC_DRAFT_MODEL
    --spec-type | 1 | LLAMA_ARG_SPEC_TYPE
    --spec-ngram-mod-n-min | n
    --spec-ngram-mod-n-max | n
    --spec-ngram-mod-n-match | n
    --spec-ngram-simple-size-n | n
    --spec-ngram-simple-size-m | n
    --spec-ngram-simple-min-hits | n
    --spec-ngram-map-k-size-n | n
    --spec-ngram-map-k-size-m | n
    --spec-ngram-map-k-min-hits | n
    --spec-ngram-map-k4v-size-n | n
    --spec-ngram-map-k4v-size-m | n
    --spec-ngram-map-k4v-min-hits | n
    --draft --draft-n --draft-max | n | LLAMA_ARG_DRAFT_MAX
    --draft-min --draft-n-min | n | LLAMA_ARG_DRAFT_MIN
    --spec-ngram-size-n | n
    --spec-ngram-size-m | n
    --spec-ngram-min-hits | n
    -lcs --lookup-cache-static | 1
    -lcd --lookup-cache-dynamic | 1
    --kv-unified-per-slot | n | LLAMA_ARG_KV_UNIFIED_PER_SLOT
    -ctxcp --ctx-checkpoints --swa-checkpoints | n | LLAMA_ARG_CTX_CHECKPOINTS
    -cms --checkpoint-min-step | n | LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT
    -cram --cache-ram | n | LLAMA_ARG_CACHE_RAM
    -kvu --kv-unified -no-kvu --no-kv-unified | 0 | LLAMA_ARG_KV_UNIFIED
    --cache-idle-slots --no-cache-idle-slots | 0 | LLAMA_ARG_CACHE_IDLE_SLOTS
    --context-shift --no-context-shift | 0 | LLAMA_ARG_CONTEXT_SHIFT
    -r --reverse-prompt | 1
    -sp --special | 0
    --warmup --no-warmup | 0
    --spm-infill | 0
    --pooling | 1 | LLAMA_ARG_POOLING
    -np --parallel | n | LLAMA_ARG_N_PARALLEL
    -cb --cont-batching -nocb --no-cont-batching | 0 | LLAMA_ARG_CONT_BATCHING
    -mm --mmproj | 1 | LLAMA_ARG_MMPROJ
    -mmu --mmproj-url | 1 | LLAMA_ARG_MMPROJ_URL
    --mmproj-auto --no-mmproj --no-mmproj-auto | 0 | LLAMA_ARG_MMPROJ_AUTO
    --mmproj-offload --no-mmproj-offload | 0 | LLAMA_ARG_MMPROJ_OFFLOAD
    -mmdev --mmproj-device | 1 | MTMD_BACKEND_DEVICE
    --image-min-tokens | n | LLAMA_ARG_IMAGE_MIN_TOKENS
    --image-max-tokens | n | LLAMA_ARG_IMAGE_MAX_TOKENS
    --mtmd-batch-max-tokens | n | LLAMA_ARG_MTMD_BATCH_MAX_TOKENS
    --video-fps | n | LLAMA_ARG_VIDEO_FPS
    --video-timestamp-interval | n | LLAMA_ARG_VIDEO_TIMESTAMP_INTERVAL
    --video-ffmpeg-dir | 1 | LLAMA_ARG_VIDEO_FFMPEG_DIR
    -a --alias | 1 | LLAMA_ARG_ALIAS
    --tags | 1 | LLAMA_ARG_TAGS
    --embd-normalize | n
    --host | 1 | LLAMA_ARG_HOST
    --port | n | LLAMA_ARG_PORT
    --reuse-port | 0 | LLAMA_ARG_REUSE_PORT
    --path | 1 | LLAMA_ARG_STATIC_PATH
    --cors-origins | 1 | LLAMA_ARG_CORS_ORIGINS
    --cors-methods | 1 | LLAMA_ARG_CORS_METHODS
    --cors-headers | 1 | LLAMA_ARG_CORS_HEADERS
    --cors-credentials --no-cors-credentials | 0 | LLAMA_ARG_CORS_CREDENTIALS
    --api-prefix | 1 | LLAMA_ARG_API_PREFIX
    --ui-config --webui-config | 1 | LLAMA_ARG_UI_CONFIG
    --ui-config-file --webui-config-file | 1 | LLAMA_ARG_UI_CONFIG_FILE
    --ui-mcp-proxy --webui-mcp-proxy --no-ui-mcp-proxy --no-webui-mcp-proxy | 0 | LLAMA_ARG_UI_MCP_PROXY
    --tools | 1 | LLAMA_ARG_TOOLS
    --tools-runtime | 1 | LLAMA_ARG_TOOLS_RUNTIME
    --mcp-servers-config | 1 | LLAMA_ARG_MCP_SERVERS_CONFIG
    --mcp-servers-json | 1 | LLAMA_ARG_MCP_SERVERS_JSON
    -ag --agent -no-ag --no-agent | 0 | LLAMA_ARG_AGENT
    --ui --webui --no-ui --no-webui | 0 | LLAMA_ARG_UI
    --embedding --embeddings | 0 | LLAMA_ARG_EMBEDDINGS
    --rerank --reranking | 0 | LLAMA_ARG_RERANKING
    --api-key | 1 | LLAMA_API_KEY
    --api-key-file | 1 | LLAMA_ARG_API_KEY_FILE
    --ssl-key-file | 1 | LLAMA_ARG_SSL_KEY_FILE
    --ssl-cert-file | 1 | LLAMA_ARG_SSL_CERT_FILE
    --chat-template-kwargs | 1 | LLAMA_ARG_CHAT_TEMPLATE_KWARGS
    -to --timeout | n | LLAMA_ARG_TIMEOUT
    --sse-ping-interval | n | LLAMA_ARG_SSE_PING_INTERVAL
    --threads-http | n | LLAMA_ARG_THREADS_HTTP
    --cache-prompt --no-cache-prompt | 0 | LLAMA_ARG_CACHE_PROMPT
    --cache-reuse | n | LLAMA_ARG_CACHE_REUSE
    --metrics | 0 | LLAMA_ARG_ENDPOINT_METRICS
    --props | 0 | LLAMA_ARG_ENDPOINT_PROPS
    --slots --no-slots | 0 | LLAMA_ARG_ENDPOINT_SLOTS
    --slot-save-path | 1
    --media-path | 1
    --models-dir | 1 | LLAMA_ARG_MODELS_DIR
    --models-preset | 1 | LLAMA_ARG_MODELS_PRESET
    --models-max | n | LLAMA_ARG_MODELS_MAX
    --models-autoload --no-models-autoload | 0 | LLAMA_ARG_MODELS_AUTOLOAD
    --jinja --no-jinja | 0 | LLAMA_ARG_JINJA
    --reasoning-format | 1 | LLAMA_ARG_THINK
    -rea --reasoning | ? | LLAMA_ARG_REASONING
    --reasoning-effort | 1 | LLAMA_ARG_REASONING_EFFORT
    --reasoning-budget | n | LLAMA_ARG_THINK_BUDGET
    --reasoning-budget-message | 1 | LLAMA_ARG_THINK_BUDGET_MESSAGE
    --reasoning-preserve --no-reasoning-preserve | 0 | LLAMA_ARG_REASONING_PRESERVE
    --chat-template | 1 | LLAMA_ARG_CHAT_TEMPLATE
    --chat-template-file | 1 | LLAMA_ARG_CHAT_TEMPLATE_FILE
    --skip-chat-parsing --no-skip-chat-parsing | 0 | LLAMA_ARG_SKIP_CHAT_PARSING
    --prefill-assistant --no-prefill-assistant | 0 | LLAMA_ARG_PREFILL_ASSISTANT
    -sps --slot-prompt-similarity | 1
    --lora-init-without-apply | 0
    --sleep-idle-seconds | n
    --log-prompts-dir | 1
    --embd-gemma-default | 0
    --fim-qwen-1.5b-default | 0
    --fim-qwen-3b-default | 0
    --fim-qwen-7b-default | 0
    --fim-qwen-7b-spec | 0
    --fim-qwen-14b-spec | 0
    --fim-qwen-30b-default | 0
    --gpt-oss-20b-default | 0
    --gpt-oss-120b-default | 0
    --vision-gemma-4b-default | 0
    --vision-gemma-12b-default | 0
    --spec-default | 0
    --mmap --no-mmap | 0 | LLAMA_ARG_MMAP
    --mlock | 0 | LLAMA_ARG_MLOCK
    -dio --direct-io -ndio --no-direct-io | 0 | LLAMA_ARG_DIO
    --memory-f32 | 0
    -cd --ctx-size-draft | n | LLAMA_ARG_CTX_SIZE_DRAFT
    -gan --grp-attn-n | n
    -gaw --grp-attn-w | n
    -ps --p-split | n
    -p --prompt | 1
    -f --file | 1
    -sys --system-prompt | 1
    -sysf --system-prompt-file | 1
    -i --interactive | 0
    -if --interactive-first | 0
    -cnv --conversation -no-cnv --no-conversation | 0
    -st --single-turn | 0
    -mli --multiline-input | 0
    --in-prefix | 1
    --in-suffix | 1
    --in-prefix-bos | 0
    --color | ?
    --no-display-prompt | 0
    --verbose-prompt | 0
    -ins --instruct | 0
    --simple-io | 0
    -o --output | 1
    --n-gpu-layers-draft | n
    --fit-print | ?
"""

_CANONICAL_OVERRIDES = {
    "ctx_size": "n_ctx",
    "parallel": "n_parallel",
    "gpu_layers": "n_gpu_layers",
    "batch_size": "n_batch",
    "ubatch_size": "n_ubatch",
    "predict": "n_predict",
    "kv_offload": "no_kv_offload",  # inverted: -nkvo gives no_kv_offload=True
    "spec_draft_ngl": "n_gpu_layers_draft",
    "spec_draft_model": "model_draft",
    "spec_draft_type_k": "cache_type_k_draft",
    "spec_draft_type_v": "cache_type_v_draft",
    "spec_draft_device": "device_draft",
    "ctx_size_draft": "n_ctx_draft",
    "verbosity": "verbosity",
    "hf_repo": "hf_repo",
}
_INVERTED = {"no_kv_offload"}
_NEGATIVE_SHORT = {"-nkvo", "-nr", "-nocb", "-ndio", "-no-cnv", "-no-kvu", "-no-ag"}
_ON_OFF_WORDS = {"on": "on", "off": "off", "auto": "auto", "true": "on", "false": "off", "1": "on",
                 "0": "off", "enabled": "on", "disabled": "off", "yes": "on", "no": "off"}
_TRUE_WORDS = {"1", "true", "on", "yes", "enabled", "y"}


class _Opt:
    __slots__ = ("aliases", "arity", "env", "canonical", "negatives")

    def __init__(self, aliases: list[str], arity: str, env: str | None):
        self.aliases = aliases
        self.arity = arity
        self.env = env
        self.negatives = {a for a in aliases if a.startswith(("--no-", "-no-")) or a in _NEGATIVE_SHORT}
        positives = [a for a in aliases if a not in self.negatives]
        longs = [a for a in positives if a.startswith("--")] or [a for a in aliases if a.startswith("--")]
        base = (longs[0] if longs else aliases[0]).lstrip("-").replace("-", "_")
        if not positives and base.startswith("no_"):
            base = base  # a lone negative flag (--no-host): its own name, value True
        self.canonical = _CANONICAL_OVERRIDES.get(base, base)


def _load_llama_grammar() -> tuple[dict[str, _Opt], dict[str, _Opt], dict[str, _Opt]]:
    by_alias: dict[str, _Opt] = {}
    by_env: dict[str, _Opt] = {}
    by_canon: dict[str, _Opt] = {}
    for row in _LLAMA_SPEC.strip().splitlines():
        parts = [p.strip() for p in row.split("|")]
        opt = _Opt(parts[0].split(), parts[1], parts[2] if len(parts) > 2 and parts[2] else None)
        for a in opt.aliases:
            by_alias.setdefault(a, opt)
        if opt.env:
            by_env.setdefault(opt.env, opt)
        by_canon.setdefault(opt.canonical, opt)
    # Older environment spellings that llama.cpp still reads.
    if "mmap" in by_canon:
        by_env.setdefault("LLAMA_ARG_NO_MMAP", by_canon["mmap"])
    if "no_kv_offload" in by_canon:
        by_env.setdefault("LLAMA_ARG_NO_KV_OFFLOAD", by_canon["no_kv_offload"])
    return by_alias, by_env, by_canon


_LLAMA_BY_ALIAS, _LLAMA_BY_ENV, _LLAMA_BY_CANON = _load_llama_grammar()

# ---------------------------------------------------------------------------------------------
# Python engines (argparse) and TGI (clap): flags whose presence alone means True.
_PY_BOOL_FLAGS = {
    # vLLM (vllm/engine/arg_utils.py)
    "enforce_eager", "trust_remote_code", "enable_prefix_caching", "enable_chunked_prefill",
    "disable_log_stats", "disable_log_requests", "enable_log_requests", "enable_auto_tool_choice",
    "enable_lora", "disable_custom_all_reduce", "enable_expert_parallel", "async_scheduling",
    "disable_sliding_window", "enable_sleep_mode", "skip_tokenizer_init", "disable_frontend_multiprocessing",
    "headless", "api_server_count_auto", "calculate_kv_scales", "enable_prompt_tokens_details",
    "fully_sharded_loras", "use_v2_block_manager", "disable_async_output_proc", "kv_sharing_fast_prefill",
    # SGLang (sglang/srt/server_args.py)
    "disable_radix_cache", "disable_cuda_graph", "disable_cuda_graph_padding", "enable_torch_compile",
    "enable_dp_attention", "enable_mixed_chunk", "disable_overlap_schedule", "enable_metrics",
    "enable_hierarchical_cache", "enable_p2p_check", "disable_chunked_prefix_cache", "enable_memory_saver",
    "skip_server_warmup", "enable_ep_moe", "enable_deepep_moe", "disable_shared_experts_fusion",
    # TGI (launcher/src/main.rs)
    "disable_custom_kernels", "json_output", "disable_grammar_support", "disable_usage_stats",
}
_PY_SHORT = {
    "vllm": {"-tp": "tensor_parallel_size", "-pp": "pipeline_parallel_size", "-dp": "data_parallel_size",
             "-q": "quantization", "-O": "compilation_config", "-dcp": "decode_context_parallel_size"},
    "sglang": {"--tp": "tp_size", "--dp": "dp_size", "--pp": "pp_size", "--ep": "ep_size",
               "--model": "model_path", "--tokenizer": "tokenizer_path"},
    "tgi": {"-p": "port"},
}
_PY_ALIASES = {
    "vllm": {"model": "model"},
    "sglang": {"tp": "tp_size", "dp": "dp_size", "pp": "pp_size", "ep": "ep_size"},
    "tgi": {"max_input_tokens": "max_input_tokens", "max_input_length": "max_input_length"},
}
_HUMAN_INT = {"max_model_len", "max_num_batched_tokens"}  # vLLM accepts 32k (1000s) and 32K (1024s)

_OLLAMA_ENV = {
    "OLLAMA_CONTEXT_LENGTH": "context_length", "OLLAMA_NUM_PARALLEL": "num_parallel",
    "OLLAMA_KV_CACHE_TYPE": "kv_cache_type", "OLLAMA_FLASH_ATTENTION": "flash_attention",
    "OLLAMA_GPU_OVERHEAD": "gpu_overhead", "OLLAMA_MAX_LOADED_MODELS": "max_loaded_models",
    "OLLAMA_SCHED_SPREAD": "sched_spread", "OLLAMA_KEEP_ALIVE": "keep_alive",
    "OLLAMA_NEW_ENGINE": "new_engine", "OLLAMA_LLM_LIBRARY": "llm_library", "OLLAMA_MAX_QUEUE": "max_queue",
    "OLLAMA_MULTIUSER_CACHE": "multiuser_cache", "OLLAMA_NOHISTORY": "nohistory",
    "OLLAMA_LOAD_TIMEOUT": "load_timeout", "OLLAMA_MODELS": "models", "OLLAMA_HOST": "host",
    "OLLAMA_VULKAN": "vulkan", "OLLAMA_NUM_GPU": "num_gpu", "OLLAMA_DEBUG": "debug",
}
_OLLAMA_BOOL = {"flash_attention", "sched_spread", "new_engine", "multiuser_cache", "nohistory", "vulkan"}

# Environment variables that decide which devices an engine sees and how it places memory.
_PLACEMENT_ENV = re.compile(
    r"^(CUDA_VISIBLE_DEVICES|CUDA_DEVICE_ORDER|NVIDIA_VISIBLE_DEVICES|HIP_VISIBLE_DEVICES|ROCR_VISIBLE_DEVICES"
    r"|GPU_DEVICE_ORDINAL|HSA_OVERRIDE_GFX_VERSION|HCC_AMDGPU_TARGET|ONEAPI_DEVICE_SELECTOR|ZE_AFFINITY_MASK"
    r"|ZES_ENABLE_SYSMAN|SYCL_CACHE_PERSISTENT|SYCL_PI_LEVEL_ZERO_USE_IMMEDIATE_COMMANDLISTS"
    r"|GGML_[A-Z0-9_]+|LLAMA_ARG_[A-Z0-9_]+|LLAMA_[A-Z0-9_]+|OLLAMA_[A-Z0-9_]+|VLLM_[A-Z0-9_]+|SGLANG_[A-Z0-9_]+"
    r"|PYTORCH_CUDA_ALLOC_CONF|PYTORCH_HIP_ALLOC_CONF|PYTORCH_ALLOC_CONF|CUDA_LAUNCH_BLOCKING|OMP_NUM_THREADS"
    r"|MTMD_BACKEND_DEVICE|MUSA_VISIBLE_DEVICES|ASCEND_RT_VISIBLE_DEVICES|METAL_DEVICE_WRAPPER_TYPE"
    r"|GPU_MAX_HEAP_SIZE|GPU_MAX_ALLOC_PERCENT|GPU_SINGLE_ALLOC_PERCENT|CUDA_MODULE_LOADING)$"
)
_SECRET_ENV = re.compile(r"(TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$", re.I)

_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_OPERATORS = {"&&", "||", ";", "|", "&", "\n", ";;", "|&", "(", ")", "&;"}
_PUNCT = set("();<>|&\n")
_REDIRECT = re.compile(r"^(<<<|<<|<>|<&|>&|>>|>\||&>>|&>|<|>)$")
_SHELLS = {"bash", "sh", "zsh", "dash", "ksh", "fish", "cmd", "cmd.exe", "powershell", "pwsh",
           "powershell.exe", "pwsh.exe", "busybox"}
_NOISE = {"cd", "pushd", "popd", "export", "source", ".", "set", "unset", "ulimit", "echo", "printf", "make",
          "cmake", "git", "cat", "tee", "grep", "sleep", "wait", "true", "false", "pip", "pip3", "conda",
          "mkdir", "rm", "cp", "mv", "ls", "chmod", "kill", "trap", "read", "curl", "wget", "ninja", "apt",
          "apt-get", "activate", "deactivate", "nvidia-smi", "head", "tail", "awk", "sed", "less", "more",
          "if", "then", "fi", "do", "done", "for", "while", "else", "[", "[[", "test", "xargs", "clear"}
_PYTHONS = re.compile(r"^(python|python3|python3\.\d+|py|pypy3?|python\.exe|python3\.exe)$", re.I)


def _basename(token: str) -> str:
    name = re.split(r"[\\/]", token)[-1]
    if name.lower().endswith(".exe"):
        name = name[:-4]
    return name


# ---------------------------------------------------------------------------------------------
# Tokenizing


_PROMPT = re.compile(
    r"^\s*(?:\(\S+\)\s*)?(?:\$|#|%|>|PS [^>\n]*>|(?:[\w.-]+|<user>)@(?:[\w.-]+|<host>)(?::[^\s$#]*)?[$#]"
    r"|[\w.-]+:[^\s$#]*[$#])\s+")

# Redaction placeholders (kvreport.redact: ``<home>``, ``<user>``, ``<host>``, ``<token>``,
# ``<credentials>``, ``<ip-1>``, ``<email-2>``…) are ordinary words, never shell redirections: a
# redacted line (``-m <home>/m.gguf --api-key <token>``) must parse as the line it was.
PLACEHOLDER = re.compile(r"<[a-z][a-z_]*(?:-[a-z_]+)*(?:-\d+)?>")
_SENTINEL = re.compile("\ue000(\\d+)\ue001")


def _protect(text: str) -> tuple[str, list[str]]:
    """``text`` with each placeholder replaced by a sentinel word of private-use characters."""
    found: list[str] = []

    def sub(m: re.Match) -> str:
        found.append(m.group(0))
        return f"\ue000{len(found) - 1}\ue001"

    if "<" not in text:
        return text, found
    return PLACEHOLDER.sub(sub, text), found


def _restore(token: str, found: list[str]) -> str:
    if not found or "\ue000" not in token:
        return token
    return _SENTINEL.sub(lambda m: found[int(m.group(1))] if int(m.group(1)) < len(found) else m.group(0), token)


def _clean_line(line: str) -> tuple[str, bool]:
    """Remove prompts, code fences and continuations; say whether the line uses Windows paths."""
    text = line.replace("\r\n", "\n").replace("\r", "\n")
    windows = bool(re.search(r"(?:^|[\s\"'=])(?:[A-Za-z]:\\|\.\\|\\\\[\w.])", text))
    out = []
    for raw in text.split("\n"):
        if raw.strip().startswith("```"):
            continue
        raw = _PROMPT.sub("", raw, count=1) if _PROMPT.match(raw) and not raw.lstrip().startswith(("-", "#!")) else raw
        out.append(raw)
    text = "\n".join(out)
    text = re.sub(r"\\[ \t]*\n", " ", text) if not windows else re.sub(r"[\^`][ \t]*\n", " ", text)
    # PowerShell (` at the end of a line) and cmd.exe (^) continuations after a space
    text = re.sub(r"(?<=[ \t])[`^][ \t]*\n", " ", text)
    if windows:
        text = re.sub(r"\\[ \t]*\n(?=\s*-)", " ", text)
    # fd numbers glued to a redirection (2>&1, 2>/dev/null): drop the number so it is no argument.
    text = re.sub(r"(?<=\s)\d+(?=>|<(?![a-z][a-z_-]*(?:-\d+)?>))", "", text)
    return text, windows


def _split(text: str, windows: bool) -> list[str]:
    """Shell words and operators (&&, ||, ;, |, &, newline); quotes removed; placeholders are words."""
    text, found = _protect(text)
    return [_restore(t, found) for t in _split_words(text, windows)]


def _split_words(text: str, windows: bool) -> list[str]:
    if windows:
        out = []
        for tok in re.findall(r'"[^"]*"?|\'[^\']*\'?|&&|\|\||[;|&\n]|[^\s;|&"\']+(?:"[^"]*"?)?', text):
            if tok in _OPERATORS or tok == "\n":
                out.append(tok)
                continue
            if len(tok) >= 2 and tok[0] == tok[-1] and tok[0] in "\"'":
                tok = tok[1:-1]
            elif tok and tok[0] in "\"'":
                tok = tok[1:]
            out.append(tok.replace('"', ""))
        # glue tokens split only by quotes (--model="C:\a b")
        return [t for t in out if t != ""]
    for attempt in (text, text + '"', text + "'"):
        try:
            lex = shlex.shlex(attempt, posix=True, punctuation_chars="();<>|&\n")
            lex.whitespace = " \t\r"
            lex.whitespace_split = True
            return list(lex)
        except ValueError:
            continue
    return text.split()


def _open_quote(text: str) -> int | None:
    """Where the quote that ``text`` (a POSIX shell line) never closes opens, or None, read as :func:`_split` reads
    it (``shlex``): a backslash escapes the next character outside single quotes, a ``#`` outside quotes starts
    a comment up to the end of the line."""
    quote, opened, i = None, None, 0
    while i < len(text):
        ch = text[i]
        if quote is None:
            if ch == "#":
                nl = text.find("\n", i)
                i = len(text) if nl < 0 else nl
                continue
            if ch == "\\":
                i += 1
            elif ch in "\"'":
                quote, opened = ch, i
        elif ch == "\\" and quote == '"':
            i += 1
        elif ch == quote:
            quote = None
        i += 1
    return opened if quote is not None else None


def quote_problem(line: str) -> str | None:
    """Why the shell line ``line`` cannot be split as typed (a quote never closed, a trailing backslash), in a
    few words for a one-line error; None when it splits. :func:`parse_command` itself never fails: it closes
    the quote at the end of the line, which is right for a pasted log but not for a command the user gives."""
    cleaned, windows = _clean_line(line)
    text, _found = _protect(cleaned)
    if windows:  # cmd.exe and PowerShell quote with "; an apostrophe is a letter (C:\\Users\\O'Brien)
        at = text.rfind('"') if text.count('"') % 2 else None
    else:
        try:
            lex = shlex.shlex(text, posix=True, punctuation_chars="();<>|&\n")
            lex.whitespace = " \t\r"
            lex.whitespace_split = True
            list(lex)
            return None
        except ValueError:
            at = _open_quote(text)
    if at is None:
        return None if windows else "a backslash at the end escapes nothing"
    rest = " ".join(text[at + 1:].split())
    shown = _restore(rest if len(rest) <= 40 else rest[:40] + "…", _found)
    if not shown:
        return f"unbalanced quote: nothing closes the {text[at]} at the end of the line"
    return f"unbalanced quote: nothing closes the {text[at]} opened before: {shown}"


def _segments(tokens: list[str]) -> list[list[str]]:
    segs: list[list[str]] = [[]]
    skip_next = False
    for tok in tokens:
        if skip_next:
            skip_next = False
            continue
        if tok in _OPERATORS or (set(tok) <= _PUNCT and not _REDIRECT.match(tok) and set(tok) & set("\n;|&()")):
            segs.append([])
        elif _REDIRECT.match(tok) or (set(tok) <= _PUNCT and set(tok) & set("<>")):
            skip_next = tok not in ("<<", "<<<")  # the redirection target is no argument
        else:
            segs[-1].append(tok)
    return [s for s in segs if s]


# ---------------------------------------------------------------------------------------------
# Finding the engine inside wrappers


class _Found:
    """The engine invocation: env assignments, a kept prefix (docker run …), program part, args."""

    def __init__(self) -> None:
        self.env: dict[str, str] = {}
        self.prefix: list[str] = []
        self.program_part: list[str] = []
        self.args: list[str] = []
        self.program: str | None = None
        self.engine: str | None = None
        self.style: str | None = None  # "llama" | "py" | "ollama" | None
        self.assign_tokens: list[str] = []
        self.limits: dict[str, float] = {}


_WRAPPER_VALUE_OPTS = {
    "sudo": {"-u", "-g", "-C", "-D", "-p", "-r", "-t", "-U", "-h", "-T"},
    "env": {"-u", "-C", "--unset", "--chdir"},
    "nice": {"-n", "--adjustment"},
    "ionice": {"-c", "-n", "-p", "-t"},
    "timeout": {"-s", "--signal", "-k", "--kill-after"},
    "taskset": set(),
    "numactl": {"-N", "-m", "-C", "-p", "-i", "--cpunodebind", "--membind", "--physcpubind", "--preferred",
                "--interleave"},
    "stdbuf": {"-i", "-o", "-e"},
    "conda": {"-n", "--name", "-p", "--prefix"},
    "micromamba": {"-n", "--name", "-p", "--prefix"},
    "mamba": {"-n", "--name", "-p", "--prefix"},
    "uv": {"--with", "--python", "-p", "--project", "--directory", "--env-file", "--extra", "--group"},
    "srun": {"-p", "-n", "-N", "-c", "-t", "-G", "--gres", "--partition", "--time", "--mem", "-A", "--account"},
    "chrt": {"-p"},
    "xvfb-run": {"-a", "-s", "-n"},
    "gdb": set(),
    "prime-run": set(), "optirun": set(), "primusrun": set(), "nohup": set(), "time": {"-f", "-o"},
    "exec": {"-a"}, "command": set(), "builtin": set(), "caffeinate": set(), "strace": {"-o", "-e", "-p"},
    "valgrind": set(), "watch": {"-n"}, "systemd-run": {"-p", "--unit", "-u"}, "doas": {"-u"},
    "runuser": {"-u", "-g"}, "firejail": set(), "flatpak-spawn": set(), "wsl": {"-d", "-u", "-e"},
    "prlimit": {"-p", "--pid", "-o", "--output"},
}
_DOCKER_VALUE_OPTS = {
    "-e", "--env", "-v", "--volume", "-p", "--publish", "--name", "--gpus", "--device", "-w", "--workdir",
    "--network", "--net", "--ipc", "--shm-size", "--runtime", "--entrypoint", "-u", "--user", "--mount",
    "--env-file", "--restart", "-m", "--memory", "--cpus", "--ulimit", "-l", "--label", "--platform",
    "--security-opt", "--cap-add", "--cap-drop", "--group-add", "--add-host", "-h", "--hostname", "--pull",
    "--log-driver", "--log-opt", "--tmpfs", "--cgroupns", "--pid", "--memory-swap", "--stop-signal",
    "--device-cgroup-rule", "--cpuset-cpus", "--health-cmd", "--uts", "--dns", "--expose", "--volumes-from",
    "--link", "--mac-address", "--cidfile", "-a", "--attach", "--oom-score-adj", "--userns", "--annotation",
}


def _image_engine(image: str) -> tuple[str | None, str | None, str | None]:
    """(engine, implied program, grammar style) of a container image name (kvreport.engines.REGISTRY)."""
    return engines.of_image(image)


def _take_env_assignments(seg: list[str], i: int, found: _Found) -> int:
    while i < len(seg) and _ASSIGN.match(seg[i]):
        name, _, value = seg[i].partition("=")
        found.env[name] = value
        found.assign_tokens.append(seg[i])
        i += 1
    return i


# `ulimit` options (bash builtin, values in KiB; POSIX sh/dash the same letters) -> limits keys.
# -v: RLIMIT_AS (address space), -d: RLIMIT_DATA, -m: RLIMIT_RSS (not enforced by Linux since 2.6),
# -l: RLIMIT_MEMLOCK (pinned memory: CUDA/ROCm host buffers, --mlock).
_ULIMIT_KEYS = {"v": "address_space_limit_kib", "d": "data_limit_kib", "m": "resident_set_limit_kib",
                "l": "locked_memory_limit_kib"}


def _merge_limits(into: dict[str, float], new: dict[str, float]) -> dict[str, float]:
    """The stricter (smaller) of two limits sets, key by key."""
    for key, value in new.items():
        into[key] = min(into[key], value) if key in into else value
    return into


def _ulimit(seg: list[str]) -> dict[str, float]:
    """The memory limits a ``ulimit`` command sets (``ulimit -v 600000``, ``ulimit -Sv 600000``,
    ``ulimit -H -m 8000000``, ``ulimit -v600000``), in KiB as ``ulimit`` takes them; ``unlimited``,
    ``hard``, ``soft`` and queries (no value) set nothing."""
    out: dict[str, float] = {}
    letter: str | None = None
    for tok in seg[1:]:
        m = re.fullmatch(r"-([A-Za-z]+?)(\d+)?", tok)
        if m:
            letters = m.group(1).replace("S", "").replace("H", "")
            letter = letters[-1] if letters else letter
            if m.group(2) and letter in _ULIMIT_KEYS:
                _merge_limits(out, {_ULIMIT_KEYS[letter]: int(m.group(2))})
            continue
        if re.fullmatch(r"\d+", tok) and letter in _ULIMIT_KEYS:
            _merge_limits(out, {_ULIMIT_KEYS[letter]: int(tok)})
        letter = None if not tok.startswith("-") else letter
    return out


def _size_bytes(text: str, default_unit: str = "b") -> float | None:
    """``4g`` / ``512m`` / ``1073741824`` / ``2GiB`` as bytes (docker --memory, prlimit, systemd sizes: binary)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([bkmgt]?)(?:i?b)?\s*", text, re.I)
    if not m:
        return None
    unit = (m.group(2) or default_unit).lower()
    return float(m.group(1)) * {"b": 1, "k": 1024, "m": MIB, "g": GIB, "t": 1024 * GIB}[unit]


# wrappers that take `run` before the command (`conda run -n env CMD`, `uv run CMD`)
_RUN_WRAPPERS = ("conda", "micromamba", "mamba", "uv", "poetry", "pipenv")
# wrappers with one operand after their options, before the command: (wrapper, whether a word is it)
_WRAPPER_OPERAND = {
    "timeout": lambda word: True,  # the duration
    "taskset": lambda word: True,  # the mask, or the list of -c/--cpu-list
    "chrt": str.isdigit,  # the priority
}


def _prlimit_option(opt: str, found: _Found) -> None:
    """prlimit --as=SOFT[:HARD] / --data=SOFT[:HARD] (bytes) -> the limits, in KiB."""
    if not (opt.startswith("--as=") or opt.startswith("--data=")):
        return
    vals = [_size_bytes(v) for v in opt.split("=", 1)[1].split(":") if v.strip()]
    vals = [v for v in vals if v is not None]
    if vals:
        key = "address_space_limit_kib" if opt.startswith("--as=") else "data_limit_kib"
        _merge_limits(found.limits, {key: int(min(vals) // 1024)})


def _skip_wrapper(seg: list[str], i: int, name: str, found: _Found) -> tuple[int, list[str] | None]:
    """The index after wrapper ``name`` (at ``seg[i]``), its options and operand; or ``(i, argv)`` for
    ``env -S 'CMD ARGS'``: the argv to look in instead."""
    opts = _WRAPPER_VALUE_OPTS[name]
    i += 1
    if name in _RUN_WRAPPERS and i < len(seg) and seg[i] == "run":
        i += 1
    while i < len(seg) and seg[i].startswith("-") and seg[i] != "--":
        opt = seg[i]
        i += 1
        if name == "prlimit":
            _prlimit_option(opt, found)
        if opt in opts and "=" not in opt and i < len(seg):
            i += 1
        if name == "env" and opt == "-S" and i < len(seg):
            return i, _split(seg[i], False) + seg[i + 1:]
    if i < len(seg) and seg[i] == "--":
        i += 1
    operand = _WRAPPER_OPERAND.get(name)
    if operand is not None and i < len(seg) and operand(seg[i]):
        i += 1
    if name == "env":
        i = _take_env_assignments(seg, i, found)
    return i, None


def _locate_in_shell(rest: list[str], found: _Found, depth: int) -> _Found | None:
    """``bash -c 'CMD'`` (``cmd /c``, ``powershell -Command``): the engine inside the command string;
    None for ``bash script.sh`` (kvreport does not read scripts)."""
    for j, t in enumerate(rest):
        if t in ("-c", "/c", "/C", "-Command", "-command") and j + 1 < len(rest) and depth < 4:
            inner = _find_in_text(rest[j + 1], depth + 1)
            if inner is not None:
                inner.env = {**found.env, **inner.env}
                inner.limits = _merge_limits(dict(found.limits), inner.limits)
            return inner
    return None


def _locate(seg: list[str], depth: int = 0) -> _Found | None:
    """Find the engine invocation in one shell segment (or an argv); None when it is shell noise."""
    found = _Found()
    i = _take_env_assignments(seg, 0, found)
    while i < len(seg):
        name = _basename(seg[i]).lower()
        if name in _WRAPPER_VALUE_OPTS:
            i, argv = _skip_wrapper(seg, i, name, found)
            if argv is not None:
                return _locate(argv, depth + 1)
            continue
        if name in ("poetry", "pipenv", "pixi", "hatch", "rye") and i + 1 < len(seg) and seg[i + 1] == "run":
            i += 2
            continue
        if name in _SHELLS:
            return _locate_in_shell(seg[i + 1:], found, depth)
        if name in ("docker", "podman", "nvidia-docker", "nerdctl"):
            return _locate_docker(seg, i, found)
        break
    if i >= len(seg):
        return None
    return _classify(seg, i, found)


def _locate_docker(seg: list[str], i: int, found: _Found) -> _Found | None:
    start = i
    i += 1
    while i < len(seg) and seg[i] in ("container", "compose"):
        i += 1
    if i >= len(seg) or seg[i] not in ("run", "create"):
        return None
    i += 1
    while i < len(seg) and (seg[i].startswith("-") or seg[i].startswith("$")):
        opt = seg[i]
        i += 1
        if opt.startswith("$"):  # an unexpanded variable standing for options ($args)
            continue
        key = opt.split("=", 1)[0]
        if "=" not in opt and key in _DOCKER_VALUE_OPTS and i < len(seg):
            val = seg[i]
            i += 1
        elif "=" in opt:
            val = opt.split("=", 1)[1]
        else:
            continue
        if key in ("-e", "--env") and "=" in val:
            name, _, value = val.partition("=")
            found.env[name] = value
        if key in ("-m", "--memory"):  # docker run --memory 4g: the container's cgroup memory limit
            size = _size_bytes(val)
            if size:
                _merge_limits(found.limits, {"container_memory_limit_mib": round(size / MIB, 2)})
    if i >= len(seg):
        return None
    image = seg[i]
    found.prefix = seg[start:i]
    rest = seg[i + 1:]
    if rest and not rest[0].startswith("-"):
        inner = _locate(rest, 1)
        if inner is not None and inner.engine is not None:
            inner.env = {**found.env, **inner.env}
            inner.limits = _merge_limits(dict(found.limits), inner.limits)
            inner.prefix = found.prefix + [image] + inner.prefix
            return inner
    engine, prog, style = _image_engine(image)
    found.engine, found.program, found.style = engine, prog, style
    found.program_part = [image]
    found.args = rest
    if engine == "vllm" and rest and rest[0] == "serve":
        found.program_part, found.args = [image, "serve"], rest[1:]
    if engine == "ollama" and rest and rest[0] in ("serve", "run"):
        found.program_part, found.args = [image, rest[0]], rest[1:]
    return found


def _classify_python(seg: list[str], i: int, found: _Found) -> _Found | None:
    """``python [opts] -m MODULE args`` or ``python [opts] script.py args``."""
    rest = seg[i + 1:]
    j = 0
    while j < len(rest) and rest[j].startswith("-") and rest[j] != "-m":
        j += 2 if rest[j] in ("-X", "-W") else 1
    if j < len(rest) and rest[j] == "-m" and j + 1 < len(rest):
        module = rest[j + 1]
        found.program = module
        found.program_part = seg[i:i + j + 3]
        found.args = rest[j + 2:]
        found.engine, found.style = _module_engine(module)
        return found
    if j < len(rest):  # python script.py
        found.program = _basename(rest[j])
        found.program_part = seg[i:i + j + 2]
        found.args = rest[j + 1:]
        found.engine, found.style = _module_engine(found.program.removesuffix(".py"))
        return found
    return None


def _program_engine(low: str) -> tuple[str | None, str | None, bool]:
    """(engine, grammar style, takes a subcommand) of a program name (lower case; kvreport.engines.REGISTRY)."""
    return engines.of_program(low)


def _classify(seg: list[str], i: int, found: _Found) -> _Found | None:
    tok = seg[i]
    name = _basename(tok)
    low = name.lower()
    rest = seg[i + 1:]
    if low in _NOISE:
        return None
    if _PYTHONS.match(low):
        return _classify_python(seg, i, found)
    found.program = name
    found.program_part = [tok]
    found.args = rest
    engine, style, subcommand = _program_engine(low)
    if engine is not None:
        found.engine, found.style = engine, style
        if subcommand and rest and not rest[0].startswith("-"):
            found.program_part, found.args = [tok, rest[0]], rest[1:]
    elif tok.startswith("-"):  # only the flags were given: guess from them
        found.program = None
        found.program_part = []
        found.args = seg[i:]
        found.engine, found.style = _guess_from_flags(seg[i:])
    return found


def _module_engine(module: str) -> tuple[str | None, str | None]:
    """(engine, grammar style) of a ``python -m`` module (kvreport.engines.REGISTRY)."""
    return engines.of_module(module)


def _guess_from_flags(args: list[str]) -> tuple[str | None, str | None]:
    keys = [a.split("=", 1)[0] for a in args if a.startswith("-")]
    py_hits = sum(1 for k in keys if k.lstrip("-").replace("-", "_") in (
        "max_model_len", "gpu_memory_utilization", "max_num_seqs", "tensor_parallel_size", "kv_cache_dtype",
        "max_num_batched_tokens", "enforce_eager"))
    sg_hits = sum(1 for k in keys if k.lstrip("-").replace("-", "_") in (
        "mem_fraction_static", "context_length", "max_running_requests", "tp_size", "chunked_prefill_size",
        "model_path"))
    llama_hits = sum(1 for k in keys if k in _LLAMA_BY_ALIAS)
    if py_hits and py_hits >= llama_hits:
        return "vllm", "py"
    if sg_hits and sg_hits >= llama_hits:
        return "sglang", "py"
    if llama_hits:
        return "llama.cpp", "llama"
    return None, None


def _find_in_text(text: str, depth: int = 0) -> _Found | None:
    cleaned, windows = _clean_line(text)
    tokens = _split(cleaned, windows)
    return _best(_segments(tokens), depth)[0]


def _best(segments: list[list[str]], depth: int = 0) -> tuple[_Found | None, dict[str, str]]:
    exported: dict[str, str] = {}
    limits: dict[str, float] = {}  # set by `ulimit` segments before the engine's
    first: _Found | None = None
    for seg in segments:
        if seg and seg[0] in ("ulimit", "builtin") and (seg[0] == "ulimit" or seg[1:2] == ["ulimit"]):
            _merge_limits(limits, _ulimit(seg[1:] if seg[0] == "builtin" else seg))
            continue
        if seg and seg[0] == "export":
            for t in seg[1:]:
                if _ASSIGN.match(t):
                    k, _, v = t.partition("=")
                    exported[k] = v
            continue
        if seg and seg[0].lower() == "set" and len(seg) >= 2 and _ASSIGN.match(seg[1]):  # Windows cmd
            k, _, v = seg[1].partition("=")
            exported[k] = v
            continue
        if seg and seg[0].startswith("$env:") and len(seg) >= 1:  # PowerShell $env:X="y"
            k, _, v = seg[0][5:].partition("=")
            if not v and len(seg) >= 3 and seg[1] == "=":
                v = seg[2]
            exported[k] = v
            continue
        found = _locate(seg, depth)
        if found is None:
            continue
        if found.engine is not None:
            found.env = {**exported, **found.env}
            found.limits = _merge_limits(dict(limits), found.limits)
            return found, exported
        if first is None:
            first = found
    if first is not None:
        first.env = {**exported, **first.env}
        first.limits = _merge_limits(dict(limits), first.limits)
    return first, exported


# ---------------------------------------------------------------------------------------------
# Flag parsing


def _number(text: str, human: bool = False) -> Any:
    s = text.strip()
    if re.fullmatch(r"[+-]?\d+", s):
        return int(s)
    if human:
        # vllm/engine/arg_utils.py human_readable_int: k/m/g/t decimal, K/M/G/T binary
        m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", s)
        if m:
            mult = {"k": 10**3, "K": 2**10, "m": 10**6, "M": 2**20, "g": 10**9, "G": 2**30,
                    "t": 10**12, "T": 2**40}[m.group(2)]
            return int(float(m.group(1)) * mult)
    if re.fullmatch(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?", s):
        try:
            return float(s)
        except ValueError:  # pragma: no cover
            return s
    return text


def _typed_llama(opt: _Opt, value: str) -> Any:
    if opt.canonical == "tensor_split":
        try:
            return [float(x) for x in re.split(r"[,/]", value) if x.strip() != ""]
        except ValueError:
            return value
    if opt.canonical == "fit_target":
        parts = [_number(x) for x in value.split(",") if x.strip() != ""]
        return parts if all(isinstance(p, (int, float)) for p in parts) else value
    if opt.arity == "?":
        return _ON_OFF_WORDS.get(value.strip().lower(), value)
    if opt.arity == "n":
        return _number(value)
    return value


def _bool_value(opt: _Opt, alias: str) -> bool:
    val = alias not in opt.negatives
    return (not val) if opt.canonical in _INVERTED else val


def _llama_unknown(name: str, eq: str, inline: str, args: list[str], i: int, flags: dict[str, Any]) -> int:
    """An option kvreport does not know: ``--x=v``, ``--x v`` (a value or a negative number), else a bare flag."""
    key = name.lstrip("-").replace("-", "_") or name
    if eq:
        flags[key] = inline
    elif i < len(args) and (not args[i].startswith("-") or re.fullmatch(r"-\d+(\.\d+)?", args[i])):
        flags[key] = args[i]
        i += 1
    else:
        flags[key] = True
    return i


def _llama_arity0(opt, name: str, eq: str, inline: str, args: list[str], i: int, flags: dict[str, Any]) -> int:
    """A switch: ``--mmap``, ``--no-mmap``, ``--flag=false``."""
    if eq:
        truth = inline.strip().lower() in _TRUE_WORDS
        value = truth if name not in opt.negatives else not truth
        flags[opt.canonical] = (not value) if opt.canonical in _INVERTED else value
    else:
        flags[opt.canonical] = _bool_value(opt, name)
    return i


def _llama_arity_opt(opt, name: str, eq: str, inline: str, args: list[str], i: int, flags: dict[str, Any]) -> int:
    """An optional on/off value (``-fa``, ``-fa on``, ``-fa=auto``): "on" when none follows."""
    if eq:
        flags[opt.canonical] = _typed_llama(opt, inline)
    elif i < len(args) and args[i].strip().lower() in _ON_OFF_WORDS:
        flags[opt.canonical] = _typed_llama(opt, args[i])
        i += 1
    else:
        flags[opt.canonical] = "on"
    return i


def _llama_arity2(opt, name: str, eq: str, inline: str, args: list[str], i: int, flags: dict[str, Any]) -> int:
    """Two values (``--override-tensor-draft A B``); a truncated pair ends the arguments."""
    if i + 1 < len(args):
        flags[opt.canonical] = [args[i], args[i + 1]]
        return i + 2
    return len(args)


def _llama_arity1(opt, name: str, eq: str, inline: str, args: list[str], i: int, flags: dict[str, Any]) -> int:
    """One value, inline (``-c=4096``) or the next word."""
    if eq:
        flags[opt.canonical] = _typed_llama(opt, inline)
    elif i < len(args):
        flags[opt.canonical] = _typed_llama(opt, args[i])
        i += 1
    else:
        flags.setdefault("_missing_value", []).append(name)  # ("... -ngl 99 -c": the engine refuses it too)
    return i


_LLAMA_ARITY = {"0": _llama_arity0, "?": _llama_arity_opt, "2": _llama_arity2}
"""How an option of each arity reads its value (anything else: one value, :func:`_llama_arity1`)."""


def _parse_llama(args: list[str], flags: dict[str, Any]) -> None:
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if not tok.startswith("-") or tok in ("-", "--"):
            flags.setdefault("_positional", []).append(tok)
            continue
        name, eq, inline = tok.partition("=")
        opt = _LLAMA_BY_ALIAS.get(name)
        if opt is None:
            i = _llama_unknown(name, eq, inline, args, i, flags)
        else:
            i = _LLAMA_ARITY.get(opt.arity, _llama_arity1)(opt, name, eq, inline, args, i, flags)
    if "_positional" in flags and not flags["_positional"]:
        del flags["_positional"]


def _llama_env_flags(env: dict[str, str], flags: dict[str, Any]) -> None:
    for name, value in env.items():
        opt = _LLAMA_BY_ENV.get(name)
        if opt is None:
            continue
        if opt.arity == "0":
            truth = value.strip().lower() in _TRUE_WORDS
            if name in ("LLAMA_ARG_NO_MMAP", "LLAMA_ARG_NO_KV_OFFLOAD"):
                flags[opt.canonical] = (not truth) if opt.canonical == "mmap" else truth
            elif opt.canonical in _INVERTED:
                flags[opt.canonical] = not truth
            else:
                flags[opt.canonical] = truth
        else:
            flags[opt.canonical] = _typed_llama(opt, value)


def _py_key(engine: str | None, name: str) -> str:
    short = _PY_SHORT.get(engine or "", {})
    if name in short:
        return short[name]
    key = name.lstrip("-").replace("-", "_")
    return _PY_ALIASES.get(engine or "", {}).get(key, key)


def _parse_py(engine: str | None, args: list[str], flags: dict[str, Any]) -> None:
    i = 0
    positional: list[str] = []
    while i < len(args):
        tok = args[i]
        i += 1
        if not tok.startswith("-") or tok in ("-", "--") or re.fullmatch(r"-\d+(\.\d+)?", tok):
            positional.append(tok)
            continue
        name, eq, inline = tok.partition("=")
        key = _py_key(engine, name)
        if key.startswith("no_") and key[3:] in _PY_BOOL_FLAGS | {"enable_prefix_caching", "enable_chunked_prefill"}:
            flags[key[3:]] = False
            continue
        if eq:
            value: Any = inline
        elif key in _PY_BOOL_FLAGS:
            value = True
        elif i < len(args) and (not args[i].startswith("-") or re.fullmatch(r"-\d+(\.\d+)?", args[i])):
            value = args[i]
            i += 1
        else:
            value = True
        if isinstance(value, str):
            low = value.lower()
            if key in _PY_BOOL_FLAGS and low in ("true", "false"):
                value = low == "true"
            elif key != "model" and not key.endswith(("_path", "_id", "model", "tokenizer", "dtype", "revision")):
                value = _number(value, human=key in _HUMAN_INT)
        flags[key] = value
    if positional and engine == "vllm" and "model" not in flags:
        flags["model"] = positional[0]


# koboldcpp (koboldcpp.py argparse): its names for llama.cpp's settings. --quantkv 0/1/2 = f16/q8_0/q4_0
# for both K and V; --flashattention is a bare flag; --tensor_split takes several numbers.
_KOBOLD = {"contextsize": "n_ctx", "gpulayers": "n_gpu_layers", "blasbatchsize": "n_batch", "threads": "threads",
           "model": "model", "model_param": "model", "tensor_split": "tensor_split", "flashattention": "flash_attn",
           "quantkv": "cache_type_k", "maingpu": "main_gpu", "lowvram": "no_kv_offload"}
_KOBOLD_BOOL = {"flashattention", "lowvram", "usemmap", "nommap", "usemlock", "noavx2", "failsafe", "remotetunnel",
                "quiet", "multiuser", "foreground", "skiplauncher", "nocertify", "noshift", "nofastforward",
                "debugmode"}
_KOBOLD_LIST = {"tensor_split", "usecublas", "usevulkan", "useclblast", "usehipblas"}


def _parse_kobold(args: list[str], flags: dict[str, Any]) -> None:
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if not tok.startswith("-"):
            flags.setdefault("model", tok)
            continue
        name, eq, inline = tok.partition("=")
        key = name.lstrip("-").replace("-", "_")
        if key in _KOBOLD_LIST and not eq:
            values = []
            while i < len(args) and not args[i].startswith("-"):
                values.append(args[i])
                i += 1
            value: Any = values
        elif eq:
            value = inline
        elif key in _KOBOLD_BOOL:
            value = True
        elif i < len(args) and (not args[i].startswith("-") or re.fullmatch(r"-\d+", args[i])):
            value = args[i]
            i += 1
        else:
            value = True
        canon = _KOBOLD.get(key, key)
        if canon == "tensor_split":
            nums = [_number(v) for v in (value if isinstance(value, list) else str(value).split(","))]
            value = [float(v) for v in nums if isinstance(v, (int, float))]
        elif canon == "cache_type_k":
            value = {0: "f16", 1: "q8_0", 2: "q4_0"}.get(_number(str(value)), value)
            flags["cache_type_v"] = value
        elif canon == "flash_attn":
            value = "on" if value is True else value
        elif isinstance(value, str) and canon not in ("model",):
            value = _number(value)
        flags[canon] = value


def ollama_env_flags(env: dict[str, str]) -> dict[str, Any]:
    """The flags an ``ollama serve`` line with these OLLAMA_* variables gives (the server config Ollama logs)."""
    flags: dict[str, Any] = {}
    _parse_ollama(["ollama", "serve"], [], {k: v for k, v in env.items() if v != ""}, flags)
    return flags


def _parse_ollama(program_part: list[str], args: list[str], env: dict[str, str], flags: dict[str, Any]) -> None:
    for name, key in _OLLAMA_ENV.items():
        if name in env:
            value = env[name]
            if key in _OLLAMA_BOOL:
                flags[key] = value.strip().lower() in _TRUE_WORDS
            elif key in ("kv_cache_type", "keep_alive", "llm_library", "models", "host"):
                flags[key] = value
            else:
                flags[key] = _number(value)
    sub = program_part[-1] if len(program_part) > 1 else None
    if sub in ("run", "pull", "show", "create", "push", "stop", "rm") and args and not args[0].startswith("-"):
        flags["model"] = args[0]
        args = args[1:]
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if tok.startswith("--"):
            name, eq, inline = tok.partition("=")
            key = name[2:].replace("-", "_")
            if eq:
                flags[key] = inline
            elif key in ("keepalive", "format", "think") and i < len(args):
                flags[key] = args[i]
                i += 1
            else:
                flags[key] = True


# ---------------------------------------------------------------------------------------------
# Public API


def _empty(line: str, argv: list[str]) -> dict:
    return {"line": line, "argv": argv, "engine_argv": [], "program": None, "engine": None, "flags": {},
            "env": {}}


def _analyse(line_or_argv: str | list[str] | tuple[str, ...]) -> tuple[dict, _Found | None]:
    if isinstance(line_or_argv, (list, tuple)):
        argv = [str(a) for a in line_or_argv]
        line = shlex.join(argv)
        found = _best([argv])[0] if argv else None
    else:
        line = str(line_or_argv) if line_or_argv is not None else ""
        cleaned, windows = _clean_line(line)
        argv = _split(cleaned, windows)
        found = _best(_segments(argv))[0]
    result = _empty(line, argv)
    if found is None:
        return result, None
    env = found.env
    flags: dict[str, Any] = {}
    if found.style == "llama":
        _llama_env_flags(env, flags)
        _parse_llama(found.args, flags)
    elif found.style == "py":
        _parse_py(found.engine, found.args, flags)
    elif found.style == "ollama":
        _parse_ollama(found.program_part, found.args, env, flags)
    elif found.style == "kobold":
        _parse_kobold(found.args, flags)
    if found.engine is None and found.style is None and found.program is not None:
        flags = {}
    result.update({
        "engine_argv": found.program_part + found.args,
        "program": found.program,
        "engine": found.engine,
        "flags": flags,
        "env": {k: v for k, v in env.items() if _PLACEMENT_ENV.match(k) or _SECRET_ENV.search(k)},
    })
    if found.limits:
        result["limits"] = dict(found.limits)
    return result, found


def parse_command(line_or_argv: str | list[str] | tuple[str, ...] | None) -> dict:
    """Parse an engine command line (a shell line as typed, or an argv list). Never raises.

    Returns ``{"line": str, "argv": [str], "engine_argv": [str], "program": str | None,
    "engine": "llama.cpp" | "ollama" | "vllm" | "sglang" | "tgi" | None, "flags": {canonical: value},
    "env": {name: value}}``.

    ``line`` is the input as typed (an argv is joined with :func:`shlex.join`); ``argv`` its shell
    words (operators such as ``&&`` kept as words); ``engine_argv`` the engine invocation found
    inside wrappers (program part first); ``program`` the engine binary's base name (``.exe``
    removed), the module for ``python -m``, or None. ``flags`` maps canonical names to typed values:
    token counts (``n_ctx``, ``n_batch``…) as int, fractions (``gpu_memory_utilization``) as float,
    ``tensor_split`` as a list of floats, on/off/auto options as those words, bare flags as bools
    (``no_kv_offload``, ``kv_unified``, ``mmap``…), ``n_gpu_layers`` "auto"/"all" kept as strings.
    llama.cpp's ``LLAMA_ARG_*`` variables from env prefixes fill flags too (the command line wins,
    as in ``common/arg.cpp``). ``env`` holds the placement-relevant variables set in the line
    (``CUDA_VISIBLE_DEVICES``, ``GGML_*``, ``OLLAMA_*``…) and any secret-looking ones so that
    redaction sees them.

    ``limits`` (present only when the line sets one) holds the memory limits the engine runs
    under, the strictest when set twice: ``address_space_limit_kib`` (``ulimit -v`` / ``prlimit
    --as``: RLIMIT_AS, KiB), ``data_limit_kib`` (``ulimit -d``: RLIMIT_DATA, KiB),
    ``resident_set_limit_kib`` (``ulimit -m``: RLIMIT_RSS, KiB, not enforced by Linux),
    ``locked_memory_limit_kib`` (``ulimit -l``: RLIMIT_MEMLOCK, KiB) and
    ``container_memory_limit_mib`` (``docker run -m/--memory``, MiB). A ``ulimit`` counts when it
    runs before the engine in the same shell: ``ulimit -v N && ./llama-server …``,
    ``bash -c 'ulimit -v N; exec ./llama-server …'``.
    """
    try:
        return _analyse(line_or_argv)[0]
    except Exception:  # noqa: BLE001 - the contract is "never raises"
        strict.check()
        line = line_or_argv if isinstance(line_or_argv, str) else ""
        if isinstance(line_or_argv, (list, tuple)):
            try:
                line = " ".join(str(a) for a in line_or_argv)
            except Exception:  # noqa: BLE001
                strict.check()
                line = ""
        return _empty(line, line.split())


# ---------------------------------------------------------------------------------------------
# Rewriting


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return repr(value).removesuffix(".0") if value.is_integer() else repr(value)
    if isinstance(value, (list, tuple)):
        return ",".join(_fmt(v) for v in value)
    return str(value)


def _quote(token: str) -> str:
    """shlex quoting, redaction placeholders included: a bare ``<token>`` or ``<home>/m.gguf`` pasted into a shell is a
    redirection (it reads a file named ``token``, or truncates ``/m.gguf``), so ``'<token>'`` is written quoted: the
    pasted command stays one word the reader replaces, and :func:`parse_command` reads it back as that word.

    A word the user's shell was to expand keeps that: ``$PWD/data:/data``, ``HF_TOKEN=$HF_TOKEN`` and ``~/.cache`` stay
    bare when the rest of the word needs no quotes, else the word is double-quoted (``"$HOME/my dir"``, with a leading
    ``~/`` left outside the quotes), never single-quoted (which would pass ``$PWD`` literally)."""
    if "$" not in token and not token.startswith("~"):
        return shlex.quote(token)
    tilde = token[:2] if token.startswith("~/") else ("~" if token == "~" else "")
    rest = token[len(tilde):]
    if shlex.quote(_SHELL_VAR.sub("x", rest) or "x") == (_SHELL_VAR.sub("x", rest) or "x"):
        return tilde + rest
    return tilde + '"' + "".join("\\" + c if c in '"\\`' else c for c in rest) + '"'


_SHELL_VAR = re.compile(r"\$(?:\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")
"""A shell variable reference the user typed (``$PWD``, ``${HF_TOKEN}``)."""


def _remove_llama(args: list[str], opt: _Opt) -> tuple[list[str], int | None, str | None, bool]:
    """Remove every occurrence of ``opt``: (args, index of the first, alias used, used '=')."""
    out: list[str] = []
    first: int | None = None
    used: str | None = None
    used_eq = False
    i = 0
    while i < len(args):
        tok = args[i]
        name, eq, _ = tok.partition("=")
        if tok.startswith("-") and name in opt.aliases:
            if first is None:
                first, used, used_eq = len(out), name, bool(eq)
            i += 1
            if not eq:
                if opt.arity in ("1", "n") and i < len(args):
                    i += 1
                elif opt.arity == "?" and i < len(args) and args[i].strip().lower() in _ON_OFF_WORDS:
                    i += 1
                elif opt.arity == "2":
                    i += 2
            continue
        out.append(tok)
        # skip the value of other options so that a value equal to an alias is not mistaken
        other = _LLAMA_BY_ALIAS.get(name) if tok.startswith("-") else None
        if other is not None and not eq and i + 1 < len(args):
            if other.arity in ("1", "n") or (other.arity == "?" and args[i + 1].strip().lower() in _ON_OFF_WORDS):
                out.append(args[i + 1])
                i += 1
        i += 1
    return out, first, used, used_eq


def _remove_py(args: list[str], engine: str | None, key: str) -> tuple[list[str], int | None, str | None, bool]:
    out: list[str] = []
    first: int | None = None
    used: str | None = None
    used_eq = False
    i = 0
    while i < len(args):
        tok = args[i]
        name, eq, _ = tok.partition("=")
        if tok.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", tok):
            k = _py_key(engine, name)
            if k == key or k == f"no_{key}":
                if first is None:
                    first, used, used_eq = len(out), name, bool(eq)
                i += 1
                if not eq and key not in _PY_BOOL_FLAGS and not k.startswith("no_") and i < len(args) and (
                        not args[i].startswith("-") or re.fullmatch(r"-\d+(\.\d+)?", args[i])):
                    i += 1
                continue
            out.append(tok)
            i += 1
            if not eq and k not in _PY_BOOL_FLAGS and i < len(args) and (
                    not args[i].startswith("-") or re.fullmatch(r"-\d+(\.\d+)?", args[i])):
                out.append(args[i])
                i += 1
            continue
        out.append(tok)
        i += 1
    return out, first, used, used_eq


def _found_of(command: dict) -> _Found | None:
    """The engine invocation of a parsed command, from its stored words (no re-lexing of words)."""
    argv = command.get("argv")
    if isinstance(argv, (list, tuple)) and argv:
        words = [str(a) for a in argv]
        line = command.get("line")
        if isinstance(line, str) and line == shlex.join(words):
            found = _best([words])[0]  # an argv given as a list (kvreport run)
        else:
            found = _best(_segments(words))[0]  # the shell words of a line, operators kept as words
        if found is not None:
            return found
    line = command.get("line")
    if isinstance(line, str) and line:
        return _analyse(line)[1]
    return None


def with_changes(command: dict, changes: dict[str, object]) -> str:
    """The engine part of ``command`` (keeping its env prefixes) with ``changes`` applied, as a line.

    ``command`` is a :func:`parse_command` result: its ``argv`` (the shell words, as stored, e.g.
    redacted word by word in a bundle) is re-read without lexing it again, so no word is lost; the
    ``line`` only when there is no argv, and ``engine_argv`` when neither finds the engine.
    Each key of ``changes`` is a flag as a suggestion spells it (``"--ctx-size"``, ``"-ngl"``,
    ``"--flash-attn"``, ``"--gpu-memory-utilization"``) or an environment variable
    (``"OLLAMA_CONTEXT_LENGTH"``). An existing occurrence under any alias or ``--flag=value`` form is
    replaced in place, keeping the user's spelling; a value of None removes the option, True adds a
    bare flag, False the negative form where one exists (``--no-kv-unified``). Words are quoted with
    :func:`shlex.quote`.
    """
    found = _found_of(command)
    if found is None:
        found = _Found()
        engine_tokens = list(command.get("engine_argv") or [])
        found.program_part, found.args = engine_tokens[:1], engine_tokens[1:]
        found.engine = command.get("engine")
        found.style = {"llama.cpp": "llama", "ollama": "ollama"}.get(found.engine or "", "py" if found.engine else None)
    assigns = list(found.assign_tokens)
    env_changes: dict[str, Any] = {}
    args = list(found.args)
    for key, value in changes.items():
        if re.fullmatch(r"[A-Z_][A-Z0-9_]*", key):
            env_changes[key] = value
            continue
        name = key if key.startswith("-") else "--" + key.replace("_", "-")
        if found.style == "kobold":
            name, value = _to_kobold(name, value)
            if name is None:
                continue
        if found.style == "llama" or (found.style is None and name in _LLAMA_BY_ALIAS):
            opt = _LLAMA_BY_ALIAS.get(name)
            if opt is None:
                opt = _Opt([name], "0" if value is True or value is False or value is None else "1", None)
            args, pos, used, used_eq = _remove_llama(args, opt)
            spelled = used or name
            new = _render_opt(opt, spelled, value, used_eq, bare_alias=bool(used) and not used_eq)
        else:
            pkey = _py_key(found.engine, name)
            args, pos, used, used_eq = _remove_py(args, found.engine, pkey)
            spelled = used if used and not used.lstrip("-").startswith("no") else name
            new = _render_py(spelled, pkey, value, used_eq)
        if pos is None:
            args.extend(new)
        else:
            args[pos:pos] = new
    for key, value in env_changes.items():
        assigns = [a for a in assigns if a.partition("=")[0] != key]
        if found.prefix and found.prefix[0] in ("docker", "podman", "nvidia-docker", "nerdctl"):
            pre = list(found.prefix)
            cleaned: list[str] = []
            j = 0
            while j < len(pre):
                if pre[j] in ("-e", "--env") and j + 1 < len(pre) and pre[j + 1].partition("=")[0] == key:
                    j += 2
                    continue
                cleaned.append(pre[j])
                j += 1
            if value is not None:
                at = cleaned.index("run") + 1 if "run" in cleaned else len(cleaned)
                cleaned[at:at] = ["-e", f"{key}={_fmt(value)}"]
            found.prefix = cleaned
        elif value is not None:
            assigns.append(f"{key}={_fmt(value)}")
    words = [_quote_assign(a) for a in assigns]
    docker_prefix = found.prefix if found.prefix and found.prefix[0] in (
        "docker", "podman", "nvidia-docker", "nerdctl") else []
    return " ".join(words + _quoted_words(command, docker_prefix + found.program_part + args))


def _quoted_words(command: dict, tokens: list[str]) -> list[str]:
    """``tokens`` quoted for the shell the user typed in: POSIX (:func:`_quote`), or cmd.exe / PowerShell
    (:func:`_quote_windows`, PowerShell's ``&`` call operator kept when the user's line began with it)."""
    if not _is_windows_command(command, tokens):
        line = str(command.get("line") or "")
        # a word the user single-quoted keeps its $ and ~ literal ('sk-abc$x', '~/x'): quoted the same way again
        return [shlex.quote(t) if ("$" in t or t.startswith("~")) and f"'{t}'" in line else _quote(t) for t in tokens]
    words = [_quote_windows(t) for t in tokens]
    if words and words[0].startswith('"') and str(command.get("line") or "").lstrip().startswith("&"):
        words.insert(0, "&")
    return words


_WINDOWS_PATH = re.compile(r"^(?:[A-Za-z]:\\|\.\\|\\\\[\w.])|\.exe$", re.I)
"""A word of a Windows command line: a drive path (``C:\\models``), ``.\\llama-server.exe``, a UNC path, an .exe."""


def _is_windows_command(command: dict, tokens: list[str]) -> bool:
    """The user typed a Windows command line (cmd.exe or PowerShell): its words are quoted the Windows way."""
    if command.get("line") and _clean_line(str(command["line"]))[1]:
        return True
    return any(_WINDOWS_PATH.search(str(t)) for t in tokens[:3])


def _quote_windows(token: str) -> str:
    """cmd.exe / PowerShell quoting: a word with no space or special character stays bare (``C:\\models\\m.gguf``),
    else it is double-quoted (cmd.exe knows no single quotes)."""
    if token and not re.search(r"[\s\"'&|<>^;,()`$]", token):
        return token
    return '"' + token.replace('"', '\\"') + '"'


_KOBOLD_FROM_LLAMA = {"--ctx-size": "--contextsize", "-c": "--contextsize", "-ngl": "--gpulayers",
                      "--gpu-layers": "--gpulayers", "--n-gpu-layers": "--gpulayers", "--flash-attn": "--flashattention",
                      "-fa": "--flashattention", "--cache-type-k": "--quantkv", "-ctk": "--quantkv",
                      "--cache-type-v": "--quantkv", "-ctv": "--quantkv", "--batch-size": "--blasbatchsize",
                      "-b": "--blasbatchsize", "--main-gpu": "--maingpu", "-mg": "--maingpu"}


def _to_kobold(name: str, value: Any) -> tuple[str | None, Any]:
    """A llama.cpp-spelled change as koboldcpp's option (None when koboldcpp has no equivalent)."""
    if name not in _KOBOLD_FROM_LLAMA and name not in _KOBOLD_FROM_LLAMA.values():
        return None, None  # a llama-server option koboldcpp's argparse does not have (--no-kv-offload, -np ...)
    kname = _KOBOLD_FROM_LLAMA.get(name, name)
    if kname == "--flashattention":
        return kname, True if value in (True, "on", "auto") else None
    if kname == "--quantkv" and value is not None:
        code = {"f16": 0, "q8_0": 1, "q4_0": 2}.get(str(value))
        return (kname, code) if code is not None else (None, None)
    return kname, value


def _quote_assign(assign: str) -> str:
    name, _, value = assign.partition("=")
    return f"{name}={_quote(value)}" if value else f"{name}="


def _render_opt(opt: _Opt, spelled: str, value: Any, used_eq: bool, bare_alias: bool) -> list[str]:
    if value is None:
        return []
    if opt.arity == "0":
        want = bool(value)
        if opt.canonical in _INVERTED:
            want = not want
        if want:
            alias = spelled if spelled not in opt.negatives else next(
                (a for a in opt.aliases if a not in opt.negatives and a.startswith("--")), spelled)
            return [alias]
        negs = [a for a in opt.aliases if a in opt.negatives]
        if not negs:
            return []
        if spelled in opt.negatives:
            return [spelled]
        long_negs = [a for a in negs if a.startswith("--")]
        return [long_negs[0] if long_negs else negs[0]]
    if value is True:  # a bare flag (an optional-value option's older form: llama.cpp's -fa before b6300)
        return [spelled]
    text = _fmt(value)
    if used_eq:
        return [f"{spelled}={text}"]
    return [spelled, text]


def _render_py(spelled: str, key: str, value: Any, used_eq: bool) -> list[str]:
    if value is None:
        return []
    if value is True:
        return [spelled]
    if value is False:
        if key in _PY_BOOL_FLAGS:
            return ["--no-" + spelled.lstrip("-")] if key in ("enable_prefix_caching", "enable_chunked_prefill") else []
        return [spelled, "false"]
    text = _fmt(value)
    return [f"{spelled}={text}"] if used_eq else [spelled, text]


def llama_alias_table() -> dict[str, tuple[str, ...]]:
    """Canonical llama.cpp option name -> its aliases (from ``llama-server --help``)."""
    return {canon: tuple(opt.aliases) for canon, opt in _LLAMA_BY_CANON.items()}


def placement_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The placement-relevant variables of an environment (default ``os.environ``)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if _PLACEMENT_ENV.match(k)}
