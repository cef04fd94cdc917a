"""kvreport.runner: `kvreport run -- CMD` (pass-through, capture, exit status, signals, -lv 4)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvreport import probes, runner
from kvreport.bundle import validate_bundle

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals and sh scripts")

KVREPORT = [sys.executable, "-c", "import sys; from kvreport.cli import main; sys.exit(main())"]
FIXED = {"host": {"os": "Linux", "ram_free_mib": 1000.0, "ram_total_mib": 2000.0}, "devices": [{"backend": "cuda", "index": 0, "name": "GPU", "total_mib": 8192.0,
                                               "free_mib": 7000.0, "source": "nvml"}],
         "engine": {}, "ollama": None, "python_engines": None, "probes": {"nvml": "ok"}, "seconds": 0.0}


@pytest.fixture
def fixed_probes(monkeypatch):
    state = {"engine": {}}

    def run_all(timeout=3.0, **kw):
        data = json.loads(json.dumps(FIXED))
        data["engine"] = dict(state["engine"])
        return data

    monkeypatch.setattr(probes, "run_all", run_all)
    return state


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_failure_collects_bundle_with_log_and_memory(fixed_probes, tmp_path, capfd):
    out = tmp_path / "b.json"
    code = ("import sys\nprint('out line 1', flush=True)\n"
            "print('llama_kv_cache: failed to allocate buffer for kv cache', file=sys.stderr, flush=True)\n"
            "print('out line 2', flush=True)\nsys.exit(3)")
    rc = runner.cli_run(_py(code), output=str(out))
    assert rc == 3
    captured = capfd.readouterr()
    assert "out line 1" in captured.out and "out line 2" in captured.out
    assert "failed to allocate buffer for kv cache" in captured.err
    bundle = validate_bundle(json.loads(out.read_text()))
    texts = [t for _n, t in bundle["log"]["lines"]]
    assert "out line 1" in texts and "llama_kv_cache: failed to allocate buffer for kv cache" in texts
    assert bundle["log"]["source"] == "kvreport run"
    assert bundle["memory_before_launch"] == [{"device": "CUDA0", "name": "GPU", "backend": "cuda", "free_mib": 7000.0,
                                               "total_mib": 8192.0, "source": "nvml"},
                                              {"device": "CPU", "name": None, "backend": "cpu", "free_mib": 1000.0,
                                               "total_mib": 2000.0, "source": "psutil (available RAM)"}]
    assert bundle["collector"]["exit_status"] == 3
    assert bundle["command"]["argv"][0] == sys.executable or bundle["command"]["argv"][0].startswith("<home>")


def test_success_collects_nothing_unless_always(fixed_probes, tmp_path):
    out = tmp_path / "b.json"
    assert runner.cli_run(_py("print('fine')"), output=str(out)) == 0
    assert not out.exists()
    assert runner.cli_run(_py("print('fine')"), output=str(out), always=True) == 0
    assert validate_bundle(json.loads(out.read_text()))["collector"]["exit_status"] == 0


def test_partial_last_line_and_no_newline(fixed_probes, tmp_path):
    out = tmp_path / "b.json"
    rc = runner.cli_run(_py("import sys; sys.stderr.write('....dots without newline'); sys.exit(1)"),
                        output=str(out))
    assert rc == 1
    texts = [t for _n, t in json.loads(out.read_text())["log"]["lines"]]
    assert texts == ["....dots without newline"]


def test_missing_and_not_executable(fixed_probes, tmp_path, capsys):
    assert runner.cli_run(["definitely-not-a-command-kvreport"]) == 127
    err = capsys.readouterr().err
    assert err.strip() == "kvreport: error: definitely-not-a-command-kvreport: command not found"
    script = tmp_path / "noexec.sh"
    script.write_text("echo hi\n")
    assert runner.cli_run([str(script)]) == 126


def test_killed_by_signal_is_128_plus_n(fixed_probes, tmp_path):
    rc = runner.cli_run(_py("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"),
                        output=str(tmp_path / "b.json"))
    assert rc == 128 + 9


def _fake_llama(tmp_path: Path) -> Path:
    tool = tmp_path / "bin" / "llama-server"
    tool.parent.mkdir()
    tool.write_text('#!/bin/sh\nprintf "args: %s\\n" "$*" >&2\nexit 1\n')
    tool.chmod(0o755)
    return tool


def test_adds_lv4_for_llama_programs(fixed_probes, tmp_path, monkeypatch, capfd):
    tool = _fake_llama(tmp_path)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("LLAMA_ARG_LOG_VERBOSITY", raising=False)
    out = tmp_path / "b.json"
    assert runner.cli_run(["llama-server", "-m", "x.gguf", "-c", "4096"], output=str(out)) == 1
    err = capfd.readouterr().err
    assert "args: -m x.gguf -c 4096 -lv 4" in err
    assert "kvreport: added -lv 4" in err
    bundle = json.loads(out.read_text())
    assert bundle["command"]["line"] == "llama-server -m x.gguf -c 4096"  # as the user typed it

    for argv, kw in [(["llama-server", "-m", "x.gguf", "-lv", "3"], {}),
                     (["llama-server", "-m", "x.gguf", "--verbose"], {}),
                     (["llama-server", "-m", "x.gguf"], {"keep_verbosity": True})]:
        runner.cli_run(argv, output=str(out), **kw)
        err = capfd.readouterr().err
        assert "-lv 4" not in err.split("args:")[1].split("\n")[0] and "added -lv 4" not in err

    fixed_probes["engine"] = {"build_number": 8000}  # older than b9151: INFO lines print by default
    runner.cli_run(["llama-server", "-m", "x.gguf"], output=str(out))
    assert "added -lv 4" not in capfd.readouterr().err


def test_wants_verbosity_rules():
    from kvreport.cmdline import parse_command

    def wants(argv, build=None, env=None):
        return runner.wants_verbosity(argv, parse_command(argv), build, env or {})

    assert wants(["llama-server", "-m", "a.gguf"])
    assert wants(["timeout", "60", "./llama-cli", "-m", "a.gguf"])
    assert not wants(["llama-bench", "-m", "a.gguf"])  # own parser, no -lv
    assert not wants(["python3", "-m", "vllm.entrypoints.openai.api_server"])
    assert not wants(["bash", "-c", "llama-server -m a.gguf"])
    assert not wants(["llama-server", "--log-verbosity=2"])
    assert not wants(["llama-server"], env={"LLAMA_ARG_LOG_VERBOSITY": "3"})
    assert not wants(["llama-server"], build=9150) and wants(["llama-server"], build=9151)


@pytest.mark.parametrize("printed, bundle", [
    ("ready", False),  # a server stopped by its user: nothing failed, no report
    ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 8192.00 MiB on device 0: cudaMalloc failed: "
     "out of memory\\nready", True),  # hung after a failure, then stopped: the failure is reported
])
def test_sigterm_is_forwarded_and_status_returned(tmp_path, printed, bundle):
    child = ("import signal, sys, time\n"
             "def h(s, f):\n    print('child got TERM', flush=True); sys.exit(42)\n"
             f"signal.signal(signal.SIGTERM, h)\nprint('{printed}', flush=True)\ntime.sleep(30)\n")
    env = {**os.environ, "PATH": str(tmp_path)}  # no GPU tools: probes are absent, fast
    proc = subprocess.Popen([*KVREPORT, "run", "--probe-timeout", "0.5", "-o", str(tmp_path / "b.json"), "--",
                             sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env, cwd=tmp_path)
    assert proc.stdout is not None
    deadline = time.monotonic() + 20
    line = b""
    while b"ready" not in line and time.monotonic() < deadline:
        line = proc.stdout.readline()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 42, err.decode()
    assert b"child got TERM" in out
    assert (tmp_path / "b.json").is_file() is bundle
    assert (b"was stopped (SIGTERM) and printed no failure" in err) is not bundle


def test_cli_run_end_to_end_exit_status(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}
    p = subprocess.run([*KVREPORT, "run", "--probe-timeout", "0.5", "-o", str(tmp_path / "b.json"), "--",
                        sys.executable, "-c", "import sys; print('x'); sys.exit(5)"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert p.returncode == 5 and p.stdout.startswith("x\n")
    assert "wrote " in p.stderr
    p = subprocess.run([*KVREPORT, "run", "--", "no-such-binary-xyz"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=60)
    assert p.returncode == 127 and p.stderr.strip() == "kvreport: error: no-such-binary-xyz: command not found"


def test_python_children_are_unbuffered(fixed_probes, tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    out = tmp_path / "b.json"
    code = "import os, sys; print('unbuffered=' + str(os.environ.get('PYTHONUNBUFFERED'))); sys.exit(1)"
    assert runner.cli_run(_py(code), output=str(out)) == 1
    texts = [t for _n, t in json.loads(out.read_text())["log"]["lines"]]
    assert texts == ["unbuffered=1"]
