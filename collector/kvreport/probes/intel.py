"""Intel GPUs through ``sycl-ls`` (device names per SYCL backend) and ``xpu-smi`` (memory).

``sycl-ls`` prints one line per device, e.g. ``[level_zero:gpu][level_zero:0] Intel(R) oneAPI
Unified Runtime over Level-Zero, Intel(R) Arc(TM) A770 Graphics 12.55.8 [1.3.29735]`` (recent) or
``[ext_oneapi_level_zero:gpu:0] Intel(R) Level-Zero, Intel(R) Arc(TM) A770 Graphics 1.3 [1.3.26241]``
(older); it reports no memory. ``xpu-smi discovery -j`` lists ``device_list`` entries whose
``memory_physical_size_byte`` is the device memory in bytes (``memory_free_size_byte`` the free
memory, where the version reports it; xpumanager's ``XPUM_DEVICE_PROPERTY_MEMORY_*`` properties).
"""

from __future__ import annotations

import json
import re

from kvreport.probes._util import Absent, Deadline, ProbeFailed, one_line, run_named, to_mib

_SYCL_NEW = re.compile(r"^\[(?P<backend>[\w]+):(?P<type>gpu|cpu|fpga|acc)\]\[(?P=backend):(?P<index>\d+)\]\s+(?P<rest>.+)$")
_SYCL_OLD = re.compile(r"^\[(?P<backend>[\w]+):(?P<type>gpu|cpu|fpga|acc):(?P<index>\d+)\]\s+(?P<rest>.+)$")


def parse_sycl_ls(text: str) -> list[dict]:
    """GPU devices (``[…:gpu]`` lines) of ``sycl-ls`` output, with backend and index."""
    devices = []
    for line in text.splitlines():
        line = line.strip()
        m = _SYCL_NEW.match(line) or _SYCL_OLD.match(line)
        if not m or m.group("type") != "gpu":
            continue
        rest = m.group("rest")
        # "<platform>, <device name> <driver version> [<runtime version>]"
        name = rest.split(", ", 1)[1] if ", " in rest else rest
        name = re.sub(r"\s+\[[^\]]*\]\s*$", "", name)
        name = re.sub(r"\s+[\d.]+$", "", name)
        devices.append({"backend": "sycl", "sycl_backend": m.group("backend").replace("ext_oneapi_", ""),
                        "index": int(m.group("index")), "name": name, "source": "sycl-ls"})
    return devices


def parse_xpu_smi(text: str) -> list[dict]:
    """Devices from ``xpu-smi discovery -j``."""
    try:
        data = json.loads(text)
    except ValueError:
        raise ProbeFailed(f"xpu-smi did not print JSON: {one_line(text, 80)}") from None
    devices = []
    if isinstance(data, dict):
        items = data.get("device_list") if "device_list" in data else [data]  # list, or `-d N -j` (one device)
    else:
        items = data
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict) or not (item.get("device_name") or item.get("device_id") is not None):
            continue
        size, free = (_bytes(item.get(k)) for k in ("memory_physical_size_byte", "memory_free_size_byte"))
        index = item.get("device_id")
        devices.append({"backend": "sycl", "index": index if isinstance(index, int) else None,
                        "name": item.get("device_name"), "total_mib": to_mib(size), "free_mib": to_mib(free),
                        "pci_bus_id": item.get("pci_bdf_address"), "source": "xpu-smi"})
    return devices


def _bytes(value) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def probe(timeout: float = 3.0) -> dict:
    """``{"devices": [...]}``; :class:`Absent` when neither sycl-ls nor xpu-smi is installed."""
    devices: list[dict] = []
    errors: list[str] = []
    found_any = False
    deadline = Deadline(timeout)
    for name, args, parser in (("xpu-smi", ["discovery", "-j"], parse_xpu_smi),
                               ("sycl-ls", [], parse_sycl_ls)):
        try:
            out = run_named(name, args, deadline.left())
        except Absent:
            continue
        found_any = True
        if out.returncode != 0:
            errors.append(f"{name} exit {out.returncode}: {one_line(out.stderr or out.stdout)}")
            continue
        try:
            parsed = parser(out.stdout)
        except ProbeFailed as exc:
            errors.append(str(exc))
            continue
        if name == "sycl-ls" and devices:
            # xpu-smi already gave memory: only add names xpu-smi did not list
            known = {d.get("name") for d in devices}
            parsed = [d for d in parsed if d.get("name") not in known]
        devices.extend(parsed)
    if not found_any:
        raise Absent("sycl-ls, xpu-smi")
    if not devices and errors:
        raise ProbeFailed("; ".join(errors))
    return {"devices": devices}
