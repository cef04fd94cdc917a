"""AMD GPUs through ``rocm-smi --showproductname --showmeminfo vram --json`` (or ``amd-smi``).

rocm-smi's JSON is ``{"card0": {"VRAM Total Memory (B)": "21458059264", "VRAM Total Used Memory (B)":
"27856896", "Card Series": "Radeon RX 7900 XT", "GFX Version": "gfx1100", ...}, "system": {...}}``
(values are strings, memory in bytes). ``amd-smi metric --mem-usage --json`` (ROCm 6+, which
deprecates rocm-smi) is read tolerantly: any ``total_vram`` / ``used_vram`` / ``free_vram`` entries
(``{"value": N, "unit": "MB"}``) per ``gpu``; its "MB" are MiB (amdsmi.h: "In MB", 2^20 bytes).
"""

from __future__ import annotations

import json
import re

from kvreport.probes._util import Absent, Deadline, ProbeFailed, one_line, run_named, to_mib
from kvreport.units import GIB, MIB


def parse_rocm_smi(text: str) -> list[dict]:
    """Devices from rocm-smi ``--json`` output."""
    try:
        data = json.loads(text)
    except ValueError:
        raise ProbeFailed(f"rocm-smi did not print JSON: {one_line(text, 80)}") from None
    if not isinstance(data, dict):
        raise ProbeFailed("rocm-smi JSON is not an object")
    devices = []
    for key, card in data.items():
        m = re.fullmatch(r"card(\d+)", key)
        if not m or not isinstance(card, dict):
            continue
        total = _int(card.get("VRAM Total Memory (B)"))
        used = _int(card.get("VRAM Total Used Memory (B)"))
        name = card.get("Card Series") or card.get("Card series") or card.get("Card Model")
        devices.append({
            "backend": "rocm",
            "index": int(m.group(1)),
            "name": name,
            "gfx_version": card.get("GFX Version"),
            "total_mib": to_mib(total),
            "used_mib": to_mib(used),
            "free_mib": to_mib(total - used) if total is not None and used is not None else None,
            "source": "rocm-smi",
        })
    return devices


def _int(value) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def _mib_field(entry) -> float | None:
    if isinstance(entry, dict):
        value, unit = entry.get("value"), str(entry.get("unit", "MB")).upper()
        factor = {"B": 1, "KB": 1024, "MB": MIB, "GB": GIB}.get(unit, MIB)
        try:
            return to_mib(float(value), factor)
        except (TypeError, ValueError):
            return None
    try:
        return float(entry)
    except (TypeError, ValueError):
        return None


def parse_amd_smi(text: str) -> list[dict]:
    """Devices from ``amd-smi metric --mem-usage --json`` output (a list of per-GPU objects)."""
    try:
        data = json.loads(text)
    except ValueError:
        raise ProbeFailed(f"amd-smi did not print JSON: {one_line(text, 80)}") from None
    if isinstance(data, dict):
        data = data.get("gpu_data") or [data]
    devices = []
    for item in data if isinstance(data, list) else []:
        if not isinstance(item, dict):
            continue
        mem = item.get("mem_usage")
        if not isinstance(mem, dict):
            mem = item
        total = _mib_field(mem.get("total_vram"))
        used = _mib_field(mem.get("used_vram"))
        free = _mib_field(mem.get("free_vram"))
        if free is None and total is not None and used is not None:
            free = round(total - used, 2)
        devices.append({"backend": "rocm", "index": _int(item.get("gpu")), "name": None,
                        "total_mib": total, "used_mib": used, "free_mib": free, "source": "amd-smi"})
    return devices


def probe(timeout: float = 3.0) -> dict:
    """``{"devices": [...]}`` from rocm-smi, else amd-smi; :class:`Absent` when neither exists."""
    deadline = Deadline(timeout)
    try:
        out = run_named("rocm-smi", ["--showproductname", "--showmeminfo", "vram", "--json"], deadline.left())
        if out.returncode == 0:
            devices = parse_rocm_smi(out.stdout)
            if devices:
                return {"devices": devices}
        rocm_error = f"rocm-smi exit {out.returncode}: {one_line(out.stderr or out.stdout)}"
    except Absent:
        rocm_error = None
    try:
        out = run_named("amd-smi", ["metric", "--mem-usage", "--json"], deadline.left())
    except Absent:
        if rocm_error:
            raise ProbeFailed(rocm_error) from None
        raise
    if out.returncode != 0:
        raise ProbeFailed(f"amd-smi exit {out.returncode}: {one_line(out.stderr or out.stdout)}")
    devices = parse_amd_smi(out.stdout)
    if not devices:
        raise ProbeFailed("amd-smi listed no GPU")
    return {"devices": devices}
