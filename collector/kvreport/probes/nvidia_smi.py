"""NVIDIA devices through ``nvidia-smi`` (the fallback when NVML cannot be loaded in-process).

Runs ``nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,
driver_version,compute_cap --format=csv,noheader,nounits``: one CSV row per GPU, memory in MiB
(nvidia-smi's "MiB" are 2^20 bytes). Older drivers do not know ``compute_cap`` and answer
``Field "compute_cap" is not a valid field to query.``; the query is then repeated without it.
Values may be ``[N/A]`` or ``[Not Supported]``.
"""

from __future__ import annotations

import csv

from kvreport.probes._util import Deadline, ProbeFailed, one_line, run_named

FIELDS = ["index", "name", "uuid", "pci.bus_id", "memory.total", "memory.used", "memory.free",
          "driver_version", "compute_cap"]


def _num(text: str) -> float | None:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        return None


def parse(text: str, fields: list[str] = FIELDS) -> list[dict]:
    """Devices from ``--format=csv,noheader,nounits`` output of the ``fields`` query."""
    try:
        rows = list(csv.reader(text.splitlines(), skipinitialspace=True))
    except csv.Error as exc:
        raise ProbeFailed(f"unreadable nvidia-smi output: {exc}") from None
    devices = []
    for row in rows:
        if not row or not row[0].strip():
            continue
        if len(row) != len(fields):
            raise ProbeFailed(f"unexpected nvidia-smi row: {one_line(','.join(row), 80)}")
        values = dict(zip(fields, (c.strip() for c in row), strict=True))
        if not values["index"].isdigit():
            raise ProbeFailed(f"unexpected nvidia-smi row: {one_line(','.join(row), 80)}")
        cc = values.get("compute_cap")
        devices.append({
            "backend": "cuda",
            "index": int(values["index"]),
            "name": values["name"],
            "uuid": values["uuid"] if values["uuid"].startswith("GPU-") else None,
            "pci_bus_id": values["pci.bus_id"] or None,
            "total_mib": _num(values["memory.total"]),
            "used_mib": _num(values["memory.used"]),
            "free_mib": _num(values["memory.free"]),
            "driver_version": values["driver_version"] if _num(values["driver_version"].split(".")[0]) else None,
            "compute_capability": cc if cc and _num(cc) is not None else None,
            "source": "nvidia-smi",
        })
    return devices


def probe(timeout: float = 3.0) -> dict:
    """``{"devices": [...]}``; :class:`Absent` without nvidia-smi, :class:`ProbeFailed` on errors."""
    fields = list(FIELDS)
    deadline = Deadline(timeout)
    out = run_named("nvidia-smi", [f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                    deadline.left())
    if out.returncode != 0 and "compute_cap" in (out.stdout + out.stderr):
        fields.remove("compute_cap")
        out = run_named("nvidia-smi", [f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                        deadline.left())
    if out.returncode != 0:
        raise ProbeFailed(f"nvidia-smi exit {out.returncode}: {one_line(out.stdout + out.stderr)}")
    devices = parse(out.stdout, fields)
    if not devices:
        raise ProbeFailed("nvidia-smi listed no GPU")
    return {"devices": devices}
