"""The KV memory model against the worked examples of tests/data/reference/kv-worked-examples.md.

Every expected number below names its source: the worked-example section (computed from
llama.cpp's rules at b10108) and, where one exists, the public llama.cpp log line quoted there.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvreport.kvcache import (
    CACHE_TYPES,
    MIB,
    KVConfig,
    ModelShape,
    dense_shape,
    kv_per_device,
    kv_size,
    layer_devices,
    max_ctx_fit,
    parse_num_list,
    row_bytes,
    shape_from_hparams,
    swa_layers,
)

Q8 = {"cache_type_k": "q8_0", "cache_type_v": "q8_0"}
Q4 = {"cache_type_k": "q4_0", "cache_type_v": "q4_0"}


def llama31_8b() -> ModelShape:
    return dense_shape(32, 8, 128, n_ctx_train=131072)


def gpt_oss_20b() -> ModelShape:
    return ModelShape(arch="gpt-oss", n_layer=24, n_head_kv=(8,) * 24, head_dim_k=(64,) * 24,
                      head_dim_v=(64,) * 24, is_swa=swa_layers(24, 2), n_swa=128, n_ctx_train=131072)


def gemma3_27b() -> ModelShape:
    return ModelShape(arch="gemma3", n_layer=62, n_head_kv=(16,) * 62, head_dim_k=(128,) * 62,
                      head_dim_v=(128,) * 62, is_swa=swa_layers(62, 6), n_swa=1024)


def deepseek_v3(mla: bool = True) -> ModelShape:
    if not mla:  # legacy GGUF converted before MLA support: 128 heads x (192 + 128)
        return dense_shape(61, 128, 192, head_dim_v=128, arch="deepseek2")
    return ModelShape(arch="deepseek2", n_layer=61, n_head_kv=(1,) * 61, head_dim_k=(576,) * 61,
                      head_dim_v=(512,) * 61, is_mla=True, kv_lora_rank=512,
                      n_embd_head_k_mla=192, n_embd_head_v_mla=128, n_ctx_train=163840)


def qwen3_next_80b() -> ModelShape:
    rec = tuple((il + 1) % 4 != 0 for il in range(48))
    r = (4 - 1) * (4096 + 2 * 16 * 128)
    s = 128 * 4096
    return ModelShape(arch="qwen3next", n_layer=48, n_head_kv=(2,) * 48, head_dim_k=(256,) * 48,
                      head_dim_v=(256,) * 48, is_recurrent=rec,
                      n_embd_r=tuple(r if x else 0 for x in rec),
                      n_embd_s=tuple(s if x else 0 for x in rec), n_ctx_train=262144)


# ---- types


def test_cache_types_match_ggml_block_sizes():
    # ggml-common.h: block_q8_0 = f16 d + 32 int8; block_q4_0 = f16 d + 16 bytes; ...
    assert CACHE_TYPES["q8_0"] == (32, 34)
    assert CACHE_TYPES["q4_0"] == (32, 18)
    assert CACHE_TYPES["q5_1"] == (32, 24)
    assert row_bytes("f16", 1024) == 2048
    assert row_bytes("q8_0", 1024) == 1088  # kv-facts.md §2.9
    assert row_bytes("Q4_0", 1024) == 576


def test_unknown_cache_type_does_not_crash():
    assert row_bytes("turbo3", 1024) is None
    s = kv_size(llama31_8b(), KVConfig(n_ctx=4096, cache_type_k="turbo3", cache_type_v="turbo3"))
    assert s.unknown_types == ("turbo3",)
    assert s.kv_bytes == 4096 * 131072  # sized as f16, flagged
    assert any("turbo3" in n for n in s.notes)


# ---- §1 dense Llama-3.1-8B


@pytest.mark.parametrize(("types", "mib"), [({}, 16384.0), (Q8, 8704.0), (Q4, 4608.0)])
def test_llama31_8b_at_131072(types, mib):
    # kv-worked-examples.md §1: 16,384 / 8,704 / 4,608 MiB; log line
    # "llama_kv_cache: size = 16384.00 MiB (131072 cells,  32 layers,  1/1 seqs), K (f16): 8192.00 MiB, V (f16): 8192.00 MiB"
    s = kv_size(llama31_8b(), KVConfig(n_ctx=131072, **types))
    assert s.kv_mib == mib
    assert s.k_bytes == s.v_bytes
    assert s.cells == 131072 and s.n_stream == 1


def test_llama31_8b_bytes_per_token():
    assert kv_size(llama31_8b(), KVConfig(n_ctx=256)).bytes_per_token == 131072
    assert kv_size(llama31_8b(), KVConfig(n_ctx=256, **Q8)).bytes_per_token == 69632
    assert kv_size(llama31_8b(), KVConfig(n_ctx=256, **Q4)).bytes_per_token == 36864


def test_slots_do_not_multiply_full_attention():
    shape = llama31_8b()
    unified = kv_size(shape, KVConfig(n_ctx=131072, n_seq=4))
    split = kv_size(shape, KVConfig(n_ctx=131072, n_seq=4, kv_unified=False))
    assert unified.kv_mib == split.kv_mib == 16384.0
    assert (split.cells, split.n_stream) == (32768, 4)  # "( 32768 cells,  32 layers,  4/4 seqs)"


def test_non_unified_padding_example():
    # §1: -c 10000 -np 3 non-unified -> 10,240 -> n_ctx_seq 3,413 -> 3,584 -> 10,752 cells -> 1,344 MiB
    s = kv_size(llama31_8b(), KVConfig(n_ctx=10000, n_seq=3, kv_unified=False))
    assert (s.n_ctx, s.n_ctx_seq, s.n_stream) == (10752, 3584, 3)
    assert s.kv_mib == 1344.0


def test_n_ctx_zero_means_n_ctx_train():
    assert kv_size(llama31_8b(), KVConfig(n_ctx=0)).n_ctx == 131072


def test_padding_eras():
    shape = llama31_8b()
    assert kv_size(shape, KVConfig(n_ctx=1000)).cells == 1024  # >= b6975: pad n_ctx to 256
    assert kv_size(shape, KVConfig(n_ctx=1000, build=6900)).cells == 1000  # b6868..b6974: none
    assert kv_size(shape, KVConfig(n_ctx=1000, build=6000, flash_attn=False)).cells == 1024  # PAD 32
    assert kv_size(shape, KVConfig(n_ctx=1010, build=6000, flash_attn=False)).cells == 1024
    assert kv_size(shape, KVConfig(n_ctx=1000, build=6000, flash_attn=True)).cells == 1024  # PAD 256


# ---- §2 gpt-oss-20b, §3 Gemma-3-27B (SWA)


@pytest.mark.parametrize(("cfg", "full", "swa", "cells"), [
    (KVConfig(n_ctx=131072), 3072.0, 18.0, 768),
    (KVConfig(n_ctx=131072, n_seq=4), 3072.0, 24.0, 1024),
    (KVConfig(n_ctx=131072, n_seq=4, kv_unified=False), 3072.0, 72.0, 768),
    (KVConfig(n_ctx=131072, swa_full=True), 3072.0, 3072.0, 131072),
])
def test_gpt_oss_swa(cfg, full, swa, cells):
    # kv-worked-examples.md §2; public log: "creating     SWA KV cache, size = 768 cells" and
    # "llama_kv_cache: size =   18.00 MiB (   768 cells,  12 layers,  1/1 seqs)"
    s = kv_size(gpt_oss_20b(), cfg)
    assert (s.kv_full_mib, s.kv_swa_mib, s.swa_cells) == (full, swa, cells)
    assert s.n_layer_full == s.n_layer_swa == 12


def test_gpt_oss_older_ubatch_2048():
    # §2: an older build's log with -ub 2048 shows 2,304 SWA cells = PAD256(128 + 2048)
    assert kv_size(gpt_oss_20b(), KVConfig(n_ctx=131072, n_ubatch=2048)).swa_cells == 2304


@pytest.mark.parametrize(("cfg", "total"), [
    (KVConfig(n_ctx=131072), 10864.0),
    (KVConfig(n_ctx=131072, n_seq=4), 12112.0),
    (KVConfig(n_ctx=131072, n_seq=4, kv_unified=False), 12736.0),
    (KVConfig(n_ctx=131072, swa_full=True), 63488.0),
    (KVConfig(n_ctx=131072, **Q8), 5771.5),
])
def test_gemma3_27b_swa(cfg, total):
    s = kv_size(gemma3_27b(), cfg)  # kv-worked-examples.md §3
    assert s.kv_mib == total
    assert (s.n_layer_full, s.n_layer_swa) == (10, 52)


def test_swa_pattern_rule():
    # llama-hparams.cpp set_swa_pattern: SWA iff il % p < p - 1; p=0 all; dense_first il % p != 0
    assert swa_layers(6, 2) == (True, False, True, False, True, False)
    assert swa_layers(4, 0) == (True,) * 4
    assert swa_layers(4, 1) == (False,) * 4
    assert swa_layers(4, 4, dense_first=True) == (False, True, True, True)


# ---- §4 DeepSeek-V3 MLA


@pytest.mark.parametrize(("n_ctx", "cfg", "expected_bytes"), [
    (32768, {}, 2_302_672_896),
    (32768, {"cache_type_k": "q8_0"}, 1_223_294_976),
    (32768, {"build": 7800}, 4_349_493_248),
    (163840, {}, 11_513_364_480),
    (163840, {"cache_type_k": "q8_0"}, 6_116_474_880),
    (163840, {"build": 7800}, 21_747_466_240),
])
def test_deepseek_v3_mla(n_ctx, cfg, expected_bytes):
    # kv-worked-examples.md §4; expected line at 32k: "size = 2196.00 MiB ( 32768 cells,  61 layers,
    # 1/1 seqs), K (f16): 2196.00 MiB, V (f16):    0.00 MiB" (V-less since b7832)
    s = kv_size(deepseek_v3(), KVConfig(n_ctx=n_ctx, **cfg))
    assert s.kv_bytes == expected_bytes
    if "build" not in cfg:
        assert s.v_bytes == 0


def test_deepseek_legacy_non_mla_gguf():
    assert kv_size(deepseek_v3(mla=False), KVConfig(n_ctx=32768)).kv_bytes == 163_745_628_160


# ---- §5 Qwen3-Next hybrid


def test_qwen3_next_hybrid():
    shape = qwen3_next_80b()
    s = kv_size(shape, KVConfig(n_ctx=262144))
    assert s.kv_mib == 6144.0 and s.n_layer_full == 12 and s.n_layer_recurrent == 36
    assert s.rs_bytes == 79_036_416  # 75.375 MiB: R 3.375 + S 72
    assert (s.r_bytes / MIB, s.s_bytes / MIB) == (3.375, 72.0)
    assert kv_size(shape, KVConfig(n_ctx=32768)).kv_mib == 768.0
    server = kv_size(shape, KVConfig(n_ctx=262144, n_seq=4))
    assert server.total_mib == 6445.5
    # builds before b8025 sized the attention part with n_ctx per stream when not unified
    old = kv_size(shape, KVConfig(n_ctx=262144, n_seq=4, kv_unified=False, build=8000))
    assert old.kv_mib == 4 * 6144.0


def test_state_does_not_grow_with_context():
    shape = qwen3_next_80b()
    a = kv_size(shape, KVConfig(n_ctx=4096)).rs_bytes
    b = kv_size(shape, KVConfig(n_ctx=262144)).rs_bytes
    assert a == b


# ---- §6 placement and inverse


def test_placement_two_gpus_tensor_split():
    # §6a: Llama-3.3-70B, -c 32768, -ts 1,1 -> CUDA0 41 layers 5,248 MiB, CUDA1 39 layers 4,992 MiB
    shape = dense_shape(80, 8, 128)
    got = kv_per_device(shape, KVConfig(n_ctx=32768), device_names=["CUDA0", "CUDA1"], tensor_split=[1, 1])
    assert {k: v / MIB for k, v in got.items()} == {"CUDA0": 5248.0, "CUDA1": 4992.0}


def test_placement_partial_offload_first_layers_on_cpu():
    shape = dense_shape(80, 8, 128)
    got = kv_per_device(shape, KVConfig(n_ctx=32768), n_gpu_layers=41, device_names=["CUDA0"])
    assert {k: v / MIB for k, v in got.items()} == {"CPU": 5120.0, "CUDA0": 5120.0}
    devs = layer_devices(80, 41, ["CUDA0"])
    assert devs[39] == "CPU" and devs[40] == "CUDA0"


def test_placement_nkvo_and_split_none_and_free_memory():
    shape = dense_shape(80, 8, 128)
    cfg = KVConfig(n_ctx=32768)
    assert kv_per_device(shape, cfg, no_kv_offload=True, device_names=["CUDA0"]) == {"CPU": 10240 * MIB}
    assert kv_per_device(shape, cfg, split_mode="none", main_gpu=1,
                         device_names=["CUDA0", "CUDA1"]) == {"CUDA1": 10240 * MIB}
    by_free = kv_per_device(shape, cfg, device_names=["CUDA0", "CUDA1"], device_free_mib=[24000, 8000])
    assert by_free["CUDA0"] > 2 * by_free["CUDA1"]
    assert sum(by_free.values()) == 10240 * MIB


@pytest.mark.parametrize(("free_mib", "types", "expected"), [
    (5572, {}, 44544), (5572, Q8, 83712), (5572, Q4, 158464),
])
def test_inverse_worked_example(free_mib, types, expected):
    # kv-worked-examples.md §6b: budget 5,572 MiB -> 44,544 / 83,712 / 158,464 tokens
    assert max_ctx_fit(llama31_8b(), free_mib * MIB, KVConfig(**types)) == expected


def test_max_ctx_fit_seed_case():
    # the seed: 1024 MiB of KV at 128 KiB/token -> 8192 (f16); q8_0 15420 -> 15360
    shape = llama31_8b()
    assert max_ctx_fit(shape, 1024 * MIB) == 8192
    assert max_ctx_fit(shape, 1024 * MIB, KVConfig(**Q8)) == 15360
    assert max_ctx_fit(shape, 100 * 1024) == 0


def test_max_ctx_fit_pure_recurrent_is_unbounded():
    shape = ModelShape(arch="mamba", n_layer=2, n_head_kv=(0, 0), head_dim_k=(0, 0), head_dim_v=(0, 0),
                       is_recurrent=(True, True), n_embd_r=(100, 100), n_embd_s=(1000, 1000))
    assert max_ctx_fit(shape, 10 * MIB) > 1 << 30
    assert max_ctx_fit(shape, 1000) == 0


@given(st.integers(1, 96), st.sampled_from([1, 2, 4, 8]), st.sampled_from([64, 80, 128, 256]),
       st.integers(1 << 20, 1 << 36), st.sampled_from(sorted(CACHE_TYPES)), st.integers(1, 8),
       st.booleans())
def test_max_ctx_fit_is_the_largest_fitting_multiple_of_256(n_layer, kvh, hd, budget, t, n_seq, unified):
    shape = dense_shape(n_layer, kvh, hd)
    cfg = KVConfig(cache_type_k=t, cache_type_v=t, n_seq=n_seq, kv_unified=unified)
    n = max_ctx_fit(shape, budget, cfg)
    assert n % 256 == 0
    if n:
        assert kv_size(shape, cfg.with_(n_ctx=n)).kv_bytes <= budget
    assert kv_size(shape, cfg.with_(n_ctx=n + 256)).kv_bytes > budget


# ---- print_info parameters


def test_parse_num_list():
    assert parse_num_list("8") == [8.0]
    assert parse_num_list("[0, 0, 8, 8]") == [0, 0, 8, 8]
    assert parse_num_list("[0, 0, 8, ...]") is None
    assert parse_num_list("abc") is None


def test_shape_from_hparams_dense():
    hp = {"arch": "llama", "n_layer": "32", "n_head": "32", "n_head_kv": "8", "n_embd_head_k": "128",
          "n_embd_head_v": "128", "n_ctx_train": "131072", "n_embd": "4096", "n_swa": "0", "is_swa_any": "0"}
    shape = shape_from_hparams(hp)
    assert shape is not None and shape.source == "log"
    assert kv_size(shape, KVConfig(n_ctx=131072)).kv_mib == 16384.0


def test_shape_from_hparams_too_little():
    assert shape_from_hparams({}) is None
    assert shape_from_hparams({"arch": "llama"}) is None


def test_shape_from_hparams_head_dim_fallback():
    shape = shape_from_hparams({"arch": "llama", "n_layer": "2", "n_head": "4", "n_embd": "256"})
    assert shape.head_dim_k == (64, 64) and shape.n_head_kv == (4, 4)
    assert shape.notes


def test_shape_from_hparams_gemma2_uses_default_period():
    hp = {"arch": "gemma2", "n_layer": "6", "n_head": "8", "n_head_kv": "4", "n_embd_head_k": "64",
          "n_embd_head_v": "64", "n_swa": "512", "is_swa_any": "1", "n_ctx_train": "8192"}
    shape = shape_from_hparams(hp, {"gemma2.attention.sliding_window": "512"})
    assert shape.is_swa == (True, False) * 3 and shape.n_swa == 512


def test_shape_from_hparams_pattern_from_gguf_kv():
    hp = {"arch": "gemma3", "n_layer": "12", "n_head": "8", "n_head_kv": "4", "n_embd_head_k": "64",
          "n_swa": "1024", "is_swa_any": "1"}
    shape = shape_from_hparams(hp, {"gemma3.attention.sliding_window_pattern": "3"})
    assert shape.is_swa == swa_layers(12, 3)


def test_shape_from_hparams_hybrid_lfm2_list():
    hp = {"arch": "lfm2", "n_layer": "6", "n_head": "8", "n_head_kv": "[0, 0, 4, 0, 0, 4]",
          "n_embd_head_k": "32", "n_embd_head_v": "32", "n_embd": "256", "n_swa": "0", "is_swa_any": "0"}
    shape = shape_from_hparams(hp, {"lfm2.shortconv.l_cache": "3"})
    assert shape.has_kv == (False, False, True, False, False, True)
    assert shape.is_recurrent == (True, True, False, True, True, False)
    assert shape.n_embd_r[0] == 256 * 2 and shape.n_embd_s[0] == 0


def test_shape_from_hparams_mla():
    hp = {"arch": "deepseek2", "n_layer": "4", "n_head": "8", "n_head_kv": "1", "n_embd_head_k": "160",
          "n_embd_head_v": "128", "n_lora_kv": "128", "n_embd_head_k_mla": "64", "n_embd_head_v_mla": "32"}
    shape = shape_from_hparams(hp)
    assert shape.is_mla
    s = kv_size(shape, KVConfig(n_ctx=8192, n_seq=4))
    assert s.kv_mib == 10.0 and s.v_bytes == 0  # loc-12: "size = 10.00 MiB ... V (f16): 0.00 MiB"


def test_shape_from_hparams_qwen3next_interval():
    hp = {"arch": "qwen3next", "n_layer": "8", "n_head": "16", "n_head_kv": "2", "n_embd_head_k": "256",
          "n_embd_head_v": "256", "ssm_d_conv": "4", "ssm_d_inner": "4096", "ssm_d_state": "128",
          "ssm_n_group": "16"}
    shape = shape_from_hparams(hp)
    assert shape.has_kv == (False, False, False, True) * 2
    assert shape.n_embd_r[0] == 24576 and shape.n_embd_s[0] == 524288


def test_shape_from_hparams_nextn_layers_have_no_kv():
    hp = {"arch": "glm4moe", "n_layer": "46", "n_layer_all": "47", "n_head": "96", "n_head_kv": "8",
          "n_embd_head_k": "128"}
    shape = shape_from_hparams(hp)
    assert shape.n_layer == 47 and shape.n_layer_kv == 46 and shape.n_layer_nextn == 1


@given(st.dictionaries(st.sampled_from(["arch", "n_layer", "n_head", "n_head_kv", "n_embd_head_k",
                                        "n_swa", "is_swa_any", "n_embd", "ssm_d_inner", "n_layer_all"]),
                       st.text(max_size=30)))
def test_shape_from_hparams_never_raises(hp):
    shape = shape_from_hparams(hp)
    if shape is not None:
        kv_size(shape, KVConfig(n_ctx=4096))


def test_smallthinker_dense_first_pattern():
    # llama-model.cpp LLM_ARCH_SMALLTHINKER: n_swa = 4096; set_swa_pattern(4, true)
    hp = {"arch": "smallthinker", "n_layer": "8", "n_head": "8", "n_head_kv": "2", "n_embd_head_k": "64",
          "n_swa": "4096", "is_swa_any": "1"}
    shape = shape_from_hparams(hp)
    assert shape.is_swa == (False, True, True, True) * 2 and shape.n_swa == 4096
