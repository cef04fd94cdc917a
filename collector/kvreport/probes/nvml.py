"""NVIDIA devices through NVML (the ``nvidia-ml-py`` package, module ``pynvml``).

Per device: name, UUID, PCI bus id, total/used/free MiB (``nvmlDeviceGetMemoryInfo``, bytes),
driver version, CUDA driver version (``nvmlSystemGetCudaDriverVersion``: 12040 -> "12.4"),
compute capability, and the compute processes with their MiB (process names only, never their
arguments). When the NVML library cannot be loaded the probe is "absent" and ``nvidia_smi`` is
tried instead.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from kvreport.probes._util import MIB, Absent, ProbeFailed

# What a loaded NVIDIA driver leaves on Linux: the control device and the /proc entry (both present in
# containers given GPUs), or WSL's GPU paravirtualisation device. None of them: NVML cannot load.
_LINUX_DRIVER_SIGNS = ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/dxg")


def _driver_absent() -> bool:
    """True on Linux when no NVIDIA driver is loaded, so that ``pynvml`` (ctypes) is not even imported."""
    return sys.platform.startswith("linux") and not any(os.path.exists(p) for p in _LINUX_DRIVER_SIGNS)


def _load():
    if _driver_absent():
        raise Absent("no NVIDIA driver loaded (no /dev/nvidiactl, /proc/driver/nvidia or /dev/dxg)")
    try:
        import pynvml
    except ImportError:
        raise Absent("nvidia-ml-py not installed") from None
    return pynvml


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _process_name(pid: int) -> str | None:
    try:
        import psutil

        return psutil.Process(pid).name()
    except Exception:  # noqa: BLE001 - another user's process, or gone
        return None


def probe(timeout: float = 3.0, nvml_module: Any = None) -> dict:
    """``{"devices": [...], "driver_version": str, "cuda_driver_version": str}`` from NVML.

    ``nvml_module`` replaces ``pynvml`` (tests). Raises :class:`Absent` when NVML cannot be
    loaded (no NVIDIA driver) and :class:`ProbeFailed` for other NVML errors.
    """
    nv = nvml_module or _load()
    try:
        nv.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError subclasses differ between versions
        name = type(exc).__name__
        text = str(exc)
        if "LibraryNotFound" in name or "Library Not Found" in text or "DriverNotLoaded" in name \
                or "Driver Not Loaded" in text or "not found" in text.lower():
            raise Absent(text or name) from None
        raise ProbeFailed(f"nvmlInit: {text or name}") from None
    try:
        driver = _safe(lambda: _text(nv.nvmlSystemGetDriverVersion()))
        cuda = _safe(nv.nvmlSystemGetCudaDriverVersion)
        cuda_text = f"{cuda // 1000}.{(cuda % 1000) // 10}" if isinstance(cuda, int) and cuda > 0 else None
        devices = []
        for index in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            mem = nv.nvmlDeviceGetMemoryInfo(handle)
            cc = _safe(lambda h=handle: nv.nvmlDeviceGetCudaComputeCapability(h))
            pci = _safe(lambda h=handle: nv.nvmlDeviceGetPciInfo(h))
            bus_id = _text(getattr(pci, "busId", "")) if pci is not None else None
            procs = []
            for p in _safe(lambda h=handle: nv.nvmlDeviceGetComputeRunningProcesses(h)) or []:
                used = getattr(p, "usedGpuMemory", None)
                procs.append({"name": _process_name(int(getattr(p, "pid", 0) or 0)),
                              "used_mib": round(used / MIB, 2) if isinstance(used, int) and used >= 0 else None})
            devices.append({
                "backend": "cuda",
                "index": index,
                "name": _text(nv.nvmlDeviceGetName(handle)),
                "uuid": _safe(lambda h=handle: _text(nv.nvmlDeviceGetUUID(h))),
                "pci_bus_id": bus_id or None,
                "total_mib": round(mem.total / MIB, 2),
                "used_mib": round(mem.used / MIB, 2),
                "free_mib": round(mem.free / MIB, 2),
                "driver_version": driver,
                "cuda_driver_version": cuda_text,
                "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
                "processes": procs,
                "source": "nvml",
            })
        return {"devices": devices, "driver_version": driver, "cuda_driver_version": cuda_text}
    except Exception as exc:  # noqa: BLE001
        raise ProbeFailed(f"NVML: {exc}") from None
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def _safe(fn):
    try:
        return fn()
    except Exception:  # noqa: BLE001 - a field the device or driver does not support
        return None
