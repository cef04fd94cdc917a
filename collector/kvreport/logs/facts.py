"""`LogFacts`: what one streaming pass over an engine log found (plain data, JSON-friendly).

Units: every ``*_mib`` is MiB (2**20 bytes), every ``*_bytes`` bytes, token counts are ints.
Values copied from ``print_info:`` / ``llama_model_loader: - kv`` lines stay raw strings
(``"[0, 0, 8, ...]"`` lists included) so that :func:`kvreport.kvcache.shape_from_hparams` sees
exactly what llama.cpp printed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field


@dataclass
class LogFacts:
    """Facts of one log. Filled by :func:`kvreport.logs.parse_log`; read by :mod:`kvreport.analyze`.

    * ``engine``: "llama.cpp" | "ollama" | "vllm" | "sglang" | "tgi" | None (decided from
      ``engine_hints``, a count of engine-specific lines; Ollama wins over the llama.cpp lines it
      copies into its own log).
    * ``devices``: device name (``CUDA0``, ``ROCm1``, ``Vulkan0``, ``MTL0``, ``CPU``) ->
      ``{"name", "description", "free_mib", "total_mib", "source"}``.
    * ``hparams`` / ``gguf_kv``: raw strings keyed as llama.cpp prints them (old
      ``llm_load_print_meta:`` spellings normalised to the ``print_info:`` keys).
    * ``ctx``: context parameters of the real attempt (``n_ctx``, ``n_ctx_seq``, ``n_seq_max``,
      ``n_batch``, ``n_ubatch``, ``flash_attn``, ``kv_unified``, ``type_k``, ``type_v``,
      ``n_slots``, ``n_ctx_slot``, ``swa_full``); ``dry_ctx`` the same from the auto-fit dry run.
    * ``kv_caches``: every KV size line (``{"mib", "cells", "layers", "n_seq", "n_stream",
      "type_k", "k_mib", "type_v", "v_mib", "section" ("", "non-SWA", "SWA", "main", "indexer"),
      "dry_run", "line"}``); ``kv_buffers`` the per-device ``KV buffer size`` lines;
      ``rs_caches`` / ``rs_buffers`` the recurrent-state twins; ``buffers`` every
      ``<dev> <kind> buffer size`` line (kind model / KV / RS / compute / output).
    * ``fit``: the engine's auto-fit step ``{"ran", "status", "changed": {"n_ctx": [from, to]},
      "projected_mib", "free_mib", "lines"}`` or None.
    * ``events``: the failure chain in log order, each ``{"kind", "lineno", "line", ...}`` with
      kind ``backend`` (backend allocator refusal), ``pinned`` (pinned host memory, recoverable),
      ``ggml`` (``failed to allocate <dev> buffer of size N``), ``reason`` (what llama.cpp says
      the buffer was for), ``retry`` (``retrying without pipeline parallelism``), ``alloc_ok`` (a
      buffer that was allocated), ``success`` (the engine came up), ``config`` (a refusal that
      is not about memory), ``engine`` (a vLLM / SGLang / Ollama / TGI failure with its phase).
    * ``final_error``: the last fatal line; ``cause_error`` the last *specific* reason line
      (``failed to initialize the context: n_seq_max must be <= 256``, ``error loading model: ...``,
      ``does not support different K (q8_0) and V (f16) cache types``), not a generic epilogue; ``error_lines`` a few error lines in order.
    """

    line_count: int = 0
    key_line_count: int = 0
    engine: str | None = None
    engine_hints: Counter = field(default_factory=Counter)
    engine_lines: dict = field(default_factory=dict)
    source_lines: dict = field(default_factory=dict)
    """``"ctx:n_ctx"`` / ``"hparams:n_layer"`` -> [line number, text] of the line a value was read from (--explain)."""
    """engine -> [line number, text] of the first line that hinted at it (for ``kvreport analyze --explain``)."""
    program: str | None = None
    version: str | None = None
    build: int | None = None
    commit: str | None = None
    cuda_name: str | None = None
    devices: dict = field(default_factory=dict)
    hparams: dict = field(default_factory=dict)
    gguf_kv: dict = field(default_factory=dict)
    ctx: dict = field(default_factory=dict)
    dry_ctx: dict = field(default_factory=dict)
    kv_caches: list = field(default_factory=list)
    kv_buffers: list = field(default_factory=list)
    rs_caches: list = field(default_factory=list)
    buffers: list = field(default_factory=list)
    fit: dict | None = None
    events: list = field(default_factory=list)
    final_error: str | None = None
    cause_error: str | None = None
    error_lines: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    vllm: dict = field(default_factory=dict)
    sglang: dict = field(default_factory=dict)
    ollama: dict = field(default_factory=dict)
    tgi: dict = field(default_factory=dict)
    # parser state (not facts)
    stage: str = ""
    in_fit: bool = False
    kv_section: str = ""
    py_stage: str = ""
    prev_key: tuple | None = None
    """The previous key line (line number, text), to read messages re-wrapped over two lines."""
    """Where a Python engine was (traceback frames, start-up lines): a phase word, see kvreport.logs.oom.STAGES."""

    def to_dict(self) -> dict:
        """A JSON-serialisable copy (parser state left out)."""
        d = asdict(self)
        d["engine_hints"] = dict(self.engine_hints)
        for k in ("stage", "in_fit", "kv_section", "py_stage", "prev_key"):
            d.pop(k, None)
        return d

    def add_event(self, kind: str, lineno: int, line: str, **data) -> dict:
        """Append one failure-chain event (bounded: a log repeating a failure forever keeps 2000)."""
        ev = {"kind": kind, "lineno": lineno, "line": line[:2000], "stage": self.stage, "dry_run": self.in_fit}
        ev.update(data)
        if len(self.events) < 2000:
            self.events.append(ev)
        return ev

    def note_line(self, key: str, lineno: int, line: str) -> None:
        """Remember where ``key`` was read (bounded: 400 keys)."""
        if key in self.source_lines or len(self.source_lines) < 400:
            self.source_lines[key] = [lineno, line[:300]]

    def add_error(self, line: str) -> None:
        if len(self.error_lines) < 50:
            self.error_lines.append(line[:2000])

    def set_device(self, name: str, source: str, **data) -> None:
        """Record what one device reported; a later source fills in what an earlier one lacked."""
        dev = self.devices.setdefault(name, {"name": name, "description": None, "free_mib": None,
                                             "total_mib": None, "source": source})
        for k, v in data.items():
            if v is not None and dev.get(k) is None:
                dev[k] = v
