"""Upload load bench (issue 8): C concurrent uploaders (default 32) for D seconds (default 60)
against gunicorn + PostgreSQL on this machine; reports bundles/s, p50/p99 latency, errors, and a
final count check (every acknowledged bundle stored once, cluster counters equal the row count).

    .venv/bin/python bench/bench_upload_load.py [--clients 32] [--seconds 60] [--workers 4] [--threads 4]

Bundles are the shared real cases with fresh ids, sent gzip-compressed as `kvreport upload` sends
them. Loopback only; a fresh database is created and dropped (--keep keeps it). Writes
bench/out/upload_load.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "server"))

import psycopg  # noqa: E402
import requests  # noqa: E402

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args(argv)

    from server_helpers import CASE_DIR as SHARED_CASES
    from server_helpers import bundle_from_case

    from kvreport.bundle import new_bundle_id
    from kvreport_server import auth, migrate
    from kvreport_server.db import Database

    name = f"kvr_upload_{secrets.token_hex(4)}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    proc = None
    result: dict = {"clients": args.clients, "seconds": args.seconds, "gunicorn_workers": args.workers,
                    "gunicorn_threads": args.threads, "cpus": os.cpu_count()}
    try:
        migrate.upgrade(url)
        db = Database(url)
        with db.Session() as s, s.begin():
            token = auth.new_token(s, "bench", "upload")
        cases = sorted(p.name for p in SHARED_CASES.iterdir() if (p / "log.txt").is_file())
        templates = [json.dumps(bundle_from_case(c)) for c in cases]
        ids_in = [json.loads(t)["id"] for t in templates]

        port = free_port()
        env = {**os.environ, "KVREPORT_DATABASE_URL": url, "KVREPORT_LOG_REQUESTS": "0", "KVREPORT_SECRET_KEY": "b"}
        proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "--workers", str(args.workers), "--threads",
                                 str(args.threads), "--bind", f"127.0.0.1:{port}", "kvreport_server:create_app()"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if requests.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.1)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Content-Encoding": "gzip"}
        lat: list[float] = []
        acked: list[str] = []
        errors: list[str] = []
        lock = threading.Lock()
        start = threading.Barrier(args.clients + 1)
        deadline = [0.0]

        def client(k: int):
            session = requests.Session()
            i = k
            start.wait()
            while time.perf_counter() < deadline[0]:
                t = templates[i % len(templates)]
                bid = new_bundle_id()
                body = gzip.compress(t.replace(ids_in[i % len(templates)], bid, 1).encode(), 1)
                i += args.clients
                t0 = time.perf_counter()
                try:
                    r = session.post(base + "/api/v1/bundles", data=body, headers=headers, timeout=60)
                    code = r.status_code
                except requests.RequestException as exc:
                    code = type(exc).__name__
                ms = (time.perf_counter() - t0) * 1000
                with lock:
                    if code == 201:
                        lat.append(ms)
                        acked.append(bid)
                    else:
                        errors.append(str(code))

        threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
        for t in threads:
            t.start()
        deadline[0] = time.perf_counter() + args.seconds
        t_start = time.perf_counter()
        start.wait()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t_start
        lat.sort()
        with psycopg.connect(url.replace("+psycopg", "")) as conn:
            rows = conn.execute("SELECT count(*), count(DISTINCT id) FROM bundles").fetchone()
            counted = conn.execute("SELECT coalesce(sum(count), 0) FROM clusters").fetchone()[0]
            stored = {r[0] for r in conn.execute("SELECT id FROM bundles")}
        result.update({
            "uploads_acknowledged": len(acked), "elapsed_s": round(elapsed, 1),
            "bundles_per_s": round(len(acked) / elapsed, 1),
            "p50_ms": round(statistics.median(lat), 1) if lat else None,
            "p99_ms": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1) if lat else None,
            "max_ms": round(lat[-1], 1) if lat else None,
            "errors": len(errors), "error_kinds": sorted(set(errors))[:10],
            "rows": rows[0], "distinct_ids": rows[1], "cluster_count_sum": counted,
            "lost": len(set(acked) - stored), "count_check": rows[0] == rows[1] == counted == len(acked)
                                                             and not (set(acked) - stored),
        })
        db.dispose()
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        if not args.keep:
            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "upload_load.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0 if result.get("count_check") and not result.get("errors") else 1


if __name__ == "__main__":
    sys.exit(main())
