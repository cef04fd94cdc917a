"""Apple GPUs (macOS): ``system_profiler SPDisplaysDataType -json``, ``sysctl hw.memsize``,
``sysctl iogpu.wired_limit_mb``.

On Apple Silicon the GPU shares the machine's RAM: Metal lets one process keep at most its
``recommendedMaxWorkingSetSize`` resident (llama.cpp prints it as ``recommendedMaxWorkingSetSize``
at load); without calling Metal this probe records ``hw.memsize`` and the administrator's
override ``iogpu.wired_limit_mb`` (0 = the system default) so the analyzer can reason about it.
Only runs on macOS (``sys.platform == "darwin"``).
"""

from __future__ import annotations

import json
import sys

from kvreport.probes._util import Absent, Deadline, ProbeFailed, one_line, run_named, to_mib


def parse_displays(text: str) -> list[dict]:
    """GPU entries of ``system_profiler SPDisplaysDataType -json``."""
    try:
        data = json.loads(text)
    except ValueError:
        raise ProbeFailed(f"system_profiler did not print JSON: {one_line(text, 80)}") from None
    devices = []
    items = data.get("SPDisplaysDataType") if isinstance(data, dict) else None
    for i, item in enumerate(items if isinstance(items, list) else []):
        if not isinstance(item, dict):
            continue
        vram = item.get("spdisplays_vram") or item.get("spdisplays_vram_shared") or ""
        total = None
        parts = str(vram).split()
        if len(parts) == 2 and parts[0].replace(".", "", 1).isdigit():
            total = float(parts[0]) * (1024 if parts[1].upper().startswith("GB") else 1)
        devices.append({
            "backend": "metal",
            "index": i,
            "name": item.get("sppci_model") or item.get("_name"),
            "gpu_cores": _int(item.get("sppci_cores")),
            "metal_support": item.get("spdisplays_mtlgpufamilysupport") or item.get("spdisplays_metal"),
            "total_mib": total,
            "source": "system_profiler",
        })
    return devices


def _int(value) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def probe(timeout: float = 3.0, platform: str | None = None) -> dict:
    """``{"devices": [...], "host": {"unified_memory_mib", "iogpu_wired_limit_mib"}}`` on macOS."""
    if (platform or sys.platform) != "darwin":
        raise Absent("not macOS")
    deadline = Deadline(timeout)
    out = run_named("system_profiler", ["SPDisplaysDataType", "-json"], deadline.left())
    if out.returncode != 0:
        raise ProbeFailed(f"system_profiler exit {out.returncode}: {one_line(out.stderr)}")
    devices = parse_displays(out.stdout)
    extra: dict = {}
    try:
        mem = run_named("sysctl", ["-n", "hw.memsize"], deadline.left())
        memsize = _int(mem.stdout.strip())
        extra["unified_memory_mib"] = to_mib(memsize)
        wired = run_named("sysctl", ["-n", "iogpu.wired_limit_mb"], deadline.left())
        limit = _int(wired.stdout.strip()) if wired.returncode == 0 else None
        extra["iogpu_wired_limit_mib"] = limit if limit else None
    except (Absent, ProbeFailed):
        pass
    for d in devices:
        if d.get("total_mib") is None and extra.get("unified_memory_mib"):
            d["total_mib"] = extra["unified_memory_mib"]
            d["unified_memory"] = True
        if extra.get("iogpu_wired_limit_mib"):
            d["max_working_set_mib"] = float(extra["iogpu_wired_limit_mib"])
    return {"devices": devices, "host": extra}
