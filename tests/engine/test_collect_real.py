"""`kvreport collect` on this machine with the real llama.cpp on PATH records the real engine facts:
what ``llama-server --version`` and ``--list-devices`` print, and the binary's path and real path."""

from __future__ import annotations

import os
import shlex
import subprocess

import pytest

from .harness import record


@pytest.fixture(scope="module")
def real_outputs(llama):
    out = {}
    for flag in ("--version", "--list-devices"):
        p = subprocess.run([str(llama.exe()), flag], env=llama.env, capture_output=True, text=True, timeout=30)
        out[flag] = (p.stdout + p.stderr).strip()
    return out


def _lines(text: str | None) -> list[str]:
    return [ln.strip() for ln in (text or "").splitlines() if ln.strip()]


def test_collect_records_real_engine(kv, llama, tiny_models, real_outputs):
    cmd = kv.server_cmd(tiny_models["tiny-fatkv"], "-c", "131072", "--fit", "off", "-lv", "4")
    run, log = kv.raw(["bash", "-c", f"ulimit -v {4 * 1024 * 1024}; exec {shlex.join(cmd)}"], name="collect")
    assert run.returncode == 1, run.tail()
    bundle, d = kv.collect(log, shlex.join(cmd))
    eng = bundle.get("engine") or {}
    record("collect/real-engine", "kvreport collect --log server.log --command 'llama-server -m tiny-fatkv.gguf -c 131072 --fit off'",
           f"--version: {' / '.join(_lines(real_outputs['--version']))}; --list-devices: "
           f"{' / '.join(_lines(real_outputs['--list-devices']))}",
           f"engine.version {eng.get('version')!r}, binary_realpath {eng.get('binary_realpath')!r}, "
           f"phase {d['failure']['phase']}")

    # the real --version / --list-devices outputs, as printed (line by line)
    assert _lines(eng.get("version_output")) == _lines(real_outputs["--version"]), eng.get("version_output")
    assert "0.6.0-dev" in (eng.get("version") or ""), eng
    assert _lines(eng.get("list_devices_output")) == _lines(real_outputs["--list-devices"]), eng.get("list_devices_output")
    # the binary found on PATH (our symlink) and the real file it points to
    assert eng.get("binary"), eng
    assert os.path.basename(eng["binary"]) == "llama-server", eng
    assert eng.get("binary_realpath") == str((llama.bin_dir / "llama-server").resolve()), eng
    # and the diagnosis of the collected bundle is the one of the log
    assert d["failure"]["phase"] == "kv_cache" and d["failure"]["requested_mib"] == 65536.0, d["failure"]
    _, d_log = kv.analyze(log, command=shlex.join(cmd))
    assert d_log["failure"] == d["failure"] or {
        k: d_log["failure"][k] for k in ("phase", "backend", "failing_device", "requested_mib")
    } == {k: d["failure"][k] for k in ("phase", "backend", "failing_device", "requested_mib")}


def test_run_records_memory_before_launch(kv, tiny_models):
    """`kvreport run` records free memory per device before launching the engine (here: the host)."""
    cmd = kv.server_cmd(tiny_models["tiny-gqa8"], "-c", "524288", "-t", "2", "--threads-http", "4", "-lv", "4")
    res = kv.run(["bash", "-c", f"ulimit -v 2000000; exec {shlex.join(cmd)}"], name="mem-before")
    assert res.run.returncode == 1, res.run.tail()
    assert res.bundle is not None, res.run.tail()
    mem = res.bundle.get("memory_before_launch") or []
    assert mem, "memory_before_launch is empty"
    assert any((m.get("free_mib") or 0) > 512 for m in mem), mem
    assert (res.bundle.get("engine") or {}).get("binary_realpath"), res.bundle.get("engine")
