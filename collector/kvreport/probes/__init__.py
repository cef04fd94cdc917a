"""Device, host and engine probes, one module per source, run concurrently with a deadline each.

:func:`run_all` never raises: every probe records ``"ok"``, ``"absent"`` (the tool or library is
not on this machine) or ``"failed: <reason>"`` (it exists but timed out, crashed or printed
something unusable) in ``probes``, and the rest of the result stays intact.

Modules: ``host`` (psutil), ``nvml`` (nvidia-ml-py; ``nvidia_smi`` only when NVML is unusable),
``amd`` (rocm-smi / amd-smi), ``intel`` (xpu-smi / sycl-ls), ``vulkan`` (vulkaninfo), ``apple``
(system_profiler, sysctl), ``llamacpp`` (``--version``, ``--list-devices`` of the engine binary),
``ollama`` (CLI and local HTTP API), ``pyengines`` (vLLM, SGLang, torch versions from package
metadata). External tools run with ``shell=False``, stdin closed, a timeout that kills their
process group, and only from the PATH without ``.`` (see ``_util.which``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from kvreport.probes._util import Absent, ProbeFailed

DEFAULT_TIMEOUT = 3.0
LLAMA_PROGRAM_HINTS = ("llama", "server", "main", "ik_llama")


def _nvidia(timeout: float) -> tuple[dict, dict[str, str]]:
    from kvreport.probes import nvidia_smi, nvml

    statuses: dict[str, str] = {}
    try:
        result = nvml.probe(timeout)
        statuses["nvml"] = "ok"
        return result, statuses
    except Absent:
        statuses["nvml"] = "absent"
    except ProbeFailed as exc:
        statuses["nvml"] = f"failed: {exc}"
    except Exception as exc:  # noqa: BLE001
        statuses["nvml"] = f"failed: {type(exc).__name__}: {exc}"
    try:
        result = nvidia_smi.probe(timeout)
        statuses["nvidia_smi"] = "ok"
        return result, statuses
    except Absent:
        statuses["nvidia_smi"] = "absent"
    except ProbeFailed as exc:
        statuses["nvidia_smi"] = f"failed: {exc}"
    except Exception as exc:  # noqa: BLE001
        statuses["nvidia_smi"] = f"failed: {type(exc).__name__}: {exc}"
    return {}, statuses


def _simple(module_name: str, **kwargs) -> Callable[[float], tuple[dict, dict[str, str]]]:
    def run(timeout: float) -> tuple[dict, dict[str, str]]:
        import importlib

        mod = importlib.import_module(f"kvreport.probes.{module_name}")
        try:
            return mod.probe(timeout, **kwargs), {module_name: "ok"}
        except Absent:
            return {}, {module_name: "absent"}
        except ProbeFailed as exc:
            return {}, {module_name: f"failed: {exc}"}
        except Exception as exc:  # noqa: BLE001 - a probe must never break the bundle
            return {}, {module_name: f"failed: {type(exc).__name__}: {exc}"[:200]}

    return run


def is_llama_program(program: str | None) -> bool:
    """True for llama.cpp program names (llama-server, llama-cli, main, server…)."""
    if not program:
        return False
    base = os.path.basename(program.replace("\\", "/")).lower().removesuffix(".exe")
    return base.startswith(("llama-", "llama_", "ik_llama")) or base in ("llama", "main", "server", "rpc-server")


def run_all(timeout: float = DEFAULT_TIMEOUT, engine_program: str | None = None,
            engine_binary: str | None = None, engine: str | None = None,
            env: dict[str, str] | None = None, python: str | None = None) -> dict:
    """Run every probe concurrently; each gets ``timeout`` seconds (and is abandoned after it).

    ``engine_program`` is the engine binary's name from the command line (``llama-server``):
    the llama.cpp probe runs only for a llama.cpp program found on the PATH, or for
    ``engine_binary`` (an absolute path that ``kvreport run`` is about to execute anyway).
    ``engine`` ("llama.cpp", "ollama", "vllm"…) limits the engine probes to that engine.
    ``python``: the engine's own interpreter (vLLM / SGLang in their own environment), asked for
    its package versions instead of kvreport's.

    Returns ``{"host": dict, "devices": [dict], "engine": dict, "ollama": dict | None,
    "python_engines": dict | None, "probes": {name: "ok" | "absent" | "failed: <reason>"},
    "seconds": float}``.
    """
    start = time.monotonic()
    tasks: dict[str, Callable[[float], tuple[dict, dict[str, str]]]] = {
        "host": _simple("host"),
        "nvidia": _nvidia,
        "amd": _simple("amd"),
        "intel": _simple("intel"),
        "vulkan": _simple("vulkan"),
        "apple": _simple("apple"),
        "pyengines": _simple("pyengines", interpreter=python),
    }
    statuses: dict[str, str] = {}
    if engine_binary or (is_llama_program(engine_program) and engine in (None, "llama.cpp")):
        tasks["llamacpp"] = _simple("llamacpp", program=engine_program, binary=engine_binary)
    else:
        statuses["llamacpp"] = "absent"
    if engine in (None, "ollama"):
        tasks["ollama"] = _simple("ollama", env=env)
    else:
        statuses["ollama"] = "absent"

    results: dict[str, tuple[dict, dict[str, str]]] = {}
    threads = []
    for name, fn in tasks.items():
        def target(name=name, fn=fn):
            results[name] = fn(timeout)

        t = threading.Thread(target=target, name=f"kvreport-probe-{name}", daemon=True)
        t.start()
        threads.append((name, t))
    deadline = start + timeout + 0.25
    for _name, t in threads:
        t.join(max(0.0, deadline - time.monotonic()))

    out: dict = {"host": {}, "devices": [], "engine": {}, "ollama": None, "python_engines": None}
    for name, _t in threads:
        if name not in results:
            if name == "nvidia":
                statuses["nvml"] = f"failed: timed out after {timeout:g} s"
            else:
                statuses[name] = f"failed: timed out after {timeout:g} s"
            continue
        data, st = results[name]
        statuses.update(st)
        if "host" in data and name == "host":
            out["host"].update(data["host"])
        elif "host" in data:
            out["host"].update({k: v for k, v in data["host"].items() if v is not None})
        out["devices"].extend(data.get("devices") or [])
        if "engine" in data:
            out["engine"] = data["engine"]
        if "ollama" in data:
            out["ollama"] = data["ollama"]
        if "python_engines" in data:
            out["python_engines"] = data["python_engines"]
    out["probes"] = dict(sorted(statuses.items()))
    out["seconds"] = round(time.monotonic() - start, 3)
    return out
