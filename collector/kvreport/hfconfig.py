"""Hugging Face ``config.json`` -> ``ModelShape``, and vLLM / SGLang KV sizing (kv-facts.md §5.2-5.3).

Units: bytes unless a name ends in ``_mib`` (2^20 bytes) or ``_gib`` (2^30 bytes); tokens.

vLLM (``vllm/v1/kv_cache_interface.py``, ``vllm/config/model.py``, ``vllm/v1/core/kv_cache_utils.py``,
``vllm/v1/worker/gpu_worker.py``): per layer a block of ``block_size`` tokens (default 16) takes
``block_size * kv_heads_per_gpu * (head_size + head_size_v) * dtype_bytes``; MLA one latent of
``kv_lora_rank + qk_rope_head_dim`` (576) per token and layer; ``kv_heads_per_gpu =
max(1, kv_heads // tensor_parallel_size)`` (MLA: 1). ``num_blocks = available // page // num_layers``;
the KV pool is ``total_gpu_memory * gpu_memory_utilization`` minus weights, peak activations and
non-torch memory.

SGLang (``python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py``): cell size per token
``kv_heads_per_tp * (head_dim + v_head_dim) * num_layers * dtype_bytes`` (MLA:
``(kv_lora_rank + qk_rope_head_dim) * num_layers * dtype_bytes``); ``rest = available_after_weights -
total * (1 - mem_fraction_static)`` GB; ``max_total_num_tokens = rest * 2^30 // cell_size`` rounded
down to ``page_size``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kvreport.errors import InputError
from kvreport.kvcache import MAX_LAYERS, ModelShape, swa_layers
from kvreport.units import GIB, MIB

#: config.json model_type -> llama.cpp arch name (only where the rules differ by arch).
MODEL_TYPE_ARCH = {
    "llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2",
    "gemma3": "gemma3", "gemma3_text": "gemma3", "gpt_oss": "gpt-oss", "deepseek_v2": "deepseek2",
    "deepseek_v3": "deepseek2", "kimi_k2": "deepseek2", "qwen3_next": "qwen3next", "cohere2": "cohere2",
    "llama4": "llama4", "llama4_text": "llama4", "phi3": "phi3",
}

# vLLM kv_cache_dtype -> bytes per element (``vllm/config/cache.py``; "auto" = the model dtype).
_DTYPE_BYTES = {"float32": 4.0, "float": 4.0, "float16": 2.0, "half": 2.0, "bfloat16": 2.0,
                "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp8_inc": 1.0, "int8": 1.0,
                "int8_per_token_head": 1.0, "fp8_per_token_head": 1.0, "nvfp4": 0.5}


def load_hf_config(path: str | os.PathLike) -> dict:
    """Read a ``config.json``; ``InputError`` (one line) when missing or not a JSON object."""
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except FileNotFoundError:
        raise InputError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read config file {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{path} is not a JSON object (a Hugging Face config.json is)")
    return cfg


def _text_config(cfg: Mapping[str, Any]) -> dict:
    """The language-model part of a (possibly multimodal) config: ``text_config`` merged over the top."""
    out = dict(cfg)
    for key in ("text_config", "llm_config", "language_config"):
        sub = cfg.get(key)
        if isinstance(sub, dict):
            out.update(sub)
            if "model_type" in sub:
                out["model_type"] = sub["model_type"]
    return out


def _pos_int(cfg: Mapping, *keys, default=None) -> int | None:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)) and v > 0:
            return int(v)
    return default


def _hf_layer_kinds(c: Mapping[str, Any], arch: str, n_layer: int, notes: list[str]) -> tuple[list, list, int]:
    """(per-layer recurrent flags, per-layer sliding-window flags, window size) from ``layer_types``,
    Qwen3-Next's ``full_attention_interval`` or the sliding-window fields."""
    layer_types = c.get("layer_types") if isinstance(c.get("layer_types"), list) else None
    is_rec = [False] * n_layer
    is_swa = [False] * n_layer
    if layer_types and len(layer_types) >= n_layer:
        for il, t in enumerate(layer_types[:n_layer]):
            t = str(t).lower()
            is_rec[il] = any(w in t for w in ("linear", "mamba", "conv", "recurrent", "ssm"))
            is_swa[il] = "sliding" in t or "local" in t or "chunk" in t
    elif arch == "qwen3next":
        k = _pos_int(c, "full_attention_interval", default=4)
        is_rec = [(il + 1) % k != 0 for il in range(n_layer)]
    n_swa = _pos_int(c, "sliding_window", "attention_chunk_size", default=0) or 0
    if c.get("use_sliding_window") is False:
        n_swa = 0
        is_swa = [False] * n_layer
    elif n_swa and not any(is_swa) and not layer_types:
        period = _pos_int(c, "sliding_window_pattern")
        if period is None:
            period = {"gemma2": 2, "gemma3": 6, "gpt-oss": 2, "cohere2": 4, "llama4": 4}.get(arch)
        if period:
            is_swa = list(swa_layers(n_layer, period))
        else:
            notes.append(f"sliding_window {n_swa} given but not which layers use it: all counted as full")
    return is_rec, is_swa, (n_swa if any(is_swa) else 0)


def _hf_state_widths(c: Mapping[str, Any], arch: str, hidden: int, notes: list[str]) -> tuple[int, int]:
    """(conv state, SSM state) values per sequence of a recurrent layer, as llama.cpp's converter maps them."""
    if arch == "qwen3next" or "linear_conv_kernel_dim" in c:
        d_conv = _pos_int(c, "linear_conv_kernel_dim", default=4)
        d_state = _pos_int(c, "linear_key_head_dim", default=128)
        n_group = _pos_int(c, "linear_num_key_heads", default=16)
        d_inner = (_pos_int(c, "linear_value_head_dim", default=128)
                   * _pos_int(c, "linear_num_value_heads", default=32))
        return (d_conv - 1) * (d_inner + 2 * n_group * d_state), d_state * d_inner
    if "mamba_d_state" in c or "ssm_state_size" in c or "state_size" in c:
        d_state = _pos_int(c, "mamba_d_state", "ssm_state_size", "state_size", default=16)
        d_conv = _pos_int(c, "mamba_d_conv", "conv_kernel", default=4)
        expand = _pos_int(c, "mamba_expand", "expand", default=2)
        d_inner = _pos_int(c, "mamba_d_inner", "intermediate_size", default=expand * hidden) \
            if "mamba_d_inner" in c else expand * hidden
        n_group = _pos_int(c, "mamba_n_groups", "n_groups", default=1)
        return (d_conv - 1) * (d_inner + 2 * n_group * d_state), d_state * d_inner
    notes.append("recurrent layers with unknown state sizes: state not counted")
    return 0, 0


def shape_from_hf_config(cfg: Mapping[str, Any]) -> ModelShape:
    """A ``ModelShape`` (source "hf_config") from a Hugging Face ``config.json`` dict.

    Fields: ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads`` (default: the
    heads), ``head_dim`` (default ``hidden_size / num_attention_heads``), ``max_position_embeddings``;
    MLA from ``kv_lora_rank`` + ``qk_rope_head_dim`` (DeepSeek-V2/V3: one latent of 576 per token);
    sliding window from ``layer_types`` ("sliding_attention") or ``sliding_window_pattern`` or the
    model type's default period (``sliding_window`` tokens; ``use_sliding_window: false`` turns it
    off); linear-attention / Mamba layers from ``layer_types`` or Qwen3-Next's
    ``full_attention_interval`` with the ``linear_*`` sizes mapped as llama.cpp's converter does.
    Raises ``InputError`` when the layer or head count is missing.
    """
    if not isinstance(cfg, Mapping):
        raise InputError("config.json must be a JSON object")
    c = _text_config(cfg)
    model_type = str(c.get("model_type") or "")
    arch = MODEL_TYPE_ARCH.get(model_type, model_type or "unknown")
    n_layer = _pos_int(c, "num_hidden_layers", "n_layer", "num_layers")
    n_head = _pos_int(c, "num_attention_heads", "n_head")
    if not n_layer or not n_head:
        raise InputError("config.json lacks num_hidden_layers / num_attention_heads")
    if n_layer > MAX_LAYERS:
        raise InputError(f"config.json says {n_layer} layers: not a model kvreport can size")
    n_kv = _pos_int(c, "num_key_value_heads", "num_kv_heads", default=n_head)
    hidden = _pos_int(c, "hidden_size", "n_embd", default=0)
    head_dim = _pos_int(c, "head_dim", default=(hidden // n_head if hidden else None))
    if not head_dim:
        raise InputError("config.json lacks head_dim and hidden_size")
    head_dim_v = _pos_int(c, "v_head_dim", default=head_dim)
    n_ctx_train = _pos_int(c, "max_position_embeddings", "max_sequence_length", "seq_length", default=0)
    notes: list[str] = []

    kv_lora = _pos_int(c, "kv_lora_rank", default=0)
    rope = _pos_int(c, "qk_rope_head_dim", default=0)
    if kv_lora and rope:
        return ModelShape(
            arch=arch, n_layer=n_layer, n_head_kv=(1,) * n_layer, head_dim_k=(kv_lora + rope,) * n_layer,
            head_dim_v=(kv_lora,) * n_layer, is_mla=True, kv_lora_rank=kv_lora,
            n_embd_head_k_mla=(_pos_int(c, "qk_nope_head_dim", default=0) or 0) + rope,
            n_embd_head_v_mla=head_dim_v, n_ctx_train=n_ctx_train, n_embd=hidden, source="hf_config")

    is_rec, is_swa, n_swa = _hf_layer_kinds(c, arch, n_layer, notes)
    n_embd_r = [0] * n_layer
    n_embd_s = [0] * n_layer
    if any(is_rec):
        r, s = _hf_state_widths(c, arch, hidden, notes)
        n_embd_r = [r if x else 0 for x in is_rec]
        n_embd_s = [s if x else 0 for x in is_rec]
    return ModelShape(
        arch=arch, n_layer=n_layer, n_head_kv=tuple(0 if r else n_kv for r in is_rec),
        head_dim_k=(head_dim,) * n_layer, head_dim_v=(head_dim_v,) * n_layer, is_swa=tuple(is_swa),
        is_recurrent=tuple(is_rec), n_swa=n_swa, n_ctx_train=n_ctx_train, n_embd=hidden,
        n_embd_r=tuple(n_embd_r), n_embd_s=tuple(n_embd_s), source="hf_config",
        name=str(c.get("_name_or_path")) if c.get("_name_or_path") else None, notes=tuple(notes))


def dtype_bytes(kv_cache_dtype: str = "auto", model_dtype: str | None = "bfloat16") -> float:
    """Bytes per element of a vLLM ``kv_cache_dtype`` (``auto`` = the model's ``torch_dtype``)."""
    t = (kv_cache_dtype or "auto").lower()
    if t == "auto":
        t = (model_dtype or "bfloat16").lower().replace("torch.", "")
    if t not in _DTYPE_BYTES:
        raise InputError(f"unknown kv_cache_dtype {kv_cache_dtype!r}")
    return _DTYPE_BYTES[t]


def _attn_layers(shape: ModelShape) -> list[int]:
    return [il for il in range(shape.n_layer) if shape.has_kv[il]]


def vllm_bytes_per_token(shape: ModelShape, kv_cache_dtype: str = "auto", model_dtype: str = "bfloat16",
                         tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1) -> float:
    """KV bytes one token costs on one GPU in vLLM (every attention layer of that PP stage).

    Full attention: ``kv_heads_per_gpu * (head_size + head_size_v) * dtype_bytes`` per layer;
    MLA: ``head_size(kv_lora_rank + rope) * dtype_bytes`` (``fp8_ds_mla``: 656 bytes).
    """
    tp = max(1, int(tensor_parallel_size))
    layers = _attn_layers(shape)
    per_stage = math.ceil(len(layers) / max(1, int(pipeline_parallel_size)))
    if shape.is_mla:
        if (kv_cache_dtype or "").lower() == "fp8_ds_mla":
            return 656.0 * per_stage
        return shape.head_dim_k[layers[0]] * dtype_bytes(kv_cache_dtype, model_dtype) * per_stage if layers else 0.0
    b = dtype_bytes(kv_cache_dtype, model_dtype)
    total = 0.0
    for il in layers[:per_stage]:
        heads = max(1, shape.n_head_kv[il] // tp)
        total += heads * (shape.head_dim_k[il] + shape.head_dim_v[il]) * b
    return total


def vllm_available_kv_bytes(total_gpu_mib: float, gpu_memory_utilization: float = 0.9,
                            weights_mib: float = 0.0, activation_peak_mib: float = 0.0,
                            non_torch_mib: float = 0.0, cudagraph_mib: float = 0.0) -> float:
    """vLLM's KV pool: ``ceil(total * gpu_memory_utilization)`` minus weights, peak activations,
    non-torch memory and the CUDA-graph estimate (``vllm/v1/worker/gpu_worker.py``). May be negative
    (vLLM then logs ``Available KV cache memory: -0.3 GiB``)."""
    requested = math.ceil(total_gpu_mib * MIB * float(gpu_memory_utilization))
    used = (weights_mib + activation_peak_mib + non_torch_mib + cudagraph_mib) * MIB
    return requested - used


def vllm_token_capacity(shape: ModelShape, available_kv_bytes: float, kv_cache_dtype: str = "auto",
                        model_dtype: str = "bfloat16", tensor_parallel_size: int = 1,
                        block_size: int = 16) -> int:
    """Tokens vLLM's KV pool holds (``GPU KV cache size: N tokens``) for a uniform model.

    ``num_blocks = available // page // num_layers``, tokens = ``num_blocks * block_size``.
    """
    per_token = vllm_bytes_per_token(shape, kv_cache_dtype, model_dtype, tensor_parallel_size)
    layers = len(_attn_layers(shape))
    if per_token <= 0 or layers == 0 or available_kv_bytes <= 0:
        return 0
    page = per_token / layers * block_size
    num_blocks = int(available_kv_bytes // page // layers)
    return num_blocks * block_size


def vllm_max_model_len(shape: ModelShape, available_kv_bytes: float, kv_cache_dtype: str = "auto",
                       model_dtype: str = "bfloat16", tensor_parallel_size: int = 1,
                       block_size: int = 16) -> int:
    """The longest ``max_model_len`` whose one request fits the pool (vLLM's estimate in
    ``To serve at least one request ... the estimated maximum model length is N``), full attention."""
    return vllm_token_capacity(shape, available_kv_bytes, kv_cache_dtype, model_dtype,
                               tensor_parallel_size, block_size)


def sglang_cell_size(shape: ModelShape, kv_cache_dtype: str = "auto", model_dtype: str = "bfloat16",
                     tp_size: int = 1) -> float:
    """SGLang's bytes per token (``cell_size``) across all attention layers on one TP rank."""
    b = dtype_bytes(kv_cache_dtype, model_dtype)
    layers = _attn_layers(shape)
    if shape.is_mla:
        return sum(shape.head_dim_k[il] for il in layers) * b
    tp = max(1, int(tp_size))
    return sum(max(1, shape.n_head_kv[il] // tp) * (shape.head_dim_k[il] + shape.head_dim_v[il])
               for il in layers) * b


def sglang_max_total_tokens(cell_size: float, available_after_weights_gib: float, total_gpu_gib: float,
                            mem_fraction_static: float = 0.88, page_size: int = 1) -> int:
    """``max_total_num_tokens``: ``rest = available - total * (1 - mem_fraction_static)`` GiB,
    ``rest * 2^30 // cell_size`` rounded down to ``page_size`` (0 when nothing is left)."""
    rest = float(available_after_weights_gib) - float(total_gpu_gib) * (1.0 - float(mem_fraction_static))
    if rest <= 0 or cell_size <= 0:
        return 0
    tokens = int(rest * GIB // cell_size)
    return tokens // max(1, page_size) * max(1, page_size)


def with_source(shape: ModelShape, source: str) -> ModelShape:
    return replace(shape, source=source)
