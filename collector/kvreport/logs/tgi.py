"""Hugging Face text-generation-inference logs (kv-facts.md §5.4): warm-up failures and the
batch token budget."""

from __future__ import annotations

import re

from kvreport.logs.facts import LogFacts

KEYWORDS = ("text_generation", "Warmup", "max_batch_total_tokens", "max batch total tokens", "prefill tokens",
            "max_total_tokens", "warmup{")

# the launcher's Args block (one line: "Args { model_id: \"...\", max_input_tokens: Some(16000), max_total_tokens:
# Some(16384), ... }"; 1.x "max_input_length: 1024, max_total_tokens: 2048")
_ARGS = re.compile(r"\b(max_input_tokens|max_input_length|max_total_tokens|max_batch_prefill_tokens): (?:Some\()?(\d+)")
# the router's warm-up span on its error line (v3: "warmup{max_input_length=Some(16000) max_prefill_tokens=16384
# max_total_tokens=Some(16384) max_batch_size=None}")
_SPAN = re.compile(r"\b(max_input_length|max_total_tokens|max_prefill_tokens)=(?:Some\()?(\d+)")
_ARG_NAMES = {"max_input_length": "max_input_tokens", "max_prefill_tokens": "max_batch_prefill_tokens"}
_TOTAL = re.compile(r"(?:Setting|Inferred) max batch total tokens(?: to|:) (\d+)")
# TGI's warm-up (flash_causal_lm.py warmup) catching an OOM: "Not enough memory to handle N prefill tokens" (2023+)
# and the older "Not enough memory to handle T total tokens with N prefill tokens" (TGI#710)
_PREFILL = re.compile(r"Not enough memory to handle (?:(\d+) total tokens with )?(\d+) prefill tokens")


def feed(f: LogFacts, line: str, lineno: int) -> None:
    """Read one cleaned TGI line into ``f``. Never raises on text."""
    t = f.tgi
    if "text_generation" in line:
        f.engine_hints["tgi"] += 3
    if "Args {" in line or "warmup{" in line:
        for name, value in (_ARGS if "Args {" in line else _SPAN).findall(line):
            t.setdefault("args", {})[_ARG_NAMES.get(name, name)] = int(value)
    m = _TOTAL.search(line)
    if m:
        t["max_batch_total_tokens"] = int(m.group(1))
        f.engine_hints["tgi"] += 2
    m = _PREFILL.search(line)
    if m:
        t["prefill_tokens"] = int(m.group(2))
        if m.group(1):
            t["max_batch_total_tokens"] = int(m.group(1))
        f.engine_hints["tgi"] += 2  # TGI's own warm-up message (flash_causal_lm.py warmup) names the engine
        # the message names no backend or device (TGI runs on CUDA, ROCm, Gaudi, Inferentia...)
        f.add_event("engine", lineno, line, engine="tgi", phase="compute_buffer", backend=None)
        f.final_error = line
        f.add_error(line)
        return
    if "Warmup encountered an error" in line or "Method Warmup" in line and "error" in line.lower():
        t["warmup_failed"] = True
        f.add_event("engine", lineno, line, engine="tgi", phase="unknown", backend=None, weak=True)
        f.final_error = line
        f.add_error(line)
        return
    if "must be <= `max_batch_total_tokens`" in line or "must be <= max_batch_total_tokens" in line:
        if t.get("max_batch_total_tokens"):
            # the router sized the paged KV cache from what warm-up left ("Inferred max batch total tokens: 6336", 1.x;
            # "Setting max batch total tokens to N", 2.x) and it holds less than one request of --max-total-tokens:
            # the KV pool is too small (as vLLM's max seq len check), not a refused setting
            f.add_event("engine", lineno, line, engine="tgi", phase="kv_capacity", backend=None)
        else:  # both values as the user set them: the launcher's argument check
            f.add_event("config", lineno, line, what=line[-200:])
        f.final_error = line
        f.add_error(line)
