"""Upload load bench (issues 8 and 15): C concurrent uploaders (default 32) for D seconds (default 60)
against gunicorn + PostgreSQL on this machine; reports bundles/s, p50/p99 latency, errors, and the
checks (every acknowledged bundle stored once; every cluster counter equal to a full scan).

    .venv/bin/python bench/bench_upload_load.py [--clients 32] [--seconds 60] [--workers 2] [--threads 2]
                                                [--ref REV] [--reanalyze N] [--no-half] [--no-healthz]

Each code (this checkout, and with ``--ref REV`` the code of git revision REV, exported with ``git
archive`` into bench/out/) runs these phases, each in its own process with that code first on
PYTHONPATH, a fresh database and its own gunicorn:

* ``GET /healthz`` by the same clients against the same gunicorn: what the HTTP stack and the load
  generator alone reach on this machine (a baseline from the same run);
* saturation: every client uploads as fast as it is answered; its rate is the capacity;
* half: the same clients send at half that rate on a fixed schedule, latency counted from each
  request's scheduled time (so a stalled server is not hidden by clients waiting on it): p50/p99 at
  half capacity (issue 15: p99 under 100 ms);
* with ``--reanalyze N``: N bundles stored first and marked as analysed by an old analyzer, then the
  uploads run at saturation while ``kvreport admin reanalyze`` re-analyses them: the ingest rate
  beside the rate alone (issue 15 item 4: at most 20 % lower) and the re-analysis rate.

Beside every figure: the load average at the start and end of the phase, the CPU used per uploaded
bundle by the gunicorn workers, the PostgreSQL backends and the load generator (from /proc), so
"bundles/s per server core" (1000 / gunicorn ms per bundle) reads apart from the load generator
that shares the cores, and "lock waits": the mean number of the database's backends waiting for a
row or transaction lock (uploads queueing behind each other) over the mean number active, sampled
from pg_stat_activity every 0.1 s.

Bundles are the real cases of tests/data/cases with fresh ids, sent gzip-compressed as `kvreport
upload` sends them. Loopback only; the databases are dropped (--keep keeps them). Writes
bench/out/upload_load.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
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
sys.path[:0] = [str(ROOT / "tests" / "server"), str(ROOT), str(ROOT / "bench")]

import psutil  # noqa: E402
import psycopg  # noqa: E402
import refcode  # noqa: E402
import requests  # noqa: E402

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
OLD = "0.0.0-bench-old"
BIG_LOG = 500  # log lines: above this a case's analysis alone takes tens of ms (see "p99 typical")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_up(base: str) -> None:
    for _ in range(300):
        try:
            if requests.get(base + "/healthz", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            time.sleep(0.1)


def _pct(lat: list[float], q: float) -> float | None:
    return round(lat[min(len(lat) - 1, int(q * len(lat)))], 1) if lat else None


class _Cpu:
    """CPU milliseconds used so far by the gunicorn processes, the database's backends and this process."""

    def __init__(self, gunicorn_pid: int, url: str):
        self.root = psutil.Process(gunicorn_pid)
        self.dbname = url.rsplit("/", 1)[1]

    @staticmethod
    def _ms(procs) -> float:
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                total += (t.user + t.system) * 1000
            except psutil.Error:
                pass
        return total

    def now(self) -> dict:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            pids = [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (self.dbname,))]
        t = time.process_time() * 1000
        return {"gunicorn": self._ms([self.root, *self.root.children(recursive=True)]),
                "postgres": self._ms(psutil.Process(p) for p in pids if psutil.pid_exists(p)), "client": t}


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


class _Uploads:
    """The clients: each takes the next bundle, sends it, records the answer."""

    def __init__(self, base: str, token: str, templates: list[str], ids_in: list[str], clients: int):
        self.base, self.templates, self.ids_in, self.clients = base, templates, ids_in, clients
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                        "Content-Encoding": "gzip"}
        self.acked: list[str] = []
        # the cases whose log alone costs the analyzer tens of ms (900 and 1,874 lines; the median is 13)
        self.big = {n for n, t in enumerate(templates) if len(json.loads(t)["log"]["lines"]) > BIG_LOG}

    def run(self, seconds: float, rate: float | None = None) -> dict:
        """Upload for ``seconds``: as fast as answered, or ``rate`` per second on a fixed schedule
        (latency then counted from each request's scheduled time)."""
        from kvreport.bundle import new_bundle_id

        lat: list[float] = []
        typical: list[float] = []  # the latencies of bundles with logs of at most BIG_LOG lines
        errors: list[str] = []
        lock = threading.Lock()
        slot = [0]
        start = threading.Barrier(self.clients + 1)
        t_begin = [0.0]

        def client(k: int):
            session = requests.Session()
            i = k
            start.wait()
            while True:
                due = None
                if rate:
                    with lock:
                        due = t_begin[0] + slot[0] / rate
                        slot[0] += 1
                    if due >= t_begin[0] + seconds:
                        return
                    time.sleep(max(0.0, due - time.perf_counter()))
                elif time.perf_counter() >= t_begin[0] + seconds:
                    return
                n = i % len(self.templates)
                bid = new_bundle_id()
                body = gzip.compress(self.templates[n].replace(self.ids_in[n], bid, 1).encode(), 1)
                i += self.clients
                t0 = time.perf_counter() if due is None else due
                try:
                    code = session.post(self.base + "/api/v1/bundles", data=body, headers=self.headers,
                                        timeout=60).status_code
                except requests.RequestException as exc:
                    code = type(exc).__name__
                ms = (time.perf_counter() - t0) * 1000
                with lock:
                    if code == 201:
                        lat.append(ms)
                        if n not in self.big:
                            typical.append(ms)
                        self.acked.append(bid)
                    else:
                        errors.append(str(code))

        threads = [threading.Thread(target=client, args=(k,)) for k in range(self.clients)]
        for t in threads:
            t.start()
        t_begin[0] = time.perf_counter()
        start.wait()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t_begin[0]
        lat.sort()
        typical.sort()
        return {"uploads_acknowledged": len(lat), "elapsed_s": round(elapsed, 1),
                "bundles_per_s": round(len(lat) / elapsed, 1), "p50_ms": _pct(lat, 0.5), "p99_ms": _pct(lat, 0.99),
                "p99_typical_ms": _pct(typical, 0.99),
                "max_ms": round(lat[-1], 1) if lat else None, "errors": len(errors),
                "error_kinds": sorted(set(errors))[:10]}


class _LockWaits:
    """Samples pg_stat_activity of the database every 0.1 s while running: how many backends wait for a
    row or transaction lock (uploads queueing behind each other) and how many are active."""

    def __init__(self, dbname: str):
        self.dbname, self.samples, self.stop = dbname, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            while not self.stop.wait(0.1):
                self.samples.append(conn.execute(
                    "SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'), count(*) FILTER (WHERE state = 'active')"
                    " FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (self.dbname,)).fetchone())

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    def summary(self) -> dict:
        n = max(len(self.samples), 1)
        return {"lock_waiting_backends": round(sum(w for w, _a in self.samples) / n, 2),
                "active_backends": round(sum(a for _w, a in self.samples) / n, 2)}


def _measured(cpu: _Cpu, fn, *a, **kw) -> dict:
    """``fn(...)`` with the load average, the CPU per acknowledged bundle of each party and the mean
    number of backends waiting for a lock beside it."""
    load0, c0 = os.getloadavg()[0], cpu.now()
    with _LockWaits(cpu.dbname) as waits:
        out = fn(*a, **kw)
    c1 = cpu.now()
    n = max(out["uploads_acknowledged"], 1)
    out.update({"load_at_start": round(load0, 2), "load_at_end": round(os.getloadavg()[0], 2),
                **{f"cpu_ms_{k}": round((c1[k] - c0[k]) / n, 2) for k in c0}, **waits.summary()})
    return out


def _preload(url: str, templates: list[str], ids_in: list[str], n: int) -> None:
    """``n`` bundles stored through the normal path, then marked as analysed by an old analyzer."""
    from kvreport.bundle import new_bundle_id, validate_bundle
    from kvreport_server import store
    from kvreport_server.db import Database

    db = Database(url)
    for i in range(n):
        t = templates[i % len(templates)]
        store.ingest(db, validate_bundle(json.loads(t.replace(ids_in[i % len(templates)], new_bundle_id(), 1))))
    db.dispose()
    with psycopg.connect(url.replace("+psycopg", "")) as conn:
        conn.execute(f"UPDATE bundles SET analyzer_version = '{OLD}'")


def _checks(url: str, acked: list[str], preloaded: int) -> dict:
    """Every acknowledged bundle stored once; the sum of cluster counts equals the rows; and, where
    the helper is there, every counter equal to a full scan (tests/server/server_helpers.scan)."""
    with psycopg.connect(url.replace("+psycopg", "")) as conn:
        rows, distinct = conn.execute("SELECT count(*), count(DISTINCT id) FROM bundles").fetchone()
        counted = conn.execute("SELECT coalesce(sum(count), 0) FROM clusters").fetchone()[0]
        stored = {r[0] for r in conn.execute("SELECT id FROM bundles")}
    lost = len(set(acked) - stored)
    out = {"rows": rows - preloaded, "cluster_count_sum": counted - preloaded, "lost": lost,
           "count_check": rows == distinct == counted == len(acked) + preloaded and not lost}
    try:
        from server_helpers import scan

        from kvreport_server.db import Database

        db = Database(url)
        out["full_scan"] = scan(db) is True
        db.dispose()
    except Exception as exc:  # noqa: BLE001 - older code may lack what the scan reads
        out["full_scan"] = f"not run: {type(exc).__name__}"
    return out


def phase(args) -> int:
    """One phase: a fresh database, gunicorn on the code first on PYTHONPATH, the uploads, the checks."""
    from server_helpers import bundle_from_case

    from kvreport_server import auth, migrate
    from kvreport_server.db import Database
    from tests.paths import case_dirs

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
        db.dispose()
        templates = [json.dumps(bundle_from_case(c.name)) for c in case_dirs()]
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
        cpu = _Cpu(proc.pid, url)
        uploads = _Uploads(base, token, templates, ids_in, args.clients)
        uploads.run(min(10.0, args.seconds / 6))  # warm-up: every worker imports, compiles and connects
        reproc = None
        if args.reanalyze:
            reproc = subprocess.Popen([sys.executable, "-c", "import sys; from kvreport.cli import main; sys.exit(main())",
                                       "admin", "reanalyze", "--database-url", url, *args.reanalyze_args.split()],
                                      env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        result.update(_measured(cpu, uploads.run, args.seconds))
        if reproc is not None:
            with psycopg.connect(url.replace("+psycopg", "")) as conn:
                left = conn.execute(f"SELECT count(*) FROM bundles WHERE analyzer_version = '{OLD}'").fetchone()[0]
            result["reanalyzed_during_uploads"] = args.reanalyze - left
            result["reanalyzed_per_s"] = round((args.reanalyze - left) / result["elapsed_s"], 1)
            note = reproc.communicate(timeout=900)[1]
            result["reanalyze_exit"] = reproc.returncode
            longest = re.search(r"longest write transaction (\d+) ms, counter rows held at most (\d+) ms", note or "")
            result["reanalyze_longest_write_ms"] = int(longest.group(1)) if longest else None
            result["reanalyze_longest_hold_ms"] = int(longest.group(2)) if longest else None
        if args.half and not args.reanalyze and result["bundles_per_s"]:
            half = _measured(cpu, uploads.run, args.seconds / 2, rate=result["bundles_per_s"] / 2)
            result["half"] = {k: half[k] for k in ("bundles_per_s", "p50_ms", "p99_ms", "p99_typical_ms", "max_ms", "errors",
                                                   "load_at_start", "load_at_end", "lock_waiting_backends",
                                                   "active_backends")}
            result["errors"] += half["errors"]
        result.update(_checks(url, uploads.acked, args.reanalyze))
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        if not args.keep:
            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    Path(args.phase).write_text(json.dumps(result, indent=1))
    return 0 if result.get("count_check") and not result.get("errors") else 1


def _print(args, results: list[dict]) -> None:
    print(f"uploads by {args.clients} clients for {args.seconds:g} s per phase; gunicorn {args.workers}x"
          f"{args.threads}; PostgreSQL; {os.cpu_count()} CPUs shared with the load generator\n")
    print(f"{'code':10} {'phase':18} {'bundles/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} {'lost':>4} "
          f"{'counts':>6} {'scan':>5} {'cpu ms/bundle: gunicorn pg client':>34} {'lock waits':>10} "
          f"{'load start..end':>16}")
    for r in results:
        if r.get("failed"):
            print(f"{r['code']:10} phase failed")
            continue
        beside = f"+ reanalyze {r['reanalyze']}" if r["reanalyze"] else "saturation"
        scan = {True: "ok", False: "BAD"}.get(r.get("full_scan"), "-")
        print(f"{r['code']:10} {beside:18} {r['bundles_per_s']:9.1f} {r['p50_ms'] or 0:8.1f} {r['p99_ms'] or 0:8.1f} "
              f"{r['errors']:6d} {r['lost']:4d} {'ok' if r['count_check'] else 'BAD':>6} {scan:>5} "
              f"{r['cpu_ms_gunicorn']:>19.2f} {r['cpu_ms_postgres']:>5.2f} {r['cpu_ms_client']:>6.2f} "
              f"{r['lock_waiting_backends']:>5.2f}/{r['active_backends']:<4.1f} "
              f"{r['load_at_start']:8.2f}..{r['load_at_end']:<6.2f}")
        if "half" in r:
            h = r["half"]
            print(f"{r['code']:10} {'half capacity':18} {h['bundles_per_s']:9.1f} {h['p50_ms'] or 0:8.1f} "
                  f"{h['p99_ms'] or 0:8.1f} {h['errors']:6d} {'':>4} {'':>6} {'':>5} {'':>34} "
                  f"{h['lock_waiting_backends']:>5.2f}/{h['active_backends']:<4.1f} "
                  f"{h['load_at_start']:8.2f}..{h['load_at_end']:<6.2f}")
    for r in results:
        if "healthz_per_s" in r:
            print(f"baseline {r['code']}: GET /healthz {r['healthz_per_s']}/s (p50 {r['healthz_p50_ms']} ms), "
                  f"same clients and gunicorn")
        if not r.get("failed") and not r["reanalyze"] and r.get("cpu_ms_gunicorn"):
            print(f"{r['code']}: {1000 / r['cpu_ms_gunicorn']:.0f} bundles/s per core of gunicorn CPU "
                  f"({1000 / (r['cpu_ms_gunicorn'] + r['cpu_ms_postgres']):.0f} with PostgreSQL's)")
        if "half" in r and r["half"].get("p99_typical_ms") is not None:
            print(f"{r['code']}: at half capacity p99 {r['half']['p99_ms']} ms over every bundle, "
                  f"{r['half']['p99_typical_ms']} ms over those with logs of at most {BIG_LOG} lines "
                  f"(target < 100 ms)")
    alone = {r["code"]: r for r in results if not r.get("failed") and not r["reanalyze"]}
    for r in results:
        if not r.get("failed") and r["reanalyze"] and r["code"] in alone:
            ratio = r["bundles_per_s"] / max(alone[r["code"]]["bundles_per_s"], 1e-9)
            print(f"{r['code']}: ingest beside re-analysis at {ratio:.0%} of uploads alone (target >= 80 %); "
                  f"{r.get('reanalyzed_during_uploads')} of {r['reanalyze']} bundles re-analysed during the uploads "
                  f"({r.get('reanalyzed_per_s')}/s); its longest write transaction "
                  f"{r.get('reanalyze_longest_write_ms', '-')} ms, counter rows held at most "
                  f"{r.get('reanalyze_longest_hold_ms', '-')} ms")


def orchestrate(args) -> int:
    codes = [("now", ROOT)]
    if args.ref:
        codes.append((args.ref, refcode.export(args.ref)))
    out_dir = ROOT / "bench" / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for label, code in codes:
        for reanalyze in ([0, args.reanalyze] if args.reanalyze else [0]):
            phase_file = out_dir / f"upload_phase_{len(results)}.json"
            phase_file.unlink(missing_ok=True)
            argv = [sys.executable, str(Path(__file__).resolve()), "--phase", str(phase_file), "--clients",
                    str(args.clients), "--seconds", str(args.seconds), "--workers", str(args.workers), "--threads",
                    str(args.threads), "--reanalyze", str(reanalyze), f"--reanalyze-args={args.reanalyze_args}"]
            argv += ["--no-healthz"] if args.no_healthz or reanalyze else []
            argv += ["--no-half"] if not args.half else []
            subprocess.run(argv, env=refcode.env_for(code), cwd=code)
            r = json.loads(phase_file.read_text()) if phase_file.is_file() else {"failed": True}
            r.update({"code": label, "reanalyze": reanalyze})
            results.append(r)
    (out_dir / "upload_load.json").write_text(json.dumps(results, indent=1))
    _print(args, results)
    ok = all(not r.get("failed") and r["count_check"] and not r["errors"] and r.get("full_scan") is not False
             for r in results if r["code"] == "now")
    return 0 if ok else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--ref", help="also measure the server of this git revision, in the same run")
    ap.add_argument("--reanalyze", type=int, default=0, metavar="N",
                    help="add a phase with `kvreport admin reanalyze` over N old bundles beside the uploads")
    ap.add_argument("--reanalyze-args", default="", metavar="ARGS",
                    help="more options for `kvreport admin reanalyze`, e.g. \"--nice 0 --batch-size 10\"")
    ap.add_argument("--no-half", dest="half", action="store_false", help="skip the half-capacity phase")
    ap.add_argument("--no-healthz", action="store_true", help="skip the GET /healthz baseline")
    ap.add_argument("--phase", help=argparse.SUPPRESS)  # internal: run one phase, write its JSON here
    args = ap.parse_args(argv)
    return orchestrate(args) if args.phase is None else phase(args)


if __name__ == "__main__":
    sys.exit(main())
