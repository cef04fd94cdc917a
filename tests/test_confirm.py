"""Fix confirmation (kvreport.confirm, kvreport.record): a run that worked after a failed one names the change."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvreport import confirm, probes, record, runner
from kvreport.cmdline import parse_command
from kvreport.fixes import SUGGESTION_IDS
from tests.paths import CASE_DIR, ROOT

FAKE_ENGINE = ROOT / "tests" / "fakebin" / "llama-server-run"
KVREPORT = [sys.executable, "-c", "import sys; from kvreport.cli import main; sys.exit(main())"]
FIXED = {"host": {"os": "Linux", "cpu_model": "Test CPU", "machine": "x86_64", "ram_free_mib": 1000.0,
                  "ram_total_mib": 32000.0},
         "devices": [{"backend": "cuda", "index": 0, "name": "GPU", "total_mib": 8192.0, "free_mib": 7000.0,
                      "source": "nvml"}],
         "engine": {}, "ollama": None, "python_engines": None, "probes": {"nvml": "ok"}, "seconds": 0.0}


def change_of(before: str, after: str, n_ctx: int | None = None):
    b, a = parse_command(before), parse_command(after)
    assert b["engine"] == a["engine"]
    return confirm.name_change(a["engine"], b, a, before_n_ctx=n_ctx)


# ------------------------------------------------------------------------------------------ naming


@pytest.mark.parametrize("before, after, change, ids", [
    ("llama-server -m m.gguf -c 262144", "llama-server -m m.gguf -c 32768",
     {"-c": [262144, 32768]}, ["reduce-ctx"]),
    ("llama-server -m m.gguf -ngl 99", "llama-server -m m.gguf -ngl 40", {"-ngl": [99, 40]}, ["reduce-gpu-layers"]),
    ("llama-server -m m.gguf -ngl all", "llama-server -m m.gguf --n-gpu-layers 30", {"-ngl": ["all", 30]},
     ["reduce-gpu-layers"]),
    ("llama-server -m m.gguf -np 8", "llama-server -m m.gguf --parallel 2", {"-np": [8, 2]}, ["reduce-parallel"]),
    ("llama-server -m m.gguf", "llama-server -m m.gguf -ctk q8_0 -ctv q8_0",
     {"-ctk": ["f16", "q8_0"], "-ctv": ["f16", "q8_0"]}, ["quantize-kv-cache"]),
    ("llama-server -m m.gguf -ub 4096 -b 4096", "llama-server -m m.gguf -ub 512 -b 2048",
     {"-b": [4096, 2048], "-ub": [4096, 512]}, ["reduce-batch"]),
    ("llama-server -m m.gguf -fa off", "llama-server -m m.gguf -fa on", {"-fa": ["off", "on"]},
     ["enable-flash-attn"]),
    ("llama-server -m m.gguf", "llama-server -m m.gguf -nkvo", {"-nkvo": [False, True]}, ["kv-cache-on-host"]),
    ("llama-server -m m.gguf --swa-full", "llama-server -m m.gguf", {"--swa-full": [True, False]},
     ["disable-swa-full"]),
    ("llama-server -m m.gguf -ts 1,1", "llama-server -m m.gguf -ts 3,1", {"-ts": [[1.0, 1.0], [3.0, 1.0]]},
     ["rebalance-devices"]),
    ("bash -c 'ulimit -v 600000; exec ./llama-server -m m.gguf -c 65536'",
     "bash -c 'ulimit -v 1000000; exec ./llama-server -m m.gguf -c 65536'",
     {"ulimit -v": [600000, 1000000]}, ["raise-memory-limit"]),
    ("vllm serve m --gpu-memory-utilization 0.97", "vllm serve m --gpu-memory-utilization 0.85",
     {"--gpu-memory-utilization": [0.97, 0.85]}, ["lower-gpu-memory-utilization"]),
    ("vllm serve m --gpu-memory-utilization 0.8", "vllm serve m --gpu-memory-utilization 0.92",
     {"--gpu-memory-utilization": [0.8, 0.92]}, ["raise-gpu-memory-utilization"]),
    ("vllm serve m --max-model-len 131072 --max-num-seqs 256", "vllm serve m --max-model-len 32k --max-num-seqs 64",
     {"--max-model-len": [131072, 32000], "--max-num-seqs": [256, 64]}, ["reduce-max-model-len", "reduce-max-num-seqs"]),
    ("vllm serve m", "vllm serve m --kv-cache-dtype fp8", {"--kv-cache-dtype": ["auto", "fp8"]},
     ["quantize-kv-cache"]),
    ("vllm serve m", "vllm serve m -tp 2", {"--tensor-parallel-size": [None, 2]}, []),
    ("vllm serve m -tp 1", "vllm serve m -tp 2", {"--tensor-parallel-size": [1, 2]}, ["more-devices"]),
    ("python -m sglang.launch_server --model-path m --mem-fraction-static 0.9",
     "python -m sglang.launch_server --model-path m --mem-fraction-static 0.8 --context-length 8192",
     {"--mem-fraction-static": [0.9, 0.8], "--context-length": [None, 8192]}, ["lower-gpu-memory-utilization"]),
    ("OLLAMA_CONTEXT_LENGTH=262144 ollama serve", "OLLAMA_CONTEXT_LENGTH=8192 OLLAMA_KV_CACHE_TYPE=q8_0 ollama serve",
     {"OLLAMA_CONTEXT_LENGTH": [262144, 8192], "OLLAMA_KV_CACHE_TYPE": ["f16", "q8_0"]},
     ["reduce-ctx", "quantize-kv-cache"]),
    # not a fix: a larger context, a prompt, a port
    ("llama-server -m m.gguf -c 4096", "llama-server -m m.gguf -c 8192", {"-c": [4096, 8192]}, []),
    ("llama-completion -m m.gguf -p 'my secret prompt' --port 1", "llama-completion -m m.gguf -p other --port 2",
     {}, []),
])
def test_name_change(before, after, change, ids):
    got_change, got_ids = change_of(before, after)
    assert got_change == change
    assert got_ids == ids
    assert set(got_ids) <= set(SUGGESTION_IDS)


def test_context_missing_from_the_failed_command_counts_from_what_the_engine_tried():
    assert change_of("llama-server -m m.gguf", "llama-server -m m.gguf -c 32768", n_ctx=262144) == (
        {"-c": [262144, 32768]}, ["reduce-ctx"])
    # without the tried context nothing says it went down
    assert change_of("llama-server -m m.gguf", "llama-server -m m.gguf -c 32768") == ({"-c": [None, 32768]}, [])


def test_describe_change():
    assert confirm.describe_change({"-c": [262144, 32768]}, ["reduce-ctx"]) == "-c 262144 -> 32768 (reduce-ctx)"
    assert confirm.describe_change({}, []) == "the same command"


def test_ready_markers_are_each_engines_own():
    assert confirm.ready_marker("llama.cpp", "main: server is listening on http://0.0.0.0:8008 - starting the main loop")
    assert confirm.ready_marker("llama.cpp", "0.00.025.893 I srv  llama_server: listening on http://127.0.0.1:18202")
    assert confirm.ready_marker("ollama", 'time=… level=INFO source=server.go:637 msg="llama runner started in 2.01 seconds"')
    assert confirm.ready_marker("vllm", "INFO:     Application startup complete.")
    assert confirm.ready_marker("sglang", "The server is fired up and ready to roll!")
    assert not confirm.ready_marker("vllm", "The server is fired up and ready to roll!")
    assert not confirm.ready_marker("llama.cpp", "llama_kv_cache: failed to allocate buffer for kv cache")
    assert confirm.is_one_shot("llama-completion") and not confirm.is_one_shot("llama-server")


def test_machine_id_is_salted_and_stable(private_data_dir):
    with record.open_record() as conn:
        a = record.machine_id(conn, FIXED["host"], FIXED["devices"])
        assert a == record.machine_id(conn, FIXED["host"], FIXED["devices"])
        assert a != record.machine_id(conn, {**FIXED["host"], "cpu_model": "Other"}, FIXED["devices"])
        salt = record.salt(conn)
    assert len(a) == 64 and "Test CPU" not in a
    # a fresh installation (another salt) names the same machine differently
    (private_data_dir / record.FILE_NAME).unlink()
    with record.open_record() as conn:
        assert record.salt(conn) != salt
        assert record.machine_id(conn, FIXED["host"], FIXED["devices"]) != a


# ----------------------------------------------------------------------------------- kvreport run


@pytest.fixture
def fixed_probes(monkeypatch):
    monkeypatch.setattr(probes, "run_all", lambda timeout=3.0, **kw: json.loads(json.dumps(FIXED)))


@pytest.fixture
def fake_llama(tmp_path, monkeypatch):
    """`llama-server` on PATH: the fake engine of tests/fakebin (fails above -c 65536)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool = bindir / "llama-server"
    tool.write_text(f'#!/bin/sh\nexec sh "{FAKE_ENGINE}" "$@"\n')
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("KVREPORT_SERVER", raising=False)
    monkeypatch.delenv("KVREPORT_TOKEN", raising=False)
    monkeypatch.setenv("KVREPORT_CONFIG_DIR", str(tmp_path / "config"))
    return tool


def failures(data_dir: Path) -> list[dict]:
    conn = sqlite3.connect(data_dir / record.FILE_NAME)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM failures ORDER BY created_at, rowid")]
    finally:
        conn.close()


def outcomes(data_dir: Path) -> list[dict]:
    conn = sqlite3.connect(data_dir / record.FILE_NAME)
    conn.row_factory = sqlite3.Row
    try:
        return [{**dict(r), "body": json.loads(r["body"])} for r in conn.execute("SELECT * FROM outcomes")]
    finally:
        conn.close()


def test_run_fails_then_works_and_confirms_reduce_ctx(fixed_probes, fake_llama, tmp_path, private_data_dir, capfd):
    bundle_path = tmp_path / "failed.json"
    rc = runner.cli_run(["llama-server", "-m", "/models/tiny.gguf", "-c", "131072"], output=str(bundle_path))
    assert rc == 1
    failed = json.loads(bundle_path.read_text())
    rows = failures(private_data_dir)
    assert [(r["bundle_id"], r["engine"], r["model"], r["phase"], r["fixed_at"]) for r in rows] == [
        (failed["id"], "llama.cpp", "tiny.gguf", "kv_cache", None)]
    capfd.readouterr()

    # another model's success confirms nothing
    assert runner.cli_run(["llama-server", "-m", "/models/other.gguf", "-c", "4096"]) == 0
    assert "this worked" not in capfd.readouterr().err
    assert failures(private_data_dir)[0]["fixed_at"] is None

    assert runner.cli_run(["llama-server", "-m", "/models/tiny.gguf", "-c", "4096"]) == 0
    err = capfd.readouterr().err
    assert f"kvreport: this worked: -c 131072 -> 4096 (reduce-ctx); bundle {failed['id']}" in err
    row = failures(private_data_dir)[0]
    assert row["fixed_at"] and row["outcome_id"]
    [out] = outcomes(private_data_dir)
    assert out["id"] == row["outcome_id"] and out["bundle_id"] == failed["id"] and out["sent_at"] is None
    body = out["body"]
    assert body["change"] == {"-c": [131072, 4096]} and body["suggestion_ids"] == ["reduce-ctx"]
    assert body["worked"] is True and body["engine"] == "llama.cpp" and len(body["machine"]) == 64
    assert "Test CPU" not in json.dumps(body)  # the machine facts stay here

    # a second success has nothing left to confirm
    assert runner.cli_run(["llama-server", "-m", "/models/tiny.gguf", "-c", "4096"]) == 0
    assert "this worked" not in capfd.readouterr().err
    assert len(outcomes(private_data_dir)) == 1


def test_a_server_is_confirmed_while_it_runs(fake_llama, tmp_path, private_data_dir):
    """The ready line in the streamed output confirms: the engine is still serving when the record says fixed."""
    env = {**os.environ, "FAKE_STOP": str(tmp_path / "stop")}
    base = [*KVREPORT, "run", "--probe-timeout", "0.5", "--"]
    failed = subprocess.run([*base, "llama-server", "-m", "/models/tiny.gguf", "-c", "131072"], env=env,
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1, failed.stderr[-2000:]
    assert len(failures(private_data_dir)) == 1
    err_file = tmp_path / "stderr.txt"
    with open(err_file, "wb") as err_fh:  # a file, not a pipe nobody reads while the server runs
        proc = subprocess.Popen([*base, "llama-server", "-m", "/models/tiny.gguf", "-c", "4096"], env=env,
                                cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err_fh, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not failures(private_data_dir)[0]["fixed_at"]:
            assert proc.poll() is None, "the engine ended before the fix was recorded"
            time.sleep(0.1)
        assert failures(private_data_dir)[0]["fixed_at"], "not confirmed while the server ran"
        assert proc.poll() is None
    finally:
        (tmp_path / "stop").write_text("")
        proc.wait(timeout=60)
    assert proc.returncode == 0
    assert "kvreport: this worked: -c 131072 -> 4096 (reduce-ctx)" in err_file.read_text()


# ------------------------------------------------------------------------------ kvreport collect


def _collect(case: str, command: str, out: Path) -> int:
    from kvreport.commands.collect import cli_collect

    return cli_collect(log_path=str(CASE_DIR / case / "log.txt"), command_line=command, output=str(out))


def test_collect_of_a_later_successful_log_confirms(fixed_probes, fake_llama, tmp_path, private_data_dir, capfd):
    """Real logs of one machine: -c 65536 under `ulimit -v 600000` failed (loc-21), under 1000000 it came up (loc-24)."""
    fail_cmd = (CASE_DIR / "loc-21-fail-ulimit-kv-600000" / "command.txt").read_text().strip()
    ok_cmd = (CASE_DIR / "loc-24-success-ulimit-1000000" / "command.txt").read_text().strip()
    _collect("loc-21-fail-ulimit-kv-600000", fail_cmd, tmp_path / "a.json")
    failed = json.loads((tmp_path / "a.json").read_text())
    assert [r["bundle_id"] for r in failures(private_data_dir)] == [failed["id"]]
    capfd.readouterr()
    _collect("loc-24-success-ulimit-1000000", ok_cmd, tmp_path / "b.json")
    err = capfd.readouterr().err
    assert f"this worked: ulimit -v 600000 -> 1000000 (raise-memory-limit); bundle {failed['id']}" in err
    [out] = outcomes(private_data_dir)
    assert out["body"]["suggestion_ids"] == ["raise-memory-limit"]


def test_collect_of_a_vllm_log_that_worked(fixed_probes, fake_llama, tmp_path, private_data_dir, capfd):
    """pub-006: the same user's vLLM failed at --max-model-len 29000 and worked at 20000 (log_ok_20k.txt)."""
    from kvreport.commands.collect import cli_collect

    case = CASE_DIR / "pub-006-vllm-llama31-8b-29k-nonmonotonic-profiling"
    model = "meta-llama/Llama-3.1-8B-Instruct"
    cli_collect(log_path=str(case / "log.txt"), command_line=f"vllm serve {model} --max-model-len 29000",
                output=str(tmp_path / "a.json"))
    assert len(failures(private_data_dir)) == 1
    capfd.readouterr()
    cli_collect(log_path=str(case / "log_ok_20k.txt"), command_line=f"vllm serve {model} --max-model-len 20000",
                output=str(tmp_path / "b.json"))
    err = capfd.readouterr().err
    assert "this worked: --max-model-len 29000 -> 20000 (reduce-max-model-len)" in err


def test_history_can_be_turned_off(fixed_probes, fake_llama, tmp_path, private_data_dir, monkeypatch):
    monkeypatch.setenv("KVREPORT_HISTORY", "0")
    assert runner.cli_run(["llama-server", "-m", "/models/tiny.gguf", "-c", "131072"],
                          output=str(tmp_path / "a.json")) == 1
    assert not (private_data_dir / record.FILE_NAME).exists()
