"""The memory picture: per device, what it had, what the engine placed there, and the request that failed.

A pure function of a bundle (its log, ``memory_before_launch``, probed ``devices``, ``host``) and its
diagnosis (``failure.failing_device`` / ``requested_mib`` / ``free_mib``), so the terminal (``kvreport
analyze``), the GitHub issue body and the server's bundle page draw the same numbers.

Units: every ``*_mib`` is MiB (2**20 bytes, what llama.cpp prints as "MiB" and ggml as "MB").

What the picture holds (:func:`memory_picture`)::

    {"unit": "MiB",
     "devices": [{
        "device": "CUDA0",                # ggml name; "CPU" is host RAM (CPU, CPU_Mapped, CUDA_Host ... buffers)
        "name": "NVIDIA GeForce RTX 4090" | None,
        "total_mib": float | None, "total_source": "log" | "before_launch" | "probe" | None,
        "free_mib": float | None,  "free_source": "log" | "before_launch" | "failure" | None,
            # free before the engine placed anything (the engine's own load-time report, or kvreport run's
            # measurement right before launch); never the collector's after-the-crash probe
        "in_use_mib": float | None,       # total - free: held by other programs / the driver before the load
        "segments": [{"kind": "weights" | "kv" | "state" | "compute" | "other", "label": str, "mib": float}],
        "placed_mib": float,              # sum of the segments
        "request": {"mib": float, "label": str} | None,   # the allocation that failed on this device
        "capacity_mib": float | None,     # total, else the free figure (the bar's right edge)
        "room_mib": float | None,         # free (else total) minus what was placed: what the request could get
        "short_mib": float | None,        # request - room when the request did not fit
        "over_mib": float | None,         # how far the stack (in use + placed + request) reaches past capacity
        "failing": bool,
        "weights_unsized": bool,          # weights went there after its free figure was read, size not printed:
                                          # the room left is not known (room_mib None)
        "scale_mib": float}],             # MiB a full-width bar stands for: one scale for all accelerators,
                                          # one for host RAM, so that bars of one group compare at a glance
     "notes": [str]}

Where the placed memory comes from: llama.cpp's ``<dev> <kind> buffer size = N MiB`` lines of the real
attempt (the auto-fit dry run is left out; when the log holds several loads, the last one: a ``model``
buffer line after KV / compute lines starts a new load), else Ollama's ``msg="model weights" / "kv cache" /
"compute graph" device=... size=...`` layout lines (the last layout).
"""

from __future__ import annotations

from kvreport.logs import LogFacts, parse_log
from kvreport.units import fmt_mib
from kvreport.vocab import BACKEND_DEVICE_PREFIX

UNIT = "MiB"
KINDS = ("in_use", "weights", "kv", "state", "compute", "other", "request", "free", "rest")
"""Drawing order of a bar, left to right."""
KIND_LABEL = {"in_use": "in use before load", "weights": "weights", "kv": "KV cache", "state": "recurrent state",
              "compute": "compute buffers", "other": "other buffers", "request": "failed request", "free": "free",
              "rest": "rest (not known if free)"}
SHORT_LABEL = {"in_use": "in use", "weights": "weights", "kv": "KV", "state": "state", "compute": "compute",
               "other": "other", "request": "failed", "free": "free", "rest": "rest"}
"""A word per kind, for a bar segment too narrow for the whole label."""
LETTER = {"in_use": "u", "weights": "W", "kv": "K", "state": "S", "compute": "C", "other": "o", "request": "X",
          "free": ".", "rest": "-"}
"""One letter per kind for the text bars (ASCII, so that any terminal and any issue tracker shows them)."""

_BUFFER_KIND = {"model": "weights", "KV": "kv", "RS": "state", "compute": "compute", "output": "other"}
_REQUEST_LABEL = {"kv_cache": "KV cache", "kv_capacity": "KV cache", "compute_buffer": "compute buffer",
                  "model_weights": "model weights", "context": "context buffers"}
_LAYOUT_KIND = {"model weights": "weights", "kv cache": "kv", "compute graph": "compute"}
_HOST = "CPU"
TEXT_WIDTH = 48
MAX_DEVICES = 16


def home_device(name: str | None) -> str | None:
    """The device whose memory a ggml buffer type uses: ``CUDA_Host`` / ``CPU_Mapped`` / ``CPU_REPACK`` /
    ``AMX`` -> "CPU" (host RAM), ``MTL0_Mapped`` / ``Metal_Mapped`` -> ``MTL0`` / ``Metal``, else the name."""
    if not name:
        return None
    n = str(name).strip()
    if n.upper().startswith("CPU") or n.endswith("_Host") or n.upper() == "AMX":
        return _HOST
    if n.endswith("_Mapped"):
        return n[: -len("_Mapped")] or n
    return n


def _attempts(entries: list[tuple[str, str, float]], first_kind: str) -> list[tuple[str, str, float]]:
    """The entries of the last load: a ``first_kind`` entry after any other kind starts a new load."""
    last: list[tuple[str, str, float]] = []
    for entry in entries:
        if entry[1] == first_kind and any(e[1] != first_kind for e in last):
            last = []
        last.append(entry)
    return last


def placed_memory(facts: LogFacts) -> dict[str, dict[str, float]]:
    """device -> {kind: MiB} the engine placed (see the module doc); zero-sized buffers are left out."""
    entries = [(home_device(b.get("device")), _BUFFER_KIND.get(b.get("kind"), "other"), float(b.get("mib") or 0.0))
               for b in facts.buffers if not b.get("dry_run")]
    if entries:
        entries = _attempts(entries, "weights")
    else:
        layout = [x for x in (facts.ollama or {}).get("layout") or [] if x.get("what") in _LAYOUT_KIND]
        entries = _attempts([(home_device(x.get("device")) or _HOST, _LAYOUT_KIND[x["what"]], float(x.get("mib") or 0.0))
                             for x in layout], "weights")
    out: dict[str, dict[str, float]] = {}
    for dev, kind, mib in entries:
        if dev and mib > 0:
            per = out.setdefault(dev, {})
            per[kind] = per.get(kind, 0.0) + mib
    return out


def _num(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if value >= 0 and value == value and value != float("inf") else None


def _probe_name(entry: dict) -> str | None:
    prefix = BACKEND_DEVICE_PREFIX.get(str(entry.get("backend") or "").lower())
    if not prefix or entry.get("index") is None:
        return None
    return f"{prefix}{entry.get('index')}"


def _capacity(dev: str, facts: LogFacts, bundle: dict) -> dict:
    """total / free / name of ``dev``: the log first, then ``memory_before_launch``, then (total and name only)
    the collector's probes."""
    info: dict = {"name": None, "total_mib": None, "total_source": None, "free_mib": None, "free_source": None}

    def fill(source: str, name=None, total=None, free=None, take_free: bool = True) -> None:
        if info["name"] is None and name:
            info["name"] = str(name).strip()[:120] or None
        if info["total_mib"] is None and _num(total) is not None:
            info["total_mib"], info["total_source"] = _num(total), source
        if take_free and info["free_mib"] is None and _num(free) is not None:
            info["free_mib"], info["free_source"] = _num(free), source

    logged = facts.devices.get(dev) or {}
    fill("log", logged.get("description"), logged.get("total_mib"), logged.get("free_mib"))
    if dev == _HOST and (facts.fit or {}).get("memory") == "host":
        fill("log", free=(facts.fit or {}).get("free_mib"))
    for entry in bundle.get("memory_before_launch") or []:
        if isinstance(entry, dict) and entry.get("device") == dev:
            fill("before_launch", entry.get("name"), entry.get("total_mib"), entry.get("free_mib"))
    for entry in bundle.get("devices") or []:
        if isinstance(entry, dict) and _probe_name(entry) == dev:
            fill("probe", entry.get("name"), entry.get("total_mib"), take_free=False)
    host = bundle.get("host") if isinstance(bundle.get("host"), dict) else {}
    if dev == _HOST:
        fill("probe", host.get("cpu_model"), host.get("ram_total_mib"), take_free=False)
    return info


def _device_order(name: str) -> tuple:
    """Accelerators by prefix and index (CUDA2 before CUDA10), host RAM last."""
    digits = name[len(name.rstrip("0123456789")):]
    return (name == _HOST, name[: len(name) - len(digits)], int(digits) if digits else -1, name)


def _device_names(facts: LogFacts, placed: dict, failing: str | None) -> list[str]:
    """The devices to draw: every accelerator the log names, every device with memory placed, the failing one."""
    names = set(placed)
    for key in facts.devices:
        home = home_device(key)
        if home and home != _HOST:
            names.add(home)
    if failing:
        names.add(failing)
    return sorted(names, key=_device_order)[:MAX_DEVICES]


def _finish(entry: dict) -> dict:
    """Derived figures of one device: in use before load, capacity, room, shortfall, overflow."""
    total, free = entry["total_mib"], entry["free_mib"]
    entry["in_use_mib"] = total - free if total is not None and free is not None and total >= free else None
    entry["capacity_mib"] = total if total is not None else free
    available = free if free is not None else total
    placed = entry["placed_mib"]
    req = (entry["request"] or {}).get("mib")
    entry["room_mib"] = max(0.0, available - placed) if available is not None and not entry.get("weights_unsized") \
        else None
    entry["short_mib"] = req - entry["room_mib"] if req is not None and entry["room_mib"] is not None \
        and req > entry["room_mib"] else None
    end = (entry["in_use_mib"] or 0.0) + placed + (req or 0.0)
    cap = entry["capacity_mib"]
    entry["over_mib"] = end - cap if cap is not None and end > cap else None
    return entry


def memory_picture(bundle: dict | None, diagnosis: dict | None, facts: LogFacts | None = None) -> dict:
    """The memory picture of ``bundle`` and its ``diagnosis`` (see the module doc). ``facts``: the bundle's
    log already parsed (``kvreport analyze`` of a raw log passes them with no bundle). Never raises on
    missing facts; an empty ``devices`` list when the log places nothing and no request failed."""
    bundle = bundle if isinstance(bundle, dict) else {}
    diagnosis = diagnosis if isinstance(diagnosis, dict) else {}
    if facts is None:
        log = bundle.get("log") if isinstance(bundle.get("log"), dict) else {}
        lines = log.get("lines") if isinstance(log.get("lines"), list) else []
        facts = parse_log(lines)
    failure = diagnosis.get("failure") if isinstance(diagnosis.get("failure"), dict) else {}
    phase = failure.get("phase") or "unknown"
    request = _num(failure.get("requested_mib")) if phase != "none" else None
    failing = home_device(failure.get("failing_device")) if request is not None else None
    if request is not None and not failing:
        failing = "?"
    placed = placed_memory(facts)
    devices = []
    for dev in _device_names(facts, placed, failing):
        info = _capacity(dev, facts, bundle)
        if dev == failing and info["free_mib"] is None and _num(failure.get("free_mib")) is not None:
            info["free_mib"], info["free_source"] = _num(failure.get("free_mib")), "failure"
        per = placed.get(dev, {})
        segments = [{"kind": k, "label": KIND_LABEL[k], "mib": round(per[k], 2)} for k in KINDS if k in per]
        entry = {"device": dev if dev != "?" else "failing device", **info,
                 "segments": segments, "placed_mib": round(sum(per.values()), 2),
                 "request": ({"mib": request, "label": _REQUEST_LABEL.get(phase, "allocation")}
                             if dev == failing else None),
                 "failing": dev == failing,
                 # the weights went to the failing device after its free memory was read, their size not printed
                 "weights_unsized": dev == failing and any(
                     isinstance(x, dict) and x.get("kind") == "free_before_load" for x in diagnosis.get("findings") or [])}
        devices.append(_finish(entry))
    for group in (True, False):
        members = [d for d in devices if (d["device"] == _HOST) == group]
        span = max((extent(d) for d in members), default=0.0)
        for d in members:
            d["scale_mib"] = round(span, 2)
    notes = []
    if failure.get("verdict") == "exceeds_alloc_limit":
        notes.append("the request hit an allocation or process limit, not only the device's free memory")
    if any(d["capacity_mib"] is None for d in devices):
        notes.append("the log and the bundle do not give the size of every device: those bars show only what "
                     "the engine placed there")
    return {"unit": UNIT, "devices": devices, "notes": notes}


# ----------------------------------------------------------------------------------------------- geometry


def bar_parts(entry: dict) -> list[dict]:
    """The pieces of one device's bar, left to right: ``{"kind", "label", "mib", "start", "end"}`` in MiB
    from the bar's left edge (in use before load, the placed buffers, the failed request, then what stayed
    free up to the capacity: ``free`` when the free memory is known, else ``rest``)."""
    parts = []
    at = 0.0

    def add(kind: str, label: str, mib: float | None) -> None:
        nonlocal at
        if mib and mib > 0:
            parts.append({"kind": kind, "label": label, "mib": mib, "start": at, "end": at + mib})
            at += mib

    add("in_use", KIND_LABEL["in_use"], entry.get("in_use_mib"))
    for seg in entry.get("segments") or []:
        add(seg["kind"], seg["label"], seg["mib"])
    req = entry.get("request") or {}
    add("request", f"failed request ({req.get('label')})" if req else "", req.get("mib"))
    cap = entry.get("capacity_mib")
    if cap is not None and cap > at:
        kind = "free" if entry.get("free_mib") is not None else "rest"
        add(kind, KIND_LABEL[kind], cap - at)
    return parts


def extent(entry: dict) -> float:
    """MiB the bar spans: the capacity, or further when the stack reaches past it."""
    parts = bar_parts(entry)
    end = parts[-1]["end"] if parts else 0.0
    return max(end, entry.get("capacity_mib") or 0.0)


def scale_of(entry: dict) -> float:
    """MiB a full-width bar of ``entry`` stands for."""
    return max(entry.get("scale_mib") or 0.0, extent(entry))


def scaled(entry: dict, width: float, min_width: float = 1.0) -> list[dict]:
    """:func:`bar_parts` with ``x`` / ``w`` in units of ``width`` (cells for text, pixels for SVG), ``width``
    standing for ``scale_mib`` (else the device's own extent); every piece gets at least ``min_width`` so that
    a small buffer stays visible (the bar can then run a little past ``width``)."""
    span = scale_of(entry)
    if span <= 0:
        return []
    out, x = [], 0.0
    for p in bar_parts(entry):
        w = max(min_width, p["end"] / span * width - x)
        out.append({**p, "x": x, "w": w})
        x += w
    return out


# ----------------------------------------------------------------------------------------------- text


def _cells(entry: dict, width: int) -> str:
    """``[uuWWKKKXXX...]!!!``-style bar: letters per kind, ``]`` at the capacity when known."""
    cap = entry.get("capacity_mib")
    span = scale_of(entry)
    cap_at = round(cap / span * width) if cap is not None and span > 0 else None
    text = ""
    for p in scaled(entry, width):
        end = round(p["x"] + p["w"])
        text += LETTER[p["kind"]] * max(1, end - len(text))
    if cap_at is None:
        return "[" + text
    cap_at = min(max(cap_at, 0), len(text))
    return "[" + text[:cap_at] + "]" + text[cap_at:]


def _had(entry: dict, unit: str = "") -> str:
    bits = []
    if entry.get("total_mib") is not None:
        bits.append(f"total {fmt_mib(entry['total_mib'])}{unit}")
    if entry.get("free_mib") is not None:
        when = " at load" if entry.get("free_source") in ("log", "before_launch") else ""
        bits.append(f"free {fmt_mib(entry['free_mib'])}{unit}{when}")
    return ", ".join(bits) if bits else "size not in the log"


def summary(entry: dict, unit: str = "") -> str:
    """One line of words and numbers for a device (also the bar's text equivalent); ``unit`` follows each
    figure (the text bars leave it out: their legend says MiB)."""
    placed = " + ".join(f"{s['label']} {fmt_mib(s['mib'])}{unit}" for s in entry.get("segments") or []) \
        or ("weights placed, size not in the log" if entry.get("weights_unsized") else "nothing placed")
    line = f"{_had(entry, unit)}; {placed}"
    req = entry.get("request")
    if req:
        line += f"; failed: {req['label']} {fmt_mib(req['mib'])}{unit}"
        if entry.get("short_mib") is not None:
            line += f", {fmt_mib(entry['short_mib'])} MiB more than was left"
        elif entry.get("room_mib") is not None:
            line += f", fit the {fmt_mib(entry['room_mib'])} MiB left yet failed"
    elif entry.get("over_mib"):
        line += f"; {fmt_mib(entry['over_mib'])} MiB past its size"
    return line


def legend(picture: dict) -> str:
    """The letters used by the picture's bars, with their meaning."""
    used = set()
    for entry in picture.get("devices") or []:
        used.update(p["kind"] for p in bar_parts(entry))
    return "  ".join(f"{LETTER[k]} {KIND_LABEL[k]}" for k in KINDS if k in used)


def text_bars(picture: dict, width: int = TEXT_WIDTH, indent: str = "") -> list[str]:
    """A few lines per picture: a legend, then per device its bar and its numbers (MiB). [] when empty."""
    devices = picture.get("devices") or []
    if not any(bar_parts(d) for d in devices):
        return []
    name_w = min(max(len(d["device"]) for d in devices), 24)
    sized = any(d.get("capacity_mib") is not None for d in devices)
    out = [f"{indent}MiB per device: {legend(picture)}" + ("  (] marks the device's size)" if sized else "")]
    for d in devices:
        head = f"{indent}{d['device'][:name_w]:<{name_w}} "
        if not bar_parts(d):
            out.append(head + "(nothing placed; size not in the log)")
            continue
        mark = " <- failed" if d.get("failing") else ""
        out.append(head + _cells(d, width) + mark)
        out.append(f"{indent}{'':<{name_w}} {summary(d)}")
    out += [f"{indent}({n})" for n in picture.get("notes") or []]
    return out
