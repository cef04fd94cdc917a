"""What `kvreport fit` computes (the command is :mod:`kvreport.commands.fit`): KV bytes per token, the KV of the requested context, the largest context that fits.

All arithmetic is ``kvreport.kvcache`` (llama.cpp's rules); this module chooses the inputs, the
memory budget, and says the result plainly. Units: tokens for contexts, MiB = 2^20 bytes.

The memory budget is ``free_mib - headroom_mib``. With ``--free-mib`` the number given is taken
as what the KV cache may use and the headroom defaults to 0; without it kvreport reads the local
devices (``kvreport.probes``) and keeps ``DEFAULT_HEADROOM_MIB`` free, the margin llama.cpp's own
``--fit`` keeps by default (``-fitt``, 1024 MiB, ``common/arg.cpp``). Model weights and compute
buffers are never counted: the answer is an upper bound set by the KV cache alone.
"""

from __future__ import annotations

import sys
from typing import Any

from kvreport.errors import InputError
from kvreport.kvcache import (
    CACHE_TYPES,
    CTX_PAD,
    KVConfig,
    ModelShape,
    is_known_type,
    kv_size,
    max_ctx_fit,
    no_fa_budget,
    normalize_type,
)
from kvreport.logs.common import to_int
from kvreport.units import GIB, MIB

_PLACED = "buffers it placed there"
"""The end of :func:`log_free_mib`'s source: a budget that already counts the weights and buffers the log placed."""

#: Cache types always shown (the ones llama.cpp users switch between).
SHOWN_TYPES = ("f16", "q8_0", "q4_0")
PY_SHOWN_TYPES = ("f16", "fp8")
"""The cache types a Hugging Face config's report shows: 16-bit (vLLM's "auto" for bf16/f16 weights) and fp8."""
#: Headroom kept free when the budget comes from the local devices (llama.cpp --fit-target default).
DEFAULT_HEADROOM_MIB = 1024.0


def _fmt_bytes(n: float) -> str:
    """Bytes in the largest binary unit that keeps the number readable (KiB/MiB/GiB)."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if n >= size:
            v = n / size
            return f"{v:,.0f} {unit}" if v == int(v) else f"{v:,.2f} {unit}"
    return f"{n:,.0f} B"


def _fit_for(shape: ModelShape, budget_bytes: float, base: KVConfig, t: str) -> tuple[int, int]:
    """(largest n_ctx rounded down to 256, the exact token count before rounding) for type ``t``.

    The count before rounding is only given where it is exact: one stream (unified cache or one
    sequence) and no sliding-window layers, whose cache size steps with n_ctx
    (llama-kv-cache-iswa.cpp); elsewhere both values are the rounded one.
    """
    cfg = base.with_(cache_type_k=t, cache_type_v=t)
    n = max_ctx_fit(shape, budget_bytes, cfg)
    if (cfg.n_seq > 1 and not cfg.kv_unified) or any(shape.is_swa or ()):
        return n, n
    per = kv_size(shape, cfg.with_(n_ctx=CTX_PAD)).bytes_per_token
    fixed = kv_size(shape, cfg.with_(n_ctx=CTX_PAD))
    fixed_bytes = fixed.total_bytes - per * fixed.cells * fixed.n_stream
    exact = int((budget_bytes - fixed_bytes) // per) if per > 0 and budget_bytes > fixed_bytes else n
    return n, max(exact, n)


def _streams(parallel, kv_unified) -> tuple[int, bool]:
    """(n_seq, kv_unified) as llama-server takes them: one unified stream for one sequence, split streams for an
    explicit ``-np N`` unless ``-kvu`` says otherwise."""
    n_seq = max(1, int(parallel or 1))
    return n_seq, (n_seq == 1) if kv_unified is None else bool(kv_unified)


def fit_report(shape: ModelShape, ctx_size: int | None, free_mib: float, parallel: int | None = None,
               kv_unified: bool | None = None, cache_type_k: str | None = None,
               cache_type_v: str | None = None, swa_full: bool = False, headroom_mib: float = 0.0,
               *, n_ubatch: int = 512, flash_attn: bool = True, free_source: str = "--free-mib",
               headroom_reason: str | None = None) -> dict[str, Any]:
    """The numbers of `kvreport fit` as a JSON-ready dict.

    ``ctx_size`` tokens requested (None/0 = the model's n_ctx_train); ``free_mib`` memory to fit
    into (MiB); ``parallel`` sequences (``-np``, default 1); ``kv_unified`` default: unified with
    one sequence, split (llama-server's explicit ``-np N`` without ``-kvu``) with more;
    ``headroom_mib`` is subtracted from ``free_mib`` before fitting.

    Keys (design.md, ``kvreport fit --json``): ``kv_bytes_per_token`` (bytes, requested types),
    ``kv_required_mib`` (attention KV of the requested context), ``max_ctx_fit`` ({type: tokens}
    for f16, q8_0, q4_0 and the requested type, at the requested parallel, rounded down to 256),
    ``headroom_mib``, ``inputs``; and more: ``rs_required_mib``, ``max_ctx_fit_exact`` (before
    rounding), ``max_ctx_fit_parallel_1``, ``fits``, ``budget_mib``, ``n_ctx``, ``n_ctx_train``,
    ``notes``.
    """
    n_seq, unified = _streams(parallel, kv_unified)
    # As in llama.cpp (common/arg.cpp), -ctk and -ctv are independent; each defaults to f16.
    tk, tv = normalize_type(cache_type_k or "f16"), normalize_type(cache_type_v or "f16")
    for t in (tk, tv):
        if not is_known_type(t):
            raise InputError(f"unknown cache type {t!r}",
                             hint="llama.cpp accepts " + ", ".join(CACHE_TYPES))
    if free_mib is None or free_mib < 0:
        raise InputError("free memory must be a number of MiB >= 0")
    headroom = float(headroom_mib or 0.0)
    budget_mib = max(0.0, float(free_mib) - headroom)
    budget = budget_mib * MIB
    base = KVConfig(n_ctx=int(ctx_size or 0), n_seq=n_seq, kv_unified=unified, cache_type_k=tk,
                    cache_type_v=tv, flash_attn=flash_attn, swa_full=swa_full, n_ubatch=n_ubatch)
    req = kv_size(shape, base)
    python = shape.source == "hf_config"  # a Hugging Face config: vLLM / SGLang, whose KV types are 16-bit and fp8
    types = list(PY_SHOWN_TYPES if python else SHOWN_TYPES)
    if tk == tv and tk not in types:
        types.append(tk)
    fit_np: dict[str, int] = {}
    exact_np: dict[str, int] = {}
    fit_1: dict[str, int] = {}
    per_type: dict[str, int] = {}
    need_type: dict[str, float] = {}
    for t in types:
        fit_np[t], exact_np[t] = _fit_for(shape, budget, base, t)
        fit_1[t], _ = _fit_for(shape, budget, base.with_(n_seq=1, kv_unified=True), t)
        per_type[t] = kv_size(shape, base.with_(cache_type_k=t, cache_type_v=t, n_ctx=CTX_PAD)).bytes_per_token
        need_type[t] = round(kv_size(shape, base.with_(cache_type_k=t, cache_type_v=t)).kv_mib, 2)
    req_fit = max_ctx_fit(shape, budget, base)
    notes = list(req.notes)
    if not flash_attn and (tv != "f16" and tv != "f32" and tv != "bf16"):
        notes.append("a quantized V cache needs flash attention (llama.cpp refuses it with -fa off)")
    notes.append("vLLM: --kv-cache-dtype fp8 and --max-model-len; SGLang: --kv-cache-dtype fp8_e4m3 and "
                 "--context-length" if python else "q8_0/q4_0 V caches need flash attention on (-fa on or auto)")
    if shape.n_ctx_train and any(v > shape.n_ctx_train for v in fit_np.values()):
        notes.append(f"the model was trained for {shape.n_ctx_train:,} tokens; contexts above it need RoPE scaling")
    return {
        "kv_bytes_per_token": req.bytes_per_token,
        "kv_required_mib": round(req.kv_mib, 2),
        "rs_required_mib": round(req.rs_mib, 2),
        "max_ctx_fit": fit_np,
        "max_ctx_fit_exact": exact_np,
        "max_ctx_fit_parallel_1": fit_1,
        "max_ctx_fit_requested_types": req_fit,
        "kv_bytes_per_token_by_type": per_type,
        "kv_required_mib_by_type": need_type,
        "headroom_mib": headroom,
        "headroom_reason": headroom_reason or (
            "none subtracted: --free-mib is taken as the memory the KV cache may use"
            if headroom == 0 else "kept free for the model weights, compute buffers and the driver"),
        "free_mib": float(free_mib),
        "free_source": free_source,
        "budget_mib": round(budget_mib, 2),
        "fits": req.total_bytes <= budget,
        "n_ctx": req.n_ctx,
        "n_ctx_seq": req.n_ctx_seq,
        "n_ctx_train": shape.n_ctx_train or None,
        "inputs": {
            "ctx_size": int(ctx_size or 0), "n_ctx": req.n_ctx, "n_seq": n_seq, "kv_unified": unified,
            "cache_type_k": tk, "cache_type_v": tv, "swa_full": bool(swa_full), "n_ubatch": n_ubatch,
            "free_mib": float(free_mib), "headroom_mib": headroom,
            "n_layer": shape.n_layer, "n_layer_kv": shape.n_layer_kv,
            "n_head_kv": _squash(shape.n_head_kv), "head_dim_k": _squash(shape.head_dim_k),
            "head_dim_v": _squash(shape.head_dim_v), "n_swa": shape.n_swa, "is_mla": shape.is_mla,
            "arch": shape.arch, "source": shape.source,
        },
        "kv": req.to_dict(),
        "notes": notes,
    }


def _squash(t):
    return t[0] if t and all(x == t[0] for x in t) else list(t)


def render_fit(rep: dict[str, Any], shape: ModelShape) -> str:
    """The human text of a fit report: what was asked, what it costs, what fits."""
    inp = rep["inputs"]
    tk, tv = inp["cache_type_k"], inp["cache_type_v"]
    types_label = tk if tk == tv else f"K {tk} / V {tv}"
    per = rep["kv_bytes_per_token"]
    lines = []
    asked = inp["ctx_size"]
    if asked:
        lines.append(f"Requested context: {asked:,} tokens (-c counts tokens, not bytes)"
                     + (f"; llama.cpp allocates {rep['n_ctx']:,}" if rep["n_ctx"] != asked else "") + ".")
    else:
        lines.append(f"Requested context: the model's training context, {rep['n_ctx']:,} tokens (-c 0).")
    if inp["n_seq"] > 1:
        mode = "one shared (unified) cache" if inp["kv_unified"] else f"{inp['n_seq']} separate streams of {rep['n_ctx_seq']:,}"
        lines.append(f"Parallel sequences: {inp['n_seq']} ({mode}).")
    geo = _geometry(shape)
    lines.append(f"Model: {shape.arch}, {geo} (from {shape.source}).")
    lines.append(f"KV per token at {types_label}: {_fmt_bytes(per)} ({per:,} bytes).")
    need = rep["kv_required_mib"] * MIB
    lines.append(f"KV for {rep['n_ctx']:,} tokens at {types_label}: {_fmt_bytes(need)} "
                 f"({rep['kv_required_mib']:,.2f} MiB)" + (
                     f", plus {rep['rs_required_mib']:,.2f} MiB of recurrent state" if rep["rs_required_mib"] else "") + ".")
    hr = rep["headroom_mib"]
    lines.append(f"Memory to fit into: {rep['free_mib']:,.0f} MiB free ({rep['free_source']}) − "
                 f"{hr:,.0f} MiB headroom ({rep['headroom_reason']}) = {rep['budget_mib']:,.0f} MiB for the KV cache.")
    verdict = "fits" if rep["fits"] else "does NOT fit"
    lines.append(f"The requested context {verdict} in that budget.")
    lines.append("")
    show_p1 = inp["n_seq"] > 1
    header = ["cache type", "bytes/token", f"KV @ {rep['n_ctx']:,}", "max context"]
    if show_p1:
        header[3] = f"max ctx (-np {inp['n_seq']})"
        header.append("max ctx (-np 1)")
    rows = [header]
    for t, n in rep["max_ctx_fit"].items():
        bpt = rep["kv_bytes_per_token_by_type"][t]
        row = [t, f"{bpt:,}", f"{rep['kv_required_mib_by_type'][t]:,.0f} MiB" if shape.n_layer_kv else "-", f"{n:,}"]
        if show_p1:
            row.append(f"{rep['max_ctx_fit_parallel_1'][t]:,}")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        lines.append("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    lines.append("")
    f16, q8 = rep["max_ctx_fit"].get("f16"), rep["max_ctx_fit"].get("q8_0")
    ex = rep["max_ctx_fit_exact"]
    parts = [f"{f16:,} tokens at f16"]
    if rep["max_ctx_fit"].get("fp8") is not None:
        parts.append(f"{rep['max_ctx_fit']['fp8']:,} at fp8")
    if q8 is not None:
        q8s = f"{q8:,} at q8_0"
        if ex.get("q8_0", q8) != q8:
            q8s += f" ({ex['q8_0']:,} before rounding down to a multiple of 256, as llama.cpp pads -c up to 256)"
        parts.append(q8s)
    if tk != tv or tk not in rep["max_ctx_fit"]:
        # the types asked for (-ctk / -ctv) are not one of the rows: their own figure, first
        asked_fit = int(rep["max_ctx_fit_requested_types"]) // 256 * 256
        parts.insert(0, f"{asked_fit:,} tokens at {types_label} (the types asked for)")
        parts[1] = parts[1].replace(" tokens at f16", " at f16")
    lines.append("The KV cache alone caps the context at " + " and ".join(parts) + ".")
    if _PLACED in str(rep.get("free_source") or ""):
        # (a log's free memory less the buffers it placed, and a compute headroom: both are counted above)
        lines.append("Model weights and output buffers the log placed, and the compute buffer's headroom, are counted.")
    else:
        lines.append("Model weights and compute buffers are not counted: the real limit is lower unless "
                     "--headroom-mib covers them.")
    for n in rep["notes"]:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def _geometry(shape: ModelShape) -> str:
    hk = _squash(shape.head_dim_k)
    kvh = _squash(shape.n_head_kv)
    parts = [f"{shape.n_layer} layers"]
    if shape.n_layer_kv != shape.n_layer:
        parts.append(f"{shape.n_layer_kv} with a KV cache")
    if shape.is_mla:
        parts.append(f"MLA latent {hk} per token per layer")
    else:
        parts.append(f"{kvh} KV heads" if not isinstance(kvh, list) else "per-layer KV heads")
        parts.append(f"head dim {hk}" if not isinstance(hk, list) else "per-layer head dims")
    if shape.is_swa_any:
        parts.append(f"{sum(1 for s, k in zip(shape.is_swa, shape.has_kv, strict=True) if s and k)} sliding-window layers (window {shape.n_swa})")
    if shape.is_recurrent_any:
        parts.append(f"{sum(shape.is_recurrent)} recurrent layers")
    return ", ".join(parts)


def _shape_from_options(model_path, log_path, hf_config) -> tuple[ModelShape, dict]:
    """The model shape and any context facts (from a log) for the CLI: the shape from ``--model``,
    else ``--config``, else the log's print_info lines; a log always gives its context facts (the
    context it ran with, its cache types, the free memory it printed), whichever gave the shape."""
    given = [x for x in (model_path, log_path, hf_config) if x]
    if not given:
        raise InputError("give the model: --model FILE.gguf, --log LOG (a llama.cpp log with its "
                         "print_info lines) or --config config.json")
    facts = _read_log_facts(log_path) if log_path else None
    ctx = _log_context(facts) if facts is not None else {}
    if model_path:
        from kvreport.gguf_meta import shape_from_gguf

        return shape_from_gguf(model_path), ctx
    if hf_config:
        from kvreport.hfconfig import load_hf_config, shape_from_hf_config

        return shape_from_hf_config(load_hf_config(hf_config)), ctx
    from kvreport.kvcache import shape_from_hparams

    shape = shape_from_hparams(facts.hparams or {}, facts.gguf_kv or {})
    if shape is None:
        raise InputError(f"{log_path} does not print the model parameters (print_info lines)",
                         hint="recent llama.cpp builds print them only with -lv 4, or give --model")
    return shape, ctx


def _read_log_facts(log_path: str):
    """The parsed facts of ``--log`` (``-`` is stdin)."""
    from kvreport.logs import parse_log

    try:
        if log_path == "-":
            return parse_log(sys.stdin)
        with open(log_path, encoding="utf-8", errors="replace") as f:
            return parse_log(f)
    except OSError as exc:
        raise InputError(f"cannot read log {log_path}: {exc.strerror or exc}") from None


def _log_context(facts) -> dict:
    """The context a log ran with (n_ctx, n_seq, cache types) and, under ``_free``, the free memory it printed."""
    ctx = dict(facts.ctx or {})
    # Recent builds print the cache types only on the KV size line (llama-kv-cache.cpp).
    for cache in reversed(facts.kv_caches or []):
        if not cache.get("dry_run"):
            ctx.setdefault("type_k", cache.get("type_k"))
            ctx.setdefault("type_v", cache.get("type_v"))
            break
    ctx = {k: v for k, v in ctx.items() if v is not None}
    room = log_free_mib(facts)
    if room:
        ctx["_free"] = room
        hp = facts.hparams or {}
        fa = str((facts.ctx or {}).get("flash_attn") or "").lower()
        if fa in ("0", "disabled", "off", "false") and "printed" not in room[3] and to_int(hp.get("n_head")):
            # flash attention off: the compute buffer grows with the context, as analyze keeps it (kvcache.no_fa_budget)
            ctx["_no_fa"] = {"n_head": to_int(hp.get("n_head")), "n_vocab": to_int(hp.get("n_vocab")) or 0,
                             "n_ubatch": to_int((facts.ctx or {}).get("n_ubatch")) or 512}
    v = {k: facts.vllm[k] for k in ("max_model_len", "pool_tokens", "available_kv_mib") if (facts.vllm or {}).get(k)}
    if v:
        ctx["_vllm"] = v  # (a vLLM log: its max_model_len and its KV pool, in tokens or MiB)
    return ctx


def local_free_mib(timeout: float = 3.0) -> tuple[float, str]:
    """Free memory of the local accelerators (sum of GPU free MiB), else host RAM; (MiB, source)."""
    try:
        from kvreport import probes
    except ImportError:
        raise InputError("no --free-mib given and device probing is not available in this install",
                         hint="pass --free-mib N") from None
    run_all = getattr(probes, "run_all", None)
    if run_all is None:
        raise InputError("no --free-mib given and device probing is not available yet", hint="pass --free-mib N")
    result = run_all(timeout)
    if isinstance(result, dict):  # {"host", "devices", "engine", ..., "probes", "seconds"}
        host, devices = result.get("host"), result.get("devices")
    else:  # the older (host, devices, engines, probe_status) tuple
        host, devices = result[0], result[1]
    gpus = [d for d in (devices or []) if isinstance(d, dict) and d.get("free_mib") is not None
            and str(d.get("backend", "")).lower() not in ("cpu", "")]
    if gpus:
        total = sum(float(d["free_mib"]) for d in gpus)
        names = ", ".join(str(d.get("name") or d.get("backend")) for d in gpus)
        return total, f"local devices: {names}"
    free = (host or {}).get("ram_free_mib")
    if free is None:
        raise InputError("could not read free memory on this machine", hint="pass --free-mib N")
    return float(free), "host RAM (no GPU found)"


def log_free_mib(facts) -> tuple[float, str, float, str] | None:
    """Room for the KV on the GPUs of the log's machine (its host RAM for a CPU-only run): the free memory the log
    printed for each at load, less the model and output buffers the log shows placed there (dry runs left out), and
    the headroom the compute buffer needs next to the KV there, as ``kvreport analyze`` keeps it: the compute buffer
    the log printed for those devices (a real attempt, else the fit step's dry run), else llama.cpp's --fit margin
    (-fitt, :data:`DEFAULT_HEADROOM_MIB`; half of what is free on a device smaller than twice that). (room MiB,
    source, headroom MiB, why) or None when the log prints no GPU's free memory. The machine running ``kvreport fit``
    is often not that one."""
    from kvreport.vocab import backend_of_device

    printed = {n: d for n, d in (facts.devices or {}).items() if d.get("free_mib") is not None and backend_of_device(n)}
    gpus = {n: d for n, d in printed.items() if backend_of_device(n) != "cpu"} or printed  # a CPU-only run: its RAM
    if not gpus:
        # Ollama's own figure for its one GPU, before it loaded anything ('msg="offload to cuda" memory.available=
        # "[11.6 GiB]"', 'msg="gpu memory" available=...'): the weights it then placed on a GPU come off it
        o = facts.ollama or {}
        avail = [x for x in (o.get("offload_available_mib") or o.get("gpu_available_mib") or []) if x is not None]
        names = {b.get("device") for b in facts.buffers or [] if backend_of_device(b.get("device")) not in (None, "cpu")}
        if len(avail) != 1 or len(names) > 1:
            return None
        gpus = {(names.pop() if names else "GPU"): {"free_mib": avail[0]}}
    placed = [b for b in facts.buffers or [] if b.get("device") in gpus and b.get("mib")]
    used = sum(float(b["mib"]) for b in placed if not b.get("dry_run")
               and not any(w in str(b.get("kind", "")) for w in ("KV", "RS", "compute")))
    free = max(0.0, sum(float(d["free_mib"]) for d in gpus.values()) - used)
    comp = [float(b["mib"]) for b in placed if b.get("kind") == "compute"]
    if comp:
        head, why = max(comp), f"the {max(comp):,.0f} MiB compute buffer the log printed"
    elif free < 2 * DEFAULT_HEADROOM_MIB:
        head, why = free / 2, (f"half of it for the compute buffer (llama.cpp's --fit margin of {DEFAULT_HEADROOM_MIB:.0f} "
                               "MiB is more than the device has)")
    else:
        head, why = DEFAULT_HEADROOM_MIB, "the compute buffer (llama.cpp's --fit target margin, -fitt)"
    return free, (f"the log's free memory on {', '.join(gpus)} at load, less {used:.0f} MiB of model and output "
                  + _PLACED), head, why


def _apply_log_context(log_ctx: dict, ctx_size, parallel, kv_unified, cache_type_k, cache_type_v) -> tuple:
    """A log supplies the context it ran with, unless the options say otherwise."""
    if ctx_size is None and str(log_ctx.get("n_ctx", "")).isdigit():
        ctx_size = int(log_ctx["n_ctx"])
    if parallel is None and str(log_ctx.get("n_seq_max", "")).isdigit():
        parallel = int(log_ctx["n_seq_max"])
    if kv_unified is None and log_ctx.get("kv_unified") in ("true", "false", True, False):
        kv_unified = log_ctx["kv_unified"] in ("true", True)
    return (ctx_size, parallel, kv_unified, cache_type_k or log_ctx.get("type_k"),
            cache_type_v or log_ctx.get("type_v"))


def fit_from_options(model_path=None, log_path=None, hf_config=None, ctx_size=None, free_mib=None, parallel=None,
                     kv_unified=None, cache_type_k=None, cache_type_v=None, swa_full=False,
                     headroom_mib=None) -> tuple[dict, ModelShape]:
    """``(fit_report, shape)`` for the options of ``kvreport fit``: the shape from a GGUF, a log or a
    Hugging Face config; the context a log ran with unless given; without ``free_mib`` the local
    devices' free memory less :data:`DEFAULT_HEADROOM_MIB`."""
    shape, log_ctx = _shape_from_options(model_path, log_path, hf_config)
    if log_ctx:
        ctx_size, parallel, kv_unified, cache_type_k, cache_type_v = _apply_log_context(
            log_ctx, ctx_size, parallel, kv_unified, cache_type_k, cache_type_v)
    log_room = (log_ctx or {}).pop("_free", None)
    vllm = (log_ctx or {}).pop("_vllm", None)
    if vllm and ctx_size is None and vllm.get("max_model_len"):
        ctx_size = int(vllm["max_model_len"])  # (vLLM sizes its pool for --max-model-len; there is no -c)
    if vllm and free_mib is None and (vllm.get("available_kv_mib") or vllm.get("pool_tokens")):
        # vLLM's own KV pool is the budget: what it printed in MiB, else its size in tokens at this model's cost
        if vllm.get("available_kv_mib"):
            free, source = float(vllm["available_kv_mib"]), "the KV cache memory vLLM printed"
        else:
            pool = int(vllm["pool_tokens"])
            per_token = kv_size(shape, KVConfig(n_ctx=CTX_PAD, cache_type_k=cache_type_k or "f16",
                                                cache_type_v=cache_type_v or "f16")).bytes_per_token
            free = pool * per_token / MIB  # (exactly the pool's tokens: no llama.cpp padding of n_ctx here)
            source = f"vLLM's KV pool of {pool:,} tokens the log printed, at this model's cost"
        headroom = 0.0 if headroom_mib is None else headroom_mib
        reason = ("none: vLLM's pool is what is left after weights and activations" if headroom_mib is None
                  else "--headroom-mib")
    elif free_mib is None and log_room:
        free, source, head, why = log_room
        no_fa = (log_ctx or {}).pop("_no_fa", None)
        if no_fa and headroom_mib is None:
            n_seq, unified = _streams(parallel, kv_unified)
            cfg = KVConfig(n_ctx=int(ctx_size or 0), n_seq=n_seq, kv_unified=unified)
            budget, comp = no_fa_budget(shape, cfg, max(0.0, free - head), head, no_fa["n_ubatch"], no_fa["n_head"],
                                        no_fa["n_vocab"])
            if comp > head:
                head, why = comp, (f"the compute buffer without flash attention at the context that fits (about "
                                   f"{comp:,.0f} MiB: attention scores n_kv x {no_fa['n_ubatch']} x {no_fa['n_head']} heads "
                                   "x 4 B and the logits), as kvreport analyze keeps it")
        headroom = head if headroom_mib is None else headroom_mib
        reason = why if headroom_mib is None else "--headroom-mib"
    elif free_mib is None:
        free, source = local_free_mib()
        headroom = DEFAULT_HEADROOM_MIB if headroom_mib is None else headroom_mib
        reason = ("llama.cpp's --fit keeps 1024 MiB free by default (-fitt)" if headroom_mib is None
                  else "--headroom-mib")
    else:
        free, source = float(free_mib), "--free-mib"
        headroom = 0.0 if headroom_mib is None else headroom_mib
        reason = None if headroom_mib is None else "--headroom-mib"
    rep = fit_report(shape, ctx_size, free, parallel, kv_unified, cache_type_k, cache_type_v, swa_full,
                     headroom, free_source=source, headroom_reason=reason)
    return rep, shape
