"""Benchmark: analyze a large log in one streaming pass, next to `grep -c` on the same file.

Builds a log of ``--size-mb`` MB (default 200; ``--size-mb 1000`` for the 1 GB run) from the real
case logs under ../shared/cases: every case log once, then the non-key lines of a realistic
server run (slot / request chatter, progress dots) as filler between repeated failure logs, so
the file looks like a llama-server that ran for days and then failed. It then runs
``kvreport.logs.parse_stream`` + ``kvreport.analyze.diagnose`` on it, and ``grep -c <pattern>`` on
the same file, and prints MB/s, the ratio to grep, and peak memory (tracemalloc for Python
allocations, ru_maxrss for the process).

    .venv/bin/python bench/bench_analyze.py [--size-mb 200] [--keep PATH]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FILLER = [
    "0.12.345.678 I slot update_slots: id  0 | task 1234 | prompt processing progress, n_tokens = 512, batch.n_tokens = 512, progress = 0.5\n",
    "0.12.345.679 I slot      release: id  0 | task 1234 | stop processing: n_tokens = 1034, truncated = 0\n",
    "0.12.345.680 I srv  update_slots: all tasks done\n",
    "0.12.345.681 I srv  log_server_r: request: POST /completion 127.0.0.1 200\n",
    "0.12.345.682 I slot print_timing: id  0 | task 1234 | prompt eval time =     100.00 ms /   512 tokens\n",
    "0.12.345.683 I slot launch_slot_: id  0 | task 1235 | processing task\n",
]


def build_log(path: Path, size_mb: int) -> tuple[int, int]:
    from tests.paths import case_dirs

    # llama.cpp's own complete logs (the loc-* runs): one engine, as a real long-running server
    logs = [(c / "log.txt").read_bytes() for c in case_dirs() if c.name.startswith("loc-")]
    filler = "".join(FILLER).encode() * 200
    target = size_mb * 1_000_000
    written = 0
    n_case = 0
    with open(path, "wb") as out:
        for lg in logs:
            out.write(lg if lg.endswith(b"\n") else lg + b"\n")
            written += len(lg) + 1
        i = 0
        while written < target:
            out.write(filler)
            written += len(filler)
            if i % 50 == 0:
                lg = logs[n_case % len(logs)]
                out.write(lg if lg.endswith(b"\n") else lg + b"\n")
                written += len(lg) + 1
                n_case += 1
            i += 1
    return written, n_case


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=200)
    ap.add_argument("--keep", help="write the log here and keep it")
    ap.add_argument("--grep-pattern", default="failed to allocate")
    ap.add_argument("--python", action="store_true",
                    help="also time the pure-Python fallback (slow: ~10 MB/s; on by default under 300 MB)")
    args = ap.parse_args()

    from kvreport.analyze import diagnose
    from kvreport.logs import parse_file

    tmpdir = tempfile.mkdtemp(prefix="kvreport-bench-")
    path = Path(args.keep) if args.keep else Path(tmpdir) / "big.log"
    try:
        t0 = time.perf_counter()
        size, _ = build_log(path, args.size_mb)
        print(f"log: {path} {size / 1e6:.0f} MB built in {time.perf_counter() - t0:.1f} s")

        # warm the page cache for both contenders
        with open(path, "rb") as fh:
            while fh.read(16 << 20):
                pass

        results = {}
        modes = [("grep -E prefilter, parallel byte ranges", True)]
        if args.python or args.size_mb < 300:
            modes.append(("pure Python chunk scan", False))
        for mode, use_grep in modes:
            c0 = os.times()
            t0 = time.perf_counter()
            facts = parse_file(path, use_grep=use_grep)
            d = diagnose(facts, {})
            c1 = os.times()
            cpu = (c1.user - c0.user) + (c1.system - c0.system) + (c1.children_user - c0.children_user) + \
                (c1.children_system - c0.children_system)
            results[mode] = (time.perf_counter() - t0, facts, d, cpu)
        # peak Python memory of the default path, measured in a separate run (tracemalloc slows it down)
        tracemalloc.start()
        parse_file(path)
        _cur, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

        grep = shutil.which("grep")
        t_grep = None
        if grep:
            print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (the ratios move with it)")
            t0 = time.perf_counter()
            r = subprocess.run([grep, "-c", args.grep_pattern, str(path)], capture_output=True, text=True, check=False)
            t_grep = time.perf_counter() - t0
            print(f"grep -c '{args.grep_pattern}': {r.stdout.strip()} lines in {t_grep:.2f} s "
                  f"({size / 1e6 / t_grep:.0f} MB/s)")
        t_grep_kw = None
        if grep:
            from kvreport.logs import KEYWORDS, grep_ere

            kwfile = Path(tmpdir) / "keywords"
            kwfile.write_text("\n".join(KEYWORDS))
            t0 = time.perf_counter()
            r = subprocess.run([grep, "-c", "-a", "-F", "-f", str(kwfile), str(path)], capture_output=True, text=True,
                               check=False, env={**os.environ, "LC_ALL": "C"})
            t_f = time.perf_counter() - t0
            print(f"grep -c -F -f <the {len(KEYWORDS)} key-line keywords>: {r.stdout.strip()} lines in {t_f:.2f} s")
            ere = Path(tmpdir) / "keywords.ere"
            ere.write_text(grep_ere() + "\n")
            t0 = time.perf_counter()
            r = subprocess.run([grep, "-c", "-a", "-E", "-f", str(ere), str(path)], capture_output=True, text=True,
                               check=False, env={**os.environ, "LC_ALL": "C"})
            t_grep_kw = time.perf_counter() - t0
            print(f"grep -c -E <the same keywords as one alternation> (the selection the analyzer makes): "
                  f"{r.stdout.strip()} lines in {t_grep_kw:.2f} s")
        for mode, (t_an, facts, d, cpu) in results.items():
            print(f"analyze ({mode}): {facts.line_count:,} lines, {facts.key_line_count:,} key lines, {t_an:.2f} s "
                  f"wall, {cpu:.2f} s CPU incl. grep ({size / 1e6 / t_an:.0f} MB/s); phase={d['failure']['phase']} "
                  f"key={d['signature']['key']}")
            if t_grep:
                print(f"  ratio to grep -c one pattern: {t_an / t_grep:.1f}x (goal: within 5x)")
            if t_grep_kw:
                print(f"  ratio to grep -c with the key-line keywords: {t_an / t_grep_kw:.1f}x")
        print(f"peak Python allocations (tracemalloc): {peak / 2**20:.1f} MiB; process max RSS: {rss_mib:.1f} MiB "
              "(goal: under 100 MB)")
    finally:
        if not args.keep:
            shutil.rmtree(tmpdir, ignore_errors=True)
        elif path.exists():
            print(f"kept {path} ({os.path.getsize(path) / 1e6:.0f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
