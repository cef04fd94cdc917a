"""Server CPU per uploaded bundle, split by stage (issue 15 item 3), next to ``json.loads`` of the same body.

For every shared real case (a bundle as ``kvreport upload`` sends it, fresh id each time) the upload
path runs in this process, stage by stage, timed with ``time.process_time`` (CPU of this process; the
database server's own CPU is not in it):

* parse   — ``limits.parse_json`` + ``limits.check_and_clean`` (the shape budget, NUL/surrogate cleaning)
* validate — ``kvreport.bundle.validate_bundle``
* secrets — ``analysis.find_secrets`` (the server's second redaction pass)
* analyze — the analyzer and the bundle's facts and facets as ``store.ingest`` computes them
  (``analysis.diagnose_with_devices`` + ``analysis.facts_and_facets``: the log parsed once), or
  ``analysis.diagnose`` + ``analysis.facets`` on a server without them (``--ref``-style old code)
* store   — the rest of ``store.ingest``: content hash and the SQL of the insert transaction
  (ingest runs the analysis inside, so store = ingest - analyze)

Printed: the median per bundle of each stage and their total, the baseline ``json.loads`` median of
the same bodies in the same run, the ratio, and the load average. ``--profile`` adds cProfile's top
functions of the whole path. PostgreSQL by default (a throwaway database), ``--sqlite`` for SQLite.

    .venv/bin/python bench/bench_ingest_cpu.py [--rounds 5] [--profile] [--sqlite] [--ref REV]

``--ref REV`` runs the same measurement, in the same run, on the collector and server of git
revision REV (exported with ``git archive`` into bench/out/) and prints both side by side.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import secrets as pysecrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "server"), str(ROOT)]

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
STAGES = ("parse", "validate", "secrets", "analyze", "store")


def _cpu(fn, *a, **kw):
    t = time.process_time_ns()
    out = fn(*a, **kw)
    return out, (time.process_time_ns() - t) / 1e6


def _analysis_as_ingest_does(analysis, bundle: dict) -> None:
    if hasattr(analysis, "diagnose_with_devices"):
        diagnosis, devices = analysis.diagnose_with_devices(bundle)
        analysis.facts_and_facets(bundle, diagnosis, devices)
    else:
        diagnosis = analysis.diagnose(bundle)
        analysis.bundle_facts(bundle, diagnosis)
        analysis.facets(bundle, diagnosis)


def run(url: str, rounds: int, profile: bool) -> dict:
    from server_helpers import bundle_from_case

    from kvreport.bundle import new_bundle_id, validate_bundle
    from kvreport_server import analysis, limits, migrate, store
    from kvreport_server.config import DEFAULTS
    from kvreport_server.db import Database
    from tests.paths import CASE_DIR as SHARED_CASES

    migrate.upgrade(url)
    db = Database(url)
    cfg = {k: v for k, v in DEFAULTS.items() if k.startswith("MAX_")}
    cases = sorted(p.name for p in SHARED_CASES.iterdir() if (p / "log.txt").is_file())
    templates = [bundle_from_case(c) for c in cases]
    times: dict[str, list[float]] = {s: [] for s in (*STAGES, "total", "json.loads")}
    prof = cProfile.Profile(time.process_time) if profile else None  # CPU time, not waits

    def one(template: dict) -> None:
        body = json.dumps({**template, "id": new_bundle_id()}).encode()
        _, base = _cpu(json.loads, body)
        times["json.loads"].append(base)
        if prof:
            prof.enable()
        data, t_parse = _cpu(limits.parse_json, body, max_nodes=cfg["MAX_JSON_NODES"],
                             max_depth=cfg["MAX_JSON_DEPTH"],
                             max_items=max(cfg["MAX_JSON_ITEMS"], cfg["MAX_LOG_LINES"]),
                             max_string=cfg["MAX_STRING_CHARS"])
        data, t_clean = _cpu(limits.check_and_clean, data, max_depth=cfg["MAX_JSON_DEPTH"],
                             max_string=cfg["MAX_STRING_CHARS"], max_log_lines=cfg["MAX_LOG_LINES"],
                             max_devices=cfg["MAX_DEVICES"])
        bundle, t_val = _cpu(validate_bundle, data)
        (refuse, flagged), t_sec = _cpu(analysis.find_secrets, bundle)
        _, t_an = _cpu(_analysis_as_ingest_does, analysis, bundle)
        _, t_ingest = _cpu(store.ingest, db, bundle, size_bytes=len(body),
                           flagged=[f"{p} ({k})" for p, k in refuse + flagged])
        if prof:
            prof.disable()
        row = {"parse": t_parse + t_clean, "validate": t_val, "secrets": t_sec, "analyze": t_an,
               "store": max(0.0, t_ingest - t_an)}
        for k, v in row.items():
            times[k].append(v)
        times["total"].append(sum(row.values()))

    for t in templates:  # warm-up: imports, compiled patterns, connections
        one(t)
    for v in times.values():
        v.clear()
    for _ in range(rounds):
        for t in templates:
            one(t)
    db.dispose()
    out = {k: statistics.median(v) for k, v in times.items()}
    out["n"] = len(times["total"])
    out["mean_total"] = statistics.fmean(times["total"])
    if prof:
        st = pstats.Stats(prof)
        st.sort_stats("cumulative").print_stats(40)
    return out


def _export(ref: str) -> Path:
    import subprocess

    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", ref], check=True, capture_output=True,
                         text=True).stdout.strip()
    dest = ROOT / "bench" / "out" / f"ref-{sha}"
    if not (dest / "server" / "kvreport_server" / "store.py").is_file():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", sha, "collector", "server", "migrations",
                                  "alembic.ini"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def _with_ref(args) -> int:
    import subprocess

    rows = {}
    for label, code in (("now", ROOT), (args.ref, _export(args.ref))):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code / "collector"), str(code / "server"), str(ROOT)])}
        argv = [sys.executable, __file__, "--rounds", str(args.rounds), "--json"] + (["--sqlite"] if args.sqlite else [])
        out = subprocess.run(argv, env=env, cwd=code, capture_output=True, text=True, check=True).stdout
        rows[label] = json.loads(out.strip().splitlines()[-1])
    print(f"server CPU per bundle, ms of the server process's CPU (medians over {rows['now']['n']} uploads of the "
          f"shared cases), {'SQLite' if args.sqlite else 'PostgreSQL'}, {os.cpu_count()} CPUs\n")
    print(f"{'stage':12} {'now':>8} {args.ref:>10}")
    for k in (*STAGES, "total", "json.loads"):
        print(f"{k:12} {rows['now'][k]:8.2f} {rows[args.ref][k]:10.2f}")
    print(f"{'load (1 min)':12} {rows['now']['load']:>8} {rows[args.ref]['load']:>10}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--sqlite", action="store_true")
    ap.add_argument("--ref", help="also measure the code of this git revision, in the same run")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ref:
        return _with_ref(args)
    load0 = os.getloadavg()
    if args.sqlite:
        tmp = tempfile.mkdtemp(prefix="kvr-ingest-")
        res = run(f"sqlite:///{tmp}/b.db", args.rounds, args.profile)
        where = "SQLite"
    else:
        import psycopg

        name = f"kvr_ingest_{pysecrets.token_hex(4)}"
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        try:
            res = run(f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}", args.rounds, args.profile)
        finally:
            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        where = "PostgreSQL"
    load1 = os.getloadavg()
    if args.json:
        print(json.dumps({**res, "load": f"{load0[0]:.2f}..{load1[0]:.2f}"}))
        return 0
    base = res["json.loads"]
    print(f"server CPU per bundle ({where}; {res['n']} uploads of the shared cases; medians, ms of this process's CPU)")
    print(f"load average (1 min) {load0[0]:.2f} at start, {load1[0]:.2f} at end; {os.cpu_count()} CPUs\n")
    print(f"{'stage':12} {'ms':>8} {'x json.loads':>13}")
    for k in (*STAGES, "total"):
        print(f"{k:12} {res[k]:8.2f} {res[k] / base if base else 0:13.1f}")
    print(f"{'json.loads':12} {base:8.3f} {'1.0':>13}   (baseline, same bodies, same run)")
    print(f"\nmean total {res['mean_total']:.2f} ms; target <= 10 ms per typical bundle: "
          f"{'met' if res['total'] <= 10 else 'NOT met'} (median {res['total']:.2f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
