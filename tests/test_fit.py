"""`kvreport fit`: the seeds' case (issue 4) and the CLI around fit_report."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from kvreport import fit as fit_mod
from kvreport.cli import main
from kvreport.errors import InputError
from kvreport.fit import fit_report, render_fit
from kvreport.kvcache import dense_shape
from tests.paths import case_dirs
from tests.tinygguf import dense


@pytest.fixture
def llama3_8b(tmp_path):
    """A GGUF header with Llama-3-8B's shape: 32 layers, 32 heads, 8 KV heads, head dim 128."""
    return dense(tmp_path / "llama3-8b.gguf", n_layer=32, n_head=32, n_head_kv=8, n_embd=4096, ctx=8192)


def test_seed_case_numbers():
    # issue 4 / design.md: Llama-3-8B shape, -c 262144, 1024 MiB free, no headroom
    shape = dense_shape(32, 8, 128, n_ctx_train=8192)
    rep = fit_report(shape, 262144, 1024, headroom_mib=0)
    assert rep["kv_bytes_per_token"] == 131072  # 128 KiB
    assert rep["kv_required_mib"] == 32768.0  # 32 GiB
    assert rep["max_ctx_fit"]["f16"] == 8192
    assert rep["max_ctx_fit"]["q8_0"] == 15360
    assert rep["max_ctx_fit_exact"]["q8_0"] == 15420
    assert rep["headroom_mib"] == 0
    assert rep["fits"] is False
    assert {"kv_bytes_per_token", "kv_required_mib", "max_ctx_fit", "headroom_mib", "inputs"} <= rep.keys()


def test_seed_case_text_says_it_plainly(llama3_8b):
    r = CliRunner().invoke(main, ["fit", "--model", str(llama3_8b), "-c", "262144", "--free-mib", "1024"])
    assert r.exit_code == 0, r.output
    out = r.output
    assert "262,144 tokens" in out and "tokens, not bytes" in out
    assert "128 KiB" in out and "32 GiB" in out
    assert "8,192 tokens at f16" in out and "15,360 at q8_0" in out and "15,420" in out
    assert "0 MiB headroom" in out and "none subtracted" in out


def test_seed_case_json(llama3_8b):
    r = CliRunner().invoke(main, ["fit", "--model", str(llama3_8b), "-c", "262144", "--free-mib", "1024", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["max_ctx_fit"] == {"f16": 8192, "q8_0": 15360, "q4_0": 28928}
    assert rep["inputs"]["source"] == "gguf" and rep["inputs"]["n_head_kv"] == 8


def test_headroom_is_subtracted_and_explained():
    shape = dense_shape(32, 8, 128)
    rep = fit_report(shape, 8192, 2048, headroom_mib=1024)
    assert rep["budget_mib"] == 1024 and rep["max_ctx_fit"]["f16"] == 8192
    text = render_fit(rep, shape)
    assert "1,024 MiB headroom" in text


def test_parallel_split_vs_unified():
    shape = dense_shape(32, 8, 128)
    split = fit_report(shape, 32768, 8000, parallel=4)
    assert split["inputs"]["kv_unified"] is False
    assert split["max_ctx_fit"]["f16"] % (4 * 256) == 0
    assert split["max_ctx_fit_parallel_1"]["f16"] == 64000
    unified = fit_report(shape, 32768, 8000, parallel=4, kv_unified=True)
    assert unified["max_ctx_fit"]["f16"] == 64000


def test_requested_type_and_unknown_type():
    shape = dense_shape(32, 8, 128)
    rep = fit_report(shape, 8192, 1024, cache_type_k="q5_1", cache_type_v="q5_1")
    assert "q5_1" in rep["max_ctx_fit"]
    with pytest.raises(InputError, match="unknown cache type"):
        fit_report(shape, 8192, 1024, cache_type_k="turbo9")


def test_fit_from_a_real_log():
    case = next(c for c in case_dirs() if c.name.startswith("loc-17"))
    r = CliRunner().invoke(main, ["fit", "--log", str(case / "log.txt"), "--free-mib", "4096", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["kv_required_mib"] == 65536.0  # the log printed size = 65536.00 MiB
    assert rep["inputs"]["source"] == "log"


def test_fit_from_a_log_fits_into_the_logs_own_free_memory(monkeypatch):
    """Without --free-mib, a log that printed its devices' free memory is fitted into that memory (the machine
    running kvreport is often not the one that wrote the log), never into the local devices'."""
    monkeypatch.setattr(fit_mod, "local_free_mib", lambda *a: pytest.fail("local devices probed for a log's fit"))
    case = next(c for c in case_dirs() if c.name.startswith("loc-17"))  # "CPU : AMD EPYC (24105 MiB, 24105 MiB free)"
    r = CliRunner().invoke(main, ["fit", "--log", str(case / "log.txt"), "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["free_mib"] == 24105.0 and "the log's free memory on CPU" in rep["free_source"]
    assert not rep["fits"]
    # the headroom is the compute buffer the log printed for that device, as `analyze` keeps it: the two agree
    assert rep["headroom_mib"] == 160.64 and "compute buffer the log printed" in rep["headroom_reason"]
    d = json.loads(CliRunner().invoke(main, ["analyze", str(case / "log.txt"), "--json"]).output)
    assert rep["max_ctx_fit"] == d["memory"]["max_ctx_fit"]


def test_fit_with_model_and_log_keeps_the_logs_context_and_free_memory(monkeypatch, llama3_8b):
    """--model gives the shape; the --log beside it still gives the context it ran with and its free memory."""
    monkeypatch.setattr(fit_mod, "local_free_mib", lambda *a: pytest.fail("local devices probed for a log's fit"))
    case = next(c for c in case_dirs() if c.name.startswith("loc-17"))
    with_log = json.loads(CliRunner().invoke(main, ["fit", "--model", str(llama3_8b), "--log",
                                                    str(case / "log.txt"), "--json"]).output)
    assert with_log["inputs"]["source"] == "gguf" and with_log["inputs"]["n_head_kv"] == 8
    assert with_log["free_mib"] == 24105.0 and "the log's free memory on CPU" in with_log["free_source"]
    log_only = json.loads(CliRunner().invoke(main, ["fit", "--log", str(case / "log.txt"), "--json"]).output)
    assert with_log["inputs"]["n_ctx"] == log_only["inputs"]["n_ctx"]


def test_fit_from_hf_config(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
                               "num_key_value_heads": 8, "hidden_size": 4096,
                               "max_position_embeddings": 131072}))
    r = CliRunner().invoke(main, ["fit", "--config", str(cfg), "-c", "131072", "--free-mib", "20000", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["kv_required_mib"] == 16384.0


def test_missing_model_is_a_one_line_error():
    r = CliRunner().invoke(main, ["fit", "--free-mib", "1000"])
    assert r.exit_code == 2
    assert "--model" in r.output


def test_without_free_mib_uses_probes(monkeypatch, llama3_8b):
    class FakeProbes:
        @staticmethod
        def run_all(timeout):
            return {"host": {"ram_free_mib": 64000},
                    "devices": [{"backend": "cuda", "name": "CUDA0", "free_mib": 9216}],
                    "engine": {}, "ollama": None, "python_engines": None, "probes": {}, "seconds": 0.1}

    monkeypatch.setitem(sys.modules, "kvreport.probes", FakeProbes)
    monkeypatch.setattr("kvreport.probes", FakeProbes, raising=False)
    r = CliRunner().invoke(main, ["fit", "--model", str(llama3_8b), "-c", "8192", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["free_mib"] == 9216 and rep["headroom_mib"] == fit_mod.DEFAULT_HEADROOM_MIB
    assert rep["max_ctx_fit"]["f16"] == 65536  # (9216 - 1024) MiB / 128 KiB


def test_without_free_mib_and_no_probe(monkeypatch, llama3_8b):
    class NoRunAll:
        pass

    monkeypatch.setitem(sys.modules, "kvreport.probes", NoRunAll)
    monkeypatch.setattr("kvreport.probes", NoRunAll, raising=False)
    r = CliRunner().invoke(main, ["fit", "--model", str(llama3_8b)])
    assert r.exit_code == 2 and "--free-mib" in r.output


def test_cli_model_error_is_one_line(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"PK\x03\x04zipzipzip" * 4)
    r = subprocess.run([sys.executable, "-m", "kvreport.cli", "fit", "--model", str(p), "--free-mib", "1000"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "not a GGUF file" in r.stderr


def test_swa_model_table_counts_the_window_cache():
    from kvreport.kvcache import ModelShape, swa_layers

    shape = ModelShape(arch="gpt-oss", n_layer=24, n_head_kv=(8,) * 24, head_dim_k=(64,) * 24,
                       head_dim_v=(64,) * 24, is_swa=swa_layers(24, 2), n_swa=128)
    rep = fit_report(shape, 131072, 4096)
    assert rep["kv_required_mib"] == 3090.0  # kv-worked-examples.md §2: 3,072 + 18 MiB
    assert rep["kv_required_mib_by_type"]["f16"] == 3090.0
    assert rep["max_ctx_fit"]["f16"] == (4096 - 18) * 1024 * 1024 // (12 * 2048) // 256 * 256


def test_ctk_alone_leaves_v_at_f16_as_llama_cpp_does():
    shape = dense_shape(n_layer=32, n_head_kv=8, head_dim=128)
    rep = fit_report(shape, 8192, 4096, cache_type_k="q8_0")
    assert rep["inputs"]["cache_type_k"] == "q8_0" and rep["inputs"]["cache_type_v"] == "f16"
    # K q8_0 (1088 B/layer/token) + V f16 (2048 B/layer/token), 32 layers, 8192 tokens
    assert rep["kv_required_mib"] == (1088 + 2048) * 32 * 8192 / 2**20


def test_fit_from_a_log_takes_the_cache_types_printed_on_the_kv_size_line():
    from tests.paths import CASE_DIR

    log = CASE_DIR / "loc-35-success-ctk-q8_0-only-fa-off" / "log.txt"
    r = CliRunner().invoke(main, ["fit", "--log", str(log), "--free-mib", "4096", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["inputs"]["cache_type_k"] == "q8_0" and rep["inputs"]["cache_type_v"] == "f16"
    assert rep["kv_required_mib"] == 49.0  # llama_kv_cache: size = 49.00 MiB ... K (q8_0) ... V (f16)


def test_fit_from_an_hf_config_speaks_vllm_cache_types(tmp_path):
    """A Hugging Face config is sized for vLLM / SGLang: 16-bit and fp8 (one byte per value), not llama.cpp's q8_0."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
                               "num_key_value_heads": 8, "hidden_size": 4096, "max_position_embeddings": 131072}))
    r = CliRunner().invoke(main, ["fit", "--config", str(cfg), "-c", "131072", "--free-mib", "20000", "--json"])
    rep = json.loads(r.output)
    assert set(rep["max_ctx_fit"]) == {"f16", "fp8"}
    assert rep["kv_bytes_per_token_by_type"]["fp8"] * 2 == rep["kv_bytes_per_token_by_type"]["f16"]
    assert not any("-fa" in n for n in rep["notes"])


def test_fit_answers_for_the_cache_types_asked_for(llama3_8b):
    # -ctk q8_0 alone (V stays f16) or a pair outside the table's rows: the summary gives that pair's own context first
    r = CliRunner().invoke(main, ["fit", "--model", str(llama3_8b), "--free-mib", "8192", "-ctk", "q8_0"])
    assert r.exit_code == 0, r.output
    rep = json.loads(CliRunner().invoke(main, ["fit", "--model", str(llama3_8b), "--free-mib", "8192", "-ctk", "q8_0",
                                               "--json"]).output)
    asked = rep["max_ctx_fit_requested_types"] // 256 * 256
    assert rep["max_ctx_fit"]["f16"] < asked < rep["max_ctx_fit"]["q8_0"]
    assert f"caps the context at {asked:,} tokens at K q8_0 / V f16" in r.output


def test_fit_of_a_config_with_a_vllm_log_uses_its_max_model_len_and_its_pool(tmp_path):
    # a vLLM log has no -c and no llama.cpp --fit margin: its max_model_len is the context asked for and its KV pool
    # (here "can be stored in KV cache (20000)" tokens) the budget (QA)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
                               "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                               "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}))
    log = tmp_path / "vllm.log"
    log.write_text("ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be "
                   "stored in KV cache (20000). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` "
                   "when initializing the engine.\n")
    r = CliRunner().invoke(main, ["fit", "--config", str(cfg), "--log", str(log), "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["inputs"]["ctx_size"] == 32768 and rep["headroom_mib"] == 0.0 and not rep["fits"]
    assert 19_000 < min(rep["max_ctx_fit"].values()) <= 20_000  # the 16-bit row: the pool itself


def test_free_mib_takes_a_unit(llama3_8b):
    for value in ("8GiB", "8 GB", "8192MiB", "8192"):
        r = CliRunner().invoke(main, ["fit", "--model", str(llama3_8b), "--free-mib", value, "--json"])
        assert r.exit_code == 0 and json.loads(r.output)["free_mib"] == 8192.0, (value, r.output)
    r = CliRunner().invoke(main, ["fit", "--model", str(llama3_8b), "--free-mib", "8 apples"])
    assert r.exit_code == 2 and "is not a number of MiB" in r.output
