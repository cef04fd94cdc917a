"""Fix confirmation with the real llama-server (issue 14 item 1): a run whose KV cache does not fit fails
(uploaded to a test server), the same command at a small context comes up; `kvreport run` says what worked,
marks the failed bundle fixed in its local record, and the server's cluster shows reduce-ctx confirmed."""

from __future__ import annotations

import json
import shlex
import sqlite3
import threading

import requests

from . import harness
from .harness import record

FATKV_BYTES_PER_TOKEN_F16 = 32 * 2 * 32 * 128 * 2
CAP_KIB = 4 * 1024 * 1024  # ulimit -v: the huge KV fails the same way whatever the machine's memory


def _capped(cmd: list[str]) -> list[str]:
    # the same cap for both runs, so that the context is the one change between them
    return ["bash", "-c", f"ulimit -v {CAP_KIB}; exec {shlex.join(cmd)}"]


def _test_server(tmp_path):
    from kvreport_server import auth, create_app, migrate
    from kvreport_server.waitress_server import create_server

    url = f"sqlite:///{tmp_path / 'server.sqlite3'}"
    migrate.upgrade(url)
    app = create_app({"DATABASE_URL": url, "SECRET_KEY": "engine-test", "LOG_REQUESTS": False, "PUBLIC_URL": None})
    with app.extensions["kvreport_db"].Session() as s, s.begin():
        token = auth.new_token(s, "engine-tier", "upload")
    server = create_server(app, "127.0.0.1", 0, threads=4)
    threading.Thread(target=server.run, daemon=True).start()
    return f"http://127.0.0.1:{server.socket.getsockname()[1]}", token, server, app


def test_failed_then_fixed_run_confirms_reduce_ctx(kv, llama, tiny_models, tmp_path):
    base, token, server, app = _test_server(tmp_path)
    data_dir = tmp_path / "client-data"
    env = {**llama.env, "KVREPORT_SERVER": base, "KVREPORT_TOKEN": token, "KVREPORT_DATA_DIR": str(data_dir),
           "KVREPORT_CONFIG_DIR": str(tmp_path / "client-config")}
    try:
        model = tiny_models["tiny-fatkv"]
        failing = _capped(kv.server_cmd(model, "-c", "131072", "--fit", "off", "-lv", "4"))
        bundle_path = tmp_path / "failed.json"
        failed = harness.run_stopping(harness.kvreport_argv("run", "--probe-timeout", "2", "--upload", "--yes",
                                                            "-o", str(bundle_path), "--", *failing),
                                      env, tmp_path, timeout=120)
        assert failed.returncode == 1, failed.tail()
        assert harness.printed_facts(failed.output).kv_failed, failed.tail()
        bundle = json.loads(bundle_path.read_text())
        assert f"{base}/bundles/{bundle['id']}" in failed.output, failed.tail()

        fixed = _capped(kv.server_cmd(model, "-c", "4096", "--fit", "off", "-lv", "4"))
        ok = harness.run_stopping(harness.kvreport_argv("run", "--probe-timeout", "2", "--", *fixed), env, tmp_path,
                                  timeout=120)
        assert ok.came_up, ok.tail()
        assert "kvreport: this worked: -c 131072 -> 4096 (reduce-ctx)" in ok.output, ok.tail(40)
        assert f"kvreport: sent to {base}/bundles/{bundle['id']}" in ok.output, ok.tail(40)

        conn = sqlite3.connect(data_dir / "history.sqlite3")
        try:
            fixed_at, outcome_id = conn.execute("SELECT fixed_at, outcome_id FROM failures WHERE bundle_id = ?",
                                                (bundle["id"],)).fetchone()
            sent_at = conn.execute("SELECT sent_at FROM outcomes WHERE id = ?", (outcome_id,)).fetchone()[0]
        finally:
            conn.close()
        assert fixed_at and outcome_id and sent_at

        cluster = requests.get(f"{base}/api/v1/bundles/{bundle['id']}", timeout=10).json()["cluster"]
        detail = requests.get(f"{base}/api/v1/clusters/{cluster['id']}", timeout=10).json()
        worked = detail["what_worked"]
        assert [(w["id"], w["machines"], w["of"]) for w in worked] == [("reduce-ctx", 1, 1)], worked
        assert worked[0]["examples"] == ["-c 131072 -> 4096"]
        page = requests.get(f"{base}/clusters/{cluster['id']}", timeout=10).text
        assert "<strong>reduce-ctx</strong>: confirmed on 1 of 1 machine" in page
        record("confirm/reduce-ctx", "kvreport run -- llama-server -m tiny-fatkv.gguf -c 131072, then -c 4096",
               "the KV cache of -c 131072 failed; -c 4096 came up", worked[0]["text"])
    finally:
        server.close()
        app.extensions["kvreport_db"].dispose()
