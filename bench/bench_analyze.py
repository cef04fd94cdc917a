"""Benchmark: ``kvreport analyze`` on big logs, next to ``grep -c`` on the same file in the same run.

Two logs, each at every ``--sizes`` (MB; default 100 and 1000), written under a temporary folder and deleted after:

* ``filler``: the llama.cpp case logs (tests/data/cases/loc-*) once, then a realistic server's non-key chatter (slot
  / request lines) with one of those logs after every 50 blocks of it — a llama-server that ran for days (97 % of
  the lines are filler);
* ``cases``: every real case log (tests/data/cases/*/log.txt and tests/data/corpus/*/log.txt) end to end, repeated
  until the size is reached — the journal of a crash-looping service, where most lines are key lines and the log
  holds thousands of failures;
* ``journal`` (only when asked for, ``--logs journal``): the ``cases`` log as journald keeps it, every line
  behind a ``Mon DD HH:MM:SS host llama-server[PID]: `` prefix (a new PID per repetition, one second per line), so
  that no run repeats byte for byte and the runs are not remembered (kvreport.logs.scan); and as ``llama-server``
  is one of the keywords (an engine hint), every line is a key line: every line is parsed.

Every analysis runs in its own process (the whole ``kvreport analyze --json`` command, and the parse alone with
each prefilter backend), timed by wall clock, CPU (user+system, children included) and peak RSS (``ru_maxrss`` of
that process from ``os.wait4``). Baselines from the same run: ``grep -c '<one pattern>'``, run in turn with the
analyze command so that each ratio compares two runs made under the same load (each pair's ratio and their median
are printed, with the CPU ratio), and ``grep -c -E`` with the analyzer's own keyword alternation. The load average
is printed beside each figure (2 shared cores here: ratios move with it).

    .venv/bin/python bench/bench_analyze.py [--sizes 100,1000] [--logs filler,cases] [--backends hyperscan,grep]
                                            [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "collector"), str(ROOT)]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "collector"), str(ROOT)]), "LC_ALL": "C"}

FILLER = [
    "0.12.345.678 I slot update_slots: id  0 | task 1234 | prompt processing progress, n_tokens = 512, batch.n_tokens = 512, progress = 0.5\n",
    "0.12.345.679 I slot      release: id  0 | task 1234 | stop processing: n_tokens = 1034, truncated = 0\n",
    "0.12.345.680 I srv  update_slots: all tasks done\n",
    "0.12.345.681 I srv  log_server_r: request: POST /completion 127.0.0.1 200\n",
    "0.12.345.682 I slot print_timing: id  0 | task 1234 | prompt eval time =     100.00 ms /   512 tokens\n",
    "0.12.345.683 I slot launch_slot_: id  0 | task 1235 | processing task\n",
]


def _with_newline(data: bytes) -> bytes:
    return data if data.endswith(b"\n") else data + b"\n"


def build_log(path: Path, size_mb: int) -> tuple[int, int]:
    """The filler-heavy log (see the module doc); returns (bytes written, case logs inserted)."""
    from tests.paths import case_dirs

    logs = [_with_newline((c / "log.txt").read_bytes()) for c in case_dirs() if c.name.startswith("loc-")]
    filler = "".join(FILLER).encode() * 200
    target = size_mb * 1_000_000
    written = 0
    n_case = 0
    with open(path, "wb") as out:
        for lg in logs:
            out.write(lg)
            written += len(lg)
        i = 0
        while written < target:
            out.write(filler)
            written += len(filler)
            if i % 50 == 0:
                lg = logs[n_case % len(logs)]
                out.write(lg)
                written += len(lg)
                n_case += 1
            i += 1
    return written, n_case


def build_cases_log(path: Path, size_mb: int) -> tuple[int, int]:
    """Every real case log end to end, repeated up to ``size_mb`` MB; returns (bytes written, repetitions)."""
    from tests.paths import CASE_DIR, CORPUS_DIR

    logs = sorted(CASE_DIR.glob("*/log.txt")) + sorted(CORPUS_DIR.glob("*/log.txt"))
    blob = b"".join(_with_newline(p.read_bytes()) for p in logs)
    target = size_mb * 1_000_000
    written = reps = 0
    with open(path, "wb") as out:
        while written < target:
            out.write(blob)
            written += len(blob)
            reps += 1
    return written, reps


def build_journal_log(path: Path, size_mb: int) -> tuple[int, int]:
    """The ``cases`` log behind journald's line prefix (see the module doc); returns (bytes written, repetitions)."""
    from tests.paths import CASE_DIR, CORPUS_DIR

    logs = sorted(CASE_DIR.glob("*/log.txt")) + sorted(CORPUS_DIR.glob("*/log.txt"))
    lines = b"".join(_with_newline(p.read_bytes()) for p in logs).splitlines(keepends=True)
    target = size_mb * 1_000_000
    written = reps = t = 0
    with open(path, "wb") as out:
        while written < target:
            reps += 1
            chunk = []
            for line in lines:
                t += 1
                chunk.append(b"Dec %02d %02d:%02d:%02d host llama-server[%d]: " % (
                    1 + t // 86400 % 28, t // 3600 % 24, t // 60 % 60, t % 60, 1000 + reps) + line)
            data = b"".join(chunk)
            out.write(data)
            written += len(data)
    return written, reps


CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from kvreport.logs import parse_file, scan
from kvreport.analyze import diagnose
path, backend, memo = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if not memo:
    scan.MEMO_MAX = 0
f = parse_file(path, backend=backend, use_grep=backend != "python")
d = diagnose(f, {})
print(json.dumps({"lines": f.line_count, "key_lines": f.key_line_count, "runs": f.runs,
                  "key": d["signature"]["key"], "findings": [x["kind"] for x in d["findings"]]}))
"""


def measure_wait4(argv: list[str]) -> dict:
    """Run ``argv`` once and reap it with ``os.wait4``: wall, CPU (user+system of it and its reaped children) and
    its own peak RSS in MiB."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=ENV)
        _pid, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {"wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "rss_mib": ru.ru_maxrss / 1024.0,
                "rc": proc.returncode, "out": out.read().decode("utf-8", "replace"),
                "err": err.read().decode("utf-8", "replace")[-500:]}


def best_of(argv: list[str], n: int) -> dict:
    runs = [measure_wait4(argv) for _ in range(n)]
    best = min(runs, key=lambda r: r["wall"])
    best["rss_mib"] = max(r["rss_mib"] for r in runs)
    return best


def _load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def paired(base: list[str], argv: list[str], n: int) -> tuple[dict, dict, list[float]]:
    """``base`` and ``argv`` run one after the other ``n`` times (so that each pair shares the machine's load):
    the fastest of each and the wall ratio of every pair."""
    pairs = [(measure_wait4(base), measure_wait4(argv)) for _ in range(n)]
    b = min((x for x, _ in pairs), key=lambda r: r["wall"])
    a = min((y for _, y in pairs), key=lambda r: r["wall"])
    a["rss_mib"] = max(y["rss_mib"] for _, y in pairs)
    return b, a, sorted(y["wall"] / x["wall"] for x, y in pairs)


def bench_one(name: str, path: Path, size: int, args) -> None:
    grep = shutil.which("grep")
    mb = size / 1e6
    with open(path, "rb") as fh:  # warm the page cache for every contender
        while fh.read(16 << 20):
            pass
    print(f"\n== {name} log: {mb:.0f} MB  ({_load()} on {os.cpu_count()} CPUs)")
    t_grep = None
    cli = [sys.executable, "-c", "import sys; from kvreport.cli import main; sys.exit(main())", "analyze",
           str(path), "--json"]
    if grep:
        # the baseline and the command alternate: each ratio compares two runs made under the same load
        g, r, ratios = paired([grep, "-c", args.grep_pattern, str(path)], cli, args.repeat)
        t_grep = g["wall"]
        print(f"  grep -c '{args.grep_pattern}': {g['out'].strip()} lines, {t_grep:.2f} s wall, {g['cpu']:.2f} s CPU "
              f"({mb / t_grep:.0f} MB/s; {_load()})")
        from kvreport.logs import grep_pattern_file

        with grep_pattern_file("-E") as kw:
            e = best_of([grep, "-c", "-a", "-E", "-f", kw, str(path)], args.repeat)
        print(f"  grep -c -E <the analyzer's keyword alternation>: {e['out'].strip()} lines, {e['wall']:.2f} s "
              f"({mb / e['wall']:.0f} MB/s; {_load()})")
    else:
        r, ratios = best_of(cli, args.repeat), []

    def line(label: str, r: dict, extra: str = "") -> None:
        ratio = f", {r['wall'] / t_grep:.1f}x grep -c" if t_grep else ""
        print(f"  {label}: {r['wall']:.2f} s wall, {r['cpu']:.2f} s CPU ({mb / r['wall']:.0f} MB/s{ratio}), "
              f"peak RSS {r['rss_mib']:.0f} MiB{extra}; {_load()}" + ("" if r["rc"] in (0, 1) else
                                                                      f"  FAILED rc={r['rc']} {r['err']}"))

    try:
        d = json.loads(r["out"])
        extra = f"; key={d['signature']['key']} findings={[x['kind'] for x in d['findings']][-3:]}"
    except ValueError:
        extra = ""
    line("kvreport analyze --json (default backend)", r, extra)
    if t_grep:
        med = ratios[len(ratios) // 2]
        print(f"    each run next to its own grep -c: {', '.join(f'{x:.1f}x' for x in ratios)} (median {med:.1f}x); "
              f"CPU {r['cpu'] / max(g['cpu'], 1e-3):.1f}x grep's")
        print(f"    goal: within 5x of grep -c ({'met' if med <= 5 else 'NOT met'}, median of the pairs), "
              f"peak RSS under 100 MB ({'met' if r['rss_mib'] * 1.048576 < 100 else 'NOT met'})")
    for backend in args.backends:
        for memo in ((True, False) if backend != "grep" else (True,)):
            slow = backend == "python" or not memo
            if slow and mb > 300 and not args.slow:
                continue  # minutes per run: --slow
            r = best_of([sys.executable, "-c", CHILD, str(path), backend, "1" if memo else "0"], args.repeat)
            try:
                info = json.loads(r["out"])
                extra = f"; {info['lines']:,} lines, {info['key_lines']:,} key lines, {info['runs']} runs"
            except ValueError:
                extra = ""
            label = f"parse_file+diagnose, {backend}" + ("" if backend == "grep" else
                                                         (", runs remembered" if memo else ", every run parsed"))
            line(label, r, extra)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,1000", help="log sizes in MB, comma-separated")
    ap.add_argument("--logs", default="filler,cases", help="filler, cases, journal (see the module doc)")
    ap.add_argument("--backends", default="hyperscan,grep,python",
                    help="prefilter backends to time one by one (kvreport.logs.scan)")
    ap.add_argument("--slow", action="store_true",
                    help="above 300 MB, also time the Python backend and what parses every key line (runs not "
                         "remembered): minutes each")
    ap.add_argument("--grep-pattern", default="failed to allocate")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each command, baselines included (the fastest "
                    "is shown: the machine is shared)")
    ap.add_argument("--keep", help="write the logs into this folder and keep them")
    args = ap.parse_args()
    from kvreport.logs import scan

    have = {"hyperscan": scan._have_hyperscan(), "grep": bool(shutil.which("grep")), "python": True}
    args.backends = [b for b in args.backends.split(",") if b and have.get(b)]
    print(f"default prefilter backend here: {scan.best_backend()}; timing: {', '.join(args.backends)}")
    tmpdir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kvreport-bench-"))
    tmpdir.mkdir(parents=True, exist_ok=True)
    try:
        for size_mb in (int(s) for s in args.sizes.split(",") if s):
            for name in args.logs.split(","):
                path = tmpdir / f"{name}-{size_mb}mb.log"
                builder = {"filler": build_log, "cases": build_cases_log, "journal": build_journal_log}[name]
                size, _n = builder(path, size_mb)
                bench_one(name, path, size, args)
                if not args.keep:
                    path.unlink()
    finally:
        if not args.keep:
            shutil.rmtree(tmpdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
