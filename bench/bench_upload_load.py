"""Upload load bench (issues 8 and 15): C concurrent uploaders (default 32) for D seconds (default 60)
against gunicorn + PostgreSQL on this machine; reports bundles/s, p50/p99 latency, errors, and a
final count check (every acknowledged bundle stored once, cluster counters equal the row count).

    .venv/bin/python bench/bench_upload_load.py [--clients 32] [--seconds 60] [--workers 4] [--threads 4]
                                                [--ref REV] [--reanalyze N] [--no-healthz]

In the same run, as baselines: ``GET /healthz`` by the same clients against the same gunicorn (what
the HTTP stack and load generator alone reach on this machine), and with ``--ref REV`` the same
upload phase against the server of git revision REV (exported with ``git archive`` into bench/out/).
``--reanalyze N`` adds a phase per code: N bundles stored first with an old analyzer version, then
the uploads run while ``kvreport admin reanalyze`` re-analyzes them; it prints the ingest rate
beside the rate of uploads alone (issue 15 item 4: at most 20 % lower) and the re-analysis rate.
Each phase runs in its own process (``--phase``) with that code first on PYTHONPATH. The load
average (``os.getloadavg``) is printed beside every figure.

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
sys.path[:0] = [str(ROOT / "tests" / "server"), str(ROOT)]

import psycopg  # noqa: E402
import requests  # noqa: E402

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthz(base: str, clients: int, seconds: float) -> dict:
    """GET /healthz by ``clients`` threads for ``seconds``: requests/s and p50 (the HTTP stack's ceiling)."""
    lat: list[float] = []
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def client():
        s = requests.Session()
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            ok = s.get(base + "/healthz", timeout=30).status_code == 200
            with lock:
                if ok:
                    lat.append((time.perf_counter() - t0) * 1000)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lat.sort()
    return {"healthz_per_s": round(len(lat) / (time.perf_counter() - t0), 1),
            "healthz_p50_ms": round(statistics.median(lat), 1) if lat else None}


def _wait_up(base: str) -> None:
    for _ in range(300):
        try:
            if requests.get(base + "/healthz", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            time.sleep(0.1)


def _preload(url: str, templates: list[str], ids_in: list[str], n: int) -> None:
    """``n`` bundles stored through the normal path, then marked as analyzed by an old analyzer."""
    from kvreport.bundle import new_bundle_id, validate_bundle
    from kvreport_server import store
    from kvreport_server.db import Database

    db = Database(url)
    for i in range(n):
        t = templates[i % len(templates)]
        store.ingest(db, validate_bundle(json.loads(t.replace(ids_in[i % len(templates)], new_bundle_id(), 1))))
    db.dispose()
    with psycopg.connect(url.replace("+psycopg", "")) as conn:
        conn.execute("UPDATE bundles SET analyzer_version = '0.0.0-bench-old'")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--ref", help="also measure the server of this git revision, in the same run")
    ap.add_argument("--reanalyze", type=int, default=0, metavar="N",
                    help="add a phase with `kvreport admin reanalyze` over N old bundles beside the uploads")
    ap.add_argument("--no-healthz", action="store_true", help="skip the GET /healthz baseline")
    ap.add_argument("--phase", help=argparse.SUPPRESS)  # internal: run one phase, write its JSON here
    args = ap.parse_args(argv)
    return orchestrate(args) if args.phase is None else phase(args)


def phase(args) -> int:
    """One phase: a fresh database, gunicorn on the code first on PYTHONPATH, the uploads, the checks."""

    from server_helpers import bundle_from_case

    from kvreport.bundle import new_bundle_id
    from kvreport_server import auth, migrate
    from kvreport_server.db import Database
    from tests.paths import CASE_DIR as SHARED_CASES

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
        if args.reanalyze:
            _preload(url, templates, ids_in, args.reanalyze)

        port = free_port()
        env = {**os.environ, "KVREPORT_DATABASE_URL": url, "KVREPORT_LOG_REQUESTS": "0", "KVREPORT_SECRET_KEY": "b"}
        proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "--workers", str(args.workers), "--threads",
                                 str(args.threads), "--bind", f"127.0.0.1:{port}", "kvreport_server:create_app()"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        _wait_up(base)
        if not args.no_healthz:
            result.update(_healthz(base, args.clients, min(10.0, args.seconds / 3)))
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
        result["load_at_start"] = round(os.getloadavg()[0], 2)
        t_start = time.perf_counter()
        reproc = None
        if args.reanalyze:
            reproc = subprocess.Popen([sys.executable, "-c", "import sys; from kvreport.cli import main; sys.exit(main())",
                                       "admin", "reanalyze", "--database-url", url], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        start.wait()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t_start
        result["load_at_end"] = round(os.getloadavg()[0], 2)
        if reproc is not None:
            with psycopg.connect(url.replace("+psycopg", "")) as conn:
                left = conn.execute("SELECT count(*) FROM bundles WHERE analyzer_version = '0.0.0-bench-old'"
                                    ).fetchone()[0]
            result["reanalyzed_during_uploads"] = args.reanalyze - left
            result["reanalyzed_per_s"] = round((args.reanalyze - left) / elapsed, 1)
            reproc.wait(600)
            result["reanalyze_exit"] = reproc.returncode
        lat.sort()
        with psycopg.connect(url.replace("+psycopg", "")) as conn:
            rows = conn.execute("SELECT count(*), count(DISTINCT id) FROM bundles").fetchone()
            rows = (rows[0] - args.reanalyze, rows[1] - args.reanalyze)
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
            "lost": len(set(acked) - stored),
            "count_check": rows[0] == rows[1] == counted - args.reanalyze == len(acked) and not (set(acked) - stored),
        })
        db.dispose()
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        if not args.keep:
            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    Path(args.phase).write_text(json.dumps(result, indent=1))
    return 0 if result.get("count_check") and not result.get("errors") else 1


def _export(ref: str) -> Path:
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", ref], check=True, capture_output=True,
                         text=True).stdout.strip()
    dest = ROOT / "bench" / "out" / f"ref-{sha}"
    if not (dest / "server" / "kvreport_server" / "store.py").is_file():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", sha, "collector", "server", "migrations",
                                  "alembic.ini"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def orchestrate(args) -> int:
    codes = [("now", ROOT)]
    if args.ref:
        codes.append((args.ref, _export(args.ref)))
    out_dir = ROOT / "bench" / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for label, code in codes:
        for reanalyze in ([0, args.reanalyze] if args.reanalyze else [0]):
            phase_file = out_dir / f"upload_phase_{len(results)}.json"
            argv = [sys.executable, str(Path(__file__).resolve()), "--phase", str(phase_file), "--clients",
                    str(args.clients), "--seconds", str(args.seconds), "--workers", str(args.workers), "--threads",
                    str(args.threads), "--reanalyze", str(reanalyze)]
            if args.no_healthz or reanalyze:
                argv.append("--no-healthz")
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code / "collector"), str(code / "server"),
                                                                 str(ROOT)])}
            subprocess.run(argv, env=env, cwd=code)
            r = json.loads(phase_file.read_text()) if phase_file.is_file() else {"failed": True}
            r.update({"code": label, "reanalyze": reanalyze})
            results.append(r)
    (out_dir / "upload_load.json").write_text(json.dumps(results, indent=1))
    print(f"uploads by {args.clients} clients for {args.seconds:g} s each; gunicorn {args.workers}x{args.threads}; "
          f"PostgreSQL; {os.cpu_count()} CPUs (load generator on the same cores)\n")
    print(f"{'code':10} {'beside':14} {'bundles/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} {'lost':>4} "
          f"{'counts':>6} {'reanalyzed/s':>12} {'load start..end':>16}")
    for r in results:
        if r.get("failed"):
            print(f"{r['code']:10} phase failed")
            continue
        beside = f"reanalyze {r['reanalyze']}" if r["reanalyze"] else "-"
        print(f"{r['code']:10} {beside:14} {r['bundles_per_s']:9.1f} {r['p50_ms'] or 0:8.1f} {r['p99_ms'] or 0:8.1f} "
              f"{r['errors']:6d} {r['lost']:4d} {'ok' if r['count_check'] else 'BAD':>6} "
              f"{r.get('reanalyzed_per_s', '-'):>12} {r.get('load_at_start', 0):7.2f}..{r.get('load_at_end', 0):<7.2f}")
    for r in results:
        if "healthz_per_s" in r:
            print(f"baseline {r['code']}: GET /healthz {r['healthz_per_s']}/s (p50 {r['healthz_p50_ms']} ms), "
                  f"same clients and gunicorn")
    alone = {r["code"]: r for r in results if not r.get("failed") and not r["reanalyze"]}
    for r in results:
        if not r.get("failed") and r["reanalyze"] and r["code"] in alone:
            ratio = r["bundles_per_s"] / max(alone[r["code"]]["bundles_per_s"], 1e-9)
            print(f"{r['code']}: ingest beside re-analysis at {ratio:.0%} of uploads alone "
                  f"(target >= 80 %); re-analysis {r.get('reanalyzed_during_uploads')} bundles during the uploads")
    ok = all(not r.get("failed") and r["count_check"] and not r["errors"] for r in results if r["code"] == "now")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
