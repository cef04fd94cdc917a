"""Benchmark: start-up of the `kvreport` commands users wait on, next to `python -c pass` of the same run.

Rows (each a fresh process, run round-robin so that load on the machine hits every row alike):

* ``python -c pass`` — the baseline every ratio is against;
* ``kvreport --help`` — target <= 2x the baseline;
* ``kvreport --version``;
* ``kvreport collect --log <case log> --command "<its command>" -o <tmp> --yes`` with no GPU tools
  on the PATH — target <= 0.36 s wall.

For each row: the median wall time, the median CPU time (user + system of the child), the ratio
of the wall median to the baseline's, and the load average (``os.getloadavg``) when the row's runs
began and ended. ``--ref REV`` also measures the collector of git revision REV (exported with
``git archive`` into ``bench/out/``) in the same run, so the figures before and after a change sit
side by side. Byte-code is written (``PYTHONDONTWRITEBYTECODE`` is dropped) and every row runs once
untimed first, as an installed package would start.

Last, ``python -X importtime`` of ``collect``: its slowest imports and whether ``--help`` imports
any of the heavy modules (requests, numpy, psutil, pynvml, marshmallow, gguf, flask, sqlalchemy, re2,
kvreport_server).

    .venv/bin/python bench/bench_startup.py [--repeat 15] [--ref HEAD~5]
"""

from __future__ import annotations

import argparse
import os
import resource
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
GPU_TOOLS = ("nvidia-smi", "rocm-smi", "amd-smi", "xpu-smi", "sycl-ls", "vulkaninfo", "system_profiler")
HEAVY = ("requests", "numpy", "psutil", "pynvml", "marshmallow", "gguf", "flask", "sqlalchemy", "re2",
         "kvreport_server")


def launcher(pyproject_text: str) -> str:
    """``python -c`` code that starts kvreport as its console script does (pyproject's [project.scripts])."""
    import tomllib

    module, func = tomllib.loads(pyproject_text)["project"]["scripts"]["kvreport"].split(":")
    return f"import sys; sys.argv[0] = 'kvreport'; from {module} import {func}; sys.exit({func}())"


def no_gpu_path() -> str:
    """The PATH without the directories that hold a GPU tool."""
    keep = []
    for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
        if d and not any(os.path.exists(os.path.join(d, t)) for t in GPU_TOOLS):
            keep.append(d)
    return os.pathsep.join(keep)


def child_env(collector: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "KVREPORT_DEBUG")}
    env["PYTHONPATH"] = str(collector)
    env["PATH"] = no_gpu_path()
    return env


def run_once(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall, cpu) seconds of one fresh process; raises on a non-zero exit."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    p = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:5])}… exited {p.returncode}: "
                           f"{p.stderr.decode(errors='replace').strip()[-300:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def export_ref(ref: str) -> tuple[Path, str]:
    """The collector of git revision ``ref``, exported once into bench/out/ref-<sha>/, and its launcher."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", ref], check=True,
                         capture_output=True, text=True).stdout.strip()
    dest = OUT / f"ref-{sha}"
    if not (dest / "collector" / "kvreport" / "cli.py").is_file():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", sha, "collector"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    pyproject = subprocess.run(["git", "-C", str(ROOT), "show", f"{sha}:pyproject.toml"], check=True,
                               capture_output=True, text=True).stdout
    return dest / "collector", launcher(pyproject)


def rows_for(label: str, py: str, collector: Path, launch: str, work: Path) -> list[tuple[str, list[str], dict]]:
    env = child_env(collector)
    log = CASE / "log.txt"
    cmd = (CASE / "command.txt").read_text().strip()
    kv = [py, "-c", launch]
    out = str(work / f"{label}.json")
    return [
        (f"kvreport --help [{label}]", [*kv, "--help"], env),
        (f"kvreport --version [{label}]", [*kv, "--version"], env),
        (f"kvreport collect --log --command [{label}]",
         [*kv, "collect", "--log", str(log), "--command", cmd, "-o", out, "--yes"], env),
    ]


def measure(rows: list[tuple[str, list[str], dict]], repeat: int, work: Path) -> dict[str, dict]:
    for _name, argv, env in rows:  # untimed: byte-code written, caches warm
        run_once(argv, env, work)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name, _a, _e in rows}
    loads: dict[str, list[float]] = {name: [] for name, _a, _e in rows}
    for _ in range(repeat):
        for name, argv, env in rows:
            loads[name].append(os.getloadavg()[0])
            samples[name].append(run_once(argv, env, work))
    return {name: {"wall": statistics.median(w for w, _c in s), "cpu": statistics.median(c for _w, c in s),
                   "load_min": min(loads[name]), "load_max": max(loads[name])}
            for name, s in samples.items()}


def importtime(py: str, collector: Path, launch: str, argv: list[str], work: Path) -> list[tuple[int, str]]:
    env = child_env(collector)
    p = subprocess.run([py, "-X", "importtime", "-c", launch, *argv], cwd=work, env=env, capture_output=True,
                       text=True, stdin=subprocess.DEVNULL)
    from bench_collect import importtime_rows  # one parser of -X importtime for the benches

    return importtime_rows(p.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--ref", help="also measure the collector of this git revision (before/after in one run)")
    args = ap.parse_args()
    py = sys.executable
    work = Path(tempfile.mkdtemp(prefix="kvreport-startup-"))
    here = ROOT / "collector"
    base_env = child_env(here)
    rows = [("python -c pass", [py, "-c", "pass"], base_env)]
    launch = launcher((ROOT / "pyproject.toml").read_text())
    rows += rows_for("now", py, here, launch, work)
    if args.ref:
        rows += rows_for(args.ref, py, *export_ref(args.ref), work)
    load0 = os.getloadavg()
    res = measure(rows, args.repeat, work)
    base = res["python -c pass"]["wall"]
    print(f"median of {args.repeat} fresh processes per row, rows interleaved ({os.cpu_count()} CPUs, "
          f"Python {sys.version.split()[0]}); load average at start {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}\n")
    print(f"{'command':48} {'wall s':>7} {'cpu s':>7} {'x pass':>7}  {'load (1 min) during':>19}")
    for name, _a, _e in rows:
        r = res[name]
        print(f"{name:48} {r['wall']:7.3f} {r['cpu']:7.3f} {r['wall'] / base:7.2f}  "
              f"{r['load_min']:8.2f}..{r['load_max']:<8.2f}")
    now_help = res["kvreport --help [now]"]["wall"] / base
    now_collect = res["kvreport collect --log --command [now]"]["wall"]
    print(f"\ntargets: --help <= 2x python -c pass: {'met' if now_help <= 2 else 'NOT met'} ({now_help:.2f}x); "
          f"collect --log --command <= 0.36 s: {'met' if now_collect <= 0.36 else 'NOT met'} ({now_collect:.3f} s)")

    helped = {m for _us, m in importtime(py, here, launch, ["--help"], work)}
    bad = sorted(m for m in helped if m.split(".")[0] in HEAVY)
    print(f"kvreport --help imports of heavy modules: {', '.join(bad) if bad else 'none'}")
    log = CASE / "log.txt"
    cmd = (CASE / "command.txt").read_text().strip()
    imp = importtime(py, here, launch, ["collect", "--log", str(log), "--command", cmd, "-o", str(work / "i.json"), "--yes"],
                     work)
    heavy = sorted({m for _us, m in imp if m.split(".")[0] in HEAVY and "." not in m})
    print(f"collect imports of heavy modules: {', '.join(heavy) if heavy else 'none'}")
    print("slowest imports of `kvreport collect` (cumulative microseconds under -X importtime):")
    for us, name in sorted(imp, reverse=True)[:10]:
        print(f"  {us:>9}  {name}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
