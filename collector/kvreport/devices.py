"""The accelerators of a bundle, one entry each: those the probes measured (``bundle.devices``) and those
only the log names (:func:`kvreport.analyze.devices_in_log`).

A device the log names is the probed one when the log gives its product name and a probed device has that
name (``NVIDIA GeForce RTX 3060``), or when the log gives only its ggml name and a probed device has that
ggml name (``CUDA0``: backend and index); each probed device is matched once, so two identical GPUs stay
two. A matched entry keeps what the probes measured and gains the log's ggml name (``device``).
"""

from __future__ import annotations

from kvreport.vocab import BACKEND_DEVICE_PREFIX


def ggml_name(device: dict) -> str | None:
    """The llama.cpp-style name of a device entry (``CUDA0``, ``ROCm1``): its ``device`` when it has one, else
    from its backend and index; None when neither is known."""
    if device.get("device"):
        return str(device["device"])
    prefix = BACKEND_DEVICE_PREFIX.get(str(device.get("backend") or "").lower())
    index = device.get("index")
    return f"{prefix}{index}" if prefix and isinstance(index, int) and not isinstance(index, bool) else None


def _name(device: dict) -> str:
    return str(device.get("name") or "").strip().lower()


def all_devices(bundle: dict) -> list[dict]:
    """Probed devices first (copies, with the log's ggml name when the log names them), then the devices only the
    log names (``"source": "log"``). CPUs are not devices here."""
    from kvreport.analyze import devices_in_log

    probed = [dict(d) for d in (bundle.get("devices") or []) if isinstance(d, dict)]
    unmatched = list(probed)
    out = list(probed)
    for logged in devices_in_log(bundle):
        key = logged.get("device")
        named = _name(logged) != str(key or "").lower()  # the log gave a product name, not only CUDA0
        candidates = [p for p in unmatched if (_name(p) == _name(logged) if named else ggml_name(p) == key)]
        if not candidates:
            out.append(logged)
            continue
        match = next((p for p in candidates if ggml_name(p) == key), candidates[0])
        unmatched.remove(match)
        if key and not match.get("device"):
            match["device"] = key
    return out


def device_label(device: dict) -> str:
    """``CUDA0: NVIDIA GeForce RTX 3060``; the name alone when the ggml name is unknown or is the name."""
    name = str(device.get("name") or "").strip()
    ggml = ggml_name(device)
    if ggml and name and ggml.lower() != name.lower():
        return f"{ggml}: {name}"
    return name or ggml or "?"
