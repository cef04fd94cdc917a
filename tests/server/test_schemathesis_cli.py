"""schemathesis's own runner (``st run --checks all``) against the real server on 127.0.0.1.

The app is served by waitress (as ``kvreport serve`` does) on a random port, on SQLite and on
PostgreSQL, with an admin token so generated requests reach the handlers and two real bundles so
the GET operations find something. The seed is fixed and the examples per operation are bounded,
so a run is repeatable and takes a few seconds per database (issue 13, item 11).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from server_helpers import bundle_from_case

SEED = 13
MAX_EXAMPLES = 12


def _st_command() -> list[str]:
    st = Path(sys.executable).with_name("st")
    if st.is_file():
        return [str(st)]
    found = shutil.which("st")
    if found is None:
        pytest.fail("schemathesis (st) is not installed; pip install -e '.[dev]'", pytrace=False)
    return [found]


def serve_in_thread(app):
    """A waitress server for ``app`` on 127.0.0.1 and a free port; returns (base URL, server)."""
    from kvreport_server.waitress_server import create_server

    server = create_server(app, "127.0.0.1", 0, threads=4)
    port = server.socket.getsockname()[1]
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{port}", server


def test_schemathesis_finds_nothing(make_app, tmp_path):
    from kvreport_server import auth

    app = make_app()
    with app.extensions["kvreport_db"].Session() as s, s.begin():
        admin = auth.new_token(s, "fuzz-admin", "admin")
    client = app.test_client()
    for case in ("loc-17-fail-huge-ctx-verbose", "loc-23-fail-ulimit-compute-after-kv-800000"):
        r = client.post("/api/v1/bundles", data=json.dumps(bundle_from_case(case)),
                        headers={"Authorization": f"Bearer {admin}", "Content-Type": "application/json"})
        assert r.status_code == 201, r.json
    base, server = serve_in_thread(app)
    try:
        cmd = [*_st_command(), "--config-file", str(Path(__file__).with_name("schemathesis.toml")), "run", f"{base}/api/v1/openapi.json", "--checks", "all",
               "--seed", str(SEED), "--max-examples", str(MAX_EXAMPLES), "--workers", "1",
               "--phases", "examples,coverage,fuzzing", "--no-shrink", "--suppress-health-check", "all",
               "--request-timeout", "20", "--max-failures", "50",
               "-H", f"Authorization: Bearer {admin}", "--report", "junit",
               "--report-junit-path", str(tmp_path / "junit.xml")]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    finally:
        server.close()
    out = proc.stdout + proc.stderr
    (tmp_path / "st-output.txt").write_text(out)
    assert proc.returncode == 0, _summary(out)


def _summary(out: str) -> str:
    """The failure headings and checks of an ``st run`` output (its requests can be huge)."""
    keep = [line[:300] for line in out.splitlines()
            if line.startswith(("___", "- ", "[", "Failures", "  ❌", "Test cases")) or "Reproduce" in line
            or line.strip().startswith(("❌", "st replay"))]
    return "\n".join(keep)[-8000:]
