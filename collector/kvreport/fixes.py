"""Fix rules: what to change, ranked as the playbook orders them and by effect.

:func:`suggest` takes the situation :mod:`kvreport.analyze` worked out (engine, phase, verdict,
sizes, the parsed command) and returns suggestions in design.md's vocabulary::

    {"id": "reduce-ctx", "title": "...", "change": {"--ctx-size": 8192},
     "command": "llama-server ... -c 8192" | None, "expected": "KV 1024 MiB of 1800 MiB free", "why": "..."}

Order (reference/playbook.md, "The order in which to try fixes"): context, parallel slots, cache
types, headroom (GPU layers, KV on host), the device that failed, the deepest error, regression.
A rule may move up when the numbers show it is the cause (``--parallel`` inflating a small
``-c`` to 256 cells per slot, ``--swa-full``, a single allocation over a backend limit, a compute
buffer on a secondary GPU). Failures that are not about runtime buffers (bad file, unknown
architecture, a refused option) get no memory suggestion. Every ``change`` names the engine's own
knob: llama.cpp flags, Ollama environment variables / Modelfile parameters, vLLM and SGLang options.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from kvreport import strict

SUGGESTION_IDS = (
    # design.md's vocabulary
    "reduce-ctx", "reduce-parallel", "quantize-kv-cache", "enable-flash-attn", "reduce-gpu-layers",
    "rebalance-devices", "free-device-memory", "kv-cache-on-host", "disable-swa-full", "work-around-alloc-limit",
    "bisect-regression", "raise-gpu-memory-utilization", "reduce-max-model-len", "reduce-max-num-seqs",
    "reduce-batch", "smaller-model-or-quant", "more-devices",
    # added here (design.md: "New ids may be added; none renamed"):
    "lower-gpu-memory-utilization",  # vLLM's start-up gate (memory_budget): utilization x total > free memory,
                                     # so the fraction must go DOWN to start next to other processes
    "raise-memory-limit",  # a host (CPU) buffer far under the machine's RAM was refused: a per-process cap
                           # (ulimit -v / RLIMIT_AS, a cgroup/container memory.max, strict overcommit) or other
                           # processes; check `ulimit -v`, `cat /sys/fs/cgroup/memory.max`, docker --memory
)
"""Every suggestion id :func:`suggest` may return; tests check the rules use no other."""

MEMORY_PHASES = ("kv_cache", "compute_buffer", "model_weights", "context", "kv_capacity", "memory_budget")


@dataclass
class Situation:
    """What the rules look at. Sizes in MiB (2**20 bytes), contexts in tokens.

    ``kv_at(n_ctx=None, n_seq=None, cache_type=None, kv_unified=None, swa_full=None) -> float | None``
    gives the attention-KV MiB of a changed configuration (kvreport.kvcache arithmetic, or linear in the context
    when ``kv_basis`` is ``"failed_buffer"``: the per-token cost derived from the failed KV buffer and n_ctx).
    ``n_gpu_layers_log``: a GPU layer count the log itself states (Ollama's ``num_gpu = N``).
    ``kv_budget_mib``: the MiB the KV may use on the failing device, the budget ``max_ctx_fit`` was computed against
    (free memory at the failure for a KV failure; that plus the device's own KV minus the compute buffer for a compute
    failure). ``kv_share``: the fraction of the KV on the failing device (per-device KV buffer lines).
    ``mem_limit_mib`` / ``mem_limit_what``: the per-process memory limit the bundle records (command.limits:
    ``ulimit -v``/``-d``, ``prlimit --as``, docker ``--memory``; else host.memory_limit_mib / address_space_limit_mib)
    that a refused host allocation ran into, and its words ("ulimit -v 600000 (586 MiB of address space)").
    ``n_ctx_rounded``: N from llama.cpp's ``n_ctx is not divisible by n_seq_max - rounding down to N`` warning.
    ``kv_headroom_mib`` / ``kv_headroom_why``: for a KV failure, what was kept out of ``kv_budget_mib`` for the compute
    buffer (the one the log printed for the device, else llama.cpp's --fit margin of 1024 MiB) and why.
    """

    engine: str = "unknown"
    phase: str = "unknown"
    backend: str = "unknown"
    verdict: str = "unknown"
    failing_device: str | None = None
    requested_mib: float | None = None
    free_mib: float | None = None
    free_at_failure_mib: float | None = None
    command: dict | None = None
    flags: dict = field(default_factory=dict)
    n_ctx: int | None = None
    n_ctx_requested: int | None = None
    n_ctx_train: int | None = None
    n_seq: int | None = None
    kv_unified: bool | None = None
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    flash_attn: bool | None = None
    n_ubatch: int | None = None
    n_batch: int | None = None
    swa_full: bool = False
    n_layer: int | None = None
    kv_mib: float | None = None
    max_ctx_fit: dict | None = None
    kv_at: object = None
    n_devices: int = 0
    kv_update: bool = False
    alloc_limit: bool = False
    offloaded_layers: int | None = None
    vllm: dict = field(default_factory=dict)
    sglang: dict = field(default_factory=dict)
    tgi: dict = field(default_factory=dict)
    weak: bool = False
    has_memory_event: bool = False
    kv_basis: str | None = None
    n_gpu_layers_log: int | None = None
    kv_budget_mib: float | None = None
    kv_share: float = 1.0
    kv_headroom_mib: float | None = None
    n_ctx_rounded: int | None = None
    mem_limit_mib: float | None = None
    mem_limit_what: str | None = None
    kv_headroom_why: str | None = None
    oom_rule: str | None = None
    """The failure-layer rule (kvreport.logs.oom) that placed the failure, when no engine rule did."""
    working_set: bool = False
    """A Metal command buffer failed for memory while the graph ran (the whole working set, not one buffer)."""
    py_stage: str | None = None
    """The start-up step of a Python engine in which a torch OOM was raised (kvreport.logs.oom.STAGES)."""
    kv_examples_fit: list = field(default_factory=list)
    """Without the model: (example shape, largest context in tokens whose f16 KV fits the budget) for the
    well-known shapes of kvreport.analyze.KV_EXAMPLES, shown as examples, never as the user's model."""


def _mib(x: float | None) -> str:
    if x is None:
        return "?"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.2f}"


def _pow2_below(n: int) -> int:
    return 1 << max(8, int(math.log2(max(n, 256))))


def _dev_index(name: str | None) -> int | None:
    if not name:
        return None
    digits = "".join(ch for ch in name if ch.isdigit())
    return int(digits) if digits and name[-1].isdigit() else None


class _Builder:
    def __init__(self, s: Situation):
        self.s = s
        self.items: list[tuple[float, dict]] = []
        self.seen: set[str] = set()

    def add(self, rank: float, sid: str, title: str, change: dict, expected: str, why: str) -> None:
        if sid in self.seen:
            return
        self.seen.add(sid)
        self.items.append((rank, {"id": sid, "title": title, "change": change,
                                  "command": _command(self.s, change), "expected": expected, "why": why}))

    def result(self, limit: int) -> list[dict]:
        self.items.sort(key=lambda t: t[0])
        return [d for _r, d in self.items[:limit]]


def _command(s: Situation, change: dict) -> str | None:
    if not s.command or not (s.command.get("argv") or s.command.get("line")):
        return None
    flag_changes = {k: v for k, v in change.items() if k.startswith("-") or k.isupper()}
    if not flag_changes:
        return None
    try:
        from kvreport.cmdline import with_changes

        return with_changes(s.command, flag_changes)
    except Exception:  # noqa: BLE001 - a command we cannot rewrite still gets the change itself
        strict.check()
        return None


def _kv(s: Situation, **kw) -> float | None:
    if not callable(s.kv_at):
        return None
    try:
        return s.kv_at(**kw)
    except Exception:  # noqa: BLE001
        strict.check()
        return None


def _is_ollama(s: Situation) -> bool:
    return s.engine == "ollama"


def _ctx_change(s: Situation, n: int) -> dict:
    return {"OLLAMA_CONTEXT_LENGTH": n} if _is_ollama(s) else {"--ctx-size": n}


# ------------------------------------------------------------------ llama.cpp family rules

def _reduce_ctx(b: _Builder, rank: float) -> None:
    """reduce-ctx with the number that justifies it.

    * ``max_ctx_fit`` known (the largest n_ctx, a multiple of 256, whose KV fits the KV budget of the failing device —
      ``Situation.kv_budget_mib``) and below the current context: that number, and the text says it is the fit.
    * The current context above the model's training context (``n_ctx_train``, GGUF ``<arch>.context_length``) and the
      fit above n_ctx_train (or unknown): n_ctx_train, and the text says so — a context beyond n_ctx_train needs RoPE
      scaling (llama.cpp ``--rope-scaling yarn``), so kvreport does not suggest one — giving the fit as well when known
      ("up to N tokens would fit in memory").
    * The current KV already fits (``fits_but_failed``) and the context is within n_ctx_train: no reduce-ctx (the
      context is not what went wrong).
    * ``max_ctx_fit`` is 0 (not even the smallest context fits, e.g. 256 cells per parallel slot): no reduce-ctx.
    * Neither known: half the current context rounded down to a power of two, labelled as a starting point.

    Without any basis for a number (no context size in the log or the command) the change carries no value and the
    text says so (design.md: no invented numbers). The ``expected`` text gives the KV at the new context computed by
    ``Situation.kv_at`` (kvreport.kvcache arithmetic) against the same budget ``max_ctx_fit`` used.
    """
    s = b.s
    cur = s.n_ctx or s.n_ctx_requested
    if not cur:
        if s.phase in ("kv_cache", "context") or s.kv_update:
            flag = "OLLAMA_CONTEXT_LENGTH" if _is_ollama(s) else "--ctx-size / -c"
            b.add(rank, "reduce-ctx", "Ask for a smaller context", {},
                  f"the log shows neither the context size nor the KV cost per token, so no value can be computed: "
                  f"lower {flag} step by step (the KV shrinks in proportion)",
                  "The KV cache is n_ctx tokens x bytes per token; a smaller context is the first lever (playbook "
                  "step 1). Run kvreport with the command line (or the model file) to get the exact number.")
        return
    if s.kv_basis is None and s.kv_examples_fit and s.phase in ("kv_cache", "context"):
        ex = "; ".join(f"{name}: about {_tok(n)} tokens" for name, n in s.kv_examples_fit)
        b.add(rank, "reduce-ctx", "Ask for a much smaller context", {},
              f"the model is not known, so no value is computed for it; for scale, the largest context whose f16 KV "
              f"fits {_mib(s.kv_budget_mib)} MiB is, for example shapes (not your model): {ex}",
              "The KV cache is n_ctx tokens x bytes per token; a smaller context is the first lever (playbook step 1). "
              "Give kvreport the model (--model FILE.gguf) or the command line to get the exact number.")
        return
    basis = " (per-token cost derived from the failed KV buffer)" if s.kv_basis == "failed_buffer" else ""
    fit = (s.max_ctx_fit or {}).get(_type_key(s.cache_type_k))
    train = s.n_ctx_train if s.n_ctx_train and s.n_ctx_train > 0 else None
    budget = s.kv_budget_mib if s.kv_budget_mib is not None else s.free_at_failure_mib
    dev = s.failing_device or "the failing device"
    if s.phase == "compute_buffer" and s.kv_budget_mib is not None:
        room = f"the {_mib(budget)} MiB {dev} has for the KV once the {_mib(s.requested_mib)} MiB compute buffer fits"
    elif s.kv_headroom_mib:
        room = (f"the {_mib(budget)} MiB left on {dev} once {s.kv_headroom_why or _mib(s.kv_headroom_mib) + ' MiB'} "
                "is kept free (llama.cpp allocates the compute buffer on the same device right after the KV)")
    else:
        room = f"the {_mib(budget)} MiB left on {dev}"
    if budget is not None and budget <= 0:
        return  # nothing is left for the KV on that device: other rules apply (e.g. raise-memory-limit)
    if fit is not None and fit <= 0:
        return  # no context fits (the minimum cells per sequence alone exceed the budget): other rules apply
    if fit and fit < cur and not (train and cur > train and fit > train):
        target = fit
        why_num = f"the largest -c (a multiple of 256) whose KV fits {room}{basis}"
    elif train and cur > train:
        target = train
        why_num = "the model's training context (n_ctx_train)"
        if fit:
            why_num += (f"; up to {_tok(fit)} tokens would fit in memory ({room}), but a context above n_ctx_train "
                        "needs RoPE scaling (--rope-scaling yarn) and may lose quality, so kvreport does not suggest one")
            if fit >= cur:
                why_num += ("; the current KV already fits, so this only makes the allocation that was refused "
                            "smaller")
        else:
            why_num += "; the log does not show the free memory of the failing device, so whether it fits is not known"
    elif fit:
        return  # the current context already fits: the context is not what failed
    else:
        target = _pow2_below(cur // 2) if cur > 512 else None
        unknown = ("the KV cost per token is not known" if budget is not None
                   else "the log does not show the free memory of the failing device")
        why_num = f"half the current context, rounded down to a power of two: a starting point, since {unknown}"
    if not target or target >= cur:
        return
    kv_new = _kv(s, n_ctx=target)
    if kv_new is not None and s.kv_mib and kv_new >= s.kv_mib * 0.99:
        return  # the context is not what sizes this cache (e.g. 256 cells per slot already)
    expected = (f"KV {_mib(kv_new)} MiB{_of_budget(s, budget)} (now {_mib(s.kv_mib)} MiB at n_ctx {_tok(cur)}){basis}"
                if kv_new is not None else f"context {_tok(target)} instead of {_tok(cur)}")
    if fit and target == train and fit > target:
        expected += f"; up to {_tok(fit)} tokens would fit"
    b.add(rank, "reduce-ctx", f"Lower the context to {target} tokens", _ctx_change(s, target), expected,
          f"The KV cache grows linearly with the context; {_tok(target)} is {why_num}. The number after -c is tokens, "
          "not bytes, and the model's advertised maximum is not a promise that it fits (playbook step 1).")


def _tok(n: int | None) -> str:
    """A token count as text, with thousands separators (8,225,280)."""
    return "?" if n is None else f"{int(n):,}"


def _of_budget(s: Situation, budget: float | None) -> str:
    """ " of Y MiB free" for an ``expected`` text: the KV budget of the failing device max_ctx_fit used."""
    if budget is None:
        return ""
    what = "available for the KV" if (s.phase == "compute_buffer" and s.kv_budget_mib is not None) \
        or s.kv_headroom_mib else "free"
    if s.kv_share and s.kv_share < 0.999:
        return f" in total, {s.kv_share:.0%} of it on {s.failing_device} within its {_mib(budget)} MiB {what}"
    if s.kv_headroom_mib and not (s.phase == "compute_buffer" and s.kv_budget_mib is not None):
        return (f" of {_mib(budget)} MiB {what} ({_mib(budget + s.kv_headroom_mib)} MiB free less "
                f"{_mib(s.kv_headroom_mib)} MiB kept for the compute buffer)")
    return f" of {_mib(budget)} MiB {what}"


def _type_key(t: str | None) -> str:
    return t if t in ("f16", "q8_0", "q4_0") else "f16"


def _reduce_parallel(b: _Builder, rank: float) -> None:
    """reduce-parallel: one slot instead of ``n_seq``.

    The KV at one slot is computed for the context the user asked for (``n_ctx_requested``, from the command). When
    that is unknown and the log has llama.cpp's per-slot rounding warning (``n_ctx is not divisible by n_seq_max -
    rounding down to N``: each slot was padded UP to a multiple of 256 cells, so -c was at most N and above
    N - 256 * n_seq), the expected KV is given as that range. Without either, a suggestion whose KV at one slot is
    the current KV (it would save nothing) is dropped.
    """
    s = b.s
    if not s.n_seq or s.n_seq <= 1:
        return
    req = s.n_ctx_requested
    change = {"OLLAMA_NUM_PARALLEL": 1} if _is_ollama(s) else {"--parallel": 1}
    rounded = s.n_ctx_rounded if not req and s.n_ctx_rounded else None
    if rounded:
        lo = max(1, rounded - 256 * s.n_seq + 1)
        kv_lo, kv_hi = _kv(s, n_seq=1, n_ctx=lo), _kv(s, n_seq=1, n_ctx=rounded)
        expected = (f"KV between {_mib(kv_lo)} and {_mib(kv_hi)} MiB with 1 slot, depending on the -c you gave "
                    f"(now {_mib(s.kv_mib)} MiB with {s.n_seq} slots)" if kv_lo is not None and kv_hi is not None
                    else f"1 sequence instead of {s.n_seq}")
        b.add(rank, "reduce-parallel", f"Use 1 parallel slot instead of {s.n_seq}", change, expected,
              f"With {s.n_seq} slots and a non-unified cache each slot gets n_ctx/{s.n_seq} cells rounded UP to 256 "
              f"(llama.cpp's warning says 'rounding down to {rounded}'), so the log shows only the rounded n_ctx "
              f"{rounded}: the -c given was between {lo} and {rounded} tokens. With one slot the KV is sized for -c "
              "itself (playbook step 2).")
        return
    kv_new = _kv(s, n_seq=1, n_ctx=req or s.n_ctx)
    if not req and kv_new is not None and s.kv_mib and kv_new >= s.kv_mib * 0.99:
        return  # the requested -c is unknown and one slot at the same n_ctx saves nothing
    kv_unified = _kv(s, kv_unified=True, n_ctx=req or s.n_ctx)
    alt = ""
    if not _is_ollama(s) and s.kv_unified is False and kv_unified is not None:
        alt = f" Keeping {s.n_seq} slots with --kv-unified (one shared stream) would need {_mib(kv_unified)} MiB."
    b.add(rank, "reduce-parallel", f"Use 1 parallel slot instead of {s.n_seq}", change,
          f"KV {_mib(kv_new)} MiB (now {_mib(s.kv_mib)} MiB with {s.n_seq} slots)" if kv_new is not None
          else f"1 sequence instead of {s.n_seq}",
          (f"With {s.n_seq} slots and a non-unified cache each slot gets n_ctx/{s.n_seq} cells rounded UP to 256, so "
           f"-c {req} became {s.n_ctx} cells (playbook step 2).{alt}") if req else
          (f"With {s.n_seq} slots each slot holds its own share of the {s.n_ctx} cells; one slot gives one sequence "
           f"the whole context (playbook step 2).{alt}"))


def _quantize(b: _Builder, rank: float) -> None:
    s = b.s
    if (s.cache_type_k or "f16") not in ("f16", "f32", "bf16") and (s.cache_type_v or "f16") not in ("f16", "f32", "bf16"):
        return
    kv_new = _kv(s, cache_type="q8_0")
    if _is_ollama(s):
        change = {"OLLAMA_KV_CACHE_TYPE": "q8_0", "OLLAMA_FLASH_ATTENTION": 1}
    else:
        change = {"--cache-type-k": "q8_0", "--cache-type-v": "q8_0", "--flash-attn": "on"}
    fit = (s.max_ctx_fit or {}).get("q8_0")
    extra = f"; up to {_tok(fit)} tokens would fit at q8_0" if fit else ""
    budget = s.kv_budget_mib if s.kv_budget_mib is not None else s.free_at_failure_mib
    if kv_new is not None and budget is not None and s.phase in ("kv_cache", "compute_buffer") \
            and kv_new * (s.kv_share or 1.0) > budget:
        # say so when q8_0 alone is not enough at this context (the numbers must not read as a fix)
        extra = (f"; still more than the {_mib(budget)} MiB {s.failing_device or 'the device'} has for it at this "
                 f"context, so combine it with a smaller context" + extra)
    b.add(rank, "quantize-kv-cache", "Store the KV cache as q8_0", change,
          (f"KV {_mib(kv_new)} MiB instead of {_mib(s.kv_mib)} MiB{extra}" if kv_new is not None
           else "about half the KV bytes of f16"),
          "q8_0 stores 34 bytes per 32 values (1.06 B/value) against 2 for f16; a quantized V cache needs "
          "flash attention (playbook step 3).")


def _headroom(b: _Builder, rank: float) -> None:
    s = b.s
    if s.backend in ("cpu", "unknown") or _is_ollama(s):
        return
    kv = s.kv_mib
    b.add(rank, "kv-cache-on-host", "Keep the KV cache in host memory", {"--no-kv-offload": True},
          f"frees the KV ({_mib(kv)} MiB) from {s.failing_device or 'the GPU'}; decoding gets slower" if kv
          else "the KV cache moves to host RAM; decoding gets slower",
          "--no-kv-offload puts every layer's K/V in host memory, leaving device memory to weights and compute "
          "buffers (playbook step 4).")


def _reduce_layers(b: _Builder, rank: float, requested: float | None = None) -> None:
    s = b.s
    cur = s.flags.get("n_gpu_layers")
    if not isinstance(cur, int) and s.n_gpu_layers_log:
        cur = s.n_gpu_layers_log
    n = None
    if isinstance(cur, int) and 0 < cur < 900:
        n = max(0, int(cur * 0.75))
    elif s.offloaded_layers:
        n = max(0, int(s.offloaded_layers * 0.75))
    elif s.n_layer:
        if requested and s.free_at_failure_mib and requested > 0:
            n = max(0, min(s.n_layer, int(s.n_layer * s.free_at_failure_mib / requested * 0.9)))
        else:
            n = s.n_layer // 2
    where = "PARAMETER num_gpu in the Modelfile or the num_gpu request option" if _is_ollama(s) else "-ngl"
    if n is None:
        # no layer count in the log or the command: no number to justify, so the change carries none
        b.add(rank, "reduce-gpu-layers", "Offload fewer layers to the GPU", {},
              f"each layer kept on the host frees its weights and its KV from {s.failing_device or 'the GPU'}; the "
              f"log shows no layer count, so lower {where} step by step",
              f"Fewer GPU layers ({where}) leave device memory for the KV cache and compute buffers; the KV of host "
              "layers lives in host memory (playbook step 4).")
        return
    change = {"num_gpu": n} if _is_ollama(s) else {"--n-gpu-layers": n}
    b.add(rank, "reduce-gpu-layers", f"Offload fewer layers to the GPU ({n})", change,
          f"each layer kept on the host frees its weights and its KV from {s.failing_device or 'the GPU'}",
          f"Fewer GPU layers ({where}) leave device memory for the KV cache and compute buffers; the KV of host "
          "layers lives in host memory (playbook step 4).")


def _rebalance(b: _Builder, rank: float) -> None:
    s = b.s
    idx = _dev_index(s.failing_device)
    n = max(s.n_devices, (idx + 1) if idx is not None else 0)
    if n < 2 or idx is None:
        return
    split = ["1"] * n
    split[idx] = "0.5"
    b.add(rank, "rebalance-devices", f"Move load off {s.failing_device}", {"--tensor-split": ",".join(split)},
          f"{s.failing_device} gets about half its current share of layers (and their KV and compute)",
          f"Each allocation lands on one device: {s.failing_device} ran out although the others may have room. "
          "Give it a smaller --tensor-split share or move tensors off it with -ot (playbook step 5).")


def _reduce_batch(b: _Builder, rank: float) -> None:
    s = b.s
    ub = s.n_ubatch or 512
    new_ub = max(64, ub // 2 if ub > 512 else 256)
    change = {"num_batch": new_ub} if _is_ollama(s) else {"--ubatch-size": new_ub}
    if not _is_ollama(s) and s.n_batch and s.n_batch > 2048:
        change["--batch-size"] = max(new_ub, 2048)
    b.add(rank, "reduce-batch", f"Lower the micro-batch to {new_ub}", change,
          f"the compute buffer shrinks roughly in proportion to -ub ({ub} -> {new_ub})",
          "Compute (graph) buffers hold activations for n_ubatch tokens at a time; -ub is their main size lever.")


def _flash(b: _Builder, rank: float) -> None:
    s = b.s
    if s.flash_attn is False:
        change = {"OLLAMA_FLASH_ATTENTION": 1} if _is_ollama(s) else {"--flash-attn": "on"}
        b.add(rank, "enable-flash-attn", "Turn flash attention on", change,
              "the attention score tensor (n_head x n_kv x n_ubatch x 4 bytes) is no longer materialised",
              "Without flash attention the compute buffer grows with the context; with it the growth is small.")


def _alloc_limit(b: _Builder, rank: float) -> None:
    s = b.s
    ub = s.n_ubatch or 512
    new_ub = max(64, ub // 2 if ub > 512 else 256)
    b.add(rank, "work-around-alloc-limit", "Keep each single allocation under the backend's limit",
          {"--ubatch-size": new_ub},
          f"a compute buffer about {ub // new_ub}x smaller than {_mib(s.requested_mib)} MiB",
          f"The {s.backend} driver refused one allocation of {_mib(s.requested_mib)} MiB because it exceeds its "
          "per-allocation limit (e.g. Vulkan maxMemoryAllocationSize, often 4 GiB), not because memory ran out; "
          "smaller -ub / -c keep the compute buffer under it (playbook step 6).")


def _free_memory(b: _Builder, rank: float) -> None:
    s = b.s
    free = s.free_at_failure_mib if s.free_at_failure_mib is not None else s.free_mib
    if s.verdict == "fits_but_failed" and s.requested_mib is not None and free is not None:
        b.add(rank, "free-device-memory", f"Free memory on {s.failing_device or 'the device'}", {},
              f"{_mib(s.requested_mib)} MiB needed and {_mib(free)} MiB were free when measured; memory taken since "
              "(another process, another model) would explain the refusal",
              "The free memory kvreport knows was measured before the failure; other processes may have taken it in "
              "between. Check what runs on the device (nvidia-smi, rocm-smi) and run one model at a time.")
        return
    b.add(rank, "free-device-memory", f"Free memory on {s.failing_device or 'the device'}", {},
          (f"{_mib(s.requested_mib)} MiB needed, {_mib(free)} MiB free" if s.requested_mib is not None and free is not None
           else f"{_mib(s.requested_mib)} MiB more must be free" if s.requested_mib is not None
           else "more free memory for the same configuration"),
          "Other processes (another model, a desktop, earlier runs) hold memory on this device; stop them or run one at a time.")


def _is_host(s: Situation) -> bool:
    """True when the failed buffer is in host memory (the CPU backend, or a ``<backend>_Host`` pinned buffer)."""
    dev = s.failing_device or ""
    return s.backend == "cpu" or dev.startswith("CPU") or dev.endswith("_Host")


def _host_cap_failure(s: Situation) -> bool:
    """A host buffer refused although it fits the RAM the log reported (verdict ``fits_but_failed``), or under a
    recorded per-process memory limit (verdict ``exceeds_alloc_limit`` with ``mem_limit_mib``)."""
    return (s.verdict == "fits_but_failed" or (s.verdict == "exceeds_alloc_limit" and s.mem_limit_mib is not None)) \
        and _is_host(s)


_ULIMIT = re.compile(r"ulimit\s+(?:-\w*\s+)*-(?:[a-zA-Z]*v)\s+(\d+)")


def _command_text(s: Situation) -> str:
    c = s.command or {}
    if c.get("line"):
        return str(c["line"])
    return " ".join(str(a) for a in c.get("argv") or [])


def _raise_memory_limit(b: _Builder, rank: float) -> None:
    """raise-memory-limit: a host (CPU) allocation well under the host's RAM failed.

    When ggml's CPU allocator (``ggml_aligned_malloc: insufficient memory``, ``ggml_backend_cpu_buffer_type_alloc_buffer:
    failed to allocate buffer of size N``, ggml/src/ggml.c and ggml-backend.cpp) is refused a buffer far smaller than the
    RAM the log reported (llama.cpp's device list ``CPU : ... (T MiB, F MiB free)`` or the fit's ``MiB of total host
    memory``), the machine has the memory and the process may not use it: a per-process address-space limit
    (``ulimit -v``, RLIMIT_AS — it counts mmap'd weights and every buffer), a cgroup/container limit
    (``/sys/fs/cgroup/memory.max``, docker ``--memory``, Kubernetes limits), strict overcommit
    (``vm.overcommit_memory = 2``) or, for pinned ``*_Host`` buffers, the locked-memory limit (``ulimit -l``); or other
    processes took the RAM after it was measured. No engine flag changes that, so ``change`` is empty; when the command
    itself sets ``ulimit -v N`` (KiB) the text names it. This is the first suggestion for that situation: the local
    cases loc-21/23/26/41/56 are real llama.cpp runs under ``ulimit -v`` (their expected.json leave
    ``top_suggestions_ok`` empty, so the ranking there is judged by this reasoning, not by a label). A regression
    (bisect-regression) stays the suggestion for GPU backends whose request fits the device's free memory.
    """
    s = b.s
    dev = s.failing_device or "CPU"
    left = s.free_at_failure_mib
    ram = s.free_mib if s.free_mib is not None else left
    nums = f"{_mib(s.requested_mib)} MiB requested on {dev}"
    if ram is not None:
        nums += f"; the log reported {_mib(ram)} MiB of host memory free"
        if left is not None and abs(left - ram) >= 1:
            nums += f" ({_mib(left)} MiB left after the buffers already allocated)"
    m = _ULIMIT.search(_command_text(s))
    if s.mem_limit_mib is not None and s.mem_limit_what:
        nums = (f"the process is capped by {s.mem_limit_what}, which counts the whole process (program, weights, KV "
                f"and compute buffers); " + nums)
    elif m:
        kib = int(m.group(1))
        nums = (f"the command caps the process with ulimit -v {kib} ({_mib(kib / 1024)} MiB of address space for the "
                f"whole process: program, weights, KV and compute buffers); " + nums)
    pinned = " and `ulimit -l` (locked memory, which pinned host buffers use)" if dev.endswith("_Host") else ""
    b.add(rank, "raise-memory-limit", "Raise the process's memory limit", {},
          nums + "; without the cap the allocation fits",
          f"A host allocation far smaller than the machine's RAM was refused, so the process is capped, not the machine: "
          f"check `ulimit -v` (RLIMIT_AS counts every mapping, mmap'd weights included){pinned}, "
          "`cat /sys/fs/cgroup/memory.max` (a container or cgroup limit: docker --memory, Kubernetes limits) and "
          "`cat /proc/sys/vm/overcommit_memory` (2 = strict accounting), and whether other processes took the RAM; "
          "raise or remove the limit (a smaller context or batch only hides it).")


def _bisect(b: _Builder, rank: float) -> None:
    s = b.s
    b.add(rank, "bisect-regression", "Check a known-good build", {},
          f"{_mib(s.requested_mib)} MiB requested with {_mib(s.free_at_failure_mib)} MiB free should have fit",
          "When the request is well under the free memory, suspect a backend limit or a regression: try the same "
          "configuration on an older build or another backend and report the known-good commit (playbook step 7).")


def _smaller_model(b: _Builder, rank: float) -> None:
    why = ("The weights were refused although they fit the free memory the log reported; a smaller model only helps "
           "under the same limit." if b.s.verdict == "fits_but_failed"
           else "The weights alone do not fit the memory available for them.")
    b.add(rank, "smaller-model-or-quant", "Use a smaller model or a smaller quantization", {},
          "weights shrink with the quantization (e.g. Q4_K_M is about 60 % of Q8_0)", why)


def _llama_rules(b: _Builder) -> None:
    s = b.s
    host_cap = _host_cap_failure(s)
    if host_cap and (s.phase in ("kv_cache", "context", "compute_buffer", "model_weights")
                     or (s.phase == "unknown" and s.has_memory_event)):
        _raise_memory_limit(b, -1)
    if s.phase in ("kv_cache", "context"):
        inflated = (s.n_seq or 1) > 1 and s.kv_unified is False and s.n_ctx and s.n_ctx_requested \
            and s.n_ctx > s.n_ctx_requested * 1.25
        if s.swa_full:
            kv_new = _kv(s, swa_full=False)
            b.add(0, "disable-swa-full", "Drop --swa-full", {"--swa-full": None},
                  f"KV {_mib(kv_new)} MiB instead of {_mib(s.kv_mib)} MiB" if kv_new else "the SWA layers keep only their window",
                  "--swa-full gives sliding-window layers a full-length cache; without it they keep n_swa + n_ubatch cells.")
        if inflated:
            _reduce_parallel(b, 0.5)
        if _is_ollama(s) and s.n_gpu_layers_log and s.phase == "context":
            # Ollama's layout step names the layer count it could not place ("with num_gpu = N")
            _reduce_layers(b, 0.7)
        _reduce_ctx(b, 1)
        if not inflated and s.kv_unified is False and (s.n_seq or 1) > 1:
            _reduce_parallel(b, 2)
        _quantize(b, 3)
        if s.verdict == "fits_but_failed" and not host_cap:
            _bisect(b, 2.5)
        _headroom(b, 4)
        _rebalance(b, 5)
        if not host_cap:
            _free_memory(b, 6)
    elif s.phase == "compute_buffer" and s.working_set:
        # Metal: a command buffer ran out while the graph ran (weights + KV + compute over the working set): shrink
        # the biggest part the numbers show, the context when it is large, else the layers on the GPU
        big_ctx = (s.n_ctx or 0) >= 8192 or (s.kv_mib or 0) >= 1024
        _reduce_ctx(b, 0 if big_ctx else 1)
        _reduce_layers(b, 1 if big_ctx else 0)
        _smaller_model(b, 2)
        _reduce_batch(b, 3)
    elif s.phase == "compute_buffer":
        idx = _dev_index(s.failing_device)
        if (s.alloc_limit or s.verdict == "exceeds_alloc_limit") and not host_cap and s.oom_rule != "ggml-pool":
            _alloc_limit(b, 0)
            _reduce_batch(b, 1)
            _reduce_ctx(b, 2)
        if s.kv_update:
            _reduce_ctx(b, 0)
        if _is_ollama(s):
            _reduce_layers(b, 0.5)
        if idx and idx > 0 and s.backend != "cpu":
            _rebalance(b, 0.7)
        _reduce_batch(b, 1)
        _flash(b, 1.5)
        _reduce_ctx(b, 2)
        if s.backend not in ("cpu",):
            _reduce_layers(b, 3)
        if s.verdict == "fits_but_failed" and not host_cap:
            _bisect(b, 4)
        if not host_cap:
            _free_memory(b, 5)
    elif s.phase == "model_weights":
        if s.backend not in ("cpu", "unknown") and not (s.failing_device or "").endswith("_Host"):
            _reduce_layers(b, 0, s.requested_mib)
            _rebalance(b, 2)
        _smaller_model(b, 1)
        if not host_cap:
            _free_memory(b, 3)
    elif s.phase == "memory_budget":
        # Ollama's check before it starts a runner: the model (weights + KV + graph) does not fit the free memory. A
        # small gap is closed by a smaller context; a model several times the free memory needs a smaller model.
        near = s.requested_mib is not None and s.free_mib and s.requested_mib <= 1.5 * s.free_mib
        _smaller_model(b, 1 if near else 0)
        _reduce_ctx(b, 0 if near else 1)
        _free_memory(b, 2)
    elif s.phase == "kv_capacity":
        # the KV cache is full at run time (no slot for the batch): each parallel slot holds n_ctx / n_parallel
        _reduce_parallel(b, 0)
        _reduce_batch(b, 1)
    elif s.phase == "unknown" and s.has_memory_event and (s.n_ctx or 0) >= 32768:
        _reduce_ctx(b, 0)
        _quantize(b, 1)
        if s.backend not in ("cpu", "unknown"):
            _reduce_layers(b, 2, s.requested_mib)
        _free_memory(b, 5)
    elif s.phase == "unknown" and s.has_memory_event:
        if (s.n_ubatch or 0) >= 2048:
            _reduce_batch(b, 0)
            if s.backend == "vulkan":
                _alloc_limit(b, 1)
            _reduce_ctx(b, 2)
        else:
            if s.backend not in ("cpu",):
                _reduce_layers(b, 0, s.requested_mib)
            _reduce_ctx(b, 1)
            if s.backend == "vulkan":
                _alloc_limit(b, 2)
        _free_memory(b, 5)


# ------------------------------------------------------------------ vLLM / SGLang / TGI / others

def _py_engine_rules(b: _Builder) -> None:
    s = b.s
    v = s.vllm or {}
    sg = s.engine == "sglang"
    util = s.flags.get("mem_fraction_static" if sg else "gpu_memory_utilization")
    util_flag = "--mem-fraction-static" if sg else "--gpu-memory-utilization"
    len_flag = "--context-length" if sg else "--max-model-len"
    seqs_flag = "--max-running-requests" if sg else "--max-num-seqs"
    max_len = s.flags.get("context_length" if sg else "max_model_len") or v.get("max_model_len")
    if s.phase == "memory_budget":
        gate = v.get("gate") or {}
        _free_memory(b, 0)
        if gate.get("free_mib") and gate.get("total_mib"):
            new_util = math.floor((gate["free_mib"] / gate["total_mib"] - 0.02) * 100) / 100
            b.add(1, "lower-gpu-memory-utilization", f"Lower {util_flag} to {new_util}", {util_flag: new_util},
                  f"{_mib(gate['total_mib'] * new_util)} MiB budget of {_mib(gate['free_mib'])} MiB free",
                  "vLLM refuses to start when the device has less free memory than utilization x total; a lower "
                  "fraction fits next to the other processes (with a smaller KV pool).")
        return
    if s.phase in ("kv_capacity", "kv_cache"):
        avail = v.get("available_kv_mib")
        negative = avail is not None and avail <= 0
        cur_util = util if isinstance(util, (int, float)) else (0.9 if not sg else None)
        # vLLM's default is 0.9; SGLang computes its own when unset, so without the value there is no number
        raise_change = {util_flag: round(min(0.95, cur_util + 0.05), 2)} if cur_util else {}
        if negative:
            b.add(0, "raise-gpu-memory-utilization", f"Raise {util_flag}", raise_change,
                  f"the KV pool was {_mib(avail)} MiB: weights and activations used the whole budget",
                  "The KV pool is what is left of utilization x total after weights and the profiled peak; "
                  "with nothing left, only a larger budget (or smaller weights / more GPUs) helps.")
            _smaller_model(b, 1)
            tp = s.flags.get("tensor_parallel_size") or 1
            b.add(2, "more-devices", "Spread the model over more GPUs", {"--tensor-parallel-size": int(tp) * 2},
                  "weights per GPU halve", "Tensor parallelism splits weights and KV heads across GPUs.")
            return
        target = v.get("estimated_max_len")
        if not target and v.get("pool_tokens"):
            target = int(v["pool_tokens"]) // 256 * 256
        if not target and s.requested_mib and s.free_mib and max_len:
            seqs = s.flags.get("max_num_seqs") or 1
            per_tok = s.requested_mib / (float(max_len) * float(seqs))
            target = int(s.free_mib / per_tok / float(seqs)) // 1024 * 1024 if per_tok > 0 else None
        if target and max_len and target < int(max_len):
            change = {len_flag: target}
            b.add(0, "reduce-max-model-len", f"Lower {len_flag} to {target}", change,
                  f"one request of {target} tokens fits the KV pool" + (f" ({_mib(avail)} MiB)" if avail else ""),
                  "The engine needs room for at least one request of the maximum length in its KV pool.")
        elif not sg:
            b.add(0, "reduce-max-model-len", f"Lower {len_flag}", {len_flag: int(max_len) // 2} if max_len else {},
                  "a shorter maximum request fits the KV pool", "The KV pool must hold one full-length request.")
        if sg:
            b.add(0.5, "raise-gpu-memory-utilization", f"Raise {util_flag}", raise_change,
                  "a larger static pool for KV tokens",
                  "SGLang sizes its token pool from --mem-fraction-static; the error asks for a larger fraction.")
        else:
            b.add(1, "raise-gpu-memory-utilization", f"Raise {util_flag}", raise_change,
                  "a larger KV pool from the same GPU", "The KV pool is utilization x total minus weights and activations.")
        seqs = s.flags.get("max_running_requests" if sg else "max_num_seqs")
        if seqs and int(seqs) > 1:
            b.add(1.5, "reduce-max-num-seqs", f"Lower {seqs_flag} to 1", {seqs_flag: 1},
                  "KV for one sequence instead of several", "Each concurrent sequence reserves its own KV.")
        b.add(2, "quantize-kv-cache", "Store the KV cache as fp8", {"--kv-cache-dtype": "fp8"},
              "half the KV bytes of bf16", "fp8 KV halves the bytes per token.")
        return
    if s.phase in ("compute_buffer", "unknown") and s.engine not in ("tgi",) and s.has_memory_event:
        _py_activation_rules(b, util, util_flag, len_flag, seqs_flag, max_len)
        return
    if s.phase == "compute_buffer" or (s.engine == "tgi" and s.phase == "unknown"):
        if s.engine == "tgi":
            cur = s.flags.get("max_batch_prefill_tokens")
            if not isinstance(cur, int):
                cur = (s.tgi or {}).get("prefill_tokens")  # "Not enough memory to handle N prefill tokens"
            new = int(cur) // 2 if isinstance(cur, int) and cur > 1 else 4096
            b.add(0, "reduce-batch", f"Lower --max-batch-prefill-tokens to {new}", {"--max-batch-prefill-tokens": new},
                  "a smaller warm-up prefill batch", "TGI warms up with a full prefill batch; it must fit next to the weights.")
        else:
            b.add(0, "reduce-batch", "Lower --max-num-batched-tokens", {"--max-num-batched-tokens": 2048},
                  "smaller activation peak during profiling", "The profiled activation peak grows with the batched tokens.")
        return
    if s.phase == "model_weights":
        _smaller_model(b, 0)
        tp = s.flags.get("tensor_parallel_size") or 1
        b.add(1, "more-devices", "Spread the model over more GPUs", {"--tensor-parallel-size": int(tp) * 2},
              "weights per GPU halve", "Tensor parallelism splits the weights across GPUs.")


def _py_activation_rules(b: _Builder, util, util_flag: str, len_flag: str, seqs_flag: str, max_len) -> None:
    """A torch OOM outside the KV pool (graph capture, profiling, warm-up, or a step the log does not name): the
    activations need room that utilization x total left to the pool. Shrink what the activations scale with
    (batched tokens, sequences, graph capture) and leave more memory outside the pool."""
    s = b.s
    sg = s.engine == "sglang"
    capture = s.py_stage == "compute_buffer" and s.phase == "compute_buffer"
    if s.phase == "unknown" and max_len:
        b.add(0, "reduce-max-model-len", f"Lower {len_flag} to {int(max_len) // 2}", {len_flag: int(max_len) // 2},
              "a shorter maximum request shrinks the KV pool and the largest activations",
              "Where the OOM was raised is not in the log; the maximum length sizes both the KV pool and the "
              "activations of the longest request.")
    batch_flag = "--chunked-prefill-size" if sg else "--max-num-batched-tokens"
    b.add(0 if capture or s.phase == "compute_buffer" else 1, "reduce-batch", f"Lower {batch_flag} to 2048",
          {batch_flag: 2048}, "a smaller activation peak per step",
          "Activations grow with the tokens processed in one step; graph capture also reserves memory per batch size "
          "(--enforce-eager / --cuda-graph-max-bs shrink that).")
    cur = util if isinstance(util, (int, float)) else (0.9 if not sg else None)
    if cur:
        new = round(max(0.5, cur - 0.05), 2)
        b.add(1, "lower-gpu-memory-utilization", f"Lower {util_flag} to {new}", {util_flag: new},
              f"{round((cur - new) * 100)} % of the GPU more outside the KV pool for activations and graphs",
              "The KV pool takes utilization x total; what torch needs beyond it must fit in the rest.")
    b.add(1.5, "reduce-max-num-seqs", f"Lower {seqs_flag} to 64", {seqs_flag: 64},
          "fewer sequences per step, smaller sampler and activation buffers",
          "Warm-up and sampling allocate per sequence of the largest batch.")


def suggest(s: Situation, limit: int = 4) -> list[dict]:
    """Ranked suggestions for a situation (at most ``limit``); [] when nothing failed or the
    failure is not about memory."""
    b = _Builder(s)
    if s.phase not in MEMORY_PHASES and not (s.phase == "unknown" and (s.has_memory_event or s.engine == "tgi")):
        return []
    flags = s.flags or {}
    py_like = s.engine in ("vllm", "sglang", "tgi", "lmdeploy") or (
        s.engine == "unknown" and (any(k in flags for k in ("max_model_len", "gpu_memory_utilization", "max_num_seqs"))
                                   or (s.oom_rule or "").startswith("torch")))
    if py_like:
        _py_engine_rules(b)
    else:
        _llama_rules(b)
    return b.result(limit)
