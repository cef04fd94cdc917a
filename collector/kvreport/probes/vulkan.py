"""Vulkan devices through ``vulkaninfo`` (full text output; ``--summary`` lacks memory).

From each ``GPU<N>:`` section of "Device Properties and Extensions": ``deviceName``,
``deviceType`` (``PHYSICAL_DEVICE_TYPE_DISCRETE_GPU`` …, CPU devices such as llvmpipe are
skipped), ``driverName``/``driverInfo``, ``maxMemoryAllocationSize`` (``VkPhysicalDeviceMaintenance3Properties``
/ ``Vulkan11Properties``, printed in hex such as ``0x80000000``: the largest single allocation,
which caps llama.cpp's Vulkan buffers), and ``memoryHeaps[i]`` with ``size`` and, when the driver
has VK_EXT_memory_budget, ``budget``/``usage`` in bytes; heaps flagged
``MEMORY_HEAP_DEVICE_LOCAL_BIT`` are the device's memory.
"""

from __future__ import annotations

import re

from kvreport.probes._util import ProbeFailed, one_line, run_named, to_mib

_GPU = re.compile(r"^GPU(\d+):?\s*$")  # "GPU0:" (recent), "GPU0" (vulkaninfo before ~1.2.140)
_KV = re.compile(r"^\s*(\w+)\s*=\s*(.*?)\s*$")
_HEAP = re.compile(r"^\s*memoryHeaps\[(\d+)\]:\s*$")
_NUM = re.compile(r"^(0x[0-9a-fA-F]+|\d+)")


def _number(text: str) -> int | None:
    m = _NUM.match(text.strip())
    if not m:
        return None
    return int(m.group(1), 16) if m.group(1).startswith("0x") else int(m.group(1))


def parse(text: str) -> list[dict]:
    """Devices from full ``vulkaninfo`` text output (CPU implementations left out)."""
    sections: dict[int, list[str]] = {}
    current: int | None = None
    for line in text.splitlines():
        m = _GPU.match(line.strip())
        if m and not line.startswith((" ", "\t")):
            current = int(m.group(1))
            sections.setdefault(current, [])
            continue
        if current is not None:
            sections[current].append(line)
    devices = []
    for index, lines in sorted(sections.items()):
        info: dict[str, str] = {}
        heaps: list[dict] = []
        heap: dict | None = None
        for line in lines:
            hm = _HEAP.match(line)
            if hm:
                heap = {"index": int(hm.group(1)), "device_local": False}
                heaps.append(heap)
                continue
            if heap is not None:
                if "MEMORY_HEAP_DEVICE_LOCAL_BIT" in line:
                    heap["device_local"] = True
                    continue
                km = _KV.match(line)
                if km and km.group(1) in ("size", "budget", "usage"):
                    heap[km.group(1)] = _number(km.group(2))
                    continue
                if km or (line.strip() and not line.startswith(("\t", " "))):
                    heap = None
            km = _KV.match(line)
            if km and km.group(1) not in info:
                info[km.group(1)] = km.group(2)
        dtype = info.get("deviceType", "")
        if "CPU" in dtype:
            continue
        local = [h for h in heaps if h["device_local"] and h.get("size")]
        total = sum(h["size"] for h in local) if local else None
        budgets = [h for h in local if h.get("budget")]
        free = sum(h["budget"] - (h.get("usage") or 0) for h in budgets) if budgets else None
        max_alloc = _number(info.get("maxMemoryAllocationSize", "")) if "maxMemoryAllocationSize" in info else None
        devices.append({
            "backend": "vulkan",
            "index": index,
            "name": info.get("deviceName"),
            "device_type": dtype.replace("PHYSICAL_DEVICE_TYPE_", "").lower() or None,
            "driver_version": info.get("driverInfo") or info.get("driverVersion"),
            "driver_name": info.get("driverName"),
            "total_mib": to_mib(total),
            "free_mib": to_mib(free),
            "max_alloc_mib": to_mib(max_alloc),
            "heaps_mib": [to_mib(h.get("size")) for h in local],
            "source": "vulkaninfo",
        })
    return devices


def probe(timeout: float = 3.0) -> dict:
    """``{"devices": [...]}``; :class:`Absent` without vulkaninfo."""
    out = run_named("vulkaninfo", [], timeout)
    if out.returncode != 0 and "GPU0" not in out.stdout:
        raise ProbeFailed(f"vulkaninfo exit {out.returncode}: {one_line(out.stderr or out.stdout)}")
    devices = parse(out.stdout)
    if not devices and "GPU0" not in out.stdout:
        raise ProbeFailed(f"vulkaninfo listed no device: {one_line(out.stdout or out.stderr, 80)}")
    return {"devices": devices}
