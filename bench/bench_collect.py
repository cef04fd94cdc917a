"""Benchmark: `kvreport collect` on this machine, next to `python -c pass` and PyTorch's
`python -m torch.utils.collect_env` (the environment report bug templates ask for), in one run.

Each command runs ``--repeat`` times (default 7) as a fresh process; the median wall time is
printed with its ratio to ``python -c pass`` and to ``collect_env``. torch is used from the
current interpreter when installed, else installed (``pip install torch==2.13.0``, from the
local wheel this workplace provides) into a throwaway virtual environment under ``bench/out/``;
when that fails the comparison is skipped with a message. The target is a collect under 0.5 s.

It also checks with ``python -X importtime`` that ``kvreport --help`` imports neither
kvreport_server, requests nor numpy, and prints the slowest imports of ``kvreport collect``.
Last, ``kvreport collect --log`` on a 200 MB log built from the shared case logs (kept in
``bench/out``), with the grep prefilter (:mod:`kvreport.excerpt_fast`) and with the line-by-line
read it replaced, and whether both give the same ``log`` section.

    .venv/bin/python bench/bench_collect.py [--repeat 7] [--no-torch]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
CASE = ROOT.parent / "shared" / "cases" / "loc-15-fail-huge-ctx-fit-default"
FORBIDDEN = ("kvreport_server", "requests", "numpy")


def timed(argv: list[str], repeat: int, cwd: Path, env: dict | None = None) -> float | None:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        p = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True)
        times.append(time.perf_counter() - start)
        if p.returncode != 0:
            print(f"  ! {' '.join(argv[:4])}… exited {p.returncode}: {p.stderr.decode(errors='replace')[-300:]}")
            return None
    return statistics.median(times)


def torch_python() -> str | None:
    """A Python that can run ``-m torch.utils.collect_env``: this one, or a bench venv with torch."""
    if subprocess.run([sys.executable, "-c", "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)"],
                      capture_output=True).returncode == 0:
        return sys.executable
    venv = OUT / "torch-venv"
    py = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if py.exists() and subprocess.run([str(py), "-c", "import torch"], capture_output=True).returncode == 0:
        return str(py)
    print("torch is not installed here: installing torch==2.13.0 into bench/out/torch-venv (one time) …")
    try:
        OUT.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "torch==2.13.0"], check=True, capture_output=True,
                       timeout=900)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        err = getattr(exc, "stderr", b"") or b""
        print(f"skipping the collect_env comparison: torch could not be installed ({exc}; "
              f"{err.decode(errors='replace').strip()[-200:]})")
        return None
    return str(py)


def import_check(kvreport_py: str) -> list[str]:
    code = "from kvreport.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
    p = subprocess.run([kvreport_py, "-X", "importtime", "-c", code], capture_output=True, text=True)
    mods = [line.split("|")[-1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")]
    return sorted({m for m in mods if m.split(".")[0] in FORBIDDEN})


def slowest_imports(kvreport_py: str, log: Path, cmd: str, out: Path, n: int = 8) -> list[tuple[int, str]]:
    code = ("import sys\nfrom kvreport.cli import main\n"
            f"sys.argv = ['kvreport', 'collect', '--log', {str(log)!r}, '--command', {cmd!r}, '-o', {str(out)!r}]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n")
    p = subprocess.run([kvreport_py, "-X", "importtime", "-c", code], capture_output=True, text=True)
    return sorted(importtime_rows(p.stderr), reverse=True)[:n]


def importtime_rows(stderr: str) -> list[tuple[int, str]]:
    """``python -X importtime`` output -> [(cumulative microseconds, module)]."""
    rows = []
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            parts = [x.strip() for x in line[len("import time:"):].split("|")]
            if parts[1].isdigit():
                rows.append((int(parts[1]), parts[2]))
    return rows


def big_log(mb: int) -> Path:
    """A log of about ``mb`` MB built from the shared case logs (the failing loc-17 case last), kept in bench/out."""
    path = OUT / f"big-{mb}mb.log"
    if path.is_file():
        return path
    OUT.mkdir(parents=True, exist_ok=True)
    cases = sorted((ROOT.parent / "shared" / "cases").glob("*/log.txt"))
    last = [p for p in cases if "loc-17" in str(p)]
    body = b"".join(p.read_bytes() for p in cases if p not in last) or b"srv  log: request\n" * 1000
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as out:
        n = 0
        while n < mb * 1_000_000:
            out.write(body)
            n += len(body)
        for p in last:
            out.write(p.read_bytes())
    os.replace(tmp, path)
    return path


def big_log_rows(kvreport: list[str], py: str, work: Path, mb: int) -> None:
    """`kvreport collect --log BIG` now (grep prefilter) next to the line-by-line read it replaced."""
    path = big_log(mb)
    now = timed([*kvreport, "collect", "--log", str(path), "-o", str(work / "big.json")], 1, work)
    old = timed([py, "-c", "import sys; from kvreport import collect, excerpt_fast; "
                 "excerpt_fast.read_excerpt = lambda p, use_grep=True: excerpt_fast.read_excerpt_slow(p); "
                 "from kvreport.cli import main; sys.exit(main())",
                 "collect", "--log", str(path), "-o", str(work / "big-old.json")], 1, work)
    size = path.stat().st_size / 1e6
    print(f"\n`kvreport collect --log` on a {size:.0f} MB log built from the case logs (one run each):")
    print(f"  line-by-line read (before): {old:8.2f} s" if old is not None else "  line-by-line read: failed")
    print(f"  grep prefilter (now):       {now:8.2f} s" if now is not None else "  grep prefilter: failed")
    if old and now:
        print(f"  speed-up: {old / now:.0f}x")
        a = json.loads((work / "big.json").read_text())["log"]
        b = json.loads((work / "big-old.json").read_text())["log"]
        print(f"  same log section: {'yes' if a == b else 'NO'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--no-torch", action="store_true", help="skip the torch.utils.collect_env comparison")
    ap.add_argument("--no-big-log", action="store_true", help="skip the 200 MB `collect --log` comparison")
    ap.add_argument("--big-mb", type=int, default=200, help="size of the big log in MB (default 200)")
    args = ap.parse_args()

    py = sys.executable
    kvreport = [py, "-c", "import sys; from kvreport.cli import main; sys.exit(main())"]
    exe = shutil.which("kvreport", path=str(Path(py).parent))
    if exe:
        kvreport = [exe]
    work = Path(tempfile.mkdtemp(prefix="kvreport-bench-"))
    log = CASE / "log.txt"
    cmd = (CASE / "command.txt").read_text().strip() if (CASE / "command.txt").is_file() else "llama-server -c 131072"
    if not log.is_file():
        log = work / "empty.log"
        log.write_text("")

    rows: list[tuple[str, float | None]] = []
    rows.append(("python -c pass", timed([py, "-c", "pass"], args.repeat, work)))
    rows.append(("kvreport --help", timed([*kvreport, "--help"], args.repeat, work)))
    rows.append(("kvreport collect (no input)", timed([*kvreport, "collect", "-o", str(work / "a.json")],
                                                      args.repeat, work)))
    rows.append(("kvreport collect --log --command", timed(
        [*kvreport, "collect", "--log", str(log), "--command", cmd, "-o", str(work / "b.json")], args.repeat, work)))
    tpy = None if args.no_torch else torch_python()
    if tpy:
        rows.append(("python -m torch.utils.collect_env", timed([tpy, "-m", "torch.utils.collect_env"],
                                                                max(3, args.repeat // 2), work)))
    base = rows[0][1]
    ref = rows[-1][1] if tpy else None
    print(f"\nmedian of {args.repeat} fresh processes each ({os.cpu_count()} CPUs, {sys.platform}, "
          f"Python {sys.version.split()[0]})\n")
    print(f"{'command':38} {'seconds':>8} {'x python -c pass':>17} {'x collect_env':>14}")
    for name, t in rows:
        if t is None:
            print(f"{name:38} {'failed':>8}")
            continue
        r1 = f"{t / base:.1f}" if base else "-"
        r2 = f"{t / ref:.2f}" if ref else "-"
        print(f"{name:38} {t:8.3f} {r1:>17} {r2:>14}")
    collect_t = rows[3][1]
    if collect_t is not None:
        print(f"\ncollect target < 0.5 s: {'met' if collect_t < 0.5 else 'NOT met'} ({collect_t:.3f} s)")

    if not args.no_big_log:
        big_log_rows(kvreport, py, work, args.big_mb)

    bad = import_check(py)
    print(f"kvreport --help imports of {', '.join(FORBIDDEN)}: {bad or 'none'}")
    print("slowest imports of `kvreport collect` (self+children, microseconds):")
    for us, name in slowest_imports(py, log, cmd, work / "c.json"):
        print(f"  {us:>9}  {name}")
    shutil.rmtree(work, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
