"""SGLang logs (kv-facts.md §5.3): the token pool ("KV Cache is allocated"), the ``Not enough memory`` refusal, the
TP memory-balance check, host KV pools (HiCache) and CUDA errors.

A table of rules (:data:`RULES`): each names the literal keywords that select its lines, its pattern and the
handler that turns a match into facts or an event. :data:`KEYWORDS` (the prefilter's share of this parser) is
derived from the table, so a rule can never be missed by the prefilter. Every rule whose keywords and pattern
match a line runs, in table order, until one returns True ("the line is read").
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from kvreport.logs.common import py_args
from kvreport.logs.facts import LogFacts


@dataclass(frozen=True)
class Rule:
    """One SGLang line format: ``keywords`` (any one selects the line), ``pattern``, and ``handle(f, m, line,
    lineno) -> bool`` (True: stop reading this line)."""

    name: str
    keywords: tuple[str, ...]
    pattern: re.Pattern
    handle: Callable[[LogFacts, re.Match, str, int], bool]


def _fail(f: LogFacts, line: str, lineno: int, phase: str, **data) -> bool:
    f.add_event("engine", lineno, line, engine="sglang", phase=phase, backend=None, **data)
    f.final_error = line
    f.add_error(line)
    return True


def _hint(f: LogFacts, m: re.Match, line: str, lineno: int) -> bool:
    f.engine_hints["sglang"] += 2
    if "sglang/srt" in line or "sglang.srt" in line:
        f.engine_hints["sglang"] += 3  # SGLang's own source tree in a traceback (it imports vLLM's layers too)
    return False


def _rank_prefix(f: LogFacts, m: re.Match, line: str, lineno: int) -> bool:
    # counted once: the prefix is a format, not a message, and LMDeploy's 2026 stats lines use the same one
    # ("[2026-03-18 21:46:41 DP0] Avg thr (in/out): ..."), so a thousand of them must not outvote one "[TM]" line
    if "sglang" not in f.engine_lines:
        f.engine_hints["sglang"] += 2
    return False


def _alloc(f: LogFacts, m: re.Match, line: str, lineno: int) -> bool:
    f.engine_hints["sglang"] += 3
    f.sglang["tokens"] = int(m.group(1))
    f.sglang["kv_mib"] = sum(float(x) for x in (m.group(2), m.group(3), m.group(4)) if x) * 1024.0
    f.add_event("alloc_ok", lineno, line, what="kv")
    return True


def _summary(f: LogFacts, m: re.Match, line: str, lineno: int) -> bool:
    f.engine_hints["sglang"] += 3
    f.sglang.update(max_total_num_tokens=int(m.group(1)), max_running_requests=int(m.group(2)),
                    context_len=int(m.group(3)), available_gpu_mib=float(m.group(4)) * 1024.0)
    return False


def _weight(f: LogFacts, m: re.Match, line: str, lineno: int) -> bool:
    f.engine_hints["sglang"] += 2
    f.sglang["avail_after_weights_mib"] = float(m.group(1)) * 1024.0
    f.sglang["weights_mib"] = float(m.group(2)) * 1024.0
    return False


def _weight_begin(f: LogFacts, m: re.Match, line: str, lineno: int) -> bool:
    # model_runner.py load_model: "Load weight begin. avail mem=23.20 GB" -- the memory the static fraction is taken of
    # (total_gpu_memory in profile_max_num_token)
    f.engine_hints["sglang"] += 2
    f.sglang["avail_before_weights_mib"] = float(m.group(1)) * 1024.0
    return False


def _server_args(f: LogFacts, m: re.Match, line: str, lineno: int) -> bool:
    f.sglang.setdefault("args", {}).update(py_args(line))
    f.engine_hints["sglang"] += 2
    return False


def _fraction(f: LogFacts, m: re.Match, line: str, lineno: int) -> bool:
    f.sglang["mem_fraction_static"] = float(m.group(1))
    return False


def _pool_stage(f: LogFacts, m: re.Match, line: str, lineno: int) -> bool:
    f.stage = "kv_pool"
    if "memory_pool_host" in line:
        f.sglang["host_pool"] = True
    f.engine_hints["sglang"] += 1
    return False


def _profiled(f: LogFacts, m: re.Match, line: str, lineno: int) -> bool:
    f.engine_hints["sglang"] += 2
    f.sglang["max_total_tokens"] = int(m.group(1))
    f.sglang["profiled_tokens"] = int(m.group(2))
    if int(m.group(2)) <= 0 and not any(e.get("profiled") for e in f.events):
        # the KV pool would hold no token at all: SGLang refuses with "Not enough memory" right after
        f.add_event("engine", lineno, line, engine="sglang", phase="kv_capacity", backend=None, profiled=True)
        f.final_error = f.final_error or line
        f.add_error(line)
    return True


def _prefill_oom(f: LogFacts, m: re.Match, line: str, lineno: int) -> bool:
    # schedule_batch alloc_token_slots (2024+): "Prefill out of memory" / "Decode out of memory. Try to lower your
    # batch size." raised when the token pool could not take a batch it had admitted
    f.engine_hints["sglang"] += 3
    return _fail(f, line, lineno, "kv_capacity")


def _retracted(f: LogFacts, m: re.Match, line: str, lineno: int) -> bool:
    # scheduler update_running_batch (2024+): "Decode out of memory happened. #retracted_reqs: N, ..." is a
    # warning: the scheduler put requests back in the queue and carried on (not a failure)
    f.engine_hints["sglang"] += 2
    f.add_event("recovered", lineno, line, what="sglang retracted requests for want of KV tokens")
    return True


def _unbalanced(f: LogFacts, m: re.Match, line: str, lineno: int) -> bool:
    # model_runner.py init_torch_distributed (every release since 2024): with tp > 1, a GPU of the group has less
    # than 90 % of this rank's free memory before loading (ValueError, later RuntimeError)
    f.engine_hints["sglang"] += 3
    return _fail(f, line, lineno, "memory_budget", unbalanced=True,
                 free_mib=float(m.group(1)) * 1024.0 if m.group(1) else None)


def _not_enough(f: LogFacts, m: re.Match, line: str, lineno: int) -> bool:
    # model_runner.py init_memory_pool: max_total_num_tokens <= 0 ("... Current value: mem_fraction_static=X" since
    # 2026)
    f.engine_hints["sglang"] += 3
    return _fail(f, line, lineno, "kv_capacity")


def _pool_cuda_error(f: LogFacts, m: re.Match, line: str, lineno: int) -> bool:
    if f.stage != "kv_pool" or not ("RuntimeError" in line or "Error" in line):
        return False
    f.add_event("engine", lineno, line, engine="sglang" if f.engine_hints["sglang"] else None, phase="kv_cache",
                backend="cuda", host=bool(f.sglang.get("host_pool")))
    f.final_error = line
    f.add_error(line)
    return True


def _input_too_long(f: LogFacts, m: re.Match, line: str, lineno: int) -> bool:
    # scheduler validate_input_length (2024+): "Input length (N tokens) exceeds the maximum allowed length (M tokens)"
    # where M = max_req_input_len = min(context_len - 1, max_total_num_tokens - 1) (scheduler.py): the request is
    # longer than the KV pool or the model's context, refused either way (kv_capacity, as every engine's refusal of a
    # request longer than its context)
    f.engine_hints["sglang"] += 3
    return _fail(f, line, lineno, "kv_capacity", request_tokens=int(m.group(1)), limit_tokens=int(m.group(2)))


def _pool_too_small(f: LogFacts, m: re.Match, line: str, lineno: int) -> bool:
    f.engine_hints["sglang"] += 3
    d = m.groupdict()
    data = {}
    if d.get("floor"):
        data = {"requested_mib": int(d["floor"]) / 1048576.0, "free_mib": int(d["budget"]) / 1048576.0}
    elif d.get("avail"):
        data = {"free_mib": float(d["avail"]) * 1024.0}
    return _fail(f, line, lineno, "kv_capacity", **data)


def _mm_too_long(f: LogFacts, m: re.Match, line: str, lineno: int) -> bool:
    f.engine_hints["sglang"] += 3
    return _fail(f, line, lineno, "kv_capacity", request_tokens=int(m.group(1)), limit_tokens=int(m.group(2)))


def _ready(f: LogFacts, m: re.Match, line: str, lineno: int) -> bool:
    f.add_event("success", lineno, line)
    return True


RULES: tuple[Rule, ...] = (
    Rule("engine words", ("sglang", "SGLang", "[TP0]", "TP0 EP0"), re.compile(r"(?i)sglang|\[TP0\]|TP0 EP0"), _hint),
    # utils configure_logger: format f"[%(asctime)s{prefix}] %(message)s" with a rank prefix (" TP1", " DP0 TP3", ...)
    Rule("logger rank prefix", (" TP", " DP", " PP"),
         re.compile(r"(?:^|\s)\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: (?:DP|PP|TP|EP|CP)\d+)+\]"), _rank_prefix),
    Rule("KV pool allocated", ("KV Cache is allocated",),
         re.compile(r"KV Cache is allocated\. #tokens:\s*(\d+),\s*(?:K size:\s*([\d.]+) GB,\s*V size:\s*([\d.]+) GB|"
                    r"KV size:\s*([\d.]+) GB)"), _alloc),
    Rule("server summary", ("max_total_num_tokens=",),
         re.compile(r"max_total_num_tokens=(\d+).*?max_running_requests=(\d+).*?context_len=(\d+).*?"
                    r"available_gpu_mem=([\d.]+) GB"), _summary),
    Rule("weights begin", ("Load weight begin",), re.compile(r"Load weight begin\. avail mem=([\d.]+) GB"), _weight_begin),
    Rule("weights loaded", ("Load weight end",),
         re.compile(r"Load weight end\..*?avail mem=([\d.]+) GB,\s*mem usage=([\d.]+) GB"), _weight),
    # server_args=ServerArgs(model_path=..., mem_fraction_static=0.88, tp_size=1, context_length=None, ...): the
    # settings in effect, when no command line is given
    Rule("server args", ("ServerArgs(",), re.compile(r"ServerArgs\("), _server_args),
    Rule("mem_fraction_static", ("mem_fraction_static=",), re.compile(r"mem_fraction_static=([\d.]+)"), _fraction),
    Rule("KV pool stage", ("memory_pool", "mem_cache"), re.compile(r"memory_pool|mem_cache"), _pool_stage),
    Rule("profiled pool", ("profiled value",),
         re.compile(r"max_total_tokens=(\d+) is larger than the profiled value (-?\d+)"), _profiled),
    Rule("decode out of memory (retracted, carried on)", ("out of memory happened",),
         # (0.1.x tp_worker.py: "[gpu_id=0] decode out of memory happened, #retracted_reqs: 2, ...")
         re.compile(r"[Dd]ecode out of memory happened"), _retracted),
    # the pools sized at start-up that cannot hold what they must (2026: kv_cache_configurator.py "Loaded weights leave
    # no GPU memory for the KV cache under --mem-fraction-static=0.7"; the hybrid mamba state cache; the unified pool
    # "cannot fit ONE worst-case request"; the SWA pool cap "leaves no room for the full KV pool"; schedule_batch
    # alloc_req_slots "runs out of memory. Please set a smaller number for `--max-running-requests`")
    Rule("pools too small for one request", ("leave no GPU memory for the KV cache", "Not enough GPU memory for hybrid",
                                             "cannot fit ONE worst-case request", "leaves no room for the full KV pool",
                                             "alloc_req_slots runs out of memory"),
         re.compile(r"Loaded weights leave no GPU memory for the KV cache|Not enough GPU memory for hybrid|"
                    r"byte budget (?P<budget>\d+) cannot fit ONE worst-case request \(bs=1 floor (?P<floor>\d+)|"
                    r"leaves no room for the full KV pool within the available (?P<avail>[\d.]+) GiB|"
                    r"alloc_req_slots runs out of memory"), _pool_too_small),
    # a request longer than the context once its images were expanded into tokens (scheduler.py, 2025)
    Rule("multimodal prompt too long", ("Multimodal prompt is too long",),
         re.compile(r"Multimodal prompt is too long after expanding multimodal tokens\..*?=> (\d+) >= (\d+)"),
         _mm_too_long),
    # mem_cache/memory_pool.py (2026, hybrid models): the per-request Mamba state slots are all taken ("AssertionError:
    # Not enough space for mamba ping pong idx, try to increase --mamba-full-memory-ratio.", sglang#19002)
    Rule("mamba state pool full", ("Not enough space for mamba",), re.compile(r"Not enough space for mamba\b"),
         _prefill_oom),
    Rule("prefill / decode out of memory", ("Prefill out of memory", "Decode out of memory"),
         re.compile(r"(?:Prefill|Decode) out of memory(?! happened)"), _prefill_oom),
    Rule("TP memory unbalanced", ("memory capacity is unbalanced",),
         re.compile(r"The memory capacity is unbalanced\.(?:.*?(?:min_per_gpu_memory|pre_model_load_memory)=([\d.]+),"
                    r"\s*local_gpu_memory=([\d.]+))?"), _unbalanced),
    Rule("not enough memory for the pool", ("Not enough memory. Please try to increase --mem-fraction-static",),
         re.compile(r"Not enough memory\. Please try to increase --mem-fraction-static"), _not_enough),
    Rule("CUDA error while creating the pool", ("CUDA error", "CUDA out of memory"),
         re.compile(r"CUDA error|CUDA out of memory"), _pool_cuda_error),
    Rule("input longer than the pool", ("exceeds the maximum allowed length",),
         re.compile(r"Input length \((\d+) tokens\) exceeds the maximum allowed length \((\d+) tokens\)"),
         _input_too_long),
    Rule("server ready", ("The server is fired up and ready",), re.compile(r"The server is fired up and ready"),
         _ready),
)

KEYWORDS: tuple[str, ...] = tuple(sorted({k for r in RULES for k in r.keywords}))
"""The literals that select a line for this parser, derived from :data:`RULES`."""


def feed(f: LogFacts, line: str, lineno: int) -> None:
    """Read one cleaned SGLang line into ``f``: every matching rule in table order until one reads the line."""
    for rule in RULES:
        if not any(k in line for k in rule.keywords):
            continue
        m = rule.pattern.search(line)
        if m is not None and rule.handle(f, m, line, lineno):
            return
