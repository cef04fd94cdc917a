"""kvreport.collect: build_bundle, kvreport collect (CLI), atomic writes, upload confirmation."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvreport import collect, fsutil, probes
from kvreport.bundle import validate_bundle
from kvreport.cli import main
from kvreport.commands import collect as collect_cmd
from kvreport.errors import UploadError
from tests.paths import CASE_DIR

FAKE_PROBES = {
    "host": {"os": "Linux", "ram_total_mib": 32000.0, "ram_free_mib": 20000.0},
    "devices": [{"backend": "cuda", "index": 0, "name": "NVIDIA GeForce RTX 3090", "total_mib": 24576.0,
                 "free_mib": 23131.0, "used_mib": 1180.0, "source": "nvml"}],
    "engine": {}, "ollama": None, "python_engines": None,
    "probes": {"host": "ok", "nvml": "ok", "vulkan": "absent"}, "seconds": 0.01,
}


@pytest.fixture(autouse=True)
def fixed_probes(monkeypatch):
    """The machine's real tools never matter here: probes answer as a one-GPU box."""
    calls = []

    def run_all(timeout=3.0, **kw):
        calls.append((timeout, kw))
        return json.loads(json.dumps(FAKE_PROBES))

    monkeypatch.setattr(probes, "run_all", run_all)
    return calls


def _case(name: str) -> Path:
    path = CASE_DIR / name
    if not path.is_dir():
        pytest.skip(f"shared case {name} not available")
    return path


# --- build_bundle --------------------------------------------------------------------------------


def test_build_bundle_from_case(fixed_probes):
    case = _case("loc-15-fail-huge-ctx-fit-default")
    lines = (case / "log.txt").read_text().splitlines()
    bundle = collect.build_bundle(lines, (case / "command.txt").read_text(), None, 1.5)
    validate_bundle(bundle)
    assert bundle["schema"] == "kvreport/bundle@1" and len(bundle["id"]) == 26
    assert bundle["created_at"].endswith("Z")
    assert bundle["command"]["flags"]["n_ctx"] == 131072 and bundle["command"]["program"] == "llama-server"
    assert bundle["engine"]["name"] == "llama.cpp"
    assert bundle["log"]["line_count"] == len(lines) and bundle["log"]["source"] == "file"
    assert bundle["devices"][0]["name"] == "NVIDIA GeForce RTX 3090"
    assert bundle["probes"]["nvml"] == "ok"
    assert bundle["model"] == {"path": "/models/tiny-fatkv.gguf", "file_name": "tiny-fatkv.gguf",
                               "error": "not found on this machine (named in the command)"}
    assert fixed_probes[0][0] == 1.5 and fixed_probes[0][1]["engine_program"] == "llama-server"


def test_log_only_llamacpp_leaves_flags_empty():
    case = _case("loc-17-fail-huge-ctx-verbose")
    bundle = collect.build_bundle((case / "log.txt").read_text().splitlines(), None, None, 1.0)
    assert bundle["command"] == {}
    assert bundle["engine"].get("name") == "llama.cpp"


def test_any_command_line_is_accepted():
    for line in ["'unclosed", "&& || ;;", "cd /x && make -j", "\x00\x01", "docker run", "a" * 10000]:
        bundle = collect.build_bundle(["hello"], line, None, 1.0)
        assert bundle["command"]["line"] == line.replace("\x00", "\x00")


def test_environment_settings_become_flags():
    bundle = collect.build_bundle(None, ["ollama", "serve"], None, 1.0,
                                  extra_env={"OLLAMA_CONTEXT_LENGTH": "32768", "CUDA_VISIBLE_DEVICES": "1"})
    assert bundle["command"]["line"] == "ollama serve"
    assert bundle["command"]["flags"]["context_length"] == 32768
    assert bundle["command"]["env"]["CUDA_VISIBLE_DEVICES"] == "1"
    bundle = collect.build_bundle(None, "llama-server -c 4096", None, 1.0,
                                  extra_env={"LLAMA_ARG_CTX_SIZE": "1024", "LLAMA_ARG_N_PARALLEL": "2"})
    assert bundle["command"]["flags"]["n_ctx"] == 4096 and bundle["command"]["flags"]["n_parallel"] == 2


def test_model_file_read_and_bad_model(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from tinygguf import dense

    good = tmp_path / "tiny.gguf"
    dense(good)
    bundle = collect.build_bundle(None, None, str(good), 1.0)
    assert bundle["model"]["file_name"] == "tiny.gguf" and bundle["model"]["size_bytes"] == good.stat().st_size
    assert bundle["model"]["gguf"]["general.architecture"] == "llama"
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOTGGUF" * 10)
    bundle = collect.build_bundle(None, None, str(bad), 1.0)
    assert "not a GGUF file" in bundle["model"]["error"] and "gguf" not in bundle["model"]
    bundle = collect.build_bundle(None, f"llama-server -m {good} -c 512", None, 1.0)  # -m of the command
    assert bundle["model"]["gguf"]["llama.block_count"] == 4


def test_memory_snapshot_prefers_llama_list_devices():
    result = {"devices": FAKE_PROBES["devices"], "host": {"ram_free_mib": 1000.0, "ram_total_mib": 2000.0},
              "engine": {"list_devices": [{"name": "CUDA0", "description": "NVIDIA GeForce RTX 3090",
                                           "total_mib": 24126.0, "free_mib": 23863.0}]}}
    assert collect.memory_snapshot(result) == [{"device": "CUDA0", "name": "NVIDIA GeForce RTX 3090",
                                                "backend": "cuda", "free_mib": 23863.0, "total_mib": 24126.0,
                                                "source": "llama.cpp --list-devices"},
                                               {"device": "CPU", "name": None, "backend": "cpu", "free_mib": 1000.0,
                                                "total_mib": 2000.0, "source": "psutil (available RAM)"}]
    assert collect.memory_snapshot({"devices": FAKE_PROBES["devices"]})[0]["device"] == "CUDA0"


# --- atomic writes -------------------------------------------------------------------------------


def test_write_json_atomic_never_leaves_partial(tmp_path, monkeypatch):
    target = tmp_path / "b.json"
    fsutil.write_json_atomic(target, {"a": 1})
    assert json.loads(target.read_text()) == {"a": 1}

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        fsutil.write_json_atomic(target, {"a": 2, "big": "x" * 100000})
    assert json.loads(target.read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json"]


# --- CLI -----------------------------------------------------------------------------------------


def _invoke(args, input=None):
    return CliRunner().invoke(main, args, input=input, catch_exceptions=False)


def test_cli_collect_writes_bundle_and_prints(tmp_path):
    case = _case("loc-21-fail-ulimit-kv-600000")
    out = tmp_path / "b.json"
    r = _invoke(["collect", "--log", str(case / "log.txt"), "--command", (case / "command.txt").read_text(),
                 "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "redacted:" in r.output and f"wrote {out}" in r.output
    bundle = validate_bundle(json.loads(out.read_text()))
    assert bundle["command"]["flags"]["n_ctx"] == 65536


def test_cli_collect_json_is_only_json_on_stdout(tmp_path):
    case = _case("loc-21-fail-ulimit-kv-600000")
    r = CliRunner().invoke(main, ["collect", "--log", str(case / "log.txt"), "--json", "-o", str(tmp_path / "b.json")],
                           catch_exceptions=False)
    assert r.exit_code == 0
    diag = json.loads(r.stdout)
    assert diag["engine"] == "llama.cpp" and "failure" in diag


def test_cli_collect_show(tmp_path):
    r = _invoke(["collect", "--show", "-o", str(tmp_path / "b.json"), "--command", "llama-server -c 1024"])
    assert r.exit_code == 0
    assert '"schema": "kvreport/bundle@1"' in r.output


def test_cli_collect_unreadable_log(tmp_path):
    r = CliRunner().invoke(main, ["collect", "--log", str(tmp_path / "missing.log"), "-o", str(tmp_path / "b.json")])
    assert r.exit_code == 2
    assert r.stderr.strip().count("\n") == 0 and r.stderr.startswith("kvreport: error: cannot read log")
    assert not (tmp_path / "b.json").exists()


def test_cli_collect_stdin_log(tmp_path):
    r = CliRunner().invoke(main, ["collect", "--log", "-", "-o", str(tmp_path / "b.json")],
                           input="llama_kv_cache: size = 1024.00 MiB\n")
    assert r.exit_code == 0
    assert json.loads((tmp_path / "b.json").read_text())["log"]["source"] == "stdin"


_NOT_LOGS = [(b"", "it is empty"), (b"\n  \n", "it is empty"), (bytes(range(256)) * 40, "it is binary data, not a log"),
             (b"\x1f\x8b\x08\x00" + b"x" * 100, "it is gzip data, not a log (decompress it first)"),
             (b"GGUF\x03\x00\x00\x00" + b"\x00" * 100, "it is a GGUF model file, not a log")]


@pytest.mark.parametrize(("content", "why"), _NOT_LOGS)
def test_cli_collect_refuses_what_analyze_refuses(tmp_path, content, why):
    """An empty or binary --log (a file or standard input) is the same one-line error, exit 2, as for
    `kvreport analyze`, and no bundle is written; `kvreport run --log` reads it the same way."""
    log = tmp_path / "in.log"
    log.write_bytes(content)
    out = tmp_path / "b.json"
    cli = [sys.executable, "-m", "kvreport.cli"]
    runs = {
        "collect file": subprocess.run([*cli, "collect", "--log", str(log), "-o", str(out)], capture_output=True,
                                       timeout=120),
        "collect stdin": subprocess.run([*cli, "collect", "--log", "-", "-o", str(out)], input=content,
                                        capture_output=True, timeout=120),
        "analyze": subprocess.run([*cli, "analyze", str(log)], capture_output=True, timeout=120),
        "run": subprocess.run([*cli, "run", "--log", str(log), "-o", str(out), "--", sys.executable, "-c",
                               "raise SystemExit(1)"], capture_output=True, timeout=120),
    }
    for name, r in runs.items():
        source = "standard input" if name == "collect stdin" else str(log)
        assert r.returncode == 2 and r.stdout == b"", (name, r.stderr)
        assert r.stderr.decode() == f"kvreport: error: nothing to analyze in {source}: {why}\n", name
    assert not out.exists()


def test_read_log_of_stdin_keeps_every_line_after_the_judged_head(tmp_path, monkeypatch):
    """Standard input is judged on its first 64 KiB (to the end of a line), then read whole: a real log longer
    than that comes out as the same excerpt as the file."""
    import io

    case = _case("loc-17-fail-huge-ctx-verbose") / "log.txt"
    data = case.read_bytes()
    assert len(data) > 64 * 1024
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    from_stdin = collect.read_log("-")
    from_file = collect.read_log(str(case))
    assert from_stdin.line_count == from_file.line_count
    assert list(from_stdin.lines()) == list(from_file.lines())


def test_upload_needs_confirmation_without_tty(tmp_path, monkeypatch):
    called = []
    monkeypatch.setattr("kvreport.upload.upload_bundle", lambda *a: called.append(a) or {})
    r = _invoke(["collect", "--upload", "--server", "http://127.0.0.1:9", "--token", "t", "-o",
                 str(tmp_path / "b.json")])
    assert r.exit_code == 0 and not called
    assert "not uploading" in r.output and "--yes" in r.output


def test_upload_failure_keeps_bundle(tmp_path, monkeypatch):
    def fail(bundle, server, token):
        raise UploadError("cannot reach http://127.0.0.1:9")

    monkeypatch.setattr("kvreport.upload.upload_bundle", fail)
    out = tmp_path / "b.json"
    r = _invoke(["collect", "--upload", "--yes", "--server", "http://127.0.0.1:9", "--token", "t", "-o", str(out)])
    assert r.exit_code == 2
    assert out.is_file() and f"kvreport upload {out}" in r.output


def test_upload_confirmed_and_sent(tmp_path, monkeypatch):
    sent = []

    def ok(bundle, server, token):
        sent.append((bundle["id"], server, token))
        return {"id": bundle["id"], "url": f"{server}/bundles/{bundle['id']}",
                "cluster": {"id": 1, "key": "k", "title": "t", "count": 3}}

    monkeypatch.setattr("kvreport.upload.upload_bundle", ok)
    monkeypatch.setattr("kvreport.config.remember_upload", lambda *a: None)
    out = tmp_path / "b.json"
    bundle = collect.build_bundle(["x"], "llama-server -c 1", None, 1.0)
    r = CliRunner().invoke(main, ["collect", "--upload", "--server", "http://srv", "--token", "tok", "-o", str(out)],
                           input="y\n", catch_exceptions=False)
    assert not sent and r.exit_code == 0  # CliRunner has no TTY: nothing is sent without --yes
    answers = []
    monkeypatch.setattr("click.confirm", lambda text, **kw: answers.append(text) or False)
    assert collect_cmd.finish(bundle, output=str(out), upload=True, server="http://srv", token="tok",
                              interactive=True) == 0
    assert not sent and "redacted:" in answers[0] and "http://srv" in answers[0]
    monkeypatch.setattr("click.confirm", lambda text, **kw: True)
    assert collect_cmd.finish(bundle, output=str(out), upload=True, server="http://srv", token="tok",
                              interactive=True) == 0
    assert sent == [(bundle["id"], "http://srv", "tok")]


def test_help_imports_no_server_requests_numpy():
    code = ("import sys\nfrom kvreport.cli import main\n"
            "for args in (['--help'], ['collect', '--help'], ['run', '--help']):\n"
            "    try:\n        main(args)\n    except SystemExit:\n        pass\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('kvreport_server', 'requests', 'numpy', 'gguf', 'flask'))\n"
            "print('BAD', bad, file=sys.stderr)\n")
    p = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, timeout=60)
    assert "BAD []" in p.stderr, p.stderr[-2000:]


def test_the_domain_modules_import_no_click():
    """Issue 11 item 7: click, prompts and terminal checks live in the command layer only."""
    code = ("import sys, kvreport.analyze, kvreport.fit, kvreport.collect, kvreport.upload\n"
            "assert 'click' not in sys.modules, sorted(m for m in sys.modules if m.startswith('click'))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    p = subprocess.run([sys.executable, "-X", "importtime", "-c", "import kvreport.analyze"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and "kvreport.analyze" in p.stderr and " click" not in p.stderr, p.stderr[-2000:]


# --- a bundle (excerpt + redaction) diagnoses like its log ----------------------------------------

from tests.paths import case_dirs  # noqa: E402


@pytest.mark.parametrize("case", case_dirs(), ids=lambda p: p.name)
@pytest.mark.parametrize("names", [(["alice"], ["gpubox"]), (["user", "llm"], ["host", "gpu", "server", "main"])],
                         ids=["names", "common-words"])
def test_bundle_diagnosis_equals_log_diagnosis(case, names):
    """The bounded excerpt and the redaction change no diagnosis: the written bundle vs the same
    bundle holding every log line unredacted."""
    from kvreport.analyze import analyze
    from kvreport.cmdline import parse_command
    from kvreport.excerpt import Excerpt
    from kvreport.redact import Redactor

    log = (case / "log.txt").read_text(errors="replace")
    cmd = (case / "command.txt").read_text() if (case / "command.txt").is_file() else None
    probe_result = {"host": {}, "devices": [], "probes": {}}
    bundle = collect.build_bundle(log.splitlines(), cmd, None, 1.0, probe_result=probe_result,
                                  redactor=Redactor(user_names=names[0], host_names=names[1]))
    full = dict(bundle)
    full["log"] = Excerpt(max_key_lines=10**9, tail_lines=10**9, max_line_chars=10**9).feed_all(
        log.splitlines()).to_log("file")
    full["command"] = parse_command(cmd) if cmd else {}
    from_bundle, from_full = analyze(bundle), analyze(full)
    assert from_bundle["failure"] == from_full["failure"]
    assert from_bundle["memory"]["kv_required_mib"] == from_full["memory"]["kv_required_mib"]
    assert [s["id"] for s in from_bundle["suggestions"]] == [s["id"] for s in from_full["suggestions"]]


# --- redaction, then parse, then suggestion: placeholders survive (QA #1) --------------------------

_RAW_SECRETS = [
    ("-m /home/alice/models/m.gguf", "-m <home>/models/m.gguf"),
    ("--api-key sk-abcdefghijklmnopqrstuvwxyz0123", "--api-key <token>"),
    ("--hf-token hf_abcdefghijklmnopqrstuvwxyzABCD", "--hf-token <token>"),
    ("--host 192.168.7.23", "--host <ip-1>"),
    ("--alias alice.smith@example.org", "--alias <email-1>"),
    ("-mu https://bob:pa55word@gpubox.example.org/m.gguf", "<credentials>@"),
    ("--alias gpubox", "--alias <host>"),
    ("--alias alice", "--alias <user>"),
]


@pytest.mark.parametrize("raw,kept", _RAW_SECRETS, ids=[k for _r, k in _RAW_SECRETS])
@pytest.mark.parametrize("where", ["middle", "end", "bash-c", "redirected"])
def test_collect_suggestions_keep_redacted_words(raw, kept, where):
    from kvreport.analyze import analyze
    from kvreport.cmdline import parse_command
    from kvreport.redact import Redactor

    case = _case("loc-17-fail-huge-ctx-verbose")
    core = {"middle": f"./llama-server {raw} -c 131072 -ngl 99",
            "end": f"./llama-server -c 131072 -ngl 99 {raw}",
            "bash-c": f"cd /home/alice && timeout 60 bash -c './llama-server {raw} -c 131072 -ngl 99'",
            "redirected": f"./llama-server {raw} -c 131072 -ngl 99 > /home/alice/s.log 2>&1"}[where]
    bundle = collect.build_bundle((case / "log.txt").read_text().splitlines(), core, None, 1.0,
                                  probe_result={"host": {}, "devices": [], "probes": {}},
                                  redactor=Redactor(user_names=["alice"], host_names=["gpubox"]))
    text = json.dumps(bundle)
    for secret in ("alice", "sk-abc", "hf_abc", "192.168.7.23", "pa55word", "gpubox"):
        assert secret not in text
    flags = bundle["command"]["flags"]
    assert flags["n_ctx"] == 131072 and flags["n_gpu_layers"] == 99 and "_positional" not in flags, flags
    diagnosis = analyze(bundle)
    commands = [s["command"] for s in diagnosis["suggestions"] if s.get("command")]
    assert commands, diagnosis["suggestions"]
    # (each word holding a placeholder is quoted when printed: a bare <...> is a shell redirection)
    quoted = " ".join(shlex.quote(w) if "<" in w else w for w in kept.split(" "))
    for cmd in commands:
        assert quoted in cmd or (" " not in kept and kept in cmd), cmd  # (a placeholder inside a quoted URL)
        again = parse_command(cmd)["flags"]
        assert again["n_gpu_layers"] == 99 and "_positional" not in again, cmd
        assert {k: v for k, v in again.items() if k not in ("n_ctx", "cache_type_k", "cache_type_v", "flash_attn",
                                                                "n_parallel", "n_gpu_layers", "fit")} == \
            {k: v for k, v in flags.items() if k not in ("n_ctx", "cache_type_k", "cache_type_v", "flash_attn",
                                                          "n_parallel", "n_gpu_layers", "fit")}, cmd


# --- engine version and devices the log printed (QA #11) -------------------------------------------

_CUDA_LOG = [
    "build: 6895 (4341dc8bc) with cc (GCC) 15.2.1 20250813 for x86_64-pc-linux-gnu",
    "ggml_cuda_init: found 1 CUDA devices:",
    "  Device 0: NVIDIA GeForce RTX 4090, compute capability 8.9, VMM: yes",
    "llama_prepare_model_devices: using device CUDA0 (NVIDIA GeForce RTX 4090) (0000:01:00.0) - 23000 MiB free",
    "llama_kv_cache: size = 16384.00 MiB (131072 cells,  32 layers,  1/1 seqs), K (f16): 8192.00 MiB, "
    "V (f16): 8192.00 MiB",
    "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 16384.00 MiB on device 0: cudaMalloc failed: "
    "out of memory",
]
_NO_PROBES = {"host": {}, "devices": [], "probes": {}}


def test_engine_version_from_the_log_and_no_devices_copied_from_it():
    """Issue 11 item 8: a bundle holds facts only; the devices the log names stay in the log."""
    bundle = collect.build_bundle(_CUDA_LOG, None, None, 1.0, probe_result=_NO_PROBES)
    assert bundle["engine"] == {"name": "llama.cpp", "version": "b6895", "build_number": 6895, "commit": "4341dc8bc",
                                "version_source": "log"}
    assert bundle["devices"] == []


def test_probed_version_and_devices_win_over_the_log():
    probed = {"host": {}, "probes": {}, "engine": {"name": "llama.cpp", "version": "b7000", "build_number": 7000},
              "devices": [{"backend": "cuda", "index": 0, "name": "NVIDIA GeForce RTX 4090", "free_mib": 20000.0,
                           "source": "nvml"}]}
    bundle = collect.build_bundle(_CUDA_LOG, None, None, 1.0, probe_result=probed)
    assert bundle["engine"]["build_number"] == 7000 and "version_source" not in bundle["engine"]
    assert [d["source"] for d in bundle["devices"]] == ["nvml"]


@pytest.mark.parametrize("name", ["pub-012-llamacpp-rocm-2x7900xtx-weights-on-gpu0-only",
                                  "pub-109-vllm-3090-gate-utilization-097"])
def test_a_case_log_leaves_no_log_device_in_the_bundle_and_diagnoses_alike(name):
    """Issue 11 item 8: the devices a real log names (ROCm0/ROCm1; CUDA0 with vLLM's load-time free MiB) are
    not copied into bundle.devices, and analyzing the bundle gives the findings of analyzing its log (no
    "23,306 MiB free on CUDA0 at collection time" made from the engine's own start-up figure)."""
    from kvreport.analyze import analyze, analyze_text
    from kvreport.logs import parse_log

    log = (_case(name) / "log.txt").read_text(errors="replace")
    assert any(k.startswith(("CUDA", "ROCm")) for k in parse_log(log.splitlines()).devices)  # the log names them
    bundle = collect.build_bundle(log.splitlines(), None, None, 1.0, probe_result=_NO_PROBES)
    assert bundle["devices"] == [] and not any(d.get("source") == "log" for d in bundle["devices"])
    assert analyze(bundle)["findings"] == analyze_text(log)["findings"]


def test_build_zero_names_no_release():
    local = _case("loc-17-fail-huge-ctx-verbose")  # "build 0 (unknown)": no release to name
    bundle = collect.build_bundle((local / "log.txt").read_text().splitlines(), None, None, 1.0,
                                  probe_result=_NO_PROBES)
    assert "version" not in bundle["engine"] and "build_number" not in bundle["engine"]
    assert bundle["devices"] == []


def test_log_facts_parsed_once(monkeypatch):
    import kvreport.logs

    calls = []
    real = kvreport.logs.parse_log

    def counting(lines, *a, **k):
        calls.append(1)
        return real(lines, *a, **k)

    monkeypatch.setattr(kvreport.logs, "parse_log", counting)
    collect.build_bundle(_CUDA_LOG, None, None, 1.0, probe_result=_NO_PROBES)
    assert len(calls) == 1


def test_ollama_version_is_not_the_runner_build():
    lines = ['time=2025-06-01T10:00:00.000Z level=INFO source=routes.go:1234 msg="server config" version=0.12.6',
             "build: 6895 (4341dc8bc) with cc (GCC) 15.2.1 for x86_64-pc-linux-gnu"]
    facts = kvreport_logs_parse(lines)
    version = collect._log_version(facts, "ollama")
    assert "build_number" not in version


def kvreport_logs_parse(lines):
    from kvreport.logs import parse_log

    return parse_log(lines)


# --- the fast --log reader gives the slow path's excerpt exactly (QA #14) --------------------------

from kvreport import excerpt_fast  # noqa: E402


def _both(path) -> tuple[dict, dict]:
    import shutil

    fast = excerpt_fast.read_excerpt_fast(str(path), shutil.which("grep"))
    assert fast is not None
    return fast.to_log("file"), excerpt_fast.read_excerpt_slow(str(path)).to_log("file")


needs_grep = pytest.mark.skipif(__import__("shutil").which("grep") is None, reason="no grep here")


@needs_grep
@pytest.mark.parametrize("case", case_dirs(), ids=lambda p: p.name)
def test_fast_excerpt_equals_slow_on_cases(case):
    fast, slow = _both(case / "log.txt")
    assert fast == slow


@needs_grep
@pytest.mark.parametrize("content", [
    b"", b"\n", b"no newline at the end", b"a\nb\n\n", b"\r\n\r\n", b"llama_kv_cache: size = 1 MiB\r\n",
    b"x" * 5000 + b" failed to allocate CUDA0 buffer\nfailed to allocate\n",  # keyword after the cut
    b"failed to allocate \xff\xfe bad utf-8\nok\n", b"\x00\x01 failed to allocate\x00\n",
    b"failed to allocate " + b"y" * 9000,
])
def test_fast_excerpt_edges(tmp_path, content):
    path = tmp_path / "l.log"
    path.write_bytes(content)
    fast, slow = _both(path)
    assert fast == slow


@needs_grep
def test_fast_excerpt_equals_slow_on_50mb(tmp_path):
    """A synthetic 50 MB log: the case logs with long filler lines between them, more key lines
    than the excerpt keeps, a failure at the end and no final newline."""
    bodies = [p.read_bytes() for p in sorted(CASE_DIR.glob("*/log.txt"))] or [b"failed to allocate x\n"]
    filler = b"".join(b"srv  log_server_r: request: GET /health 127.0.0.1 200 " + b"." * 700 + b"\n"
                      for _ in range(64))
    path = tmp_path / "big.log"
    with open(path, "wb") as out:
        n = i = 0
        while n < 50_000_000:
            chunk = filler + bodies[i % len(bodies)]
            out.write(chunk)
            n += len(chunk)
            i += 1
        out.write(b"ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9.00 MiB: cudaMalloc failed: out of memory")
    fast, slow = _both(path)
    assert fast["line_count"] == slow["line_count"] > 60000
    assert fast == slow


def test_read_excerpt_without_grep_or_with_a_failing_grep(tmp_path, monkeypatch):
    case = _case("loc-17-fail-huge-ctx-verbose")
    slow = excerpt_fast.read_excerpt_slow(str(case / "log.txt")).to_log("file")
    assert excerpt_fast.read_excerpt(str(case / "log.txt"), use_grep=False).to_log("file") == slow
    bad = tmp_path / "grep"
    bad.write_text("#!/bin/sh\nexit 2\n")
    bad.chmod(0o755)
    assert excerpt_fast.read_excerpt_fast(str(case / "log.txt"), str(bad)) is None
    monkeypatch.setattr("shutil.which", lambda name, *a, **k: str(bad) if name == "grep" else None)
    assert excerpt_fast.read_excerpt(str(case / "log.txt")).to_log("file") == slow
    assert collect.read_log(str(case / "log.txt")).to_log("file") == slow


def test_collect_keeps_a_command_it_cannot_split(tmp_path):
    """design.md: collect never fails because it cannot parse the command. A line cut inside a quote is stored as
    typed, marked, and no suggestion rewrites it into a command to paste (its words would be a guess)."""
    log = tmp_path / "l.log"
    log.write_text("llama_kv_cache_init: failed to allocate buffer for kv cache\n")
    out = tmp_path / "b.json"
    r = subprocess.run([sys.executable, "-m", "kvreport.cli", "collect", "--log", str(log), "--command",
                        'llama-server -m "unterminated -c 5', "--yes", "-o", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    b = json.loads(out.read_text())
    assert b["command"]["line"] == 'llama-server -m "unterminated -c 5'
    assert "unbalanced quote" in b["command"]["split_error"]
    from kvreport.analyze import analyze

    assert all(s.get("command") is None for s in analyze(b)["suggestions"])
