"""GGUF header reading on tiny real files written with gguf-py's GGUFWriter (tests/tinygguf.py)."""

from __future__ import annotations

import resource
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvreport.errors import ModelFileError
from kvreport.gguf_meta import gguf_summary, read_gguf_metadata, shape_from_gguf
from kvreport.kvcache import MIB, KVConfig, kv_size, swa_layers
from tests.tinygguf import dense, write_gguf


def test_dense_gqa(tmp_path):
    p = dense(tmp_path / "m.gguf", n_layer=4, n_head=8, n_head_kv=2, n_embd=256, ctx=4096)
    meta = read_gguf_metadata(p)
    assert meta["general.architecture"] == "llama"
    assert meta["llama.block_count"] == 4
    assert meta["GGUF.version"] == 3
    shape = shape_from_gguf(p)
    assert shape.source == "gguf"
    assert shape.n_head_kv == (2,) * 4 and shape.head_dim_k == (32,) * 4  # 256 / 8
    # 4 layers x 2 heads x 32 x 2 (K+V) x 2 B = 1 KiB/token -> 4 MiB at 4096 (loc-02 prints 4.00 MiB)
    assert kv_size(shape, KVConfig(n_ctx=4096)).kv_mib == 4.0


def test_per_layer_head_count_kv_array(tmp_path):
    p = write_gguf(tmp_path / "m.gguf", "llama", {
        ".block_count": 4, ".embedding_length": 512, ".context_length": 8192,
        ".attention.head_count": 8, ".attention.head_count_kv": [8, 4, 2, 0],
        ".attention.key_length": 64, ".attention.value_length": 64})
    shape = shape_from_gguf(p)
    assert shape.n_head_kv == (8, 4, 2, 0)
    assert shape.has_kv == (True, True, True, False)
    s = kv_size(shape, KVConfig(n_ctx=1024))
    assert s.bytes_per_token == (8 + 4 + 2) * 64 * 2 * 2


def test_swa_scalar_pattern_and_swa_head_sizes(tmp_path):
    p = write_gguf(tmp_path / "g.gguf", "gemma3", {
        ".block_count": 12, ".embedding_length": 512, ".context_length": 32768,
        ".attention.head_count": 8, ".attention.head_count_kv": 4,
        ".attention.key_length": 128, ".attention.value_length": 128,
        ".attention.sliding_window": 1024, ".attention.sliding_window_pattern": 6})
    shape = shape_from_gguf(p)
    assert shape.is_swa == swa_layers(12, 6) and shape.n_swa == 1024
    s = kv_size(shape, KVConfig(n_ctx=32768))
    assert (s.n_layer_full, s.n_layer_swa, s.swa_cells) == (2, 10, 1536)


def test_swa_default_period_gemma2(tmp_path):
    p = write_gguf(tmp_path / "g2.gguf", "gemma2", {
        ".block_count": 6, ".embedding_length": 512, ".context_length": 8192,
        ".attention.head_count": 8, ".attention.head_count_kv": 4,
        ".attention.key_length": 64, ".attention.value_length": 64, ".attention.sliding_window": 512})
    shape = shape_from_gguf(p)
    # loc-10: -c 8192 -np 4 --no-kv-unified -> 24.00 + 12.00 MiB
    s = kv_size(shape, KVConfig(n_ctx=8192, n_seq=4, kv_unified=False))
    assert (s.kv_full_mib, s.kv_swa_mib) == (24.0, 12.0)


def test_swa_bool_array_and_shared_kv_layers(tmp_path):
    pattern = [True, True, True, False]
    p = write_gguf(tmp_path / "g4.gguf", "gemma4", {
        ".block_count": 8, ".embedding_length": 512, ".context_length": 131072,
        ".attention.head_count": 8, ".attention.head_count_kv": 2,
        ".attention.key_length": 256, ".attention.value_length": 256,
        ".attention.key_length_swa": 128, ".attention.value_length_swa": 128,
        ".attention.sliding_window": 512, ".attention.sliding_window_pattern": pattern,
        ".attention.shared_kv_layers": 2})
    shape = shape_from_gguf(p)
    assert shape.is_swa == tuple(pattern * 2)
    assert shape.head_dim_k[0] == 128 and shape.head_dim_k[3] == 256
    assert shape.has_kv == (True,) * 6 + (False, False)


def test_mla(tmp_path):
    p = write_gguf(tmp_path / "ds.gguf", "deepseek2", {
        ".block_count": 61, ".embedding_length": 7168, ".context_length": 163840,
        ".attention.head_count": 128, ".attention.head_count_kv": 1,
        ".attention.key_length": 576, ".attention.value_length": 512,
        ".attention.key_length_mla": 192, ".attention.value_length_mla": 128,
        ".attention.kv_lora_rank": 512})
    shape = shape_from_gguf(p)
    assert shape.is_mla and shape.kv_lora_rank == 512
    # kv-worked-examples.md §4: 2,196 MiB at 32k, V-less
    s = kv_size(shape, KVConfig(n_ctx=32768))
    assert s.kv_mib == 2196.0 and s.v_bytes == 0


def test_hybrid_qwen3next(tmp_path):
    p = write_gguf(tmp_path / "q.gguf", "qwen3next", {
        ".block_count": 48, ".embedding_length": 2048, ".context_length": 262144,
        ".attention.head_count": 16, ".attention.head_count_kv": 2,
        ".attention.key_length": 256, ".attention.value_length": 256, ".full_attention_interval": 4,
        ".ssm.conv_kernel": 4, ".ssm.inner_size": 4096, ".ssm.state_size": 128, ".ssm.group_count": 16,
        ".ssm.time_step_rank": 32})
    s = kv_size(shape_from_gguf(p), KVConfig(n_ctx=262144))
    assert s.kv_mib == 6144.0 and s.rs_mib == 75.375  # kv-worked-examples.md §5


def test_hybrid_lfm2(tmp_path):
    p = write_gguf(tmp_path / "l.gguf", "lfm2", {
        ".block_count": 6, ".embedding_length": 256, ".context_length": 128000,
        ".attention.head_count": 8, ".attention.head_count_kv": [0, 0, 4, 0, 0, 4],
        ".shortconv.l_cache": 3})
    shape = shape_from_gguf(p)
    s = kv_size(shape, KVConfig(n_ctx=1048576, n_seq=4))
    assert s.kv_mib == 1024.0  # loc-56: the failed KV buffer of 1073741824 bytes
    assert s.n_layer_recurrent == 4 and s.rs_bytes == 4 * 4 * 256 * 2 * 4


def test_long_arrays_are_summarized(tmp_path):
    p = write_gguf(tmp_path / "v.gguf", "llama", {
        ".block_count": 2, ".embedding_length": 64, ".attention.head_count": 2}, n_vocab=5000)
    meta = read_gguf_metadata(p)
    assert meta["tokenizer.ggml.tokens"] == {"array": "string", "len": 5000}
    assert "tokenizer.ggml.tokens" not in gguf_summary(meta)


def test_nextn_layers(tmp_path):
    p = write_gguf(tmp_path / "glm.gguf", "glm4moe", {
        ".block_count": 47, ".nextn_predict_layers": 1, ".embedding_length": 4096,
        ".attention.head_count": 96, ".attention.head_count_kv": 8, ".attention.key_length": 128,
        ".attention.value_length": 128})
    shape = shape_from_gguf(p)
    assert shape.n_layer == 47 and shape.n_layer_kv == 46


# ---- bad files


def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError, match="not found"):
        read_gguf_metadata(tmp_path / "nope.gguf")


def test_not_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_text("hello world, not a model")
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        read_gguf_metadata(p)


def test_empty_file_and_directory(tmp_path):
    (tmp_path / "e.gguf").write_bytes(b"")
    with pytest.raises(ModelFileError, match="empty"):
        read_gguf_metadata(tmp_path / "e.gguf")
    with pytest.raises(ModelFileError, match="directory"):
        read_gguf_metadata(tmp_path)


def test_unknown_version(tmp_path):
    p = tmp_path / "v9.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 9, 0, 0))
    with pytest.raises(ModelFileError, match="version 9"):
        read_gguf_metadata(p)


def test_truncated_header(tmp_path):
    p = dense(tmp_path / "t.gguf")
    data = p.read_bytes()
    p.write_bytes(data[:100])
    with pytest.raises(ModelFileError, match="truncated"):
        read_gguf_metadata(p)


def test_truncated_tensor_data(tmp_path):
    p = write_gguf(tmp_path / "td.gguf", "llama", {".block_count": 1, ".attention.head_count": 1,
                                                    ".embedding_length": 64},
                   tensors={"token_embd.weight": (64, 64)})
    data = p.read_bytes()
    p.write_bytes(data[:-1000])
    with pytest.raises(ModelFileError, match="truncated GGUF file"):
        read_gguf_metadata(p)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(st.binary(max_size=300), st.integers(0, 400))
def test_garbage_and_cut_files_raise_model_file_error_only(tmp_path, junk, cut):
    good = dense(tmp_path / "base.gguf").read_bytes()
    for data in (b"GGUF" + junk, good[:cut] + junk):
        p = tmp_path / "fuzz.gguf"
        p.write_bytes(data)
        try:
            read_gguf_metadata(p)
        except ModelFileError:
            pass


# ---- a big sparse model: header only


def test_big_sparse_model_reads_only_the_header(tmp_path):
    tensors = {f"blk.{i}.ffn_up.weight": (8192, 8192) for i in range(150)}  # 150 x 256 MiB = 37.5 GiB
    p = write_gguf(tmp_path / "big.gguf", "llama", {
        ".block_count": 80, ".embedding_length": 8192, ".context_length": 131072,
        ".attention.head_count": 64, ".attention.head_count_kv": 8}, n_vocab=50000,
        tensors=tensors, declare_only=True, sparse_size=41 * 10**9)
    assert p.stat().st_size > 40 * 10**9
    before = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    shape = shape_from_gguf(p)
    elapsed = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF)
    assert shape.n_layer == 80
    assert elapsed < 1.0
    # page faults stay far below what touching the tensor data would need (40 GB / 4 KiB)
    assert (after.ru_minflt - before.ru_minflt) + (after.ru_majflt - before.ru_majflt) < 20000
    assert kv_size(shape, KVConfig(n_ctx=32768)).kv_mib == 80 * 32768 * 4096 / MIB
