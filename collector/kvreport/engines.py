"""The engine registry: one entry per engine, the one place to add an engine.

An entry says how kvreport recognises the engine and reads it:

* ``programs`` / ``program_prefixes``: executable names (lower case, no ``.exe``) on a command line, with the
  command-line grammar each implies (``grammars``, default ``grammar``); ``subcommand``: a first bare word after the
  program is a subcommand (``vllm serve``, ``ollama run``);
* ``modules``: ``python -m`` module prefixes; ``images``: substrings of container image names (``ghcr.io/ggml-org/
  llama.cpp:server``, ``vllm/vllm-openai``) with the program an image implies;
* ``parser``: the module of :mod:`kvreport.logs` that reads its log (None: only the failure layer,
  :mod:`kvreport.logs.oom`, reads it);
* ``fix_family``: the rows of :data:`kvreport.fixes.RULES` that apply (its knobs);
* ``devices``: how its logs name devices (documentation for the parsers);
* ``settings``: its memory settings in its own words (:class:`Setting`: ``-c`` for llama.cpp, ``num_ctx`` and
  ``OLLAMA_NUM_PARALLEL`` for Ollama, ``--max-model-len`` for vLLM), keyed by the :data:`SETTINGS` they set, with
  the flags of :func:`kvreport.cmdline.parse_command` that hold their values (the issue body's Environment rows).

:data:`kvreport.vocab.ENGINES` and the titles, :mod:`kvreport.cmdline`'s program / module / image tables,
:mod:`kvreport.logs`' parser list and engine decision, and :func:`kvreport.fixes.family_of` are derived from
:data:`REGISTRY`. To add an engine: an entry here, its parser (or failure-layer rules), its grammar in
:mod:`kvreport.cmdline` if it is new, and its rows in :data:`kvreport.fixes.RULES`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SETTINGS = ("context", "parallel", "cache_types", "gpu_layers", "flash_attention", "memory_fraction", "split")
"""What the memory settings of an engine set, in the order they are shown."""


@dataclass(frozen=True)
class Setting:
    """One memory setting of an engine: ``what`` of :data:`SETTINGS` it sets, ``word`` as the engine's users write
    it, ``keys`` the ``parse_command`` flags holding its value(s), ``default`` the engine's value when unset
    (only when certain)."""

    what: str
    word: str
    keys: tuple[str, ...]
    default: str | None = None


def _settings(*rows: tuple) -> tuple[Setting, ...]:
    return tuple(Setting(what, word, tuple(keys.split()), *default) for what, word, keys, *default in rows)


@dataclass(frozen=True)
class Engine:
    name: str
    title: str
    grammar: str
    fix_family: str
    programs: tuple[str, ...] = ()
    program_prefixes: tuple[str, ...] = ()
    grammars: dict = field(default_factory=dict)
    subcommand: bool = False
    modules: tuple[str, ...] = ()
    images: tuple[tuple[str, str], ...] = ()
    parser: str | None = None
    devices: str = ""
    settings: tuple[Setting, ...] = ()

    def setting(self, what: str) -> Setting | None:
        """The setting of this engine that sets ``what`` (of :data:`SETTINGS`), or None."""
        return next((s for s in self.settings if s.what == what), None)


REGISTRY: tuple[Engine, ...] = (
    Engine("llama.cpp", "llama.cpp", "llama", "llama.cpp-family",
           programs=("llama", "main", "server", "llama-server", "ik_llama-server", "rpc-server", "llama_server"),
           program_prefixes=("llama-", "ik_llama", "koboldcpp"), grammars={"koboldcpp": "kobold"},
           modules=("llama_cpp", "koboldcpp"), images=(("llama.cpp", "llama-server"), ("llama-cpp", "llama-server"),
                                                        ("llamacpp", "llama-server"), ("llama_cpp", "llama-server")),
           parser="llamacpp",
           devices="ggml names: CUDA0, ROCm0, MUSA0, Vulkan0, MTL0/Metal, SYCL0, CANN0, OPENVINO0, CPU; host buffers "
                   "<backend>_Host; 'Device 0: NVIDIA ...' and 'using device CUDA0 (...) - N MiB free' lines",
           settings=_settings(("context", "-c", "n_ctx"), ("parallel", "-np", "n_parallel"),
                              ("cache_types", "-ctk / -ctv", "cache_type_k cache_type_v", "f16"),
                              ("gpu_layers", "-ngl", "n_gpu_layers"), ("flash_attention", "-fa", "flash_attn"),
                              ("split", "-sm / -ts", "split_mode tensor_split"))),
    Engine("ollama", "Ollama", "ollama", "llama.cpp-family", programs=("ollama",), subcommand=True,
           images=(("ollama", "ollama"),), parser="ollama",
           devices="inventory lines msg=\"inference compute\" id=GPU-... library=CUDA|ROCm|Metal; its runner prints "
                   "llama.cpp's ggml names",
           # num_ctx / num_gpu: the model options (Modelfile PARAMETER, request options) whose server-wide defaults
           # are OLLAMA_CONTEXT_LENGTH / OLLAMA_NUM_GPU, the variables parse_command reads
           settings=_settings(("context", "num_ctx", "context_length"), ("parallel", "OLLAMA_NUM_PARALLEL", "num_parallel"),
                              ("cache_types", "OLLAMA_KV_CACHE_TYPE", "kv_cache_type", "f16"),
                              ("gpu_layers", "num_gpu", "num_gpu"),
                              ("flash_attention", "OLLAMA_FLASH_ATTENTION", "flash_attention"),
                              ("split", "OLLAMA_SCHED_SPREAD", "sched_spread"))),
    Engine("vllm", "vLLM", "py", "python", programs=("vllm",), subcommand=True, modules=("vllm",),
           images=(("vllm", "vllm"),), parser="vllm", devices="torch devices: cuda:0, xpu:0, hpu:0",
           settings=_settings(("context", "--max-model-len", "max_model_len"),
                              ("parallel", "--max-num-seqs", "max_num_seqs"),
                              ("cache_types", "--kv-cache-dtype", "kv_cache_dtype", "auto"),
                              ("memory_fraction", "--gpu-memory-utilization", "gpu_memory_utilization"),
                              ("split", "-tp / -pp", "tensor_parallel_size pipeline_parallel_size"))),
    Engine("sglang", "SGLang", "py", "python", programs=("sglang",), subcommand=True, modules=("sglang",),
           images=(("sglang", "sglang"),), parser="sglang", devices="torch devices; ranks [TP0] / TP0 EP0",
           settings=_settings(("context", "--context-length", "context_length"),
                              ("parallel", "--max-running-requests", "max_running_requests"),
                              ("cache_types", "--kv-cache-dtype", "kv_cache_dtype", "auto"),
                              ("memory_fraction", "--mem-fraction-static", "mem_fraction_static"),
                              ("split", "--tp-size", "tp_size"))),
    Engine("tgi", "TGI", "py", "python", programs=("text-generation-launcher", "text-generation-server"),
           modules=("text_generation",), images=(("text-generation-inference", "text-generation-launcher"),),
           parser="tgi", devices="shard ranks; torch devices",
           settings=_settings(("context", "--max-total-tokens", "max_total_tokens"),
                              ("parallel", "--max-concurrent-requests", "max_concurrent_requests"),
                              ("memory_fraction", "--cuda-memory-fraction", "cuda_memory_fraction"),
                              ("split", "--num-shard", "num_shard"))),
    Engine("lmdeploy", "LMDeploy", "py", "python", programs=("lmdeploy",), subcommand=True, modules=("lmdeploy",),
           images=(("lmdeploy", "lmdeploy"),), devices="TurboMind [TM] lines; torch devices",
           settings=_settings(("context", "--session-len", "session_len"),
                              ("memory_fraction", "--cache-max-entry-count", "cache_max_entry_count"),
                              ("split", "--tp", "tp"))),
    Engine("mlx-lm", "mlx-lm", "py", "mlx", programs=("mlx_lm.server", "mlx_lm.generate", "mlx_lm"),
           program_prefixes=("mlx_lm.",), modules=("mlx_lm", "mlx_vlm"), devices="Apple GPU (Metal), one device",
           settings=_settings(("context", "--max-kv-size", "max_kv_size"))),
)

ENGINE_NAMES: tuple[str, ...] = tuple(e.name for e in REGISTRY)
BY_NAME: dict[str, Engine] = {e.name: e for e in REGISTRY}


def of_program(low: str) -> tuple[str | None, str | None, bool]:
    """(engine, grammar, takes a subcommand) of a program name (lower case, no ``.exe``); (None, None, False)."""
    for e in REGISTRY:
        if low in e.programs:
            return e.name, e.grammars.get(low, e.grammar), e.subcommand
    for e in REGISTRY:
        for prefix in e.program_prefixes:
            if low.startswith(prefix):
                return e.name, e.grammars.get(prefix, e.grammar), False
    return None, None, False


def of_module(module: str) -> tuple[str | None, str]:
    """(engine, grammar) of a ``python -m`` module; (None, "py") when no engine owns it."""
    low = module.lower()
    for e in REGISTRY:
        for prefix in e.modules:
            if low.startswith(prefix):
                return e.name, e.grammars.get(prefix, "py")
    return None, "py"


def of_image(image: str) -> tuple[str | None, str | None, str | None]:
    """(engine, implied program, grammar) of a container image name, in registry order (llama.cpp's images are
    checked before Ollama's, whose name contains "llama")."""
    low = image.lower()
    for e in REGISTRY:
        for part, program in e.images:
            if part in low:
                if e.name == "llama.cpp" and (":full" in low or ":light" in low):
                    program = "llama-cli"  # the full/light images run the CLI
                return e.name, program, e.grammar
    return None, None, None


def fix_family(name: str | None) -> str | None:
    """The fix-rule family of an engine (None for an unknown engine)."""
    e = BY_NAME.get(name or "")
    return e.fix_family if e else None
