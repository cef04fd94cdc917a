"""config.json -> ModelShape, and the vLLM / SGLang sizing of kv-facts.md §5.2-5.3.

Expected numbers come from kv-worked-examples.md §1 and §4 (vLLM / SGLang paragraphs).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvreport.errors import InputError
from kvreport.hfconfig import (
    dtype_bytes,
    load_hf_config,
    sglang_cell_size,
    sglang_max_total_tokens,
    shape_from_hf_config,
    vllm_available_kv_bytes,
    vllm_bytes_per_token,
    vllm_token_capacity,
)
from kvreport.kvcache import GIB, MIB, KVConfig, kv_size

LLAMA31_8B = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "hidden_size": 4096, "max_position_embeddings": 131072,
              "torch_dtype": "bfloat16"}
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "num_hidden_layers": 61, "num_attention_heads": 128,
               "num_key_value_heads": 128, "hidden_size": 7168, "kv_lora_rank": 512,
               "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
               "max_position_embeddings": 163840}


def test_dense_shape_matches_llama_cpp():
    shape = shape_from_hf_config(LLAMA31_8B)
    assert shape.source == "hf_config" and shape.n_ctx_train == 131072
    assert kv_size(shape, KVConfig(n_ctx=131072)).kv_mib == 16384.0


def test_vllm_llama31_8b():
    # §1: page per layer 2x16x8x128x2 = 65,536 B; 131,072 B/token; 50 GiB -> 25,600 blocks -> 409,600 tokens
    shape = shape_from_hf_config(LLAMA31_8B)
    assert vllm_bytes_per_token(shape) == 131072
    assert vllm_token_capacity(shape, 50 * GIB) == 409600
    assert vllm_bytes_per_token(shape, tensor_parallel_size=2) == 65536  # TP=2 halves the heads
    assert vllm_bytes_per_token(shape, kv_cache_dtype="fp8") == 65536


def test_vllm_kv_heads_replicated_when_fewer_than_tp():
    shape = shape_from_hf_config(LLAMA31_8B)
    assert vllm_bytes_per_token(shape, tensor_parallel_size=16) == 32 * 1 * 256 * 2


def test_mla_config():
    shape = shape_from_hf_config(DEEPSEEK_V3)
    assert shape.is_mla and shape.head_dim_k[0] == 576
    # §4: 61 x 1,152 B = 70,272 B/token in llama.cpp, SGLang (bf16) and vLLM
    assert kv_size(shape, KVConfig(n_ctx=32768)).kv_mib == 2196.0
    assert sglang_cell_size(shape) == 70272
    assert vllm_bytes_per_token(shape) == 70272
    assert vllm_bytes_per_token(shape, kv_cache_dtype="fp8_ds_mla") == 656 * 61


def test_sglang_dense_and_capacity():
    shape = shape_from_hf_config(LLAMA31_8B)
    cell = sglang_cell_size(shape)
    assert cell == 131072
    # rest = 60 - 80 x (1 - 0.88) = 50.4 GiB -> 50.4 x 2^30 // 131072 tokens
    assert sglang_max_total_tokens(cell, 60, 80, 0.88) == int(50.4 * GIB // 131072)
    assert sglang_max_total_tokens(cell, 60, 80, 0.88, page_size=64) % 64 == 0
    assert sglang_max_total_tokens(cell, 5, 80, 0.88) == 0


def test_vllm_available_kv():
    avail = vllm_available_kv_bytes(48 * 1024, 0.9, weights_mib=16 * 1024, activation_peak_mib=2048)
    assert avail == pytest.approx((48 * 1024 * 0.9 - 16 * 1024 - 2048) * MIB, rel=1e-9)
    assert vllm_available_kv_bytes(24 * 1024, 0.5, weights_mib=16 * 1024) < 0


def test_gemma3_text_config_and_layer_types():
    cfg = {"model_type": "gemma3", "text_config": {
        "model_type": "gemma3_text", "num_hidden_layers": 12, "num_attention_heads": 8,
        "num_key_value_heads": 4, "head_dim": 128, "hidden_size": 1024, "sliding_window": 1024,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 5 + ["full_attention"]}}
    shape = shape_from_hf_config(cfg)
    assert shape.arch == "gemma3" and sum(shape.is_swa) == 10 and shape.n_swa == 1024


def test_qwen3_next_hybrid():
    cfg = {"model_type": "qwen3_next", "num_hidden_layers": 48, "num_attention_heads": 16,
           "num_key_value_heads": 2, "head_dim": 256, "hidden_size": 2048, "full_attention_interval": 4,
           "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
           "linear_value_head_dim": 128, "linear_num_value_heads": 32, "max_position_embeddings": 262144}
    s = kv_size(shape_from_hf_config(cfg), KVConfig(n_ctx=262144))
    assert s.kv_mib == 6144.0 and s.rs_mib == 75.375  # kv-worked-examples.md §5


def test_qwen2_use_sliding_window_false():
    cfg = dict(LLAMA31_8B, model_type="qwen2", sliding_window=4096, use_sliding_window=False)
    assert not shape_from_hf_config(cfg).is_swa_any


def test_bad_configs(tmp_path):
    with pytest.raises(InputError):
        shape_from_hf_config({"model_type": "llama"})
    p = tmp_path / "c.json"
    p.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        load_hf_config(p)
    p.write_text("[1, 2]")
    with pytest.raises(InputError, match="not a JSON object"):
        load_hf_config(p)
    with pytest.raises(InputError, match="not found"):
        load_hf_config(tmp_path / "missing.json")
    with pytest.raises(InputError):
        dtype_bytes("int3")
    p.write_text(json.dumps(LLAMA31_8B))
    assert load_hf_config(p)["num_hidden_layers"] == 32


@given(st.dictionaries(st.sampled_from(["model_type", "num_hidden_layers", "num_attention_heads",
                                        "num_key_value_heads", "head_dim", "hidden_size", "sliding_window",
                                        "layer_types", "kv_lora_rank", "qk_rope_head_dim"]),
                       st.one_of(st.integers(-5, 300), st.text(max_size=8), st.none(), st.booleans(),
                                 st.lists(st.text(max_size=12), max_size=5))))
def test_shape_from_hf_config_raises_only_input_error(cfg):
    try:
        shape = shape_from_hf_config(cfg)
    except InputError:
        return
    kv_size(shape, KVConfig(n_ctx=1024))
