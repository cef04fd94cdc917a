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
from collections.abc import Callable
from dataclasses import dataclass, field

from kvreport import strict
from kvreport.logs.common import to_int
from kvreport.logs.oom import CRASH
from kvreport.units import MIB

SUGGESTION_IDS = (
    # design.md's vocabulary
    "reduce-ctx", "reduce-parallel", "quantize-kv-cache", "enable-flash-attn", "reduce-gpu-layers",
    "rebalance-devices", "free-device-memory", "kv-cache-on-host", "disable-swa-full", "work-around-alloc-limit",
    "bisect-regression", "raise-gpu-memory-utilization", "reduce-max-model-len", "reduce-max-num-seqs",
    "reduce-batch", "smaller-model-or-quant", "more-devices",
    # added here (design.md: "New ids may be added; none renamed"):
    "lower-gpu-memory-utilization",  # vLLM's start-up gate (memory_budget): utilization x total > free memory,
                                     # so the fraction must go DOWN to start next to other processes
    "raise-ctx",  # a request longer than the context (or the KV filled up while serving): the context must grow,
                  # computed from the request's tokens and checked against kvreport's own fit
    "shrink-cuda-graphs",  # an OOM while a Python engine captured its CUDA graphs: fewer / smaller graphs
                           # (vLLM --enforce-eager, SGLang --cuda-graph-max-bs or --disable-cuda-graph)
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
    when ``kv_basis`` is ``"failed_buffer"`` / ``"ollama_layout"``: the per-token cost derived from the failed KV buffer,
    or from the KV of Ollama's layout, and n_ctx).
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
    max_ctx_fit_now: int | None = None
    """The largest context whose KV fits at the cache types in use when K and V differ (-ctk q8_0 with an f16 V):
    :attr:`max_ctx_fit` holds same-type pairs only."""
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
    n_expert: int | None = None
    """Experts per layer of a mixture-of-experts model (llama.cpp's ``print_info: n_expert``)."""
    n_seq_known: bool = True
    """False when no log line or flag gave the parallel slots (n_seq is then the assumed 1)."""
    device_total_mib: float | None = None
    """The total memory of the failing device as the log gave it (a torch OOM's "total capacity", vLLM's gate)."""
    others_mib: float | None = None
    """MiB other processes held on the failing device when it failed (torch's process list)."""
    torch_oom: bool = False
    """The failure is torch's OutOfMemoryError as an engine parser read it (only Python engines raise it)."""
    engine_build: int | None = None
    """llama.cpp's build number as the log printed it ("build: 4589 (...)")."""
    request_tokens: int | None = None
    """Tokens of a request the engine refused (or could not fit) for its context, as its line gives them."""
    limit_tokens: int | None = None
    """The context (or maximum length) in tokens the refused request met, as the line gives it."""
    limit_setting: str | None = None
    """The engine setting that limit is, when the line names one other than its context setting (TGI's
    --max-input-tokens)."""
    split_room_mib: float | None = None
    """MiB the GPUs of the failing backend would have left together after the failed request (free at load less what
    the engine placed on them, less the request); below zero no --tensor-split places the load. None: not known."""
    running_seqs: int | None = None
    """The sequences the engine ran at once when it failed, as its line gives them (vLLM's sampler warm-up "with N
    dummy requests" is max_num_seqs)."""
    ollama_layer: dict | None = None
    """Ollama's refused layout on the failing GPU: {"layers", "per_layer_mib" (weights + KV of one layer), "graph_mib"}
    and "free_mib", what the device had for it ("inference compute ... available")."""
    ollama_version: str | None = None
    """Ollama's version as its log printed it ("Listening on ... (version 0.5.7)")."""
    ollama_service: bool = False
    """The log is the journal of Ollama's systemd unit ("ollama[PID]:", "Started ollama.service"): its settings are the
    unit's environment, not a command's."""
    min_cuda_compute: float | None = None
    """The lowest CUDA compute capability Ollama listed ("inference compute ... compute=6.1")."""
    draft_failed: bool = False
    """The failure came while llama-server loaded its speculative-decoding draft model (its context, KV, compute)."""
    graph_capture: bool = False
    """The engine was capturing CUDA graphs when it failed (kvreport.logs.facts.LogFacts.graph_capture)."""
    sampler_warmup: bool = False
    """vLLM's sampler warm-up ran out of memory ("CUDA out of memory occurred when warming up sampler with N dummy
    requests"), wherever the log placed the failure."""
    fa_auto_disabled: bool = False
    fa_logged: str | None = None
    """The flash_attn value the log printed ("llama_context: flash_attn = auto"; "0"/"1" on builds whose -fa took no
    value): one of :data:`_FA_WORDS` says the build reads -fa with a value, whatever build number the log printed."""
    """llama.cpp's "auto" flash attention was turned off for this model and backend ("Flash Attention was auto, set to
    disabled"): turning it on would be refused as well."""
    limit_seqs: int | None = None
    """The concurrent sequences an engine's state pool holds, as its refusal gives them (vLLM's "max_num_seqs (N)
    exceeds available Mamba cache blocks (M)")."""
    kv_estimate_mib: float | None = None
    final_error: str | None = None
    """The line that ended the run (the diagnosis's ``final_error``): for a failure that is not about memory, whether
    the engine crashed (:func:`crashed`)."""
    """The engine's own estimate of the KV cache in MiB, when it printed one (Ollama's ``memory.required.kv``)."""
    metal_plan: dict = field(default_factory=dict)
    """vllm-metal's budget breakdown (MiB; ``fraction`` as printed): metal_limit, model_memory, overhead, kv_budget."""


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
    """Collects suggestions; for an id given more than once the BEST (lowest) rank wins, with the text of the rule
    that gave it. Ties keep the order in which the rules were applied."""

    def __init__(self, s: Situation):
        self.s = s
        self.items: dict[str, tuple[float, int, dict]] = {}
        self.n = 0
        self.rule: str | None = None  # the RULES row being applied (for --explain)
        self.origin: dict[str, tuple[float, str | None]] = {}

    def add(self, rank: float, sid: str, title: str, change: dict, expected: str, why: str) -> None:
        self.n += 1
        old = self.items.get(sid)
        if old is not None and old[0] <= rank:
            return
        if str((self.s.command or {}).get("program") or "").startswith("llama_cpp."):
            change = _llama_cpp_python(change)
        if self.s.engine == "tgi":
            change = _tgi_launcher_rules(self.s, change)
        command = _command(self.s, change)
        if command and command.endswith(" ollama serve") and _ollama_client(self.s):
            user = _command_text(self.s)
            why += (f" These are the Ollama server's settings, not `{user}`'s: restart `ollama serve` with them (the "
                    f"command above), then run `{user}` again.")
            if isinstance(change.get("OLLAMA_CONTEXT_LENGTH"), int):
                why += (f" For this model alone, `/set parameter num_ctx {change['OLLAMA_CONTEXT_LENGTH']}` inside the "
                        "`ollama run` session (or the request's options.num_ctx) does the same without a restart.")
        if _borrowed_names(self.s, change):
            title += " (vLLM's name for it: the engine is not known, use its own setting of that name)"
            command = None
        self.items[sid] = (rank, self.n, {"id": sid, "title": title, "change": change,
                                          "command": command, "expected": expected, "why": why})
        self.origin[sid] = (rank, self.rule)

    def result(self, limit: int) -> list[dict]:
        return [d for _r, _n, d in sorted(self.items.values(), key=lambda t: (t[0], t[1]))[:limit]]


def _tgi_launcher_rules(s: Situation, change: dict) -> dict:
    """TGI's launcher refuses a command unless max_input_tokens < max_total_tokens and max_batch_prefill_tokens >=
    max_input_tokens (launcher/src/main.rs): a change that lowers one of them lowers --max-input-tokens with it,
    keeping the user's room for new tokens, so that the command is accepted when pasted."""
    if "--max-total-tokens" not in change and "--max-batch-prefill-tokens" not in change:
        return change
    out = dict(change)
    args = (s.tgi or {}).get("args") or {}
    max_in = out.get("--max-input-tokens") or to_int(s.flags.get("max_input_tokens") or s.flags.get(
        "max_input_length")) or args.get("max_input_tokens")
    max_total = to_int(s.flags.get("max_total_tokens")) or args.get("max_total_tokens")
    room = (max_total - max_in) if max_total and max_in and max_total > max_in else None
    total = out.get("--max-total-tokens")
    if isinstance(total, int) and total > 1 and max_in is not None and max_in >= total:
        max_in = max(1, total - room) if room and total - room >= total // 2 else total // 2
        out["--max-input-tokens"] = max_in
    prefill = out.get("--max-batch-prefill-tokens")
    if isinstance(prefill, int) and (max_in is None or max_in > prefill):
        out["--max-input-tokens"] = prefill  # (its default, from the model's positions, may be above it too)
        if max_total is not None and "--max-total-tokens" not in out and max_total <= prefill:
            out["--max-total-tokens"] = prefill + (room or 1024)
    return out


LLAMA_CPP_PYTHON_OPTIONS = {
    "--ctx-size": ("--n_ctx", None), "--n-gpu-layers": ("--n_gpu_layers", None), "--ubatch-size": ("--n_ubatch", None),
    "--batch-size": ("--n_batch", None), "--flash-attn": ("--flash_attn", {"on": "true", True: "true"}),
    "--cache-type-k": ("--type_k", {"f16": 1, "q8_0": 8, "q4_0": 2}),
    "--cache-type-v": ("--type_v", {"f16": 1, "q8_0": 8, "q4_0": 2}),
    "--no-kv-offload": ("--offload_kqv", {True: "false"}), "--tensor-split": ("--tensor_split", None),
    "--main-gpu": ("--main_gpu", None)}
"""llama-cpp-python's server (python -m llama_cpp.server, its ModelSettings) for llama-server's options: (its option,
value translation); type_k / type_v are ggml type ids (GGML_TYPE_F16 1, Q4_0 2, Q8_0 8). An option not listed has no
equivalent there and is left out of the change."""

_NO_REWRITE_PROGRAMS = ("llama_cpp.",)
"""Programs of an engine whose settings have other names than the engine's own program (llama-cpp-python's server
takes --n_ctx, --n_gpu_layers, not llama-server's -c, -ngl): their command is not rewritten, the change is given."""


def _ollama_unit_command(env: dict) -> str:
    """The OLLAMA_* settings as a drop-in of Ollama's systemd unit, applied and the service restarted (Ollama's FAQ:
    "Setting environment variables on Linux"), in one line to paste."""
    lines = "".join(f'Environment="{k}={v}"\\n' for k, v in env.items())
    # (one drop-in file per setting, so that applying a second suggestion does not undo the first)
    name = "kvreport-" + "-".join(k.lower().removeprefix("ollama_").replace("_", "-") for k in env) + ".conf"
    return ("sudo mkdir -p /etc/systemd/system/ollama.service.d && printf '[Service]\\n" + lines + "' | sudo tee "
            f"/etc/systemd/system/ollama.service.d/{name} >/dev/null && sudo systemctl daemon-reload && "
            "sudo systemctl restart ollama")


def _borrowed_names(s: Situation, change: dict) -> bool:
    """A change spelled in vLLM's options for an engine kvreport does not know (a torch OOM of another program): the
    idea carries over, the flag name does not, so no command is rewritten with it."""
    if s.engine != "unknown" or family_of(s) != PYTHON:
        return False
    own = {str(k).lstrip("-").replace("-", "_") for k in (s.flags or {})}
    return any(k.startswith("--") and k.lstrip("-").replace("-", "_") not in own for k in change)


def _llama_cpp_python(change: dict) -> dict:
    """A llama-server-spelled change in llama-cpp-python's server options (:data:`LLAMA_CPP_PYTHON_OPTIONS`)."""
    out = {}
    for k, v in change.items():
        if k not in LLAMA_CPP_PYTHON_OPTIONS:
            if not k.startswith("-"):
                out[k] = v
            continue
        name, values = LLAMA_CPP_PYTHON_OPTIONS[k]
        out[name] = values.get(v, v) if values else v
    return out


def _command(s: Situation, change: dict) -> str | None:
    env = {k: v for k, v in change.items() if k.startswith("OLLAMA_")}
    serve = bool(s.command) and s.command.get("engine") == "ollama" and "serve" in (s.command.get("argv") or [])
    if _is_ollama(s) and s.ollama_service and env and len(env) == len(change) and not serve:
        # (the server is the unit: a second "ollama serve" would not bind its port; but a user who gave the "ollama
        # serve" line they run in a shell gets that line back with the new settings)
        return _ollama_unit_command(env)
    if not s.command or not (s.command.get("argv") or s.command.get("line")):
        return None
    if s.command.get("engine") != s.engine or str(s.command.get("program") or "").startswith(_NO_REWRITE_PROGRAMS):
        return None  # another program's command line: the change's flags are not its flags
    if s.command.get("split_error"):
        return None  # a line that does not split (a quote left open): its words are a guess, no command to paste
    if (s.command.get("flags") or {}).get("_missing_value"):
        return None  # an option at the end with no value ("... -c"): a rewrite would give it the next flag as value
    flag_changes = {k: v for k, v in change.items() if k.startswith("-") or k.isupper()}
    if not flag_changes:
        return None
    if _is_ollama(s) and all(k.isupper() for k in flag_changes) and _ollama_client(s):
        # Ollama's OLLAMA_* settings are the server's: on a client command (ollama run / pull / ...) they do nothing,
        # the server must be restarted with them
        return " ".join(f"{k}={v}" for k, v in flag_changes.items()) + " ollama serve"
    try:
        from kvreport.cmdline import parse_command, with_changes

        line = with_changes(s.command, flag_changes)
        # a rewrite the program's own grammar does not read (a flag it lacks, Python code) or that changes nothing
        # is no command to paste: the change itself stays
        before, after = parse_command(_command_text(s)), parse_command(line)
        if " ".join(line.split()) == " ".join(_command_text(s).split()) \
                or (before["flags"], before.get("env")) == (after["flags"], after.get("env")):
            return None
        return line
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


FA_VALUE_BUILD = 6300
"""llama.cpp's -fa/--flash-attn took no value until about build 6300 (Aug 2025, ggml-org/llama.cpp#15434-era);
since then it reads on|off|auto (builds near b6343 already pass a string, WasmEdge#4343)."""


def _fa_on(s: Situation) -> dict:
    """Flash attention on, in the form the user's build reads: nothing when it is already on (a bare -fa on the
    command line is the older builds' "on"), a bare flag for a build before :data:`FA_VALUE_BUILD`, else "on"."""
    typed = str((s.flags or {}).get("flash_attn", "")).lower()
    if s.flash_attn is True and typed not in ("off", "0", "false", "disabled"):
        return {}  # (a command that says -fa off keeps it off when pasted, whatever the log printed)
    if s.fa_logged in _FA_WORDS or typed in _FA_WORDS:
        return {"--flash-attn": "on"}  # (a bare -fa would take the next argument as its value on such a build)
    return {"--flash-attn": True} if s.engine_build and s.engine_build < FA_VALUE_BUILD else {"--flash-attn": "on"}


_FA_WORDS = ("on", "off", "auto", "enabled", "disabled")
"""The values of -fa since it takes one (on|off|auto; the log prints enabled/disabled/auto)."""


def _ollama_slots(s: Situation) -> int:
    """Ollama's parallel slots (OLLAMA_NUM_PARALLEL) when the log or command gave them: its runner's context is
    num_ctx x slots (Ollama 0.2+), so a per-request context is the runner's divided by them."""
    return int(s.n_seq) if _is_ollama(s) and s.n_seq and s.n_seq > 1 and s.n_seq_known else 1


def _train_total(s: Situation) -> int | None:
    """The model's training context as a total n_ctx: n_ctx_train per sequence (llama.cpp's n_ctx_per_seq = n_ctx /
    n_seq without a unified KV cache; Ollama's runner is num_ctx x its slots), so 4 slots of 32768 are not above a
    32768 training context."""
    train = s.n_ctx_train if s.n_ctx_train and s.n_ctx_train > 0 else None
    if train is None:
        return None
    seqs = _ollama_slots(s) if _is_ollama(s) else (int(s.n_seq) if s.n_seq and s.n_seq > 1 and not s.kv_unified else 1)
    return train * seqs


def _ctx_change(s: Situation, n: int) -> dict:
    """The change that gives the engine a context of ``n`` tokens in all (Ollama: per request, n / slots)."""
    if _is_ollama(s):
        return {_ollama_ctx_knob(s): n // _ollama_slots(s)}
    return {"--ctx-size": n}


def _ollama_before(s: Situation, version: tuple[int, int, int]) -> bool:
    """The log's Ollama version is known and older than ``version``."""
    ver = re.match(r"(\d+)\.(\d+)\.(\d+)", s.ollama_version or "")
    return bool(ver) and tuple(map(int, ver.groups())) < version


def _ollama_ctx_knob(s: Situation) -> str:
    """Ollama's context setting: OLLAMA_CONTEXT_LENGTH (the server's default, 0.5.13+), else num_ctx (a Modelfile's
    PARAMETER or the request's option), the only one older servers read."""
    return "num_ctx" if _ollama_before(s, (0, 5, 13)) else "OLLAMA_CONTEXT_LENGTH"


def _ctx_title(s: Situation, n: int) -> str:
    slots = _ollama_slots(s)
    return (f"{n // slots} tokens per request ({n} in all with {slots} parallel slots)" if slots > 1
            else f"{n} tokens")


# ------------------------------------------------------------------ llama.cpp family rules

def _reduce_ctx_by_examples(b: _Builder, rank: float) -> bool:
    """Without the model (a typed summary line): reduce-ctx with no value, the scale given by example shapes."""
    s = b.s
    if not (s.kv_basis is None and s.kv_examples_fit and s.phase in ("kv_cache", "context")):
        return False
    ex = "; ".join(f"{name}: about {_tok(n)} tokens" for name, n in s.kv_examples_fit)
    b.add(rank, "reduce-ctx", "Ask for a much smaller context", {},
          f"the model is not known, so no value is computed for it; for scale, the largest context whose f16 KV "
          f"fits {_mib(s.kv_budget_mib)} MiB is, for example shapes (not your model): {ex}",
          "The KV cache is n_ctx tokens x bytes per token; a smaller context is the first lever (playbook step 1). "
          "Give kvreport the model (--model FILE.gguf) or the command line to get the exact number.")
    return True


def _ctx_room(s: Situation, budget: float | None, dev: str) -> str:
    """The words for the memory a new context must fit in (for reduce-ctx's explanation)."""
    if s.phase == "compute_buffer" and s.kv_budget_mib is not None:
        return f"the {_mib(budget)} MiB {dev} has for the KV once the {_mib(s.requested_mib)} MiB compute buffer fits"
    if s.kv_headroom_mib:
        return (f"the {_mib(budget)} MiB left on {dev} once {s.kv_headroom_why or _mib(s.kv_headroom_mib) + ' MiB'} "
                "is kept free (llama.cpp allocates the compute buffer on the same device right after the KV)")
    return f"the {_mib(budget)} MiB left on {dev}"


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
        big_cb = big_compute_unknown_ctx(s)
        if s.phase in ("kv_cache", "context") or s.kv_update or budget_names_cache(s) or big_cb:
            flag = _ollama_ctx_knob(s) if _is_ollama(s) else _CTX_KNOB_OF_RULE.get(s.oom_rule or "", "--ctx-size / -c")
            what = (f"a {_mib(s.requested_mib)} MiB compute buffer at the default micro-batch comes from a long context "
                    f"(its attention scores grow with it)" if big_cb else
                    "the log shows neither the context size nor the KV cost per token")
            b.add(rank, "reduce-ctx", "Ask for a smaller context", {},
                  f"{what}, so no value can be computed: lower {flag} step by step (the "
                  f"{'compute buffer' if big_cb else 'KV'} shrinks in proportion)",
                  "The KV cache is n_ctx tokens x bytes per token; a smaller context is the first lever (playbook "
                  "step 1). Run kvreport with the command line (or the model file) to get the exact number.")
        return
    if _reduce_ctx_by_examples(b, rank):
        return
    basis = {"failed_buffer": " (per-token cost derived from the failed KV buffer)",
             "ollama_layout": " (per-token cost derived from the KV of Ollama's memory layout)"}.get(s.kv_basis or "", "")
    fit = _fit_now(s)
    train = _train_total(s)
    budget = s.kv_budget_mib if s.kv_budget_mib is not None else s.free_at_failure_mib
    dev = s.failing_device or "the failing device"
    room = _ctx_room(s, budget, dev)
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
    b.add(rank, "reduce-ctx", f"Lower the context to {_ctx_title(s, target)}", _ctx_change(s, target), expected,
          f"The KV cache grows linearly with the context; {_tok(target)} is {why_num}. The number after -c is tokens, "
          "not bytes, and the model's advertised maximum is not a promise that it fits (playbook step 1)."
          + (" For one model: PARAMETER num_ctx in the Modelfile or the num_ctx request option." if _is_ollama(s) else ""))


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


def _fit_now(s: Situation) -> int | None:
    """The largest context that fits at the cache types in use (the mixed pair's own figure when K and V differ)."""
    if s.max_ctx_fit_now is not None:
        return s.max_ctx_fit_now
    return (s.max_ctx_fit or {}).get(_type_key(s.cache_type_k))


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
    # Ollama: one slot keeps the per-request context (its runner's n_ctx is num_ctx x slots)
    one = s.n_ctx // _ollama_slots(s) if _ollama_slots(s) > 1 and s.n_ctx else (req or s.n_ctx)
    kv_new = _kv(s, n_seq=1, n_ctx=one)
    if kv_new is not None and s.kv_mib and kv_new >= s.kv_mib * 0.99:
        return  # one slot at this context saves nothing (the KV is sized by the context, not by the slots)
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


def _q8_ctx(s: Situation) -> int | None:
    """The context to pair with a q8_0 cache so that the change fits: the current one when its q8_0 KV fits the budget
    (or the numbers to tell are missing); else the largest that fits at q8_0 (``max_ctx_fit["q8_0"]``, or the current
    context scaled by budget / KV when only ``kv_at`` and the budget are known), at most ``n_ctx_train`` when the current
    context is above it; 0 when nothing fits."""
    cur = s.n_ctx or s.n_ctx_requested
    budget = s.kv_budget_mib if s.kv_budget_mib is not None else s.free_at_failure_mib
    if budget is not None and budget <= 0:
        return 0
    fit = (s.max_ctx_fit or {}).get("q8_0")
    if not cur:
        return cur
    if fit is None:
        kv = _kv(s, cache_type="q8_0")
        if kv is None or budget is None or kv * (s.kv_share or 1.0) <= budget:
            return cur
        fit = int(cur * budget / (kv * (s.kv_share or 1.0))) // 256 * 256
        kv_fit = _kv(s, n_ctx=fit, cache_type="q8_0") if fit > 0 else None
        if kv_fit is None or kv_fit * (s.kv_share or 1.0) > budget:
            return 0
    target = min(cur, fit)
    train = _train_total(s)
    if train and cur > train and target > train:
        target = train
    return target


def _quantize(b: _Builder, rank: float) -> None:
    """quantize-kv-cache: q8_0 K and V (flash attention on). When the q8_0 KV at the current context still exceeds the
    budget of the failing device, the change also sets the largest context that fits at q8_0 (more than reduce-ctx
    keeps at f16), so the suggestion works when pasted; when not even that fits, no suggestion."""
    s = b.s
    if (s.cache_type_k or "f16") not in ("f16", "f32", "bf16") and (s.cache_type_v or "f16") not in ("f16", "f32", "bf16"):
        return
    cur = s.n_ctx or s.n_ctx_requested
    target = _q8_ctx(s)
    if target == 0:
        return  # even the smallest context does not fit at q8_0: other rules apply
    if _is_ollama(s) and s.min_cuda_compute is not None and s.min_cuda_compute < 7.0:
        return  # Ollama keeps flash attention off on a GPU under compute 7.0, and with it an f16 cache (llm/server.go)
    if _is_ollama(s) and _ollama_before(s, (0, 5, 0)):
        return  # OLLAMA_KV_CACHE_TYPE came with Ollama 0.5.0: an older server ignores it (a no-op)
    if _is_ollama(s):
        change = {"OLLAMA_KV_CACHE_TYPE": "q8_0", "OLLAMA_FLASH_ATTENTION": 1}
    else:
        change = {"--cache-type-k": "q8_0", "--cache-type-v": "q8_0", **_fa_on(s)}
    fit = (s.max_ctx_fit or {}).get("q8_0")
    extra = f"; up to {_tok(fit)} tokens would fit at q8_0" if fit else ""
    budget = s.kv_budget_mib if s.kv_budget_mib is not None else s.free_at_failure_mib
    why = ("q8_0 stores 34 bytes per 32 values (1.06 B/value) against 2 for f16; a quantized V cache needs "
           "flash attention (playbook step 3).")
    if target and cur and target < cur:
        change.update(_ctx_change(s, target))
        kv_new = _kv(s, n_ctx=target, cache_type="q8_0")
        kv_cur = _kv(s, cache_type="q8_0")
        now = _fit_now(s)
        expected = (f"KV {_mib(kv_new)} MiB{_of_budget(s, budget)} at n_ctx {_tok(target)} instead of {_mib(s.kv_mib)} "
                    f"MiB at n_ctx {_tok(cur)}" if kv_new is not None else f"context {_tok(target)} at q8_0")
        if now:
            types = s.cache_type_k or "f16" if (s.cache_type_k or "f16") == (s.cache_type_v or "f16") else \
                f"{s.cache_type_k or 'f16'}/{s.cache_type_v or 'f16'}"
            expected += f" ({_tok(now)} tokens fit at {types})"
        b.add(rank, "quantize-kv-cache", f"Store the KV cache as q8_0 and use a context of {_ctx_title(s, target)}", change,
              expected,
              why + f" At the current context the q8_0 KV ({_mib(kv_cur)} MiB) would still not fit, so the change also "
              f"sets {_tok(target)} tokens, the most that fits at q8_0 (a context above n_ctx_train is not offered): "
              "together they keep more context than a smaller context alone.")
        return
    kv_new = _kv(s, cache_type="q8_0")
    if kv_new is not None and s.kv_mib and kv_new >= s.kv_mib * 0.99:
        return  # kvreport's own arithmetic: no smaller KV (no no-op)
    if kv_new is None and cur and s.kv_examples_fit and all(cur > 2 * n for _name, n in s.kv_examples_fit):
        # a summary without the model: for every example shape the q8_0 KV at this context (about half of f16) is
        # still over what there is, so the same -c with q8_0 is predicted to fail again; reduce-ctx says what fits
        return
    b.add(rank, "quantize-kv-cache", "Store the KV cache as q8_0", change,
          (f"KV {_mib(kv_new)} MiB instead of {_mib(s.kv_mib)} MiB{extra}" if kv_new is not None
           else "about half the KV bytes of f16"), why)


def _headroom(b: _Builder, rank: float) -> None:
    s = b.s
    if s.backend in ("cpu", "unknown") or _is_ollama(s) or (s.flags or {}).get("no_kv_offload") is True:
        return  # nothing to move, or the command already keeps the KV on the host (no no-op)
    kv = s.kv_mib * (s.kv_share or 1.0) if s.kv_mib else None  # (the failing device's share of a KV over several)
    b.add(rank, "kv-cache-on-host", "Keep the KV cache in host memory", {"--no-kv-offload": True},
          f"frees the KV ({_mib(kv)} MiB) from {s.failing_device or 'the GPU'}; decoding gets slower" if kv
          else "the KV cache moves to host RAM; decoding gets slower",
          "--no-kv-offload puts every layer's K/V in host memory, leaving device memory to weights and compute "
          "buffers (playbook step 4).")


def _reduce_layers(b: _Builder, rank: float, requested: float | None = None) -> None:
    s = b.s
    if s.verdict == "exceeds_alloc_limit" and s.phase == "compute_buffer":
        return  # the compute buffer's size follows the batch and the context, not the layers: still over the limit
    cur = s.flags.get("n_gpu_layers")
    if not isinstance(cur, int) and s.n_gpu_layers_log:
        cur = s.n_gpu_layers_log
    if isinstance(cur, int) and s.offloaded_layers:
        cur = min(cur, s.offloaded_layers)  # "-ngl 99" means all: the log's "offloaded N/M layers" is the count
    elif isinstance(cur, int) and s.n_layer:
        cur = min(cur, s.n_layer + 1)  # the layers plus the output layer
    elif isinstance(cur, int) and cur >= 99:
        cur = None  # the "all layers" idiom with the model's layer count unknown: 3/4 of 99 may change nothing
    n = None
    lay = s.ollama_layer if _is_ollama(s) else None
    if lay and lay.get("free_mib") and lay.get("per_layer_mib"):
        # the layers whose weights and KV fit beside the compute graph in what the device had (Ollama's own numbers)
        fit = int((lay["free_mib"] - lay["graph_mib"]) / lay["per_layer_mib"])
        if 0 <= fit < lay["layers"]:
            change = {"num_gpu": fit}
            b.add(rank, "reduce-gpu-layers", f"Offload fewer layers to the GPU ({fit})", change,
                  f"{fit} layers x {_mib(lay['per_layer_mib'])} MiB (weights and KV) + the {_mib(lay['graph_mib'])} MiB "
                  f"graph within the {_mib(lay['free_mib'])} MiB the GPU had; or drop num_gpu and let Ollama place them",
                  "Ollama could not place the layers it was told to (num_gpu set in the Modelfile or the request): "
                  "fewer layers on the GPU, or no num_gpu at all, lets its own layout fit (PARAMETER num_gpu / the "
                  "num_gpu request option).")
            return
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
    if _moe_on_host(b, rank, n):
        return
    change = {"num_gpu": n} if _is_ollama(s) else {"--n-gpu-layers": n}
    b.add(rank, "reduce-gpu-layers", f"Offload fewer layers to the GPU ({n})", change,
          f"each layer kept on the host frees its weights and its KV from {s.failing_device or 'the GPU'}",
          f"Fewer GPU layers ({where}) leave device memory for the KV cache and compute buffers; the KV of host "
          "layers lives in host memory (playbook step 4).")


N_CPU_MOE_BUILD = 6089
"""llama.cpp b6089 (PR #15077, 2025-08) added ``--n-cpu-moe N``: the expert weights of the first N layers stay in host
memory, attention and the KV of every layer stay on the GPU (``--cpu-moe``: all of them)."""


def _moe_on_host(b: _Builder, rank: float, n_gpu: int) -> bool:
    """For a mixture-of-experts model (the log's ``n_expert`` > 1) on llama.cpp's own programs, the same room is made
    by keeping the experts of the layers that -ngl would have moved off in host memory: ``--n-cpu-moe`` (b6089+) moves
    most of each layer's weights and none of its KV or attention. Returns whether it added that suggestion."""
    s = b.s
    flags = s.flags or {}
    if _is_ollama(s) or not (s.n_expert or 0) > 1 or not s.n_layer or flags.get("cpu_moe") is True:
        return False
    if s.engine_build is not None and s.engine_build < N_CPU_MOE_BUILD:
        return False
    if str((s.command or {}).get("program") or "").startswith(_NO_REWRITE_PROGRAMS):
        return False  # (llama-cpp-python's server has no such setting)
    now = flags.get("n_cpu_moe") if isinstance(flags.get("n_cpu_moe"), int) else 0
    k = max(now + max(1, (s.n_layer - now) // 4), min(s.n_layer, s.n_layer - n_gpu))
    if k <= now or k > s.n_layer:
        return False
    b.add(rank, "reduce-gpu-layers", f"Keep the experts of {k} layers in host memory (--n-cpu-moe {k})",
          {"--n-cpu-moe": k},
          f"the expert weights of the first {k} of {s.n_layer} layers (most of an MoE layer's weights) leave "
          f"{s.failing_device or 'the GPU'}; attention and the KV cache of every layer stay there",
          f"A mixture-of-experts model ({s.n_expert} experts per layer) runs only a few experts per token, so its expert "
          "weights cost little speed in host memory; --n-cpu-moe frees more device memory per layer than -ngl and keeps "
          "the KV on the GPU (llama.cpp b6089+; older builds: -ot \"ffn_.*_exps=CPU\").")
    return True


def _rebalance(b: _Builder, rank: float) -> None:
    s = b.s
    idx = _dev_index(s.failing_device)
    n = max(s.n_devices, (idx + 1) if idx is not None else 0)
    if n < 2 or idx is None or (s.split_room_mib is not None and s.split_room_mib < 0) or s.backend == "metal" \
            or _is_ollama(s):
        # (the devices together lack the room: no split places the load; a Mac has one GPU, however named; Ollama
        # has no setting for a per-GPU split, it places the layers itself)
        return
    split = ["1"] * n
    split[idx] = "0.5"
    room = (f"; the {n} devices together keep {_mib(s.split_room_mib)} MiB after it" if s.split_room_mib is not None
            else "")
    b.add(rank, "rebalance-devices", f"Move load off {s.failing_device}", {"--tensor-split": ",".join(split)},
          f"{s.failing_device} gets about half its current share of layers (and their KV and compute){room}",
          f"Each allocation lands on one device: {s.failing_device} ran out although the others may have room. "
          "Give it a smaller --tensor-split share or move tensors off it with -ot (playbook step 5).")


def _ub_target(s: Situation) -> tuple[int, str]:
    """The micro-batch to suggest and the reason. A compute buffer scales about linearly with n_ubatch, so when the
    failed buffer's size and the free memory of its device are known the -ub that fits is computed (90 % of the free
    memory, a power of two, at most half the current); 0 when even 32 would not fit. A -ub far above llama.cpp's
    default (>= 2048) goes back to the default 512; otherwise half the current (256 from the default)."""
    ub = s.n_ubatch or 512
    assumed = "" if s.n_ubatch else " (the log shows no -ub: llama.cpp's default 512 assumed)"
    free = s.free_at_failure_mib if s.free_at_failure_mib is not None else s.free_mib
    req = s.requested_mib
    if s.phase == "compute_buffer" and req and free is not None and 0 < free < req:
        raw = ub * free * 0.9 / req
        if raw < 32:
            return 0, ""
        new = min(1 << int(math.log2(raw)), max(32, ub // 2))
        return new, (f"the compute buffer scales about linearly with -ub: {_mib(req)} MiB at -ub {ub}{assumed} is about "
                     f"{_mib(req * new / ub)} MiB at -ub {new}, within the {_mib(free)} MiB free")
    if s.n_ubatch and s.n_ubatch >= 2048:
        pred = f" (about {_mib(req * 512 / ub)} MiB instead of {_mib(req)} MiB)" if req else ""
        return 512, f"-ub {ub} is far above llama.cpp's default 512; the compute buffer shrinks about in proportion{pred}"
    new = max(64, ub // 2 if ub > 512 else 256)
    return new, f"the compute buffer shrinks roughly in proportion to -ub ({ub} -> {new})"


def _reduce_batch(b: _Builder, rank: float) -> None:
    s = b.s
    ub = s.n_ubatch or 512
    new_ub, expected = _ub_target(s)
    if not new_ub or new_ub >= ub:
        return  # not even a tiny batch fits: the batch is not the lever (other rules apply)
    change = {"num_batch": new_ub} if _is_ollama(s) else {"--ubatch-size": new_ub}
    if not _is_ollama(s) and s.n_batch and s.n_batch > 2048:
        change["--batch-size"] = max(new_ub, 2048)
    where = " (Ollama: PARAMETER num_batch in the Modelfile or the num_batch request option)" if _is_ollama(s) else ""
    b.add(rank, "reduce-batch", f"Lower the micro-batch to {new_ub}", change, expected,
          "Compute (graph) buffers hold activations for n_ubatch tokens at a time; -ub is their main size lever"
          f"{where}.")


def _flash(b: _Builder, rank: float) -> None:
    s = b.s
    if s.flash_attn is False:
        change = {"OLLAMA_FLASH_ATTENTION": 1} if _is_ollama(s) else _fa_on(s)
        b.add(rank, "enable-flash-attn", "Turn flash attention on", change,
              "the attention score tensor (n_head x n_kv x n_ubatch x 4 bytes) is no longer materialised",
              "Without flash attention the compute buffer grows with the context; with it the growth is small.")


def _flash_for_v_cache(b: _Builder, rank: float) -> None:
    """llama.cpp refused a quantized V cache without flash attention: turn it on (unless the build turned its own
    "auto" off for this model and backend, when on would be refused too)."""
    s = b.s
    if s.fa_auto_disabled:
        return
    change = {"OLLAMA_FLASH_ATTENTION": 1} if _is_ollama(s) else _fa_on(s)
    if change:
        b.add(rank, "enable-flash-attn", "Turn flash attention on for the quantized V cache", change,
              "the context is created with the quantized V cache",
              "llama.cpp stores a quantized V cache only with flash attention (llama-context.cpp refuses it otherwise); "
              "the alternative is an f16 V cache (--cache-type-v f16) at twice the V bytes.")


def _metal_wired_limit(b: _Builder, rank: float) -> None:
    """macOS lets the GPU wire only part of the unified memory (recommendedMaxWorkingSetSize, about 2/3 of RAM up to 36
    GB, 3/4 above); ``sysctl iogpu.wired_limit_mb`` (macOS 14+) raises it until the next reboot."""
    b.add(rank, "raise-memory-limit", "Let the GPU use more of the Mac's memory", {},
          "a larger working set for weights, KV and compute: `sudo sysctl iogpu.wired_limit_mb=<MiB>` (e.g. the RAM "
          "less 8 GiB for the system; until the next reboot)",
          "Metal ran out of the working set macOS grants the GPU (recommendedMaxWorkingSetSize, about 2/3 to 3/4 of "
          "RAM), not of the RAM itself; macOS 14+ raises that limit with iogpu.wired_limit_mb (llama.cpp#1870, "
          "Ollama#434).")


def _reduce_parallel_compute(b: _Builder, rank: float) -> None:
    """Ollama's runner sizes its graph for num_ctx x slots: one slot gives a graph for one request's context."""
    s = b.s
    slots = _ollama_slots(s)
    b.add(rank, "reduce-parallel", f"Use 1 parallel slot instead of {slots}", {"OLLAMA_NUM_PARALLEL": 1},
          f"a runner context {slots}x smaller (num_ctx instead of num_ctx x {slots}), and the attention part of the "
          "compute buffer with it",
          f"Ollama gives its runner a context of num_ctx x OLLAMA_NUM_PARALLEL: with {slots} slots the compute graph "
          "(whose attention scores grow with the context) is built for all of them at once; one slot keeps each "
          "request's context and shrinks the graph (playbook step 2).")


def _alloc_limit(b: _Builder, rank: float) -> None:
    s = b.s
    ub = s.n_ubatch or 512
    new_ub = max(64, ub // 2 if ub > 512 else 256)
    b.add(rank, "work-around-alloc-limit", "Keep each single allocation under the backend's limit",
          {"num_batch": new_ub} if _is_ollama(s) else {"--ubatch-size": new_ub},
          f"a compute buffer about {ub // new_ub}x smaller than {_mib(s.requested_mib)} MiB" if s.requested_mib is not None
          else f"a compute buffer about {ub // new_ub}x smaller",
          f"The {s.backend} driver refused one allocation of {_mib(s.requested_mib)} MiB because it exceeds its "
          "per-allocation limit (e.g. Vulkan maxMemoryAllocationSize, often 4 GiB), not because memory ran out; "
          "smaller -ub / -c keep the compute buffer under it (playbook step 6).")


def _free_memory(b: _Builder, rank: float) -> None:
    s = b.s
    if s.verdict == "exceeds_alloc_limit":
        return  # a limit on one allocation: more free memory leaves the same request over it
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
           else f"{_mib(s.requested_mib)} MiB free for the refused allocation (the log does not say how much was)"
           if s.requested_mib is not None
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


def _ollama_client(s: Situation) -> bool:
    """The command is an Ollama client subcommand (``ollama run``, ``ollama pull``...), not the server
    (``engine_argv``: kvreport.cmdline's words from the engine's program on)."""
    argv = (s.command or {}).get("engine_argv") or []
    return len(argv) > 1 and str(argv[1]) != "serve"


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


def _bisect_crash(b: _Builder, rank: float) -> None:
    b.add(rank, "bisect-regression", "Try a known-good build", {},
          "the engine failed on something that is not memory: "
          + " ".join(str(b.s.final_error or "").split())[:160],
          "A crash (an assert, a segfault, a lost device) is a bug of the engine or the driver, not a setting: run the "
          "same command on the previous release (or another backend) and report the last build that works "
          "(playbook step 7).")


def _shorter_kernels(b: _Builder, rank: float) -> None:
    """A quarter of the micro-batch (at least 64 tokens): each kernel of the prefill does a quarter of the work, so a
    GPU watchdog that reset a long one is not reached; memory is not the question here."""
    s = b.s
    ub = s.n_ubatch or 512
    new_ub = max(64, ub // 4)
    if new_ub >= ub:
        return
    change = {"num_batch": new_ub} if _is_ollama(s) else {"--ubatch-size": new_ub}
    b.add(rank, "reduce-batch", f"Lower the micro-batch to {new_ub}", change,
          f"each prefill kernel does {new_ub} tokens' work instead of {ub}",
          "The driver reset the GPU while a batch ran (a lost device): kernels that run longer than the driver's "
          "watchdog (amdgpu's job timeout, Windows' TDR) are reset, and their time grows with the micro-batch. If a "
          "small batch fails too, the driver or the build is at fault (try a known-good build).")


def _smaller_model(b: _Builder, rank: float) -> None:
    why = ("The weights were refused although they fit the free memory the log reported; a smaller model only helps "
           "under the same limit." if b.s.verdict == "fits_but_failed"
           else "The weights fit, but leave too little of the budget to the KV cache: smaller weights leave it more."
           if b.s.phase in ("kv_capacity", "kv_cache")
           else "The weights alone do not fit the memory available for them.")
    example = {LLAMA: "e.g. Q4_K_M is about 60 % of Q8_0", MLX: "a 4-bit MLX quant is about a quarter of 16-bit weights"
               }.get(family_of(b.s), "FP8 halves 16-bit weights; 4-bit AWQ/GPTQ quarters them")
    b.add(rank, "smaller-model-or-quant", "Use a smaller model or a smaller quantization", {},
          f"weights shrink with the quantization ({example})", why)


def _slots_for_full_kv(b: _Builder, rank: float) -> None:
    """The KV cache filled up while serving (no slot for a batch): each of N parallel sequences owns n_ctx / N of
    it, so one sequence gets the whole context (or -c must grow)."""
    s = b.s
    if _is_ollama(s) and request_refused(s):
        return  # Ollama's slots each get the whole num_ctx: fewer of them do not make a long request fit
    unset_ollama = _is_ollama(s) and not s.n_seq_known  # OLLAMA_NUM_PARALLEL unset: up to 4 slots (0.2 and later)
    if (not s.n_seq or s.n_seq <= 1) and not unset_ollama:
        return  # one slot already, or the slot count is not in the log: no change to name
    if _is_ollama(s):
        b.add(rank, "reduce-parallel", "Serve one request at a time", {"OLLAMA_NUM_PARALLEL": 1},
              "one request gets the whole num_ctx instead of a share of it",
              "Ollama splits the context between its parallel slots (OLLAMA_NUM_PARALLEL, up to 4 by default); a "
              "long request then fills its share of the KV cache. One slot, or a larger num_ctx, gives it room.")
        return
    n = s.n_seq
    b.add(rank, "reduce-parallel", f"Use 1 parallel slot instead of {n}", {"--parallel": 1},
          f"one sequence gets all {s.n_ctx or 'n_ctx'} cells" if s.n_ctx else "one sequence gets the whole context",
          "The KV cache ran out of free cells while serving: each parallel slot owns n_ctx / n_parallel cells. One "
          "slot (or a larger -c) gives a long request room.")


def _draft_ctx(b: _Builder, rank: float) -> None:
    """The draft model's own context (-cd / --ctx-size-draft; its default is the main model's): sized to what the
    failed draft buffer says fits, else a quarter of the main context, never below 4096 (the draft must hold the
    requests it drafts for)."""
    s = b.s
    cur = s.n_ctx
    if not cur:
        return
    target = cur // 4
    if s.phase == "kv_cache" and s.requested_mib and s.free_at_failure_mib is not None and s.requested_mib > 0:
        target = int(cur * s.free_at_failure_mib * 0.8 / s.requested_mib)
    target = target // 256 * 256
    if target < 4096 or target >= cur:
        return
    b.add(rank, "reduce-ctx", f"Give the draft model a context of {_tok(target)} tokens",
          {"--ctx-size-draft": target},
          f"the draft's KV and compute buffers shrink with its context ({_tok(cur)} now); the main model keeps its "
          "context", "The failure came while the speculative-decoding draft model was loaded: its context is its own "
          "setting (-cd, --ctx-size-draft), by default the main model's.")


def _draft_cache(b: _Builder, rank: float) -> None:
    s = b.s
    b.add(rank, "quantize-kv-cache", "Store the draft model's KV cache as q8_0",
          {"--cache-type-k-draft": "q8_0", "--cache-type-v-draft": "q8_0", **_fa_on(s)},
          "about half the draft's KV bytes of f16", "The draft's cache has its own types (-ctkd / -ctvd); -ctk / -ctv "
          "apply to the main model only.")


def _draft_host(b: _Builder, rank: float) -> None:
    b.add(rank, "reduce-gpu-layers", "Keep the draft model on the CPU", {"--n-gpu-layers-draft": 0},
          "the draft's weights and KV leave the GPU (drafting gets slower)",
          "-ngld / --n-gpu-layers-draft places the draft model's layers, apart from the main model's -ngl.")


def _flag_value(s: Situation, flag: str) -> int | None:
    """The command's value of ``flag`` ("--max-model-len" -> flags["max_model_len"]) as an integer, or None."""
    return to_int((s.flags or {}).get(flag.lstrip("-").replace("-", "_")))


def _raise_ctx(b: _Builder, rank: float) -> None:
    """raise-ctx: the context grows to hold the request (its tokens rounded up to a multiple of 256; llama-server
    splits -c between its --parallel slots, so times the slots), in the engine's own setting; not when kvreport's
    own fit says that context's KV does not fit (then only a shorter request helps: no raise-ctx is given)."""
    s = b.s
    from kvreport.engines import BY_NAME

    eng = BY_NAME.get(s.engine or "")
    setting = eng.setting("context") if eng else None
    word = s.limit_setting or (setting.word if setting else "the context length setting")
    if s.request_tokens is None:
        # llama-server splits -c between its slots; Ollama gives every slot the whole num_ctx (its runner's context is
        # num_ctx x OLLAMA_NUM_PARALLEL), so fewer slots do not give a request more room there
        shares = s.engine == "llama.cpp"
        b.add(rank, "raise-ctx", "Give the context more room", {},
              "the log does not show how many tokens the request needs: raise " + word
              + (" (or serve fewer requests at a time)" if shares else "") + " until it fits, or send shorter requests",
              "The context (the KV cache) filled up or was too small for the request; the engine itself asks for a "
              "larger context." + (" Each parallel slot owns its share of it." if shares else ""))
        return
    slots = s.n_seq if (s.engine == "llama.cpp" and s.n_seq and s.n_seq > 1) else 1
    target = -(-s.request_tokens // 256) * 256 * slots
    if s.limit_tokens and target <= s.limit_tokens:
        return  # the line's numbers do not say the context is short of the request: no value to give
    fit = _fit_now(s)
    if fit is not None and target > fit:
        return  # kvreport's own numbers say the KV of that context does not fit: only a shorter request helps
    title = f"Raise the context to {_tok(target)} tokens"
    if s.engine in ("llama.cpp", "ollama"):
        change = _ctx_change(s, target)
    else:
        if (_flag_value(s, word) or 0) >= target and s.engine == "vllm":
            # the context is already longer: vLLM V0's prompt limit is min(max_model_len, max_num_batched_tokens)
            # without chunked prefill, so the smaller one refused it
            word, title = "--max-num-batched-tokens", f"Raise --max-num-batched-tokens to {_tok(target)}"
        if (_flag_value(s, word) or 0) >= target:
            return  # already at least that: the change would be none, or a cut
        change = {word: target} if setting or s.limit_setting else {}
    had = f" (now {_tok(s.limit_tokens)})" if s.limit_tokens else ""
    b.add(rank, "raise-ctx", f"{title}{had}", change,
          f"the {_tok(s.request_tokens)}-token request fits" + (f" in each of the {slots} slots" if slots > 1 else "")
          + ("; whether its KV fits the free memory is not known from this log (kvreport fit --model checks it)"
             if fit is None else f"; its KV fits ({_tok(fit)} tokens would)"),
          "The engine refused a request longer than its context: nothing ran out of memory, the context is too "
          "small for it. A larger context costs KV memory in proportion; the other way out is a shorter request. "
          "Above the model's trained context length the model needs RoPE scaling to stay coherent"
          + (", and vLLM refuses such a --max-model-len unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is set"
             if s.engine == "vllm" else "") + ".")


def _mlx_max_kv(b: _Builder, rank: float) -> None:
    """mlx-lm: cap the KV cache (--max-kv-size, a rotating cache of that many tokens)."""
    s = b.s
    n = _pow2_below(s.n_ctx // 2) if s.n_ctx and s.n_ctx > 1024 else None
    b.add(rank, "reduce-ctx", f"Cap the KV cache{f' at {n} tokens' if n else ''}", {"--max-kv-size": n} if n else {},
          f"the KV holds at most {n} tokens" if n else "the log shows no context size: pick a cap below the prompt",
          "mlx-lm keeps every token's K/V unless --max-kv-size caps it (a rotating cache); long prompts and prompt "
          "caches grow it without bound.")


def _mlx_prefill(b: _Builder, rank: float) -> None:
    """mlx-lm: process the prompt in smaller steps (--prefill-step-size, 2048 by default)."""
    b.add(rank, "reduce-batch", "Prefill in steps of 512 tokens", {"--prefill-step-size": 512},
          "the largest prefill activation about 4x smaller than at the default step of 2048",
          "mlx evaluates the prompt --prefill-step-size tokens at a time; its attention and MoE buffers grow with the "
          "step, and one buffer above Metal's maximum buffer size is refused.")


def _drop_swa_full(b: _Builder, rank: float) -> None:
    s = b.s
    kv_new = _kv(s, swa_full=False)
    b.add(rank, "disable-swa-full", "Drop --swa-full", {"--swa-full": None},
          f"KV {_mib(kv_new)} MiB instead of {_mib(s.kv_mib)} MiB" if kv_new else "the SWA layers keep only their window",
          "--swa-full gives sliding-window layers a full-length cache; without it they keep n_swa + n_ubatch cells.")


def _reduce_layers_sized(b: _Builder, rank: float) -> None:
    """reduce-gpu-layers sized by the failed request against the free memory when no layer count is known."""
    _reduce_layers(b, rank, b.s.requested_mib)


# ------------------------------------------------------------------ vLLM / SGLang / TGI / others: builders

def _py_knobs(s: Situation) -> dict:
    """The engine's own names for the same ideas (vLLM / SGLang / LMDeploy) and the current values from the command or
    the log."""
    sg, lmd = s.engine == "sglang", s.engine == "lmdeploy"
    v = s.vllm or {}
    if s.engine == "tgi":  # text-generation-launcher: its fraction, total tokens, batch size, prefill tokens
        return {"sg": False, "lmd": False, "tgi": True, "util": s.flags.get("cuda_memory_fraction"),
                "util_flag": "--cuda-memory-fraction", "len_flag": "--max-total-tokens", "seqs_flag": "--max-batch-size",
                "batch_flag": "--max-batch-prefill-tokens", "max_len": s.flags.get("max_total_tokens"),
                "fp8": "fp8_e4m3fn"}
    if lmd:  # TurboMind / PyTorch engine: KV = cache_max_entry_count x the free memory after the weights
        return {"sg": False, "lmd": True, "util": s.flags.get("cache_max_entry_count"),
                "util_flag": "--cache-max-entry-count", "len_flag": "--session-len", "seqs_flag": "--max-batch-size",
                "batch_flag": "--max-prefill-token-num", "max_len": s.flags.get("session_len"), "fp8": None}
    return {"sg": sg, "lmd": False, "fp8": "fp8", "util": s.flags.get("mem_fraction_static" if sg else "gpu_memory_utilization"),
            "util_flag": "--mem-fraction-static" if sg else "--gpu-memory-utilization",
            "len_flag": "--context-length" if sg else "--max-model-len",
            "seqs_flag": "--max-running-requests" if sg else "--max-num-seqs",
            "batch_flag": "--chunked-prefill-size" if sg else "--max-num-batched-tokens",
            "max_len": s.flags.get("context_length" if sg else "max_model_len") or v.get("max_model_len")}


def _py_total_mib(s: Situation) -> float | None:
    """The device's total memory from the log (vLLM's profiling line or gate, a torch OOM's total capacity)."""
    v = s.vllm or {}
    if v.get("total_gpu_gib"):
        return float(v["total_gpu_gib"]) * 1024.0
    return ((v.get("gate") or {}).get("total_mib")) or s.device_total_mib


def _py_lower_util_gate(b: _Builder, rank: float) -> None:
    """vLLM's start-up gate: the utilization that fits the free memory the gate line printed."""
    s = b.s
    gate = (s.vllm or {}).get("gate") or {}
    util_flag = _py_knobs(s)["util_flag"]
    if not (gate.get("free_mib") and gate.get("total_mib")):
        return
    new_util = math.floor((gate["free_mib"] / gate["total_mib"] - 0.02) * 100) / 100
    budget = new_util * gate["total_mib"]
    weights = (s.vllm or {}).get("weights_mib")
    if new_util <= 0 or budget < 1024 or (weights and budget < weights + 1024):
        return  # under 1 GiB of budget (or less than the weights the log printed, plus 1 GiB) no model starts there
    b.add(rank, "lower-gpu-memory-utilization", f"Lower {util_flag} to {new_util}", {util_flag: new_util},
          f"{_mib(budget)} MiB budget of {_mib(gate['free_mib'])} MiB free"
          + (f", above the {_mib(weights)} MiB of weights" if weights else
             "; the weights must fit in it too (the log does not give their size)"),
          "vLLM refuses to start when the device has less free memory than utilization x total; a lower "
          "fraction fits next to the other processes (with a smaller KV pool).")


def _py_cur_util(s: Situation):
    k = _py_knobs(s)
    if isinstance(k["util"], (int, float)):
        return k["util"]
    gate = ((s.vllm or {}).get("gate") or {}).get("utilization") if not k["sg"] else (s.sglang or {}).get(
        "mem_fraction_static")
    if isinstance(gate, (int, float)):
        return gate
    # vLLM's default is 0.9, LMDeploy's 0.8, TGI's --cuda-memory-fraction 1.0; SGLang computes its own when unset, so
    # without the value no number
    if k.get("tgi"):
        return 1.0
    return 0.8 if k["lmd"] else (0.9 if not k["sg"] else None)


def _py_raise_util_change(s: Situation) -> dict | None:
    """The raised fraction: computed when the log gives the KV needed, the pool and the device total (the pool grows
    by the added fraction x total), else 0.05 more; None when the current value is already at 0.95 or the computed one
    would be above it (raising cannot close the gap: no suggestion predicted to fail)."""
    sg_new = _sglang_fraction(s)
    if sg_new is not None:
        return {"--mem-fraction-static": sg_new} if sg_new <= 0.95 else None
    cur = _py_cur_util(s)
    if not cur:
        return {}
    v = s.vllm or {}
    total = _py_total_mib(s)
    new = round(min(0.95, cur + 0.05), 2)
    if v.get("kv_needed_mib") and v.get("available_kv_mib") is not None and v["available_kv_mib"] > 0 and total:
        new = math.ceil((cur + (v["kv_needed_mib"] - v["available_kv_mib"]) / total + 0.01) * 100) / 100
        if new > 0.95:
            return None
    elif v.get("kv_needed_mib") and v.get("available_kv_mib") and v.get("weights_mib") and not total:
        # the device's size is not in the log, but the budget held the weights and the pool: utilization x total is
        # at least their sum, and activations are never as large again, so total < 2 x (weights + pool) / utilization
        total_max = 2 * (v["weights_mib"] + v["available_kv_mib"]) / cur
        if v["kv_needed_mib"] - v["available_kv_mib"] > (0.95 - cur) * total_max:
            return None  # no utilization up to 0.95 closes the gap
    if new <= cur:
        return None
    return {_py_knobs(s)["util_flag"]: new}


def _sglang_rest_mib(s: Situation, fraction: float) -> float | None:
    """SGLang's memory for its token pool at ``fraction`` (model_runner profile_max_num_token: rest = available after
    the weights - total x (1 - mem_fraction_static), total being the memory available before them), from its "Load
    weight begin/end ... avail mem=" lines; None without them."""
    g = s.sglang or {}
    before, after = g.get("avail_before_weights_mib"), g.get("avail_after_weights_mib")
    if s.engine != "sglang" or not before or after is None:
        return None
    return after - before * (1.0 - fraction)


def _sglang_fraction(s: Situation) -> float | None:
    """The smallest --mem-fraction-static that leaves SGLang's token pool 1 GiB (a few thousand tokens of a 7-8B model),
    in hundredths; None when the log lacks the two "avail mem" lines."""
    g = s.sglang or {}
    before, after = g.get("avail_before_weights_mib"), g.get("avail_after_weights_mib")
    if s.engine != "sglang" or not before or after is None:
        return None
    return math.ceil((1.0 - (after - 1024.0) / before) * 100 + 1e-9) / 100


def _py_raise_util_negative(b: _Builder, rank: float) -> None:
    s = b.s
    avail = (s.vllm or {}).get("available_kv_mib")
    change = _py_raise_util_change(s)
    if change is None:
        return
    b.add(rank, "raise-gpu-memory-utilization", f"Raise {_py_knobs(s)['util_flag']}", change,
          f"the KV pool was {_mib(avail)} MiB: weights and activations used the whole budget",
          "The KV pool is what is left of utilization x total after weights and the profiled peak; "
          "with nothing left, only a larger budget (or smaller weights / more GPUs) helps.")


def _py_more_devices(b: _Builder, rank: float) -> None:
    s = b.s
    flag, name = _TP_FLAG.get(s.engine, _TP_FLAG["vllm"])  # (each engine's own knob: SGLang --tp-size, TGI --num-shard)
    tp = to_int(str(s.flags.get(name) or 1)) or 1
    what = "the weights" if s.phase == "model_weights" else "weights and KV heads"
    change, why = {flag: tp * 2}, f"Tensor parallelism splits {what} across GPUs."
    env = (s.command or {}).get("env") or {}
    key = next((k for k in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES") if env.get(k)), None)
    ids = [x.strip() for x in str(env.get(key) or "").split(",") if x.strip()]
    if key and len(ids) < tp * 2:
        # the command hides the other GPUs: a larger tensor-parallel size needs as many visible, or the engine refuses
        if not all(x.isdigit() for x in ids):
            return  # (UUIDs or MIG names: which other devices to add is not ours to guess)
        more = [str(i) for i in range(64) if str(i) not in ids][:tp * 2 - len(ids)]
        change[key] = ",".join(ids + more)
        why += f" {key} must list as many GPUs as {flag}: {', '.join(more)} added (check they exist: nvidia-smi -L)."
    b.add(rank, "more-devices", "Spread the model over more GPUs", change, "weights per GPU halve", why)


_TP_FLAG = {"vllm": ("--tensor-parallel-size", "tensor_parallel_size"), "sglang": ("--tp-size", "tp_size"),
            "tgi": ("--num-shard", "num_shard")}
"""Each Python engine's own knob for splitting the model over GPUs, and its parsed flag name."""


def _visible_gpus(s: Situation) -> int:
    """The GPUs the command made visible (CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES as a list)."""
    env = (s.command or {}).get("env") or {}
    for key in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        ids = [x for x in str(env.get(key) or "").split(",") if x.strip()]
        if ids:
            return len(ids)
    return 0


def unused_visible_gpus(s: Situation) -> bool:
    """A Python engine ran out of device memory on one GPU while its command made several visible and left the model
    on one of them (no tensor parallelism: vLLM --tensor-parallel-size, SGLang --tp-size, TGI --num-shard)."""
    knob = _TP_FLAG.get(s.engine)
    if not knob or s.engine == "tgi" and s.flags.get("sharded") is True:
        return False
    tp = to_int(str(s.flags.get(knob[1]) or 1)) or 1
    return _visible_gpus(s) > tp and s.backend not in ("cpu",)


def _py_use_visible_gpus(b: _Builder, rank: float) -> None:
    s = b.s
    n = _visible_gpus(s)
    flag = _TP_FLAG[s.engine][0]
    n = 1 << (n.bit_length() - 1)  # (tensor parallelism wants a power of two that divides the attention heads)
    b.add(rank, "more-devices", f"Split the model over the {n} GPUs the command made visible", {flag: n},
          f"weights (and KV heads) per GPU about {n}x smaller",
          f"The command makes {_visible_gpus(s)} GPUs visible but runs the whole model on one of them ({flag} unset); "
          "tensor parallelism spreads the weights and the KV cache over them.")


def _py_pool_target(s: Situation, max_len) -> int | None:
    v = s.vllm or {}
    target = v.get("estimated_max_len")
    if not target and v.get("pool_tokens"):
        target = int(v["pool_tokens"]) // 256 * 256
    if not target and v.get("kv_needed_mib") and v.get("available_kv_mib") and max_len and v["available_kv_mib"] > 0:
        # the KV one request needs is linear in its length: the longest that fits the pool the log printed
        target = int(float(max_len) * v["available_kv_mib"] / v["kv_needed_mib"]) // 256 * 256 or None
    if not target and s.requested_mib and s.free_mib and max_len:
        seqs = s.flags.get("max_num_seqs") or 1
        per_tok = s.requested_mib / (float(max_len) * float(seqs))
        target = int(s.free_mib / per_tok / float(seqs)) // 1024 * 1024 if per_tok > 0 else None
    return target


def _py_reduce_max_len(b: _Builder, rank: float) -> None:
    s = b.s
    k = _py_knobs(s)
    max_len, len_flag = k["max_len"], k["len_flag"]
    avail = (s.vllm or {}).get("available_kv_mib")
    pool = (s.vllm or {}).get("pool_tokens")
    if pool is not None and int(pool) < 256:
        return  # a pool of a few tokens: no useful length fits it (more memory, fewer weights or more GPUs do)
    target = _py_pool_target(s, max_len)
    if target and max_len and target < int(max_len):
        b.add(rank, "reduce-max-model-len", f"Lower {len_flag} to {target}", {len_flag: target},
              f"one request of {target} tokens fits the KV pool" + (f" ({_mib(avail)} MiB)" if avail else ""),
              "The engine needs room for at least one request of the maximum length in its KV pool.")
    elif not k["sg"]:
        b.add(rank, "reduce-max-model-len", f"Lower {len_flag}", {len_flag: int(max_len) // 2} if max_len else {},
              "a shorter maximum request fits the KV pool", "The KV pool must hold one full-length request.")


def _py_raise_util(b: _Builder, rank: float) -> None:
    s = b.s
    k = _py_knobs(s)
    change = _py_raise_util_change(s)
    if change is None:
        return  # already at 0.95 (or the gap needs more): a smaller maximum length or fp8 KV instead
    title = f"Raise {k['util_flag']}" + (f" to {change[k['util_flag']]}" if change else "")
    if k["sg"]:
        new = change.get("--mem-fraction-static")
        rest = _sglang_rest_mib(s, new) if new else None
        g = s.sglang or {}
        expected = (f"a token pool of about {_mib(rest)} MiB: {_mib(g['avail_after_weights_mib'])} MiB free after the "
                    f"weights less {_mib(g['avail_before_weights_mib'])} MiB x (1 - {new}) kept out of it"
                    if rest is not None else "a larger static pool for KV tokens")
        b.add(rank, "raise-gpu-memory-utilization", title, change, expected,
              "SGLang sizes its token pool from --mem-fraction-static; the error asks for a larger fraction.")
    else:
        v = s.vllm or {}
        computed = bool(v.get("kv_needed_mib") and _py_total_mib(s))
        b.add(rank, "raise-gpu-memory-utilization", title, change,
              (f"the pool grows by {_mib(v['kv_needed_mib'] - v['available_kv_mib'])} MiB to the "
               f"{_mib(v['kv_needed_mib'])} MiB one full-length request needs" if computed
               else "a larger KV pool from the same GPU"),
              "The KV pool is utilization x total minus weights and activations.")


def _py_one_seq(b: _Builder, rank: float) -> None:
    s = b.s
    k = _py_knobs(s)
    seqs = s.flags.get("max_running_requests" if k["sg"] else "max_num_seqs")
    if seqs and int(seqs) > 1:
        b.add(rank, "reduce-max-num-seqs", f"Lower {k['seqs_flag']} to 1", {k["seqs_flag"]: 1},
              "KV for one sequence instead of several", "Each concurrent sequence reserves its own KV.")


def _py_seqs_to_pool(b: _Builder, rank: float) -> None:
    """The state pool holds ``limit_seqs`` sequences and the engine was set to run more at once: that many, no more."""
    s = b.s
    k = _py_knobs(s)
    b.add(rank, "reduce-max-num-seqs", f"Lower {k['seqs_flag']} to {s.limit_seqs}", {k["seqs_flag"]: s.limit_seqs},
          f"at most {s.limit_seqs} sequences at once, what the state pool holds",
          "Each running sequence of a hybrid (Mamba / linear-attention) model holds one state block; the pool holds "
          f"{s.limit_seqs}.")


def _py_fp8(b: _Builder, rank: float) -> None:
    """fp8 KV halves the bytes per token (of a bf16/fp16 cache). When the log gives the KV one full-length request
    needs and the pool, and half of it still exceeds the pool, the change also sets the maximum length that fits at
    fp8 (twice the longest that fits now); when that is not below the current maximum, no suggestion."""
    s = b.s
    k = _py_knobs(s)
    v = s.vllm or {}
    if k["lmd"]:
        return  # LMDeploy quantizes its KV with --quant-policy (4 / 8), not a dtype flag
    cur_util = _py_cur_util(s)
    rest = _sglang_rest_mib(s, cur_util) if cur_util else None
    if rest is not None and rest <= 0:
        return  # no memory for the pool at all at this fraction: smaller KV entries do not make one
    if str((s.flags or {}).get("kv_cache_dtype") or "").lower().startswith("fp8"):
        return  # already fp8: the change would be the command as it is
    need, avail, max_len = v.get("kv_needed_mib"), v.get("available_kv_mib"), k["max_len"]
    if need and avail is not None and need / 2 > avail:
        cur_fit = v.get("estimated_max_len") or (int(float(max_len) * avail / need) if max_len and avail > 0 else 0)
        new_len = (2 * int(cur_fit)) // 256 * 256
        if not max_len or new_len <= 0 or new_len >= int(max_len) or not k["len_flag"]:
            return
        b.add(rank, "quantize-kv-cache", f"Store the KV cache as fp8 with {k['len_flag']} {new_len}",
              {"--kv-cache-dtype": k["fp8"], k["len_flag"]: new_len},
              f"one request of {new_len} tokens at fp8 needs about the {_mib(avail)} MiB pool ({_mib(need / 2)} MiB "
              f"for {max_len} tokens at fp8, still more than the pool)",
              "fp8 KV halves the bytes per token, so the pool holds twice the tokens; at the current maximum length "
              "half the KV still does not fit, so the change also sets the longest request that does.")
        return
    b.add(rank, "quantize-kv-cache", "Store the KV cache as fp8", {"--kv-cache-dtype": k["fp8"]},
          "half the KV bytes of bf16" + (f": {_mib(need / 2)} MiB for one full-length request, within the "
                                          f"{_mib(avail)} MiB pool" if need and avail is not None else ""),
          "fp8 KV halves the bytes per token.")


def _py_prefill_batch(b: _Builder, rank: float) -> None:
    s = b.s
    if s.engine == "tgi":
        total = (s.tgi or {}).get("max_batch_total_tokens")
        prefill = (s.tgi or {}).get("prefill_tokens")
        if isinstance(total, int) and isinstance(prefill, int) and prefill < 512 and total > 2 * prefill:
            # "N total tokens with 2 prefill tokens": the KV for the total is what did not fit, not the prefill
            new = max(prefill, total // 2)
            b.add(rank, "reduce-batch", f"Lower --max-batch-total-tokens to {new}", {"--max-batch-total-tokens": new},
                  f"a KV cache for {_tok(new)} tokens instead of {_tok(total)}",
                  "TGI's warm-up allocates the KV cache for --max-batch-total-tokens and failed with a tiny prefill: "
                  "the total, not the prefill batch, is what must shrink.")
            return
        cur = s.flags.get("max_batch_prefill_tokens")
        if not isinstance(cur, int):
            cur = prefill  # "Not enough memory to handle N prefill tokens"
        new = int(cur) // 2 if isinstance(cur, int) and cur > 1 else 4096
        change: dict = {"--max-batch-prefill-tokens": new}
        args = (s.tgi or {}).get("args") or {}
        max_in = to_int(s.flags.get("max_input_tokens") or s.flags.get("max_input_length")) or args.get("max_input_tokens")
        max_total = to_int(s.flags.get("max_total_tokens")) or args.get("max_total_tokens")
        why = "TGI warms up with a full prefill batch; it must fit next to the weights."
        if max_in and max_in > new:
            # the launcher refuses max_batch_prefill_tokens below max_input_tokens (launcher/src/main.rs): the longest
            # prompt shrinks with it, and max_total_tokens stays above it by the same number of new tokens
            change["--max-input-tokens"] = new
            change["--max-total-tokens"] = new + max(1, (max_total - max_in) if max_total and max_total > max_in
                                                     else 1024)
            why += (f" The launcher requires --max-batch-prefill-tokens >= --max-input-tokens, so the longest prompt "
                    f"goes from {_tok(max_in)} to {_tok(new)} tokens too.")
        b.add(rank, "reduce-batch", f"Lower --max-batch-prefill-tokens to {new}", change,
              "a smaller warm-up prefill batch", why)
    else:
        b.add(rank, "reduce-batch", "Lower --max-num-batched-tokens", {"--max-num-batched-tokens": 2048},
              "smaller activation peak during profiling", "The profiled activation peak grows with the batched tokens.")


def _py_act_max_len(b: _Builder, rank: float) -> None:
    k = _py_knobs(b.s)
    max_len, len_flag = k["max_len"], k["len_flag"]
    if not max_len or k["lmd"]:
        return  # (TurboMind's pool is --cache-max-entry-count x the free memory, whatever --session-len says)
    b.add(rank, "reduce-max-model-len", f"Lower {len_flag} to {int(max_len) // 2}", {len_flag: int(max_len) // 2},
          "a shorter maximum request shrinks the KV pool and the largest activations",
          "Where the OOM was raised is not in the log; the maximum length sizes both the KV pool and the "
          "activations of the longest request.")


def _py_act_batch(b: _Builder, rank: float) -> None:
    """The tokens of one step down to 2048; below a current value of 2048 or less, half of it (never under 256)."""
    s = b.s
    if sampler_warmup(s) or graph_capture(s):
        return  # the sampler's batch, and the captured graphs' batch sizes, follow max_num_seqs, not tokens per step
    batch_flag = _py_knobs(s)["batch_flag"]
    cur = s.flags.get(batch_flag.lstrip("-").replace("-", "_")) or (s.vllm or {}).get("max_num_batched_tokens")
    new = 2048 if not isinstance(cur, (int, float)) or cur > 2048 else int(cur) // 2
    seqs = _py_seqs_now(s)
    if new < 256 or (s.engine == "vllm" and seqs and new < seqs):
        return  # (vLLM refuses max_num_batched_tokens below max_num_seqs)
    change = {batch_flag: new, **_v0_chunked(b.s, new)}
    b.add(rank, "reduce-batch", f"Lower {batch_flag} to {new}", change, "a smaller activation peak per step",
          "Activations grow with the tokens processed in one step; graph capture also reserves memory per batch size "
          "(--enforce-eager / --cuda-graph-max-bs shrink that).")


def _v0_chunked(s: Situation, batched: int) -> dict:
    """vLLM V0 (before 0.8) without chunked prefill refuses --max-num-batched-tokens below max_model_len: the change
    turns chunked prefill on with it (V1 always chunks; SGLang and others have no such rule)."""
    if s.engine != "vllm":
        return {}
    v = s.vllm or {}
    cfg = v.get("config") or {}
    max_len = s.flags.get("max_model_len") or to_int(cfg.get("max_model_len") or cfg.get("max_seq_len"))
    ver = re.match(r"(\d+)\.(\d+)", str(v.get("version") or ""))
    v0 = cfg.get("chunked_prefill_enabled") == "False" or (ver is not None and (int(ver[1]), int(ver[2])) < (0, 8)) \
        or s.flags.get("enable_chunked_prefill") is False  # (turned off in the command or the args line)
    if not v0 or s.flags.get("enable_chunked_prefill") is True or (isinstance(max_len, int) and batched >= max_len):
        return {}
    return {"--enable-chunked-prefill": True}


def _py_workspace(b: _Builder, rank: float) -> None:
    """A FlashInfer workspace twice the failed request, in whole 128 MiB (vLLM VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE,
    default 394 MiB; SGLang SGLANG_FLASHINFER_WORKSPACE_SIZE, default 384 MiB; both in bytes)."""
    s = b.s
    if not s.requested_mib:
        return
    env = "SGLANG_FLASHINFER_WORKSPACE_SIZE" if s.engine == "sglang" else "VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE"
    new_mib = max(512, math.ceil(2 * s.requested_mib / 128) * 128)
    b.add(rank, "work-around-alloc-limit", f"Give FlashInfer a {new_mib} MiB workspace", {env: int(new_mib * MIB)},
          f"room for the {_mib(s.requested_mib)} MiB buffer that overflowed the workspace",
          "FlashInfer carves its temporary buffers out of one workspace of fixed size; the device had memory, the "
          f"workspace did not. {env} sets it (bytes); SGLang's --enable-deterministic-inference fixes it at 2 GiB.")


def _py_metal_fraction(b: _Builder, rank: float) -> None:
    s = b.s
    new, p = _metal_fraction(s), s.metal_plan
    b.add(rank, "raise-gpu-memory-utilization", f"Raise --gpu-memory-utilization to {new}",
          {"--gpu-memory-utilization": new},
          f"{_mib(p['metal_limit'] * new)} MiB of the {_mib(p['metal_limit'])} MiB Metal limit: "
          f"{_mib(p['metal_limit'] * new - p['model_memory'] - p['overhead'])} MiB left for the KV cache",
          f"vllm-metal gives the KV cache what is left of fraction x Metal limit after the weights "
          f"({_mib(p['model_memory'])} MiB) and its overhead ({_mib(p['overhead'])} MiB); at {p['fraction']} nothing "
          "was left (VLLM_METAL_MEMORY_FRACTION, when set, takes precedence over the flag).")


def _py_cumem_lower_util(b: _Builder, rank: float) -> None:
    """:func:`cumem_oom`: the computed fraction when the log gives the numbers (:func:`_py_act_lower_util`), else the
    direction without a number (the trainer's setting, e.g. vllm_gpu_memory_utilization, is not in the log)."""
    if _py_cur_util(b.s):
        _py_act_lower_util(b, rank)
        return
    b.add(rank, "lower-gpu-memory-utilization", "Lower --gpu-memory-utilization (the trainer's vllm_gpu_memory_utilization)",
          {}, "the weights and a smaller KV pool fit beside what the training process holds when vLLM wakes up",
          "vLLM's sleep-mode allocator maps the weights and the KV pool back on wake_up; the pool's size is "
          "gpu_memory_utilization x the GPU, so with a trainer on the same GPU a smaller fraction is what fits.")


def _py_act_lower_util(b: _Builder, rank: float) -> None:
    """Leave more memory outside the KV pool: when the torch OOM gives the request, the free memory and the device's
    total, the fraction drops by the missing share of the total (plus 0.01), at least 0.05; else 0.05 (LMDeploy:
    --cache-max-entry-count 0.5, its documented first step). Below 0.3 the pool would be too small to be a fix."""
    s = b.s
    k = _py_knobs(s)
    util_flag = k["util_flag"]
    cur = _py_cur_util(s)
    if not cur and k["sg"] and sglang_unplaced_oom(s):
        # SGLang chose its own fraction and the log does not show it: no number to justify, its FAQ's direction
        b.add(rank, "lower-gpu-memory-utilization", "Lower --mem-fraction-static below the value SGLang chose", {},
              "a smaller KV pool, and more of the GPU left for the activations of prefill and decoding; the log does "
              "not show the fraction SGLang computed (its server_args line does): go 0.05-0.1 below it",
              "SGLang's troubleshooting page: a smaller --mem-fraction-static leaves room for activations and 'helps "
              "prevent OOM errors during both prefill and decoding' (a prefill OOM: --chunked-prefill-size; a decode "
              "OOM: --max-running-requests).")
        return
    if not cur:
        return
    new = round(max(0.5, cur - 0.05), 2)
    total = _py_total_mib(s)
    gap = (s.requested_mib - s.free_mib) if s.requested_mib is not None and s.free_mib is not None else None
    computed = ""
    if k["lmd"]:
        new = 0.5 if cur > 0.5 else round(cur / 2, 2)
    elif gap and gap > 0 and total:
        new = min(round(cur - 0.05, 2), math.floor((cur - gap / total - 0.01) * 100) / 100)
        computed = (f": {_mib(gap)} MiB more than was free is {gap / total:.1%} of the {_mib(total)} MiB device, "
                    "plus 1 % headroom")
    if new < 0.3 or new >= cur:
        return
    change, shrunk = {util_flag: new}, ""
    v = s.vllm or {}
    pool, avail, max_len = v.get("pool_tokens"), v.get("available_kv_mib"), to_int(str(k["max_len"] or ""))
    if not k["lmd"] and pool and avail and avail > 0 and total and max_len:
        # vLLM refuses to start when its pool holds less than one request of max_model_len ("To serve at least one
        # request with the models's max seq len ..."): the smaller pool must still hold it, or the length comes down too
        left = avail - (cur - new) * total
        new_pool = int(float(pool) * left / avail) if left > 0 else 0
        if new_pool < max_len:
            fit_len = new_pool // 256 * 256
            if fit_len < 1024:
                return  # the pool would hold almost nothing: a smaller fraction is no fix here
            change[k["len_flag"]] = fit_len
            shrunk = (f"; the pool shrinks from {pool:,} to about {new_pool:,} tokens, below {k['len_flag']} {max_len:,}, "
                      f"so the maximum length comes down to {fit_len:,} with it (vLLM refuses a pool shorter than one "
                      "request)")
    title = f"Lower {util_flag} to {new}" + (f" and {k['len_flag']} to {change[k['len_flag']]}" if shrunk else "")
    if kv_alloc_oom(s):
        b.add(rank, "lower-gpu-memory-utilization", title, change,
              f"a KV pool {round((cur - new) * 100)} % of the GPU smaller{computed}{shrunk}",
              "The KV pool is utilization x total, sized before it was allocated; its allocation failed because less "
              "was free by then (another process, or the fraction above what this device can give): a smaller "
              "fraction makes a pool that fits.")
        return
    share = ("of the memory left after the weights" if k["lmd"] else "of the GPU")  # TurboMind: x free after weights
    b.add(rank if not k["lmd"] else min(rank, -0.5), "lower-gpu-memory-utilization", title, change,
          f"{round((cur - new) * 100)} % {share} more outside the KV pool for activations and graphs{computed}{shrunk}",
          "The KV pool takes utilization x total; what torch needs beyond it must fit in the rest.")


def _py_graphs(b: _Builder, rank: float) -> None:
    """Graph capture reserves memory for every captured batch size (up to max_num_seqs / --cuda-graph-max-bs): vLLM
    runs without graphs (--enforce-eager); SGLang captures up to 16 sequences (its own advice), or none when already
    at or below that."""
    s = b.s
    if s.engine == "vllm" and s.flags.get("enforce_eager") is not True:
        b.add(rank, "shrink-cuda-graphs", "Run without CUDA graphs", {"--enforce-eager": True},
              "no graph capture: the memory its captured batch sizes reserved stays free (decoding gets slower)",
              "The failure came while vLLM captured its CUDA graphs, one per batch size up to max_num_seqs.")
    elif s.engine == "sglang":
        cur = to_int(s.flags.get("cuda_graph_max_bs"))
        change = {"--cuda-graph-max-bs": 16} if not cur or cur > 16 else {"--disable-cuda-graph": True}
        b.add(rank, "shrink-cuda-graphs", "Capture fewer CUDA graphs" if "--cuda-graph-max-bs" in change
              else "Run without CUDA graphs", change, "less memory held by captured graphs",
              "The failure came while SGLang captured its CUDA graphs (its own advice: a smaller --cuda-graph-max-bs, "
              "or --disable-cuda-graph).")


def _py_seqs_now(s: Situation) -> int | None:
    """The engine's concurrent sequences: the command's setting, else what the failing line says it ran."""
    return _flag_value(s, _py_knobs(s)["seqs_flag"]) or s.running_seqs


def _py_act_seqs(b: _Builder, rank: float) -> None:
    """Fewer concurrent sequences: half the value the command sets (never more than it), else 64, below the engines'
    defaults (vLLM 256 and more, SGLang and LMDeploy's batch sizes likewise)."""
    seqs_flag = _py_knobs(b.s)["seqs_flag"]
    cur = _py_seqs_now(b.s)
    new = max(1, cur // 2) if cur else 64
    if cur and new >= cur:
        return  # already one sequence: nothing to lower
    b.add(rank, "reduce-max-num-seqs", f"Lower {seqs_flag} to {new}", {seqs_flag: new},
          "fewer sequences per step, smaller sampler and activation buffers",
          "Warm-up and sampling allocate per sequence of the largest batch.")


# ------------------------------------------------------------------ conditions (one named predicate per row)

def always(s: Situation) -> bool:
    """Always: the family and the phase alone decide."""
    return True


def host_cap(s: Situation) -> bool:
    """A host buffer refused although it fits the RAM the log reported, or under a recorded per-process limit."""
    return _host_cap_failure(s)


def not_host_cap(s: Situation) -> bool:
    """Not a host buffer refused under a per-process cap (freeing device memory can help)."""
    return not _host_cap_failure(s)


def swa_full(s: Situation) -> bool:
    """--swa-full gives sliding-window layers a full-length cache."""
    return s.swa_full


def parallel_inflates_ctx(s: Situation) -> bool:
    """Several slots with a non-unified cache padded the requested -c by more than 25 % (256 cells per slot)."""
    return bool((s.n_seq or 1) > 1 and s.kv_unified is False and s.n_ctx and s.n_ctx_requested
                and s.n_ctx > s.n_ctx_requested * 1.25)


def parallel_splits_ctx(s: Situation) -> bool:
    """Several slots with a non-unified cache, without inflating -c (each slot gets its share)."""
    return not parallel_inflates_ctx(s) and s.kv_unified is False and (s.n_seq or 1) > 1


def ollama_slots_multiply_ctx(s: Situation) -> bool:
    """Ollama ran several slots: its runner's context (and KV) is num_ctx x slots, so one slot keeps each request's
    context at a fraction of the KV."""
    return _ollama_slots(s) > 1


def ollama_layout_names_layers(s: Situation) -> bool:
    """Ollama's layout step named the layer count it could not place ("with num_gpu = N"), and the KV the log
    printed is not what did not fit (under 1 GiB: above it the context is the lever, as in small_ctx_on_gpu)."""
    return _is_ollama(s) and bool(s.n_gpu_layers_log) and not _big_kv(s)


def fits_but_failed_not_host_cap(s: Situation) -> bool:
    """The request fit the free memory the log reported, on a device (not a capped host buffer)."""
    return s.verdict == "fits_but_failed" and not _host_cap_failure(s)


def working_set_big_ctx(s: Situation) -> bool:
    """Metal's working set overflowed while the graph ran, at a large context (>= 8192 tokens or >= 1 GiB of KV)."""
    return s.working_set and ((s.n_ctx or 0) >= 8192 or (s.kv_mib or 0) >= 1024)


def working_set_small_ctx(s: Situation) -> bool:
    """Metal's working set overflowed while the graph ran, at a small context (the layers are the big part)."""
    return s.working_set and not working_set_big_ctx(s)


def working_set(s: Situation) -> bool:
    """Metal's working set (weights + KV + compute) overflowed while the graph ran."""
    return s.working_set


def buffer_over_alloc_limit(s: Situation) -> bool:
    """One compute buffer was over the backend's per-allocation limit (not a capped host buffer, not ggml's own
    2023 memory pool, whose size llama.cpp computes itself)."""
    return not s.working_set and (s.alloc_limit or s.verdict == "exceeds_alloc_limit") and not _host_cap_failure(s) \
        and s.oom_rule != "ggml-pool"


def kv_update(s: Situation) -> bool:
    """The compute buffer failed while the KV cache was being updated (shifted/defragmented): the context sizes it."""
    return not s.working_set and s.kv_update


def ollama_compute(s: Situation) -> bool:
    """Ollama's compute graph did not fit: fewer layers on the GPU is Ollama's own lever (num_gpu)."""
    return not s.working_set and _is_ollama(s)


def secondary_gpu(s: Situation) -> bool:
    """The buffer failed on a GPU other than the first (index > 0): the split decides its load."""
    idx = _dev_index(s.failing_device)
    return not s.working_set and bool(idx) and s.backend != "cpu"


_V_QUANT_NEEDS_FA = re.compile(r"V cache quantization requires flash_attn|quantized V cache was requested, but this "
                               r"requires Flash Attention")
"""llama.cpp's refusal of a quantized V cache without flash attention (llama_new_context_with_model, 2024;
llama-context.cpp "quantized V cache was requested, but this requires Flash Attention", 2025+)."""


_UNKNOWN_ARCH = re.compile(r"unknown model architecture|unknown architecture|model architecture \S+ (?:is )?not supported|"
                           r"does not (?:yet )?support (?:the )?(?:model )?architecture")
"""A loader that does not know the model's architecture (llama.cpp llama-model-loader "unknown model architecture:
'qwen3next'", as LM Studio, Ollama and the bindings relay it): a build that knows it, not a setting."""


def unknown_arch(s: Situation) -> bool:
    """The model's architecture is newer than the engine's build."""
    return s.phase == "unknown" and bool(_UNKNOWN_ARCH.search(s.final_error or ""))


_ARCH_NAME = re.compile(r"architecture:? '?([\w.-]+)'?")


def _update_for_arch(b: _Builder, rank: float) -> None:
    m = _ARCH_NAME.search(b.s.final_error or "")
    b.add(rank, "bisect-regression", "Use a build that knows the model's architecture", {},
          f"the engine's build does not know the architecture {m.group(1)!r}" if m
          else "the engine's build does not know this model's architecture",
          "Support for a new architecture arrives in a newer release of the engine (and of the programs that bundle "
          "it: LM Studio's runtime, Ollama, llama-cpp-python): update it, or use a model of a supported architecture.")


def v_quant_needs_fa(s: Situation) -> bool:
    """The context was refused because its quantized V cache needs flash attention."""
    return s.phase == "unknown" and bool(_V_QUANT_NEEDS_FA.search(s.final_error or ""))


def graph_buffer(s: Situation) -> bool:
    """A compute (graph) buffer that is not Metal's whole working set."""
    return not s.working_set


def graph_buffer_on_gpu(s: Situation) -> bool:
    """A compute (graph) buffer on a GPU backend (not the CPU)."""
    return not s.working_set and s.backend != "cpu"


def graph_buffer_fits_but_failed(s: Situation) -> bool:
    """A compute buffer that fit the free memory the log reported, on a device (not a capped host buffer)."""
    return not s.working_set and fits_but_failed_not_host_cap(s)


def graph_buffer_not_host_cap(s: Situation) -> bool:
    """A compute buffer that is not a host buffer refused under a per-process cap."""
    return not s.working_set and not _host_cap_failure(s)


def weights_on_gpu(s: Situation) -> bool:
    """The weights failed on a GPU device (not the CPU, not a pinned host buffer, not the host killing the process)."""
    return s.backend not in ("cpu", "unknown") and not (s.failing_device or "").endswith("_Host") \
        and not host_ran_out(s)


def fixed_workspace(s: Situation) -> bool:
    """FlashInfer's attention workspace (a buffer of fixed size, set by an environment variable) overflowed."""
    return s.oom_rule == "flashinfer-workspace"


def others_hold_the_gap(s: Situation) -> bool:
    """Other processes held at least the memory the request lacked (requested - free): freeing them makes it fit."""
    return bool(s.others_mib) and s.requested_mib is not None and s.free_mib is not None and \
        s.others_mib >= s.requested_mib - s.free_mib


def _metal_fraction(s: Situation) -> float | None:
    """The memory fraction that leaves vllm-metal 10 % of its Metal limit for the KV after the weights and its
    overhead, in steps of 0.05; None when that is not above the fraction used or above 0.95."""
    p = s.metal_plan or {}
    if not all(isinstance(p.get(k), (int, float)) for k in ("metal_limit", "model_memory", "overhead", "fraction")) \
            or p["metal_limit"] <= 0:
        return None
    new = math.ceil(((p["model_memory"] + p["overhead"]) / p["metal_limit"] + 0.10) * 20) / 20
    return new if p["fraction"] < new <= 0.95 else None


def metal_fraction_too_low(s: Situation) -> bool:
    """vllm-metal refused for want of KV budget, and a larger memory fraction (at most 0.95) leaves room for it."""
    return _metal_fraction(s) is not None


def metal_fraction_maxed(s: Situation) -> bool:
    """vllm-metal refused for want of KV budget and no fraction up to 0.95 leaves room: the weights are too big."""
    return bool(s.metal_plan.get("metal_limit")) and _metal_fraction(s) is None


def host_ran_out(s: Situation) -> bool:
    """The host itself ran out (the OOM killer, ENOMEM, std::bad_alloc): fewer GPU layers would put more on it."""
    from kvreport.logs.oom import HOST_RULES

    return s.oom_rule in HOST_RULES


_CTX_KNOB_OF_RULE = {"exllama-autosplit": "max_seq_len (exllamav2, ExUI; tabbyAPI: max_seq_len and cache_size)"}
"""The context setting of an engine kvreport knows only by its memory error (kvreport.logs.oom rule id -> words)."""


def request_refused(s: Situation) -> bool:
    """A request longer than the context (kvreport.logs.oom.REQUEST_RULES): the context is too small for the request;
    nothing was short of memory, so no memory lever (a smaller pool, a smaller batch) helps."""
    from kvreport.logs.oom import REQUEST_RULES

    return s.oom_rule in REQUEST_RULES or s.request_tokens is not None


def not_request_refused(s: Situation) -> bool:
    """The KV filled up while serving (no slot for a batch), not a request refused for its length."""
    return not request_refused(s)


def budget_names_cache(s: Situation) -> bool:
    """The engine's own budget check names the cache it sized for the maximum length (exllamav2/v3's auto-split:
    "Insufficient VRAM for model and cache"), or Ollama's estimate gives a KV of at least half its requirement
    ("memory.required.kv" beside "model requires more system memory"): the cache, sized by the context, is the first
    lever."""
    if s.oom_rule == "exllama-autosplit":
        return True
    return bool(_is_ollama(s) and s.kv_estimate_mib and s.requested_mib and s.kv_estimate_mib >= 0.5 * s.requested_mib)


def budget_gap_small(s: Situation) -> bool:
    """Ollama's memory check: the model needs at most 1.5x the free memory (a smaller context closes the gap)."""
    return bool(s.requested_mib is not None and s.free_mib and s.requested_mib <= 1.5 * s.free_mib)


def budget_gap_tiny(s: Situation) -> bool:
    """The memory check missed by at most 5 % of the free memory and 1 GiB (Ollama's "requires 59.8 GiB ... available
    59.8 GiB"): freeing that little (another model, the page cache, a browser) is the smallest change."""
    return bool(s.requested_mib is not None and s.free_mib
                and s.requested_mib - s.free_mib <= min(1024.0, 0.05 * s.free_mib))


def budget_gap_large(s: Situation) -> bool:
    """Ollama's memory check: the model needs more than 1.5x the free memory (or the gap is not known)."""
    return not budget_gap_small(s)


def small_ctx_on_gpu(s: Situation) -> bool:
    """The context could not be created on a GPU although the context is small (8192 tokens or less, or Ollama's
    default, which was 2048 until 2025): the weights left no room, so the layers on the GPU are the lever."""
    small = (s.n_ctx is not None and s.n_ctx <= 8192) or (s.n_ctx is None and _is_ollama(s))
    return small and not _big_kv(s) and s.backend not in ("cpu",) and not _host_cap_failure(s)


def _big_kv(s: Situation) -> bool:
    """The KV cache is 1 GiB or more, by kvreport's arithmetic or, without it, the engine's own estimate: then the KV
    is what did not fit, and the context is the lever."""
    kv = s.kv_mib if s.kv_mib is not None else s.kv_estimate_mib
    return kv is not None and kv >= 1024


def mlx_over_limit(s: Situation) -> bool:
    """mlx refused one buffer above Metal's maximum buffer size (the largest prefill activation)."""
    return s.alloc_limit or s.verdict == "exceeds_alloc_limit"


def mlx_not_over_limit(s: Situation) -> bool:
    """An mlx memory failure that names no per-buffer limit."""
    return not mlx_over_limit(s)


def big_compute_unknown_ctx(s: Situation) -> bool:
    """A compute buffer of 8 GiB or more at a context the log does not give, at a micro-batch known to be the default
    (the log or command says -ub <= 512, or Ollama, whose runner keeps num_batch 512 unless set): without flash
    attention llama.cpp's KQ scores are n_ctx x n_ubatch x n_head x 4 bytes (8 GiB at -ub 512 is about 128k tokens with
    32 heads, 32k with 128; 4k tokens take 256 MiB with 32), so a buffer that size says the context is long."""
    ub_default = (s.n_ubatch is not None and s.n_ubatch <= 512) or (s.n_ubatch is None and _is_ollama(s))
    # (with the micro-batch unknown too, a buffer of 16 GiB or more: even at -ub 4096 that is a context of 8k-32k
    # tokens, at the default 512 of 64k-256k; the context is the lever either way)
    ub_any = s.n_ubatch is None and (s.requested_mib or 0) >= 16384
    return s.phase == "compute_buffer" and not s.working_set and s.n_ctx is None and (ub_default or ub_any) \
        and (s.requested_mib or 0) >= 8192


def crashed(s: Situation) -> bool:
    """A failure that is not about memory, ended by a crash (an assert, a segfault, an abort, a lost device): the
    playbook's last step, an older known-good build, is the one fix that applies."""
    return s.phase == "unknown" and not s.has_memory_event and bool(CRASH.search(s.final_error or ""))


_WATCHDOG = re.compile(r"ErrorDeviceLost|DeviceLostError|\bdevice lost\b|DEVICE_HUNG|\b887A0006\b|context is lost")
"""A GPU the driver reset under a running batch: Vulkan's VK_ERROR_DEVICE_LOST (vulkan-hpp "vk::Queue::submit:
ErrorDeviceLost", ggml-vulkan "device lost on Vulkan0"), amdgpu's "The CS has been cancelled because the context is
lost" after its ring timeout, DirectX's DXGI_ERROR_DEVICE_HUNG (887A0006)."""


def gpu_watchdog(s: Situation) -> bool:
    """A crash in which the driver reset the GPU under a running batch (:data:`_WATCHDOG`): a kernel that outran the
    driver's watchdog (amdgpu's job timeout, Windows' TDR) during a long prefill is the usual cause, and a smaller
    micro-batch shortens every kernel (ollama#17870, fh-003: num_batch 128 ran the prompt that crashed at 512)."""
    return s.phase == "unknown" and not s.has_memory_event and bool(_WATCHDOG.search(s.final_error or ""))


def huge_ctx(s: Situation) -> bool:
    """An unplaced memory failure at a context of 32768 tokens or more: the context is the likely cause."""
    return (s.n_ctx or 0) >= 32768


def huge_ctx_on_gpu(s: Situation) -> bool:
    """An unplaced memory failure at a context of 32768 tokens or more, on a known GPU backend."""
    return huge_ctx(s) and s.backend not in ("cpu", "unknown")


def big_ubatch(s: Situation) -> bool:
    """An unplaced memory failure at a moderate context with -ub >= 2048 (the compute buffer is the likely cause)."""
    return not huge_ctx(s) and (s.n_ubatch or 0) >= 2048


def big_ubatch_vulkan(s: Situation) -> bool:
    """As big_ubatch, on Vulkan (whose per-allocation limit a large compute buffer meets)."""
    return big_ubatch(s) and s.backend == "vulkan"


def small_ubatch(s: Situation) -> bool:
    """An unplaced memory failure at a moderate context and a moderate -ub (< 2048)."""
    return not huge_ctx(s) and (s.n_ubatch or 0) < 2048


def small_ubatch_on_gpu(s: Situation) -> bool:
    """As small_ubatch, on a backend other than the CPU."""
    return small_ubatch(s) and s.backend != "cpu"


def small_ubatch_vulkan(s: Situation) -> bool:
    """As small_ubatch, on Vulkan (whose per-allocation limit a buffer may meet)."""
    return small_ubatch(s) and s.backend == "vulkan"


def not_huge_ctx(s: Situation) -> bool:
    """An unplaced memory failure at a context under 32768 tokens."""
    return not huge_ctx(s)


def vllm_gate_numbers(s: Situation) -> bool:
    """vLLM's start-up gate line gave the free and total memory of the device."""
    gate = (s.vllm or {}).get("gate") or {}
    return bool(gate.get("free_mib") and gate.get("total_mib"))


def vllm_gate_near_miss(s: Situation) -> bool:
    """vLLM's start-up gate missed by a little: the free memory is within 5 % of the device of what utilization x
    total asked, so a slightly lower fraction starts the engine with nearly the same pool."""
    gate = (s.vllm or {}).get("gate") or {}
    free, total, want = gate.get("free_mib"), gate.get("total_mib"), gate.get("requested_mib")
    return bool(free and total and want) and 0 < want - free <= 0.05 * total


def negative_pool(s: Situation) -> bool:
    """vLLM's KV pool came out empty or negative: weights and activations took the whole budget."""
    avail = (s.vllm or {}).get("available_kv_mib")
    return avail is not None and avail <= 0


def kv_alloc_oom(s: Situation) -> bool:
    """The KV pool's own allocation failed (a torch OOM while the engine created its KV tensors): the pool was sized
    from the memory fraction for more than was free then; a larger fraction makes it larger still."""
    return s.phase == "kv_cache" and s.torch_oom


def draft_failed(s: Situation) -> bool:
    """llama-server's speculative-decoding draft model failed to load or to get its context."""
    return s.draft_failed


def graph_capture(s: Situation) -> bool:
    """A compute failure while the engine captured its CUDA graphs."""
    return s.graph_capture


def sampler_warmup(s: Situation) -> bool:
    """vLLM's sampler warm-up ran out of memory: its batch is max_num_seqs dummy requests of the vocabulary's logits."""
    return s.sampler_warmup


def seqs_over_pool(s: Situation) -> bool:
    """The engine was set to run more sequences at once than its state pool holds (the line gives the pool)."""
    return bool(s.limit_seqs)


def pool_too_small(s: Situation) -> bool:
    """The KV pool exists but cannot hold one request of the maximum length (not a request refused for its length,
    not a pool whose own allocation failed)."""
    return not negative_pool(s) and not request_refused(s) and not kv_alloc_oom(s) and not seqs_over_pool(s)


def util_cannot_grow(s: Situation) -> bool:
    """The KV pool is too small and no memory fraction up to 0.95 grows it enough (or it is already there): the
    weights leave too little room on these devices."""
    return pool_too_small(s) and _py_raise_util_change(s) is None


def sglang_pool_too_small(s: Situation) -> bool:
    """SGLang's token pool is too small (its error asks for a larger --mem-fraction-static)."""
    return pool_too_small(s) and s.engine == "sglang"


def vllm_pool_too_small(s: Situation) -> bool:
    """vLLM's (or another Python engine's) KV pool is too small for one request of the maximum length."""
    return pool_too_small(s) and s.engine != "sglang"


def activation_oom(s: Situation) -> bool:
    """A torch OOM outside the KV pool (graph capture, profiling, warm-up, serving or an unnamed step), in any Python
    engine (TGI's knobs by their own names, kvreport.fixes._py_knobs); TGI's own warm-up message has rows of its own
    (:func:`prefill_batch`)."""
    return s.has_memory_event and (s.engine != "tgi" or s.torch_oom or (s.oom_rule or "").startswith("torch"))


def sglang_unplaced_oom(s: Situation) -> bool:
    """SGLang ran out of memory at a step the log does not name: its troubleshooting page's fix for both prefill and
    decoding is a smaller --mem-fraction-static (docs.sglang.io, references/faq: "CUDA Out of Memory")."""
    return s.engine == "sglang" and activation_oom(s) and not s.py_stage


def cumem_oom(s: Situation) -> bool:
    """vLLM's sleep-mode allocator could not map its pools back (csrc/cumem_allocator.cpp, wake_up in an RL trainer's
    colocated rollouts): the weights and the KV pool sized by gpu_memory_utilization no longer fit beside what the
    trainer holds; a smaller fraction is the maintainers' fix (lmm-r1#42, OpenRLHF-family threads)."""
    return s.oom_rule == "vllm-cumem-allocator"


def prefill_batch(s: Situation) -> bool:
    """A compute failure that is not a torch OOM read from the log (TGI's warm-up prefill, vLLM's profiling)."""
    return not activation_oom(s)


def tgi_unplaced(s: Situation) -> bool:
    """TGI failed in its warm-up ("Method Warmup encountered an error", "Warming up model") and the log does not say
    why: its warm-up prefill batch is the usual cause. A shard killed with no memory line is not placed there."""
    return s.engine == "tgi" and (s.py_stage == "compute_buffer" or "warm" in (s.final_error or "").lower())


# ------------------------------------------------------------------ the rule table


@dataclass(frozen=True)
class Rule:
    """One fix rule: when ``family`` and ``phase`` match and ``when`` holds, ``build`` may add suggestion ``sid`` at
    ``rank`` (lower is first). The best rank given for an id wins."""

    sid: str
    family: str
    phases: tuple[str, ...]
    when: Callable[[Situation], bool]
    rank: float
    build: Callable[[_Builder, float], None]


LLAMA = "llama.cpp-family"
MLX = "mlx"
PYTHON = "python"
FAMILIES = (LLAMA, PYTHON, MLX)
_KVC = ("kv_cache", "context")
_PLACED = ("kv_cache", "context", "compute_buffer", "model_weights", "unknown")
_CB = ("compute_buffer",)
_UNK = ("unknown",)
_ACT = ("compute_buffer", "unknown")


def _r(sid: str, family: str, phases, when, rank: float, build) -> Rule:
    return Rule(sid, family, (phases,) if isinstance(phases, str) else tuple(phases), when, rank, build)


RULES: tuple[Rule, ...] = (
    # llama.cpp and the programs built on it, Ollama included (playbook order: context, parallel, cache types,
    # headroom, the failing device, the deepest error, regression)
    _r("raise-memory-limit", LLAMA, _PLACED, host_cap, -1, _raise_memory_limit),
    _r("disable-swa-full", LLAMA, _KVC, swa_full, 0, _drop_swa_full),
    _r("reduce-parallel", LLAMA, _KVC, parallel_inflates_ctx, 0.5, _reduce_parallel),
    _r("reduce-parallel", LLAMA, _KVC, ollama_slots_multiply_ctx, 0.5, _reduce_parallel),
    _r("reduce-gpu-layers", LLAMA, "context", ollama_layout_names_layers, 0.7, _reduce_layers),
    _r("reduce-gpu-layers", LLAMA, "context", small_ctx_on_gpu, 0.5, _reduce_layers),
    _r("reduce-ctx", LLAMA, _KVC, always, 1, _reduce_ctx),
    _r("reduce-parallel", LLAMA, _KVC, parallel_splits_ctx, 2, _reduce_parallel),
    _r("quantize-kv-cache", LLAMA, _KVC, always, 3, _quantize),
    _r("bisect-regression", LLAMA, _KVC, fits_but_failed_not_host_cap, 2.5, _bisect),
    _r("kv-cache-on-host", LLAMA, _KVC, always, 4, _headroom),
    _r("rebalance-devices", LLAMA, _KVC, always, 5, _rebalance),
    _r("free-device-memory", LLAMA, _KVC, not_host_cap, 6, _free_memory),
    _r("reduce-ctx", LLAMA, _CB, working_set_big_ctx, 0, _reduce_ctx),
    _r("reduce-ctx", LLAMA, _CB, working_set_small_ctx, 1, _reduce_ctx),
    _r("reduce-gpu-layers", LLAMA, _CB, working_set_big_ctx, 1, _reduce_layers),
    _r("reduce-gpu-layers", LLAMA, _CB, working_set_small_ctx, 0, _reduce_layers),
    _r("raise-memory-limit", LLAMA, _CB, working_set, 1.5, _metal_wired_limit),
    _r("smaller-model-or-quant", LLAMA, _CB, working_set, 2, _smaller_model),
    _r("reduce-batch", LLAMA, _CB, working_set, 3, _reduce_batch),
    _r("work-around-alloc-limit", LLAMA, _CB, buffer_over_alloc_limit, 0, _alloc_limit),
    _r("reduce-parallel", LLAMA, _CB, ollama_slots_multiply_ctx, -0.1, _reduce_parallel_compute),
    _r("reduce-ctx", LLAMA, _CB, kv_update, 0, _reduce_ctx),
    _r("reduce-ctx", LLAMA, _CB, huge_ctx, 0.2, _reduce_ctx),
    _r("reduce-ctx", LLAMA, _CB, big_compute_unknown_ctx, 0.3, _reduce_ctx),
    _r("reduce-gpu-layers", LLAMA, _CB, ollama_compute, 0.5, _reduce_layers),
    _r("rebalance-devices", LLAMA, _CB, secondary_gpu, 0.7, _rebalance),
    _r("reduce-batch", LLAMA, _CB, graph_buffer, 1, _reduce_batch),
    _r("enable-flash-attn", LLAMA, _CB, graph_buffer, 1.5, _flash),
    _r("reduce-ctx", LLAMA, _CB, graph_buffer, 2, _reduce_ctx),
    _r("reduce-gpu-layers", LLAMA, _CB, graph_buffer_on_gpu, 3, _reduce_layers),
    _r("bisect-regression", LLAMA, _CB, graph_buffer_fits_but_failed, 4, _bisect),
    _r("free-device-memory", LLAMA, _CB, graph_buffer_not_host_cap, 5, _free_memory),
    _r("reduce-gpu-layers", LLAMA, "model_weights", weights_on_gpu, 0, _reduce_layers_sized),
    _r("smaller-model-or-quant", LLAMA, "model_weights", host_ran_out, 0, _smaller_model),
    _r("smaller-model-or-quant", LLAMA, "model_weights", always, 1, _smaller_model),
    _r("rebalance-devices", LLAMA, "model_weights", weights_on_gpu, 2, _rebalance),
    _r("free-device-memory", LLAMA, "model_weights", not_host_cap, 3, _free_memory),
    _r("reduce-ctx", LLAMA, "memory_budget", budget_names_cache, -0.5, _reduce_ctx),
    _r("reduce-parallel", LLAMA, "memory_budget", ollama_slots_multiply_ctx, -0.3, _reduce_parallel),
    _r("smaller-model-or-quant", LLAMA, "memory_budget", budget_gap_large, 0, _smaller_model),
    _r("smaller-model-or-quant", LLAMA, "memory_budget", budget_gap_small, 1, _smaller_model),
    _r("reduce-ctx", LLAMA, "memory_budget", budget_gap_small, 0, _reduce_ctx),
    _r("reduce-ctx", LLAMA, "memory_budget", budget_gap_large, 1, _reduce_ctx),
    _r("free-device-memory", LLAMA, "memory_budget", budget_gap_tiny, -0.4, _free_memory),
    _r("free-device-memory", LLAMA, "memory_budget", always, 2, _free_memory),
    _r("raise-ctx", LLAMA, "kv_capacity", request_refused, -1, _raise_ctx),
    _r("reduce-parallel", LLAMA, "kv_capacity", always, 0, _slots_for_full_kv),
    _r("raise-ctx", LLAMA, "kv_capacity", not_request_refused, 0.5, _raise_ctx),
    _r("reduce-batch", LLAMA, "kv_capacity", not_request_refused, 1, _reduce_batch),
    _r("reduce-batch", LLAMA, _UNK, gpu_watchdog, -1.5, _shorter_kernels),
    _r("bisect-regression", LLAMA, _UNK, gpu_watchdog, -1, _bisect_crash),
    _r("bisect-regression", LLAMA, _UNK, crashed, -1, _bisect_crash),
    _r("bisect-regression", LLAMA, _UNK, unknown_arch, -1, _update_for_arch),
    _r("enable-flash-attn", LLAMA, _UNK, v_quant_needs_fa, -1, _flash_for_v_cache),
    _r("reduce-ctx", LLAMA, (*_KVC, *_CB), draft_failed, -1.2, _draft_ctx),
    _r("quantize-kv-cache", LLAMA, _KVC, draft_failed, -1.1, _draft_cache),
    _r("reduce-gpu-layers", LLAMA, (*_KVC, *_CB, "model_weights"), draft_failed, -1.0, _draft_host),
    _r("reduce-ctx", LLAMA, _UNK, huge_ctx, 0, _reduce_ctx),
    _r("quantize-kv-cache", LLAMA, _UNK, huge_ctx, 1, _quantize),
    _r("reduce-gpu-layers", LLAMA, _UNK, huge_ctx_on_gpu, 2, _reduce_layers_sized),
    _r("reduce-batch", LLAMA, _UNK, big_ubatch, 0, _reduce_batch),
    _r("work-around-alloc-limit", LLAMA, _UNK, big_ubatch_vulkan, 1, _alloc_limit),
    _r("reduce-ctx", LLAMA, _UNK, big_ubatch, 2, _reduce_ctx),
    _r("reduce-gpu-layers", LLAMA, _UNK, small_ubatch_on_gpu, 0, _reduce_layers_sized),
    _r("reduce-ctx", LLAMA, _UNK, small_ubatch, 1, _reduce_ctx),
    _r("work-around-alloc-limit", LLAMA, _UNK, small_ubatch_vulkan, 2, _alloc_limit),
    _r("smaller-model-or-quant", LLAMA, _UNK, host_ran_out, 4, _smaller_model),
    _r("free-device-memory", LLAMA, _UNK, always, 5, _free_memory),
    # vLLM, SGLang, TGI, LMDeploy (and unknown engines with their flags or a torch OOM)
    _r("more-devices", PYTHON, (*_ACT, "model_weights", "kv_cache", "kv_capacity"), unused_visible_gpus, -1.5,
       _py_use_visible_gpus),
    _r("raise-gpu-memory-utilization", PYTHON, "memory_budget", metal_fraction_too_low, -0.5, _py_metal_fraction),
    _r("smaller-model-or-quant", PYTHON, "memory_budget", metal_fraction_maxed, -0.5, _smaller_model),
    _r("free-device-memory", PYTHON, "memory_budget", always, 0, _free_memory),
    _r("free-device-memory", PYTHON, (*_ACT, "model_weights", "kv_cache"), others_hold_the_gap, -0.5, _free_memory),
    _r("lower-gpu-memory-utilization", PYTHON, "memory_budget", vllm_gate_near_miss, -0.5, _py_lower_util_gate),
    _r("lower-gpu-memory-utilization", PYTHON, "memory_budget", vllm_gate_numbers, 1, _py_lower_util_gate),
    _r("lower-gpu-memory-utilization", PYTHON, "kv_cache", kv_alloc_oom, 0, _py_act_lower_util),
    _r("free-device-memory", PYTHON, "kv_cache", kv_alloc_oom, 0.5, _free_memory),
    _r("raise-gpu-memory-utilization", PYTHON, ("kv_capacity", "kv_cache"), negative_pool, 0, _py_raise_util_negative),
    _r("smaller-model-or-quant", PYTHON, ("kv_capacity", "kv_cache"), negative_pool, 1, _smaller_model),
    _r("more-devices", PYTHON, ("kv_capacity", "kv_cache"), negative_pool, 2, _py_more_devices),
    _r("raise-ctx", PYTHON, "kv_capacity", request_refused, -1, _raise_ctx),
    _r("reduce-max-num-seqs", PYTHON, "kv_capacity", seqs_over_pool, -1, _py_seqs_to_pool),
    _r("reduce-max-model-len", PYTHON, ("kv_capacity", "kv_cache"), pool_too_small, 0, _py_reduce_max_len),
    _r("raise-gpu-memory-utilization", PYTHON, ("kv_capacity", "kv_cache"), sglang_pool_too_small, 0.5, _py_raise_util),
    _r("raise-gpu-memory-utilization", PYTHON, ("kv_capacity", "kv_cache"), vllm_pool_too_small, 1, _py_raise_util),
    _r("reduce-max-num-seqs", PYTHON, ("kv_capacity", "kv_cache"), pool_too_small, 1.5, _py_one_seq),
    _r("quantize-kv-cache", PYTHON, ("kv_capacity", "kv_cache"), pool_too_small, 2, _py_fp8),
    _r("smaller-model-or-quant", PYTHON, ("kv_capacity", "kv_cache"), util_cannot_grow, 2.5, _smaller_model),
    _r("more-devices", PYTHON, ("kv_capacity", "kv_cache"), util_cannot_grow, 3, _py_more_devices),
    _r("work-around-alloc-limit", PYTHON, _CB, fixed_workspace, -1, _py_workspace),
    _r("bisect-regression", PYTHON, _UNK, crashed, -1, _bisect_crash),
    _r("lower-gpu-memory-utilization", PYTHON, _UNK, sglang_unplaced_oom, -0.1, _py_act_lower_util),
    _r("lower-gpu-memory-utilization", PYTHON, _UNK, cumem_oom, -0.2, _py_cumem_lower_util),
    _r("reduce-max-model-len", PYTHON, _UNK, activation_oom, 0, _py_act_max_len),
    _r("reduce-max-num-seqs", PYTHON, _CB, sampler_warmup, -0.5, _py_act_seqs),
    _r("shrink-cuda-graphs", PYTHON, _CB, graph_capture, 1.2, _py_graphs),
    _r("reduce-batch", PYTHON, _CB, activation_oom, 0, _py_act_batch),
    _r("reduce-batch", PYTHON, _UNK, activation_oom, 1, _py_act_batch),
    _r("lower-gpu-memory-utilization", PYTHON, _ACT, activation_oom, 1, _py_act_lower_util),
    _r("reduce-max-num-seqs", PYTHON, _ACT, activation_oom, 1.5, _py_act_seqs),
    _r("reduce-batch", PYTHON, _CB, prefill_batch, 0, _py_prefill_batch),
    _r("reduce-batch", PYTHON, _UNK, tgi_unplaced, 0, _py_prefill_batch),
    _r("smaller-model-or-quant", PYTHON, "model_weights", always, 0, _smaller_model),
    _r("more-devices", PYTHON, "model_weights", always, 1, _py_more_devices),
    # mlx-lm and its front-ends (LM Studio's MLX engine, vMLX, mlx-omni-server): their own knobs
    _r("bisect-regression", MLX, _UNK, crashed, -1, _bisect_crash),
    _r("reduce-batch", MLX, _ACT, mlx_over_limit, 0, _mlx_prefill),
    _r("reduce-ctx", MLX, _ACT, mlx_over_limit, 1, _mlx_max_kv),
    _r("raise-ctx", MLX, "kv_capacity", request_refused, -1, _raise_ctx),
    _r("reduce-ctx", MLX, (*_KVC, *_ACT), mlx_not_over_limit, 0, _mlx_max_kv),
    _r("reduce-batch", MLX, _ACT, mlx_not_over_limit, 1, _mlx_prefill),
    _r("smaller-model-or-quant", MLX, (*_KVC, *_ACT, "model_weights"), always, 2, _smaller_model),
)
"""Every fix rule, in the order :func:`suggest` applies them (docs/fix-rules.md is generated from it)."""


def family_of(s: Situation) -> str:
    """"python" for vLLM, SGLang, TGI, LMDeploy (and an unknown engine with their flags or a torch OOM), "mlx" for
    mlx-lm and its front-ends, else "llama.cpp-family" (llama.cpp, the programs built on it, Ollama)."""
    from kvreport.engines import fix_family

    family = fix_family(s.engine)
    if family:
        return family
    flags = s.flags or {}
    py_like = any(k in flags for k in ("max_model_len", "gpu_memory_utilization", "max_num_seqs")) or \
        (s.oom_rule or "").startswith("torch") or s.oom_rule in _PYTHON_RULES or s.torch_oom
    return PYTHON if py_like else LLAMA


_PYTHON_RULES = ("flashinfer-workspace", "vllm-sampler-warmup", "vllm-metal-kv-budget")
"""Failure-layer formats (kvreport.logs.oom) that only the Python engines print."""


def suggest(s: Situation, limit: int = 4) -> list[dict]:
    """Ranked suggestions for a situation (at most ``limit``); [] when nothing failed or the
    failure is not about memory. Walks :data:`RULES`: every row whose family, phase and condition match calls its
    builder; the best rank per id wins."""
    return suggest_explained(s, limit)[0]


def suggest_explained(s: Situation, limit: int = 4) -> tuple[list[dict], list[dict]]:
    """:func:`suggest` and, for each suggestion, the row of :data:`RULES` that gave it its rank:
    ``{"id", "rank", "rule"}`` (``rule``: "#N family phases when=condition build=builder", as docs/fix-rules.md
    numbers the rows)."""
    b = _Builder(s)
    # a failure that is not about memory gets only its own rows (a crash: a known-good build; a refused setting: the
    # setting the refusal names), never a memory fix
    not_memory = next((w for w in NOT_MEMORY_CONDITIONS if w(s)), None)
    if s.phase not in MEMORY_PHASES and not (s.phase == "unknown" and (s.has_memory_event or tgi_unplaced(s)
                                                                       or not_memory)):
        return [], []
    fam = family_of(s)
    for i, rule in enumerate(RULES, 1):
        if not_memory is not None and rule.when is not not_memory:
            continue
        if rule.family == fam and s.phase in rule.phases and rule.when(s):
            b.rule = f"#{i} {rule.family} {'/'.join(rule.phases)} when={rule.when.__name__} build={rule.build.__name__}"
            rule.build(b, rule.rank)
    out = b.result(limit)
    return out, [{"id": d["id"], "rank": b.origin[d["id"]][0], "rule": b.origin[d["id"]][1]} for d in out]


NOT_MEMORY_CONDITIONS = (gpu_watchdog, crashed, v_quant_needs_fa, unknown_arch)
"""The conditions of the rows for failures that are not about memory (see :func:`suggest_explained`)."""


def _first_line(fn) -> str:
    return ((fn.__doc__ or "").strip().splitlines() or [""])[0].strip()


def rules_markdown() -> str:
    """docs/fix-rules.md: every rule of :data:`RULES` in the order :func:`suggest` applies it
    (``python scripts/fix_rules_table.py > docs/fix-rules.md``; tests/test_fix_rules_table.py checks the file)."""
    out = ["# Fix rules", "",
           "Generated from `kvreport.fixes.RULES` by `python scripts/fix_rules_table.py > docs/fix-rules.md`; "
           "tests/test_fix_rules_table.py fails when this file and the code disagree.", "",
           "`suggest()` walks the rows in this order. Every row whose engine family, phase and condition match calls "
           "its builder, which may add the suggestion (a builder declines when its numbers do not justify a change). "
           "For an id added by several rows the best (lowest) rank wins; ties keep the order of the rows. "
           "Family `llama.cpp-family` is llama.cpp, the programs built on it and Ollama; `python` is vLLM, SGLang, "
           "TGI and LMDeploy.", "",
           "| # | family | phase | condition | what the condition means | id | rank | builder |",
           "|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(RULES, 1):
        out.append(f"| {i} | {r.family} | {', '.join(r.phases)} | `{r.when.__name__}` | "
                   f"{_first_line(r.when).replace('|', '/')} | `{r.sid}` | {r.rank:g} | `{r.build.__name__}` |")
    return "\n".join(out) + "\n"
