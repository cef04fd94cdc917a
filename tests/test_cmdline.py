"""kvreport.cmdline: shell-line splitting, engine detection, flag grammars, rewriting."""

from __future__ import annotations

import shlex
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvreport.cmdline import llama_alias_table, parse_command, quote_problem, with_changes
from tests.paths import CASE_DIR

# --- real command lines from tests/data/cases ------------------------------------------------------


def _case_command(name: str) -> str:
    path = CASE_DIR / name / "command.txt"
    if not path.is_file():
        pytest.skip(f"shared case {name} not available")
    return path.read_text()


def test_case_cd_timeout_llama_server():
    cmd = parse_command(_case_command("loc-04-success-np4-kv-unified"))
    assert cmd["engine"] == "llama.cpp"
    assert cmd["program"] == "llama-server"
    assert cmd["flags"]["n_ctx"] == 8192
    assert cmd["flags"]["n_parallel"] == 4
    assert cmd["flags"]["kv_unified"] is True
    assert cmd["flags"]["verbosity"] == 4
    assert cmd["engine_argv"][0] == "./llama-server"


def test_case_bash_c_inside_timeout():
    cmd = parse_command(_case_command("loc-26-fail-ulimit-compute-after-q8_0-kv-600000"))
    assert cmd["program"] == "llama-server"
    f = cmd["flags"]
    assert (f["n_ctx"], f["cache_type_k"], f["cache_type_v"], f["flash_attn"]) == (65536, "q8_0", "q8_0", "on")


def test_case_env_prefixes_sycl():
    cmd = parse_command(_case_command("pub-020-ipexllm-llamacpp-sycl-3arc-ctx-above-22528"))
    assert cmd["engine"] == "llama.cpp"
    assert cmd["env"]["ONEAPI_DEVICE_SELECTOR"] == "level_zero:0,1,2"
    assert cmd["flags"]["n_gpu_layers"] == 999
    assert cmd["flags"]["split_mode"] == "layer"


def test_case_windows_paths_and_long_flags():
    cmd = parse_command(_case_command("pub-039-llamacpp-cuda-3gpu-minimax-m3-compute-buffer-51gb"))
    f = cmd["flags"]
    assert f["model"] == r"C:\models\IQ4_XS\MiniMax-M3-IQ4_XS-00001-of-00006.gguf"
    assert f["tensor_split"] == [11.0, 11.0, 10.0]
    assert f["mmap"] is False and f["fit"] == "off" and f["flash_attn"] == "on"
    assert f["cache_type_k"] == "q8_0" and f["n_ubatch"] == 2048 and f["n_parallel"] == 1


def test_case_multiline_with_make_and_subshell():
    cmd = parse_command(_case_command("pub-012-llamacpp-rocm-2x7900xtx-weights-on-gpu0-only"))
    assert cmd["program"] == "llama-cli"
    assert cmd["flags"]["n_gpu_layers"] == 999
    assert cmd["flags"]["prompt"] == "What is machine learning?"


def test_case_docker_tgi_with_unexpanded_variables():
    cmd = parse_command(_case_command("pub-030-tgi-command-r-plus-8xa30-warmup-oom"))
    assert cmd["engine"] == "tgi"
    assert cmd["flags"]["max_total_tokens"] == 11000
    assert cmd["flags"]["cuda_memory_fraction"] == 0.99


def test_case_flags_only():
    cmd = parse_command(_case_command("pub-036-llamacpp-cuda-8x3090-dsv4-compute-buffer-cuda2"))
    assert cmd["engine"] == "llama.cpp" and cmd["program"] is None
    assert cmd["flags"] == {"n_gpu_layers": 99, "n_ctx": 4096, "flash_attn": "off"}
    vl = parse_command(_case_command("pub-049-vllmrs-xinfer-kv-plan-2-seqs-x-262144"))
    assert vl["engine"] == "vllm" and vl["flags"]["max_model_len"] == 262144


# --- llama.cpp grammar ---------------------------------------------------------------------------


@pytest.mark.parametrize("line, key, value", [
    ("llama-server -c 4096", "n_ctx", 4096),
    ("llama-server --ctx-size=4096", "n_ctx", 4096),
    ("llama-server -np 4", "n_parallel", 4),
    ("llama-server --parallel=8", "n_parallel", 8),
    ("llama-server -ngl 99", "n_gpu_layers", 99),
    ("llama-server --n-gpu-layers all", "n_gpu_layers", "all"),
    ("llama-server --gpu-layers auto", "n_gpu_layers", "auto"),
    ("llama-server -ctk q4_0", "cache_type_k", "q4_0"),
    ("llama-server --cache-type-v=q8_0", "cache_type_v", "q8_0"),
    ("llama-server -fa", "flash_attn", "on"),
    ("llama-server -fa -c 5", "flash_attn", "on"),
    ("llama-server -fa off", "flash_attn", "off"),
    ("llama-server --flash-attn auto", "flash_attn", "auto"),
    ("llama-server -kvu", "kv_unified", True),
    ("llama-server --no-kv-unified", "kv_unified", False),
    ("llama-server -nkvo", "no_kv_offload", True),
    ("llama-server --kv-offload", "no_kv_offload", False),
    ("llama-server --swa-full", "swa_full", True),
    ("llama-server -fit off", "fit", "off"),
    ("llama-server -fitt 512,1024", "fit_target", [512, 1024]),
    ("llama-server -fitc 8192", "fit_ctx", 8192),
    ("llama-server -b 4096", "n_batch", 4096),
    ("llama-server -ub 1024", "n_ubatch", 1024),
    ("llama-server -sm row", "split_mode", "row"),
    ("llama-server -ts 3/1", "tensor_split", [3.0, 1.0]),
    ("llama-server -mg 1", "main_gpu", 1),
    ("llama-server --no-mmap", "mmap", False),
    ("llama-server -t 8", "threads", 8),
    ("llama-server -m /m/a.gguf", "model", "/m/a.gguf"),
    ("llama-server -lv 4", "verbosity", 4),
    ("llama-server --log-verbosity 1", "verbosity", 1),
    ("llama-server -v", "verbose", True),
    ("llama-server -dev CUDA0,CUDA1", "device", "CUDA0,CUDA1"),
    ("llama-server -ot exps=CPU", "override_tensor", "exps=CPU"),
    ("llama-server --kv-unified-per-slot 2048", "kv_unified_per_slot", 2048),
])
def test_llama_flags(line, key, value):
    assert parse_command(line)["flags"][key] == value


def test_llama_env_vars_and_command_line_precedence():
    cmd = parse_command("LLAMA_ARG_CTX_SIZE=4096 LLAMA_ARG_N_PARALLEL=2 LLAMA_ARG_FLASH_ATTN=on llama-server -c 8192")
    assert cmd["flags"]["n_ctx"] == 8192          # the command line wins
    assert cmd["flags"]["n_parallel"] == 2
    assert cmd["flags"]["flash_attn"] == "on"
    assert cmd["env"]["LLAMA_ARG_CTX_SIZE"] == "4096"
    assert parse_command("LLAMA_ARG_NO_MMAP=1 llama-server")["flags"]["mmap"] is False


def test_alias_table_covers_help():
    table = llama_alias_table()
    assert set(table["n_ctx"]) == {"-c", "--ctx-size"}
    assert set(table["n_gpu_layers"]) >= {"-ngl", "--gpu-layers", "--n-gpu-layers"}
    assert set(table["kv_unified"]) >= {"-kvu", "--kv-unified", "--no-kv-unified"}


# --- wrappers ------------------------------------------------------------------------------------


@pytest.mark.parametrize("line", [
    "CUDA_VISIBLE_DEVICES=1 ./build/bin/llama-server -c 8192",
    "cd ~/llama.cpp && ./llama-server -c 8192",
    "nohup ./llama-server -c 8192 > server.log 2>&1 &",
    "sudo -E -u llm timeout -s INT 60 nice -n 5 llama-server -c 8192",
    "env -u FOO CUDA_VISIBLE_DEVICES=1 llama-server -c 8192",
    "bash -c 'exec llama-server -c 8192'",
    "sh -c \"cd /x; llama-server -c 8192\"",
    "./llama-server \\\n  -m a.gguf \\\n  -c 8192",
    "$ llama-server -c 8192",
    "user@box:~/llama.cpp$ ./llama-server -c 8192",
    "```\nllama-server -c 8192\n```",
    "export CUDA_VISIBLE_DEVICES=0; llama-server -c 8192 2>&1 | tee log.txt",
    "docker run --gpus all -v /m:/models -p 8080:8080 ghcr.io/ggml-org/llama.cpp:server-cuda -c 8192 -m /models/a.gguf",
    r".\llama-server.exe -c 8192 -m C:\m\a.gguf",
    "numactl --interleave=all taskset -c 0-15 ./llama-server -c 8192",
    "uv run --with x llama-server -c 8192",
])
def test_wrappers(line):
    cmd = parse_command(line)
    assert cmd["engine"] == "llama.cpp", cmd
    assert cmd["program"] == "llama-server"
    assert cmd["flags"]["n_ctx"] == 8192
    assert cmd["line"] == line


def test_export_and_prefix_env():
    cmd = parse_command("export CUDA_VISIBLE_DEVICES=0,1 && GGML_CUDA_ENABLE_UNIFIED_MEMORY=1 llama-server -c 1")
    assert cmd["env"] == {"CUDA_VISIBLE_DEVICES": "0,1", "GGML_CUDA_ENABLE_UNIFIED_MEMORY": "1"}


def test_argv_input():
    cmd = parse_command(["timeout", "30", "./llama-server", "-m", "my model.gguf", "-c", "1024"])
    assert cmd["line"] == "timeout 30 ./llama-server -m 'my model.gguf' -c 1024"
    assert cmd["flags"]["model"] == "my model.gguf"
    assert cmd["engine_argv"] == ["./llama-server", "-m", "my model.gguf", "-c", "1024"]


# --- other engines -------------------------------------------------------------------------------


def test_vllm_serve():
    cmd = parse_command("CUDA_VISIBLE_DEVICES=0,1 vllm serve meta-llama/Llama-3.1-8B --max-model-len 32k "
                        "--gpu-memory-utilization 0.95 -tp 2 --enforce-eager --kv-cache-dtype fp8 "
                        "--max_num_seqs=64 --no-enable-prefix-caching")
    f = cmd["flags"]
    assert cmd["engine"] == "vllm" and cmd["program"] == "vllm"
    assert f["model"] == "meta-llama/Llama-3.1-8B"
    assert f["max_model_len"] == 32000 and f["gpu_memory_utilization"] == 0.95
    assert f["tensor_parallel_size"] == 2 and f["enforce_eager"] is True
    assert f["kv_cache_dtype"] == "fp8" and f["max_num_seqs"] == 64
    assert f["enable_prefix_caching"] is False
    assert parse_command("vllm serve m --max-model-len 32K")["flags"]["max_model_len"] == 32768


def test_vllm_module_and_docker():
    cmd = parse_command("python3 -m vllm.entrypoints.openai.api_server --model m --max-model-len 4096 "
                        "--pipeline-parallel-size 2 --block-size 16 --max-num-batched-tokens 8192")
    assert cmd["engine"] == "vllm" and cmd["program"] == "vllm.entrypoints.openai.api_server"
    assert cmd["flags"]["pipeline_parallel_size"] == 2 and cmd["flags"]["block_size"] == 16
    d = parse_command("docker run --runtime nvidia --gpus all -e VLLM_USE_V1=1 vllm/vllm-openai:v0.8 --model m")
    assert d["engine"] == "vllm" and d["env"]["VLLM_USE_V1"] == "1" and d["flags"]["model"] == "m"


def test_sglang():
    cmd = parse_command("python -m sglang.launch_server --model-path Qwen/Qwen2-7B --mem-fraction-static 0.8 "
                        "--context-length 65536 --max-running-requests 32 --tp 2 --kv-cache-dtype fp8_e5m2 "
                        "--chunked-prefill-size 4096 --disable-radix-cache")
    f = cmd["flags"]
    assert cmd["engine"] == "sglang"
    assert (f["mem_fraction_static"], f["context_length"], f["max_running_requests"], f["tp_size"]) == (
        0.8, 65536, 32, 2)
    assert f["kv_cache_dtype"] == "fp8_e5m2" and f["chunked_prefill_size"] == 4096
    assert f["disable_radix_cache"] is True and f["model_path"] == "Qwen/Qwen2-7B"


def test_ollama_env():
    cmd = parse_command("OLLAMA_CONTEXT_LENGTH=32768 OLLAMA_NUM_PARALLEL=2 OLLAMA_KV_CACHE_TYPE=q8_0 "
                        "OLLAMA_FLASH_ATTENTION=1 OLLAMA_GPU_OVERHEAD=536870912 ollama serve")
    f = cmd["flags"]
    assert cmd["engine"] == "ollama"
    assert f == {"context_length": 32768, "num_parallel": 2, "kv_cache_type": "q8_0",
                 "flash_attention": True, "gpu_overhead": 536870912}
    assert parse_command("ollama run qwen2:72b --verbose")["flags"] == {"model": "qwen2:72b", "verbose": True}


def test_koboldcpp_and_llama_cpp_python():
    k = parse_command("python koboldcpp.py --model m.gguf --contextsize 150000 --gpulayers 99 --usecublas normal 0 "
                      "--tensor_split 3 1 --flashattention --quantkv 1")
    assert k["engine"] == "llama.cpp" and k["program"] == "koboldcpp.py"
    f = k["flags"]
    assert (f["n_ctx"], f["n_gpu_layers"], f["tensor_split"], f["flash_attn"]) == (150000, 99, [3.0, 1.0], "on")
    assert f["cache_type_k"] == f["cache_type_v"] == "q8_0"
    out = with_changes(k, {"--ctx-size": 65536, "--cache-type-k": "q4_0"})
    assert "--contextsize 65536" in out and "--quantkv 2" in out and "--ctx-size" not in out
    p = parse_command("python3 -m llama_cpp.server --model m.gguf --n_ctx 4096 --n_gpu_layers -1")
    assert p["engine"] == "llama.cpp" and p["flags"]["n_ctx"] == 4096 and p["flags"]["n_gpu_layers"] == -1


def test_windows_continuations():
    ps = parse_command("llama-server.exe -m model.gguf `\n  -c 4096 `\n  -ngl 99")
    assert ps["flags"] == {"model": "model.gguf", "n_ctx": 4096, "n_gpu_layers": 99}
    cmd = parse_command("llama-server.exe -m C:\\m\\model.gguf ^\n  -c 4096")
    assert cmd["flags"]["n_ctx"] == 4096


@pytest.mark.parametrize("line", ["", "   ", "echo hi", "cd /x && ls", "'", "\"unclosed", "&&&", "\\", "\x00",
                                  "docker run", "bash -c", "python -m", "sudo", "env", "timeout 5"])
def test_odd_lines(line):
    cmd = parse_command(line)
    assert cmd["line"] == line
    assert cmd["flags"] == {} or cmd["engine"] is None


# --- with_changes --------------------------------------------------------------------------------


def test_with_changes_keeps_user_spelling_and_env():
    cmd = parse_command("cd /opt && CUDA_VISIBLE_DEVICES=0 timeout 120 ./llama-server -m /m/x.gguf -c 131072 "
                        "-np 4 --flash-attn=on -lv 4")
    out = with_changes(cmd, {"--ctx-size": 8192, "--parallel": None, "-ctk": "q8_0", "--flash-attn": "off",
                             "--kv-unified": False})
    assert out == ("CUDA_VISIBLE_DEVICES=0 ./llama-server -m /m/x.gguf -c 8192 --flash-attn=off -lv 4 "
                   "-ctk q8_0 --no-kv-unified")


def test_with_changes_replaces_every_alias():
    cmd = parse_command("llama-server -c 1 --ctx-size 2 --ctx-size=3 -ngl 99")
    assert with_changes(cmd, {"--ctx-size": 4096}) == "llama-server -c 4096 -ngl 99"
    assert with_changes(cmd, {"-ngl": None, "--swa-full": True}) == "llama-server -c 1 --ctx-size 2 --ctx-size=3 --swa-full"


def test_with_changes_quotes():
    cmd = parse_command(["llama-server", "-m", "/my models/a b.gguf"])
    out = with_changes(cmd, {"-c": 512})
    assert shlex.split(out) == ["llama-server", "-m", "/my models/a b.gguf", "-c", "512"]


def test_with_changes_vllm_and_ollama_and_docker():
    v = parse_command("vllm serve m --gpu_memory_utilization=0.8 --max-model-len 65536")
    assert with_changes(v, {"--gpu-memory-utilization": 0.95, "--max-model-len": 16384, "--enforce-eager": True}) == (
        "vllm serve m --gpu_memory_utilization=0.95 --max-model-len 16384 --enforce-eager")
    o = parse_command("OLLAMA_NUM_PARALLEL=4 ollama serve")
    assert with_changes(o, {"OLLAMA_CONTEXT_LENGTH": 8192, "OLLAMA_NUM_PARALLEL": None}) == (
        "OLLAMA_CONTEXT_LENGTH=8192 ollama serve")
    d = parse_command("docker run --gpus all -e OLLAMA_CONTEXT_LENGTH=65536 ollama/ollama")
    out = with_changes(d, {"OLLAMA_CONTEXT_LENGTH": 8192})
    assert "OLLAMA_CONTEXT_LENGTH=8192" in out and "65536" not in out and out.startswith("docker run")


# --- properties ----------------------------------------------------------------------------------

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200)
_shellish = st.lists(st.sampled_from(
    ["llama-server", "-c", "4096", "&&", "|", ";", "'", '"', "\\\n", "bash", "-c", "docker", "run", "-e", "X=1",
     "--flash-attn", "on", "-fa", "=", "$(", ")", "vllm", "serve", "--max-model-len", "1k", "ollama", "sudo",
     "timeout", "10", "env", "python", "-m", "sglang.launch_server", "C:\\x", "~", "#", "\n", "2>&1", ">"]),
    max_size=30).map(" ".join)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.one_of(_text, _shellish))
def test_parse_never_raises(line):
    cmd = parse_command(line)
    assert set(cmd) == {"line", "argv", "engine_argv", "program", "engine", "flags", "env"}
    assert cmd["line"] == line
    with_changes(cmd, {"--ctx-size": 1024})


@settings(max_examples=100, deadline=None)
@given(st.lists(_text, max_size=10))
def test_parse_argv_never_raises(argv):
    parse_command(argv)


@pytest.mark.parametrize("line, problem", [
    ('llama-server -m "unterminated -c 4096', 'unbalanced quote: nothing closes the " opened before: unterminated -c 4096'),
    ("llama-server -m 'unterminated -c 4096", "unbalanced quote: nothing closes the ' opened before: unterminated -c 4096"),
    ('llama-server -m x -c 4096 --alias "', 'unbalanced quote: nothing closes the " at the end of the line'),
    ("llama-server -m x \\", "a backslash at the end escapes nothing"),
    ('C:\\llama\\llama-server.exe -m "C:\\models\\a b.gguf -c 4096',
     'unbalanced quote: nothing closes the " opened before: C:\\models\\a b.gguf -c 4096'),
    ('$ OLLAMA_HOST=<host>:11434 ollama run "llama3', 'unbalanced quote: nothing closes the " opened before: llama3'),
])
def test_quote_problem_names_the_open_quote(line, problem):
    assert quote_problem(line) == problem


@pytest.mark.parametrize("line", [
    "llama-server -m '/m/a b.gguf' -c 4096", 'vllm serve "org/m" --max-model-len 4096',
    "bash -c 'llama-server -m \"x y.gguf\" -c 4096'", "echo it\\'s && llama-server -c 4096",
    "llama-server -c 4096 # it's a comment", "llama-server -m a.gguf \\\n  -c 4096",
    'C:\\Users\\O\'Brien\\llama-server.exe -m "C:\\m\\a b.gguf" -c 4096',
    "```\n$ llama-server -m x.gguf\n```", "llama-server -m <home>/m.gguf --api-key <token>",
])
def test_quote_problem_accepts_lines_that_split(line):
    assert quote_problem(line) is None


_word = st.text(alphabet=st.sampled_from(string.ascii_letters + string.digits + " _-=:,./@%+'\"$&|;<>()*?![]{}~^#"),
                max_size=12)


@settings(max_examples=300, deadline=None)
@given(st.lists(_word, max_size=8), st.sampled_from(['"', "'"]),
       st.text(alphabet=string.ascii_letters + string.digits + " -", min_size=1, max_size=60))
def test_quoted_lines_split_and_a_lone_quote_is_found(argv, quote, tail):
    """Any argv joined with shell quoting splits (no false alarm); the same line with one more quote that is
    never closed is refused, naming that quote and what follows it."""
    line = shlex.join(["llama-server", *argv])
    assert quote_problem(line) is None, line
    problem = quote_problem(f"{line} {quote}{tail}")
    shown = " ".join(tail.split())
    shown = shown if len(shown) <= 40 else shown[:40] + "…"
    assert problem == (f"unbalanced quote: nothing closes the {quote} opened before: {shown}" if shown
                       else f"unbalanced quote: nothing closes the {quote} at the end of the line")


_values = {
    "--ctx-size": ("n_ctx", st.integers(min_value=0, max_value=2**24)),
    "--parallel": ("n_parallel", st.integers(min_value=1, max_value=512)),
    "-ngl": ("n_gpu_layers", st.one_of(st.integers(min_value=0, max_value=999), st.sampled_from(["auto", "all"]))),
    "--cache-type-k": ("cache_type_k", st.sampled_from(["f16", "q8_0", "q4_0", "bf16"])),
    "--flash-attn": ("flash_attn", st.sampled_from(["on", "off", "auto"])),
    "--tensor-split": ("tensor_split", st.lists(st.sampled_from([1.0, 2.0, 0.5, 3.0]), min_size=1, max_size=4)),
}
_base_lines = st.sampled_from([
    "llama-server -m /m/a.gguf",
    "CUDA_VISIBLE_DEVICES=0 ./llama-server -m '/m/a b.gguf' -c 4096 -np 2",
    "cd /x && timeout 60 llama-cli -m a.gguf --ctx-size=8192 -fa -ngl 99 -ctk q8_0",
    "bash -c 'ulimit -v 1000; exec ./llama-server -c 65536 --flash-attn on -ts 1,1'",
    "llama-server -fa -np 4 -kvu",
])


@settings(max_examples=200, deadline=None)
@given(_base_lines, st.sampled_from(sorted(_values)), st.data())
def test_with_changes_round_trip(line, flag, data):
    canon, strategy = _values[flag]
    value = data.draw(strategy)
    before = parse_command(line)
    out = with_changes(before, {flag: value})
    after = parse_command(out)
    assert after["flags"][canon] == value
    for k, v in before["flags"].items():  # nothing else changed
        if k != canon:
            assert after["flags"][k] == v
    removed = parse_command(with_changes(before, {flag: None}))
    assert canon not in removed["flags"]


# --- redaction placeholders are words, not redirections (QA #1) ----------------------------------

# every placeholder kvreport.redact emits: fixed ones and the numbered <kind-N> ones
_PLACEHOLDERS = ["<home>", "<user>", "<host>", "<token>", "<credentials>", "<ip-1>", "<ip-12>", "<email-1>",
                 "<email-3>"]
# (template, flag checked, the value it must have); {p} is the placeholder
_POSITIONS = [
    ("./llama-server -m {p}/m.gguf -c 131072 -ngl 99", "model", "{p}/m.gguf"),
    ("./llama-server -m {p} -c 131072 -ngl 99", "model", "{p}"),
    ("{p}/llama.cpp/build/bin/llama-server -m /m.gguf -c 131072 -ngl 99", "model", "/m.gguf"),
    ("./llama-server -m /m.gguf --api-key {p} -c 131072 -ngl 99", "api_key", "{p}"),
    ("./llama-server -m /m.gguf --api-key={p} -c 131072 -ngl 99", "api_key", "{p}"),
    ("./llama-server -m /m.gguf -c 131072 --host {p} -ngl 99", "host", "{p}"),
    ("./llama-server -m /m.gguf -c 131072 -ngl 99 --alias {p}", "alias", "{p}"),
    ("./llama-server -m '{p}/a b.gguf' -c 131072 -ngl 99", "model", "{p}/a b.gguf"),
    ('./llama-server -m "{p}/m.gguf" -c 131072 -ngl 99', "model", "{p}/m.gguf"),
    ("HF_TOKEN={p} ./llama-server -m /m.gguf -c 131072 -ngl 99", "model", "/m.gguf"),
    ("cd {p}/llama.cpp && ./llama-server -m /m.gguf -c 131072 -ngl 99", "model", "/m.gguf"),
    ("./llama-server -m /m.gguf -c 131072 -ngl 99 > {p}/server.log 2>&1", "model", "/m.gguf"),
    ("./llama-server -m /m.gguf -c 131072 -ngl 99 2>{p}/err.log | tee {p}/out", "model", "/m.gguf"),
    ("timeout 60 bash -c './llama-server -m {p}/m.gguf -c 131072 -ngl 99 > {p}/log'", "model", "{p}/m.gguf"),
    ("<user>@<host>:~$ ./llama-server -m {p}/m.gguf -c 131072 -ngl 99", "model", "{p}/m.gguf"),
    ("./llama-server -m /m.gguf -c 131072 -ngl 99 -mu http://{p}@{p}:8080/m.gguf", "model_url",
     "http://{p}@{p}:8080/m.gguf"),
]


@pytest.mark.parametrize("placeholder", _PLACEHOLDERS)
@pytest.mark.parametrize("template,flag,value", _POSITIONS)
def test_placeholders_are_words(placeholder, template, flag, value):
    line = template.format(p=placeholder)
    parsed = parse_command(line)
    flags = parsed["flags"]
    assert parsed["engine"] == "llama.cpp" and parsed["program"] == "llama-server", parsed
    assert flags["n_ctx"] == 131072 and flags["n_gpu_layers"] == 99, flags
    assert flags[flag] == value.format(p=placeholder), flags
    assert "_positional" not in flags, flags
    new = with_changes(parsed, {"--ctx-size": 45568})
    reparsed = parse_command(new)
    assert reparsed["flags"] == {**flags, "n_ctx": 45568}, (new, reparsed["flags"])
    assert "131072" not in new and new.count("45568") == 1, new
    assert "--ctx-size" not in new, new  # the user's -c kept, its value replaced
    for word in parsed["engine_argv"]:  # no engine word lost
        assert word == "131072" or word in new or shlex.quote(word) in new, (word, new)
    if "HF_TOKEN" in line:
        assert f"HF_TOKEN={shlex.quote(placeholder)}" in new  # quoted: a bare <...> is a shell redirection


def test_with_changes_reads_the_stored_words():
    """A bundle's command was redacted word by word: its argv, not a re-lexed line, is rewritten."""
    parsed = parse_command("./llama-server -m /m.gguf -c 131072 --api-key SECRET -ngl 99 > s.log 2>&1")
    parsed["argv"] = [("<token>" if w == "SECRET" else w) for w in parsed["argv"]]
    parsed["line"] = "something else entirely < > |"  # never re-read when argv is there
    assert with_changes(parsed, {"-c": 4096}) == "./llama-server -m /m.gguf -c 4096 --api-key '<token>' -ngl 99"
    argv_parsed = parse_command(["./llama-server", "-m", "<home>/m.gguf", "-c", "5", "--api-key", "<token>"])
    assert argv_parsed["flags"]["model"] == "<home>/m.gguf"
    assert with_changes(argv_parsed, {"-c": 8}) == "./llama-server -m '<home>/m.gguf' -c 8 --api-key '<token>'"


def test_real_redirections_still_recognised():
    parsed = parse_command("./llama-server -m m.gguf -c 4096 > server.log 2>&1 < /dev/null | tee out.txt")
    assert parsed["engine_argv"] == ["./llama-server", "-m", "m.gguf", "-c", "4096"]
    assert with_changes(parsed, {"-c": 8}) == "./llama-server -m m.gguf -c 8"
    parsed = parse_command("./llama-server -m m.gguf -c 4096 >server.log 2>/dev/null")
    assert parsed["engine_argv"] == ["./llama-server", "-m", "m.gguf", "-c", "4096"]


def test_placeholder_quoting_in_rewritten_lines():
    parsed = parse_command(["./llama-server", "-m", "<home>/my model.gguf", "-c", "5"])
    new = with_changes(parsed, {"-c": 6})
    assert new == "./llama-server -m '<home>/my model.gguf' -c 6"
    assert parse_command(new)["flags"]["model"] == "<home>/my model.gguf"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_PLACEHOLDERS + ["/", "x", ".gguf", "-", "_", ":", "@", "="]), min_size=1,
                max_size=6))
def test_any_placeholder_word_survives(parts):
    word = "".join(parts)
    if word.startswith("-"):
        word = "v" + word
    parsed = parse_command(["./llama-server", "-m", word, "-c", "5", "-ngl", "99"])
    assert parsed["flags"]["model"] == word
    new = with_changes(parsed, {"-c": 7})
    assert parse_command(new)["flags"] == {**parsed["flags"], "n_ctx": 7}, new


# --- memory limits set in the line (QA #7) ---------------------------------------------------------


@pytest.mark.parametrize("line,limits", [
    ("cd /opt/llama.cpp/bin && timeout 120 bash -c 'ulimit -v 600000; exec ./llama-server -m m.gguf -c 65536'",
     {"address_space_limit_kib": 600000}),
    ("ulimit -v 800000 && ./llama-server -c 5", {"address_space_limit_kib": 800000}),
    ("ulimit -Sv 800000; ./llama-server -c 5", {"address_space_limit_kib": 800000}),
    ("ulimit -v600000; ./llama-server -c 5", {"address_space_limit_kib": 600000}),
    ("ulimit -H -v 700000 -m 9000; ./llama-server -c 5",
     {"address_space_limit_kib": 700000, "resident_set_limit_kib": 9000}),
    ("ulimit -v 900000; ulimit -v 500000; ./llama-server -c 5", {"address_space_limit_kib": 500000}),
    ("ulimit -d 400000 && ulimit -l 64 && ./llama-server -c 5", {"data_limit_kib": 400000,
                                                               "locked_memory_limit_kib": 64}),
    ("(ulimit -v 600000; exec ./llama-server -c 5) > log 2>&1", {"address_space_limit_kib": 600000}),
    ("prlimit --as=1073741824 ./llama-server -c 5", {"address_space_limit_kib": 1048576}),
    ("docker run --gpus all -m 4g ghcr.io/ggml-org/llama.cpp:server -c 5", {"container_memory_limit_mib": 4096.0}),
    ("docker run --memory=512m vllm/vllm-openai --max-model-len 5", {"container_memory_limit_mib": 512.0}),
])
def test_memory_limits_in_the_line(line, limits):
    parsed = parse_command(line)
    assert parsed["engine"] in ("llama.cpp", "vllm") and parsed["limits"] == limits, parsed


@pytest.mark.parametrize("line", [
    "./llama-server -c 5", "ulimit -v unlimited; ./llama-server -c 5", "ulimit -a && ./llama-server -c 5",
    "./llama-server -c 5; ulimit -v 5", "ulimit -c 0 && ./llama-server -c 5",
])
def test_no_memory_limits(line):
    assert "limits" not in parse_command(line)


def test_ulimit_cases():
    for name, kib in (("loc-21-fail-ulimit-kv-600000", 600000), ("loc-41-neg-ulimit-weights-buffer-no-mmap-150000",
                                                                150000)):
        path = CASE_DIR / name / "command.txt"
        if path.is_file():
            assert parse_command(path.read_text())["limits"] == {"address_space_limit_kib": kib}


def test_a_windows_command_is_quoted_the_windows_way():
    # cmd.exe knows no single quotes and PowerShell runs no quoted string as a program without "&": a Windows line keeps
    # bare words bare and double-quotes the rest, "&" only where the user typed it (QA)
    cmd = parse_command('.\\llama-server.exe -m "C:\\models\\m.gguf" -c 131072 -ngl 99')
    assert with_changes(cmd, {"--ctx-size": 4096}) == ".\\llama-server.exe -m C:\\models\\m.gguf -c 4096 -ngl 99"
    cmd = parse_command('& "C:\\Program Files\\llama\\llama-server.exe" -m "C:\\my models\\m.gguf" -c 131072')
    assert with_changes(cmd, {"--ctx-size": 4096}) == \
        '& "C:\\Program Files\\llama\\llama-server.exe" -m "C:\\my models\\m.gguf" -c 4096'
    for line in (".\\llama-server.exe -m m.gguf -c 4096", '& "C:\\a b\\llama-server.exe" -c 1'):
        assert parse_command(with_changes(parse_command(line), {"--ctx-size": 2048}))["flags"]["n_ctx"] == 2048
