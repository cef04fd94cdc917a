"""Suggestions that work when pasted (issue 12 item 6), over EVERY case of tests/data/cases and tests/data/corpus.

Each suggestion is run back through kvreport's own model (the Situation the fix rules saw: ``kv_at``,
``max_ctx_fit``, the budget of the failing device, the engine's own figures) and must be:

* not a no-op: some key of ``change`` differs from the current value (the parsed command's flags, else the value
  the log shows), and a rewritten ``command`` differs from the user's (as text and as parsed flags);
* not predicted to fail: a reduce-ctx / quantize-kv-cache context fits the KV budget at its cache type; a vLLM
  ``--max-model-len`` is within the log's "estimated maximum model length" / pool; fp8 KV fits the pool the log
  printed; a llama.cpp ``-ub`` computed for a compute buffer fits the free memory (the buffer scales ~linearly with
  n_ubatch); a lowered ``--gpu-memory-utilization`` fits the free memory of vLLM's start-up gate; a raised one stays
  at most 0.95.
"""

from __future__ import annotations

import pytest

from kvreport import fixes
from kvreport.analyze import analyze_text
from kvreport.cmdline import parse_command
from tests.paths import CASE_DIR, CORPUS_DIR

CASES = sorted([p for base in (CASE_DIR, CORPUS_DIR) if base.is_dir() for p in base.iterdir()
                if (p / "log.txt").is_file()], key=lambda p: (p.parent.name, p.name))

_TRUE = {"on", "1", "true", "yes", "enabled"}


def _norm(v):
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return round(float(v), 4)
    t = str(v).strip().lower()
    if t in _TRUE:
        return True
    if t in ("off", "0", "false", "no", "disabled"):
        return False
    try:
        return round(float(t), 4)
    except ValueError:
        return t


def _current(s: fixes.Situation, key: str) -> list:
    """Every value the command or the log shows for the knob ``key`` (a change to one of them is a no-op)."""
    f, v, sg = s.flags or {}, s.vllm or {}, s.sglang or {}
    table = {
        "--ctx-size": [f.get("n_ctx"), s.n_ctx], "OLLAMA_CONTEXT_LENGTH": [f.get("context_length"), s.n_ctx],
        "num_ctx": [s.n_ctx],
        "--parallel": [f.get("n_parallel"), s.n_seq],
        # an n_seq no line or flag gave is the assumed 1, not a value the user has
        "OLLAMA_NUM_PARALLEL": [f.get("num_parallel"), s.n_seq if s.n_seq_known else None],
        "--cache-type-k": [f.get("cache_type_k"), s.cache_type_k], "--cache-type-v": [f.get("cache_type_v"), s.cache_type_v],
        "OLLAMA_KV_CACHE_TYPE": [f.get("kv_cache_type"), s.cache_type_k],
        "--flash-attn": [f.get("flash_attn"), s.flash_attn], "OLLAMA_FLASH_ATTENTION": [f.get("flash_attention")],
        "--ubatch-size": [f.get("n_ubatch"), s.n_ubatch], "num_batch": [s.n_ubatch],
        "--batch-size": [f.get("n_batch"), s.n_batch],
        "--n-gpu-layers": [f.get("n_gpu_layers")], "num_gpu": [f.get("num_gpu"), s.n_gpu_layers_log],
        "--gpu-memory-utilization": [f.get("gpu_memory_utilization"), (v.get("gate") or {}).get("utilization")],
        "--mem-fraction-static": [f.get("mem_fraction_static"), sg.get("mem_fraction_static")],
        "--max-model-len": [f.get("max_model_len"), v.get("max_model_len")],
        "--context-length": [f.get("context_length"), sg.get("context_len")],
        "--max-num-seqs": [f.get("max_num_seqs")], "--max-running-requests": [f.get("max_running_requests")],
        "--tensor-parallel-size": [f.get("tensor_parallel_size")], "--kv-cache-dtype": [f.get("kv_cache_dtype")],
        "--max-num-batched-tokens": [f.get("max_num_batched_tokens")],
        "--chunked-prefill-size": [f.get("chunked_prefill_size")],
        "--max-batch-prefill-tokens": [f.get("max_batch_prefill_tokens")],
        "--no-kv-offload": [f.get("no_kv_offload")], "--tensor-split": [f.get("tensor_split")],
        "--swa-full": [None if s.swa_full else "absent"],
    }
    return [_norm(x) for x in table.get(key, []) if x is not None]


def _no_op(s: fixes.Situation, change: dict) -> bool:
    """True when every knob of ``change`` already has the new value (in the command or the log)."""
    if not change:
        return False
    return all(_norm(val) in _current(s, key) if val is not None else "absent" in _current(s, key)
               for key, val in change.items())


def _budget(s: fixes.Situation):
    return s.kv_budget_mib if s.kv_budget_mib is not None else s.free_at_failure_mib


def _ctx_fits(s: fixes.Situation, n_ctx: int, cache_type: str) -> tuple[bool, str]:
    """Does the KV at ``n_ctx`` tokens and ``cache_type`` fit the budget the diagnosis computed?"""
    fit = (s.max_ctx_fit or {}).get(cache_type)
    if fit is not None:
        return n_ctx <= fit, f"max_ctx_fit[{cache_type}]={fit}"
    budget = _budget(s)
    if callable(s.kv_at) and budget is not None:
        kv = s.kv_at(n_ctx=n_ctx, cache_type=None if cache_type == "f16" else cache_type)
        if kv is not None:
            return kv * (s.kv_share or 1.0) <= budget * 1.001, f"kv_at={kv} budget={budget}"
    return True, "no numbers"


def _diagnose(case, monkeypatch):
    seen = []
    real = fixes.suggest_explained

    def spy(s, *a, **kw):
        seen.append(s)
        return real(s, *a, **kw)

    monkeypatch.setattr(fixes, "suggest_explained", spy)
    cmd_file = case / "command.txt"
    cmd = cmd_file.read_text(errors="replace").strip() if cmd_file.is_file() else None
    d = analyze_text((case / "log.txt").read_text(errors="replace"), cmd)
    return d, (seen[-1] if seen else None), cmd


def _cache_type(s: fixes.Situation, change: dict) -> str:
    t = change.get("--cache-type-k") or change.get("OLLAMA_KV_CACHE_TYPE") or s.cache_type_k
    return t if t in ("f16", "q8_0", "q4_0") else "f16"


def _ctx_value(change: dict):
    for key in ("--ctx-size", "OLLAMA_CONTEXT_LENGTH", "num_ctx"):
        if isinstance(change.get(key), int):
            return change[key]
    return None


def _problems(sug: dict, s: fixes.Situation, cmd: str | None) -> list[str]:
    out = []
    change, sid = sug["change"], sug["id"]
    if _no_op(s, change):
        out.append(f"no-op change {change}")
    if cmd and sug["command"] is not None:
        if " ".join(sug["command"].split()) == " ".join(cmd.split()):
            out.append("command equals the original")
        else:
            a, b = parse_command(cmd), parse_command(sug["command"])
            if a["flags"] == b["flags"] and a.get("env") == b.get("env"):
                out.append(f"command parses to the same flags: {sug['command']}")
    ct = _cache_type(s, change)
    n = _ctx_value(change)
    if sid == "reduce-ctx" and n is not None:
        ok, why = _ctx_fits(s, n, ct)
        if not ok:
            out.append(f"reduce-ctx {n} predicted to fail ({why})")
    if sid == "quantize-kv-cache" and ct != "f16":
        cur = n if n is not None else s.n_ctx
        if cur:
            ok, why = _ctx_fits(s, cur, ct)
            if not ok and s.phase in ("kv_cache", "context", "unknown"):
                out.append(f"{ct} at context {cur} predicted to fail ({why})")
    v = s.vllm or {}
    for key in ("--max-model-len", "--context-length"):
        val = change.get(key)
        if isinstance(val, int):
            per_tok = 0.5 if change.get("--kv-cache-dtype") == "fp8" else 1.0  # fp8 halves the KV per token
            for cap in (v.get("estimated_max_len"), v.get("pool_tokens")):
                if cap and val * per_tok > cap:
                    out.append(f"{key} {val} above what the log says fits ({cap})")
    if change.get("--kv-cache-dtype") == "fp8" and v.get("kv_needed_mib") and v.get("available_kv_mib") is not None:
        scale = (change.get("--max-model-len") or v.get("max_model_len") or 1) / (v.get("max_model_len") or 1)
        if v["kv_needed_mib"] / 2 * scale > v["available_kv_mib"] * 1.001:
            out.append(f"fp8 KV {v['kv_needed_mib'] / 2 * scale:.0f} MiB over the pool {v['available_kv_mib']:.0f} MiB")
    util = change.get("--gpu-memory-utilization")
    gate = v.get("gate") or {}
    cur_util = _current(s, "--gpu-memory-utilization")
    if sid == "lower-gpu-memory-utilization" and util is not None:
        if not 0 < util < (cur_util[0] if cur_util else 0.9):
            out.append(f"utilization {util} is not a lower positive fraction")
    if sid == "lower-gpu-memory-utilization" and util and gate.get("free_mib") and gate.get("total_mib"):
        if util * gate["total_mib"] > gate["free_mib"]:
            out.append(f"utilization {util} x {gate['total_mib']:.0f} MiB over {gate['free_mib']:.0f} MiB free")
    for key in ("--gpu-memory-utilization", "--mem-fraction-static"):
        if sid == "raise-gpu-memory-utilization" and isinstance(change.get(key), float) and change[key] > 0.95:
            out.append(f"{key} {change[key]} leaves no room for the driver")
    ub = change.get("--ubatch-size") or change.get("num_batch")
    free = s.free_at_failure_mib if s.free_at_failure_mib is not None else s.free_mib
    if sid == "reduce-batch" and s.phase == "compute_buffer" and isinstance(ub, int) and s.n_ubatch and s.requested_mib \
            and free is not None and s.verdict == "exceeds_free" and not s.working_set:
        if s.requested_mib * ub / s.n_ubatch > free * 1.001:
            out.append(f"-ub {ub}: compute buffer ~{s.requested_mib * ub / s.n_ubatch:.0f} MiB over {free:.0f} MiB free")
    return out


@pytest.mark.parametrize("case", CASES, ids=[f"{c.parent.name}/{c.name}" for c in CASES])
def test_every_suggestion_works_when_pasted(case, monkeypatch):
    d, s, cmd = _diagnose(case, monkeypatch)
    if s is None:
        assert d["suggestions"] == []
        return
    bad = {sug["id"]: p for sug in d["suggestions"] if (p := _problems(sug, s, cmd))}
    assert not bad, bad


# ---------------------------------------------------------------- the computed values, on situations of known shape

def test_ub_is_computed_to_fit_the_free_memory():
    s = fixes.Situation(engine="llama.cpp", phase="compute_buffer", backend="cuda", failing_device="CUDA0",
                        verdict="exceeds_free", requested_mib=40960.0, free_mib=3000.0, free_at_failure_mib=3000.0,
                        n_ubatch=8192, n_batch=8192)
    top = next(x for x in fixes.suggest(s) if x["id"] == "reduce-batch")
    # 8192 x 3000 x 0.9 / 40960 = 540 -> 512 (a power of two): ~2,560 MiB, within 3,000 MiB; not merely halved
    assert top["change"] == {"--ubatch-size": 512, "--batch-size": 2048}
    assert "2,560 MiB at -ub 512" in top["expected"]


def test_q8_0_that_still_does_not_fit_comes_with_the_context_that_does():
    s = fixes.Situation(engine="llama.cpp", phase="kv_cache", backend="cuda", failing_device="CUDA0",
                        verdict="exceeds_free", n_ctx=131072, kv_mib=16384.0, kv_budget_mib=6000.0,
                        cache_type_k="f16", cache_type_v="f16", max_ctx_fit={"f16": 47872, "q8_0": 90112, "q4_0": 1},
                        kv_at=lambda n_ctx=None, cache_type=None, **kw: (n_ctx or 131072) / 8 * (
                            0.53 if cache_type == "q8_0" else 1.0) / 1024 * 1024 / 1024)
    q = next(x for x in fixes.suggest(s) if x["id"] == "quantize-kv-cache")
    assert q["change"]["--ctx-size"] == 90112 and q["change"]["--cache-type-v"] == "q8_0"
    assert "47,872 tokens fit at f16" in q["expected"]


def test_no_raise_of_a_utilization_already_at_095_and_no_negative_gate_value():
    s = fixes.Situation(engine="vllm", phase="kv_capacity", flags={"gpu_memory_utilization": 0.95},
                        vllm={"max_model_len": 262144, "kv_needed_mib": 63488.0, "available_kv_mib": 56985.6})
    out = fixes.suggest(s)
    assert "raise-gpu-memory-utilization" not in [x["id"] for x in out]
    assert out[0]["change"] == {"--max-model-len": 235264}  # 262144 x 56985.6 / 63488, a multiple of 256
    gate = fixes.Situation(engine="vllm", phase="memory_budget", verdict="exceeds_free", requested_mib=21719.0,
                           free_mib=225.0, vllm={"gate": {"free_mib": 225.0, "total_mib": 31027.0, "utilization": 0.7}})
    assert [x["id"] for x in fixes.suggest(gate)] == ["free-device-memory"]


def test_activation_oom_lowers_the_utilization_by_the_computed_gap():
    s = fixes.Situation(engine="vllm", phase="compute_buffer", verdict="exceeds_free", requested_mib=4096.0,
                        free_mib=1024.0, device_total_mib=24576.0, has_memory_event=True)
    low = next(x for x in fixes.suggest(s) if x["id"] == "lower-gpu-memory-utilization")
    # 0.9 - 3072 / 24576 - 0.01 = 0.765 -> 0.76
    assert low["change"] == {"--gpu-memory-utilization": 0.76}
