"""The host: OS, kernel, CPU model and cores, RAM and swap (psutil), container and WSL detection.

RAM "free" is psutil's ``available`` (what a new allocation can get without swapping, MemAvailable
on Linux), in MiB. Container detection: ``/.dockerenv``, ``/run/.containerenv`` (podman), the
``container`` variable (systemd-nspawn, podman), and ``/proc/1/cgroup`` naming docker, kubepods,
containerd or lxc. WSL: a kernel release containing "microsoft" (``uname -r`` of WSL1/WSL2
kernels) or ``WSL_DISTRO_NAME``. Memory limits that cap what an engine started from here may
allocate: the cgroup's ``memory.max`` (v2) / ``memory.limit_in_bytes`` (v1) and the process's
RLIMIT_AS / RLIMIT_DATA (``ulimit -v`` / ``-d``), in MiB.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from pathlib import Path

from kvreport.probes._util import MIB


def _read(path: str, limit: int = 65536) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(limit)
    except OSError:
        return ""


def cpu_model() -> str | None:
    """The CPU's marketing name (``/proc/cpuinfo`` "model name", macOS sysctl, Windows registry name)."""
    if sys.platform.startswith("linux"):
        text = _read("/proc/cpuinfo", 1 << 20)
        for key in ("model name", "Model", "Hardware", "cpu model"):
            m = re.search(rf"^{key}\s*:\s*(.+)$", text, re.M)
            if m:
                return m.group(1).strip()
    if sys.platform == "darwin":
        try:
            from kvreport.probes._util import run_named

            out = run_named("sysctl", ["-n", "machdep.cpu.brand_string"], 1.0)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except Exception:  # noqa: BLE001
            pass
    return platform.processor() or None


def container() -> str | None:
    """The container runtime this process runs in ("docker", "podman", "kubernetes", "lxc"…), or None."""
    if os.path.exists("/.dockerenv"):
        return "docker"
    if os.path.exists("/run/.containerenv"):
        return "podman"
    env = os.environ.get("container")
    if env:
        return env
    cgroup = _read("/proc/1/cgroup")
    for word, name in (("kubepods", "kubernetes"), ("docker", "docker"), ("containerd", "containerd"),
                       ("lxc", "lxc"), ("libpod", "podman")):
        if word in cgroup:
            return name
    return None


def is_wsl(release: str | None = None) -> bool:
    """True under Windows Subsystem for Linux."""
    release = platform.release() if release is None else release
    return "microsoft" in release.lower() or bool(os.environ.get("WSL_DISTRO_NAME")) or \
        Path("/proc/sys/fs/binfmt_misc/WSLInterop").exists()


def rlimits_mib() -> dict[str, float]:
    """This process's own soft limits (``resource.getrlimit``) that cap allocations, in MiB:
    ``address_space_limit_mib`` (RLIMIT_AS, ``ulimit -v``) and ``data_limit_mib`` (RLIMIT_DATA,
    ``ulimit -d``). Unlimited limits (and platforms without ``resource``) are left out. A child
    (``kvreport run -- CMD``) inherits them."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return {}
    out: dict[str, float] = {}
    for key, name in (("address_space_limit_mib", "RLIMIT_AS"), ("data_limit_mib", "RLIMIT_DATA")):
        which = getattr(resource, name, None)
        if which is None:
            continue
        try:
            soft, _hard = resource.getrlimit(which)
        except (OSError, ValueError):
            continue
        if soft not in (resource.RLIM_INFINITY, -1) and soft >= 0:
            out[key] = round(soft / MIB, 2)
    return out


# cgroup v1 "no limit" is a huge page-aligned number (PAGE_COUNTER_MAX * page size, ~2**63)
_CGROUP_NO_LIMIT = 2**60


def cgroup_memory_limit_mib(root: str = "/sys/fs/cgroup", self_cgroup: str | None = None) -> float | None:
    """The memory limit of this process's cgroup in MiB (a container's ``--memory``, a systemd
    ``MemoryMax=``), or None when there is none. cgroup v2: ``memory.max`` (``max`` = none) of the
    process's own group (``/proc/self/cgroup`` "0::/path") or the root; v1:
    ``memory/memory.limit_in_bytes`` (a value near 2**63 = none)."""
    if self_cgroup is None:
        self_cgroup = _read("/proc/self/cgroup")
    candidates = []
    m = re.search(r"^0::(/\S*)$", self_cgroup, re.M)
    if m and m.group(1) not in ("", "/"):
        candidates.append(os.path.join(root, m.group(1).lstrip("/"), "memory.max"))
    candidates.append(os.path.join(root, "memory.max"))
    m1 = re.search(r"^\d+:[^:\n]*\bmemory\b[^:\n]*:(/\S*)$", self_cgroup, re.M)
    if m1 and m1.group(1) not in ("", "/"):
        candidates.append(os.path.join(root, "memory", m1.group(1).lstrip("/"), "memory.limit_in_bytes"))
    candidates.append(os.path.join(root, "memory", "memory.limit_in_bytes"))
    for path in candidates:
        text = _read(path, 100).strip()
        if not text:
            continue
        if text == "max":
            return None
        if text.isdigit():
            value = int(text)
            return None if value >= _CGROUP_NO_LIMIT else round(value / MIB, 2)
    return None


def probe(timeout: float = 3.0) -> dict:
    """``{"host": {os, os_release, kernel, machine, cpu_model, cpu_cores_physical, cpu_cores_logical,
    ram_total_mib, ram_free_mib, swap_total_mib, swap_free_mib, container, wsl, memory_limit_mib,
    address_space_limit_mib, data_limit_mib}}``; the three limits (MiB) only when set: the cgroup
    memory limit (:func:`cgroup_memory_limit_mib`) and this process's RLIMIT_AS / RLIMIT_DATA
    (:func:`rlimits_mib`)."""
    import psutil

    uname = platform.uname()
    vm = psutil.virtual_memory()
    try:
        sw = psutil.swap_memory()
        swap_total, swap_free = round(sw.total / MIB, 2), round(sw.free / MIB, 2)
    except Exception:  # noqa: BLE001 - some containers hide swap
        swap_total = swap_free = None
    os_release = None
    if sys.platform.startswith("linux"):
        m = re.search(r'^PRETTY_NAME="?([^"\n]+)"?', _read("/etc/os-release"), re.M)
        os_release = m.group(1) if m else None
    elif sys.platform == "darwin":
        os_release = f"macOS {platform.mac_ver()[0]}".strip()
    elif sys.platform == "win32":  # pragma: no cover
        os_release = f"Windows {platform.version()}"
    host = {
        "os": uname.system or sys.platform,
        "os_release": os_release,
        "kernel": uname.release or None,
        "machine": uname.machine or None,
        "cpu_model": cpu_model(),
        "cpu_cores_physical": psutil.cpu_count(logical=False),
        "cpu_cores_logical": psutil.cpu_count(logical=True),
        "ram_total_mib": round(vm.total / MIB, 2),
        "ram_free_mib": round(vm.available / MIB, 2),
        "swap_total_mib": swap_total,
        "swap_free_mib": swap_free,
        "container": container(),
        "wsl": is_wsl(uname.release),
    }
    try:
        limit = cgroup_memory_limit_mib() if sys.platform.startswith("linux") else None
    except Exception:  # noqa: BLE001 - a limit we cannot read is no limit we know of
        limit = None
    if limit is not None:
        host["memory_limit_mib"] = limit
    host.update(rlimits_mib())
    return {"host": host}
