"""SGLang logs (kv-facts.md §5.3): the token pool ("KV Cache is allocated"), the
``Not enough memory`` refusal, host KV pools (HiCache) and CUDA errors."""

from __future__ import annotations

import re

from kvreport.logs.facts import LogFacts

KEYWORDS = ("sglang", "SGLang", "profiled value", "mem_fraction_static", "mem-fraction-static", "KV Cache is allocated",
            "max_total_num_tokens", "Load weight end", "memory_pool", "TP0", "CUDA error", "Not enough memory",
            "memory capacity is unbalanced", "Prefill out of memory")
_UNBALANCED = re.compile(r"The memory capacity is unbalanced\.(?:.*?(?:min_per_gpu_memory|pre_model_load_memory)=([\d.]+),\s*"
                         r"local_gpu_memory=([\d.]+))?")

_ALLOC = re.compile(r"KV Cache is allocated\. #tokens:\s*(\d+),\s*(?:K size:\s*([\d.]+) GB,\s*V size:\s*([\d.]+) GB|KV size:\s*([\d.]+) GB)")
_SUMMARY = re.compile(r"max_total_num_tokens=(\d+).*?max_running_requests=(\d+).*?context_len=(\d+).*?available_gpu_mem=([\d.]+) GB")
_WEIGHT = re.compile(r"Load weight end\..*?avail mem=([\d.]+) GB,\s*mem usage=([\d.]+) GB")
_FRACTION = re.compile(r"mem_fraction_static=([\d.]+)")
_PROFILED = re.compile(r"max_total_tokens=(\d+) is larger than the profiled value (-?\d+)")


def feed(f: LogFacts, line: str, lineno: int) -> None:
    """Read one cleaned SGLang line into ``f``. Never raises on text."""
    s = f.sglang
    low = line.lower()
    if "sglang" in low or "[TP0]" in line or "TP0 EP0" in line:
        f.engine_hints["sglang"] += 2
    m = _ALLOC.search(line)
    if m:
        f.engine_hints["sglang"] += 3
        s["tokens"] = int(m.group(1))
        gb = [float(x) for x in (m.group(2), m.group(3), m.group(4)) if x]
        s["kv_mib"] = sum(gb) * 1024.0
        f.add_event("alloc_ok", lineno, line, what="kv")
        return
    m = _SUMMARY.search(line)
    if m:
        f.engine_hints["sglang"] += 3
        s.update(max_total_num_tokens=int(m.group(1)), max_running_requests=int(m.group(2)),
                 context_len=int(m.group(3)), available_gpu_mib=float(m.group(4)) * 1024.0)
    m = _WEIGHT.search(line)
    if m:
        f.engine_hints["sglang"] += 2
        s["avail_after_weights_mib"] = float(m.group(1)) * 1024.0
        s["weights_mib"] = float(m.group(2)) * 1024.0
    m = _FRACTION.search(line)
    if m:
        s["mem_fraction_static"] = float(m.group(1))
    if "memory_pool" in line or "mem_cache" in line:
        f.stage = "kv_pool"
        if "memory_pool_host" in line:
            s["host_pool"] = True
        f.engine_hints["sglang"] += 1
    m = _PROFILED.search(line) if "profiled value" in line else None
    if m:
        f.engine_hints["sglang"] += 2
        s["max_total_tokens"] = int(m.group(1))
        s["profiled_tokens"] = int(m.group(2))
        if int(m.group(2)) <= 0 and not any(e.get("profiled") for e in f.events):
            # the KV pool would hold no token at all: SGLang refuses with "Not enough memory" right after
            f.add_event("engine", lineno, line, engine="sglang", phase="kv_capacity", backend=None, profiled=True)
            f.final_error = f.final_error or line
            f.add_error(line)
        return
    if "Prefill out of memory" in line:
        # scheduler (2024): the token pool could not take a prefill batch it had admitted
        f.engine_hints["sglang"] += 3
        f.add_event("engine", lineno, line, engine="sglang", phase="kv_capacity", backend=None)
        f.final_error = line
        f.add_error(line)
        return
    if "memory capacity is unbalanced" in line:
        # model_runner.py init_torch_distributed (every release since 2024): with tp > 1, a GPU of the group has
        # less than 90 % of this rank's free memory before loading (ValueError, later RuntimeError)
        m = _UNBALANCED.search(line)
        f.engine_hints["sglang"] += 3
        f.add_event("engine", lineno, line, engine="sglang", phase="memory_budget", backend=None, unbalanced=True,
                    free_mib=float(m.group(1)) * 1024.0 if m and m.group(1) else None)
        f.final_error = line
        f.add_error(line)
        return
    if "Not enough memory. Please try to increase --mem-fraction-static" in line:
        f.engine_hints["sglang"] += 3
        f.add_event("engine", lineno, line, engine="sglang", phase="kv_capacity", backend=None)
        f.final_error = line
        f.add_error(line)
        return
    if ("RuntimeError" in line or "Error" in line) and ("CUDA error" in line or "CUDA out of memory" in line) \
            and f.stage == "kv_pool":
        f.add_event("engine", lineno, line, engine="sglang" if f.engine_hints["sglang"] else None, phase="kv_cache",
                    backend="cuda", host=bool(s.get("host_pool")))
        f.final_error = line
        f.add_error(line)
        return
    if "The server is fired up and ready" in line:
        f.add_event("success", lineno, line)
