"""Benchmark: redaction throughput (MB/s) on adversarial and on real text, next to a baseline.

Real text: every case log of tests/data/cases and tests/data/corpus, redacted line by line as the
collector does (``Redactor.redact_text`` per log line) and through the server's second pass
(``find_secrets`` over the lines). Adversarial text: single lines of ``--kb`` KB built to make
backtracking regular expressions quadratic (``'token ' + 'a-' * n``, ``'=' * n``, ``'x:' * n``…);
with Python's ``re`` the first took seconds at 16 KB (issue 13, item 1). Each figure comes with the
baseline of the same run on the same text: one ``str.replace`` pass and one ``re.search`` of a
literal, so machines compare by ratio.

    .venv/bin/python bench/bench_redact.py [--kb 256] [--repeat 3]
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "collector"))

from kvreport.redact import Redactor, find_secrets  # noqa: E402
from tests.paths import CASE_DIR, CORPUS_DIR  # noqa: E402

ADVERSARIAL = {
    "token a-a-a-": lambda n: "token " + "a-" * (n // 2),
    "====": lambda n: "=" * n,
    "@@@@": lambda n: "@" * n,
    "x:x:x:": lambda n: "x:" * (n // 2),
    "////": lambda n: "/" * n,
    "a.a.a.@": lambda n: "a." * (n // 2) + "@",
    "api_key=api_key=": lambda n: "api_key=" * (n // 8),
    "HF_TOKEN=a-a- ": lambda n: ("HF_TOKEN=" + "a-" * 20 + " ") * (n // 50),
    "curl -u x -u x": lambda n: "curl " + "-u x " * (n // 5),
    "<token<token": lambda n: "<" + "token" * (n // 5),
    "1.2.3.4.": lambda n: "1.2." * (n // 4),
    "mixed": lambda n: ("a-b=c:d@e.f/ g\\h 'i\" token " * (n // 30)),
}


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _row(label: str, size: int, seconds: float, base: float, rx: float) -> None:
    mb = size / 1e6
    print(f"{label:<28} {mb:8.2f} MB {mb / seconds:10.2f} MB/s   str.replace {mb / base:9.1f} MB/s"
          f"   re.search {mb / rx:9.1f} MB/s   ({seconds / base:,.0f}x str.replace)")


def _real_lines() -> list[str]:
    lines: list[str] = []
    for base in (CASE_DIR, CORPUS_DIR):
        if base.is_dir():
            for path in sorted(base.glob("*/*.txt")):
                lines += path.read_text(errors="replace").splitlines()
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kb", type=int, default=256, help="size of each adversarial line (KB)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    n = args.kb * 1000
    literal = re.compile("zq_not_there")

    lines = _real_lines()
    if lines:
        text = "\n".join(lines)
        size = len(text.encode())
        base = _best(lambda: text.replace("token", "TOKEN"), args.repeat)
        rx = _best(lambda: literal.search(text), args.repeat)
        client = _best(lambda: [Redactor().redact_text(line) for line in lines], args.repeat)
        server = _best(lambda: find_secrets({"lines": lines}), args.repeat)
        print(f"real text: {len(lines):,} lines of the case logs")
        _row("client (redact_text/line)", size, client, base, rx)
        _row("server (find_secrets)", size, server, base, rx)
    else:
        print("real text: no case logs found under tests/data")
    print(f"adversarial text: one line of {args.kb} KB each")
    for label, make in ADVERSARIAL.items():
        line = make(n)
        size = len(line.encode())
        base = _best(lambda line=line: line.replace("token", "TOKEN"), args.repeat)
        rx = _best(lambda line=line: literal.search(line), args.repeat)
        client = _best(lambda line=line: Redactor().redact_text(line), args.repeat)
        _row(label, size, client, base, rx)
    t = _best(lambda: Redactor().redact_text("token " + "a-" * 8000), args.repeat)
    print(f"Redactor().redact_text('token ' + 'a-' * 8000): {t * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
