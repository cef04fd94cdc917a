"""`LogFacts`: what one streaming pass over an engine log found (plain data, JSON-friendly).

Units: every ``*_mib`` is MiB (2**20 bytes), every ``*_bytes`` bytes, token counts are ints.
Values copied from ``print_info:`` / ``llama_model_loader: - kv`` lines stay raw strings
(``"[0, 0, 8, ...]"`` lists included) so that :func:`kvreport.kvcache.shape_from_hparams` sees
exactly what llama.cpp printed.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field, fields

LIST_CAP = 400
"""The most items any list of :class:`LogFacts` holds (half the first ones, half the last ones)."""
DICT_CAP = 400
"""The most keys any dict of :class:`LogFacts` read from log text holds (later new keys are dropped)."""
EVENTS_CAP = 2000
REPEAT_KEYS = 50
"""The most distinct failure keys counted for earlier runs (the rest are counted under ``"other"``)."""


class Bounded(list):
    """A list that never holds more than ``cap`` items: once full, each append drops the item in the middle, so the
    first ``cap // 2`` items (how a run started) and the last ones (how it ended) are kept. Otherwise a list."""

    def __init__(self, items=(), cap: int = LIST_CAP):
        super().__init__(items)
        self.cap = cap
        self.dropped = 0

    def append(self, item) -> None:
        if len(self) >= self.cap:
            del self[self.cap // 2]
            self.dropped += 1
        super().append(item)

    def extend(self, items) -> None:
        for item in items:
            self.append(item)


class CappedDict(dict):
    """A dict of at most ``cap`` keys: a new key beyond that is dropped (the keys already read keep updating)."""

    def __init__(self, items=(), cap: int = DICT_CAP):
        super().__init__(items)
        self.cap = cap

    def __setitem__(self, key, value) -> None:
        if len(self) < self.cap or key in self:
            super().__setitem__(key, value)

    def setdefault(self, key, default=None):
        if key not in self and len(self) >= self.cap:
            return default
        return super().setdefault(key, default)


_FAIL_KINDS = frozenset(("backend", "ggml", "reason", "engine", "config", "final", "oom"))
_DIGITS = re.compile(r"\d+(?:\.\d+)?")


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
    engine_lines: dict = field(default_factory=CappedDict)
    """engine -> [line number, text] of the first line that hinted at it (for ``kvreport analyze --explain``)."""
    source_lines: dict = field(default_factory=CappedDict)
    """``"ctx:n_ctx"`` / ``"hparams:n_layer"`` -> [line number, text] of the line a value was read from (--explain)."""
    program: str | None = None
    version: str | None = None
    build: int | None = None
    commit: str | None = None
    cuda_name: str | None = None
    devices: dict = field(default_factory=CappedDict)
    hparams: dict = field(default_factory=CappedDict)
    gguf_kv: dict = field(default_factory=CappedDict)
    ctx: dict = field(default_factory=CappedDict)
    dry_ctx: dict = field(default_factory=CappedDict)
    kv_caches: list = field(default_factory=Bounded)
    kv_buffers: list = field(default_factory=Bounded)
    rs_caches: list = field(default_factory=Bounded)
    buffers: list = field(default_factory=Bounded)
    fit: dict | None = None
    events: list = field(default_factory=lambda: Bounded(cap=EVENTS_CAP))
    final_error: str | None = None
    cause_error: str | None = None
    error_lines: list = field(default_factory=Bounded)
    warnings: list = field(default_factory=Bounded)
    vllm: dict = field(default_factory=CappedDict)
    sglang: dict = field(default_factory=CappedDict)
    ollama: dict = field(default_factory=CappedDict)
    tgi: dict = field(default_factory=CappedDict)
    graph_capture: bool = False
    """A Python engine was capturing CUDA graphs (vLLM capture_model, SGLang "Capture cuda graph begin") and had not
    said it finished: an OOM now is the graphs' memory."""
    kv_pool_mib: float | None = None
    """The KV pool an engine without a parser of its own printed (MiB): TensorRT-LLM's "Allocate N bytes for k/v
    cache" (2024) and "[MemUsageChange] Allocated X GiB for max tokens in paged KV cache (T)" (kvcache manager)."""
    repeats: dict = field(default_factory=dict)
    """Earlier runs that failed (a new run started after each failure): failure key (:meth:`run_key`) -> count,
    at most :data:`REPEAT_KEYS` keys. Only the last run's facts are kept; see :meth:`fold`."""
    runs: int = 1
    """Runs seen: 1 + the earlier failed runs folded into :attr:`repeats`."""
    last_failed: LogFacts | None = field(default=None, repr=False, compare=False)
    """The facts of the last run that failed, kept while a later run has not failed (see :meth:`finish_runs`)."""
    # parser state (not facts)
    stage: str = ""
    in_fit: bool = False
    kv_section: str = ""
    py_stage: str = ""
    prev_key: tuple | None = None
    n_events: int = 0
    """Events ever added to this run (``events`` is bounded, so its length stops counting)."""
    """The previous key line (line number, text), to read messages re-wrapped over two lines."""
    """Where a Python engine was (traceback frames, start-up lines): a phase word, see kvreport.logs.oom.STAGES."""

    def to_dict(self) -> dict:
        """A JSON-serialisable copy (parser state left out)."""
        d = asdict(self)
        d["engine_hints"] = dict(self.engine_hints)
        for k in _STATE:
            d.pop(k, None)
        return d

    def add_event(self, kind: str, lineno: int, line: str, **data) -> dict:
        """Append one failure-chain event (bounded: a log repeating a failure forever keeps 2000)."""
        ev = {"kind": kind, "lineno": lineno, "line": line[:2000], "stage": self.stage, "dry_run": self.in_fit}
        ev.update(data)
        self.events.append(ev)
        self.n_events += 1
        return ev

    # -- runs: a log of a crash loop holds the same failure many times; only the last run's facts are kept
    def run_failed(self) -> bool:
        """True when the current run has failed: a fatal line, or a failure event outside an auto-fit dry run."""
        return self.final_error is not None or any(e["kind"] in _FAIL_KINDS and not e.get("dry_run")
                                                   for e in self.events)

    def run_key(self) -> str | None:
        """A short key for the current run's failure (its first failure event: kind, engine or backend, device,
        phase; and the fatal line with its numbers replaced by ``N``), None when the run has not failed. Line numbers
        never enter it, so the same failure at another place in a log has the same key."""
        ev = next((e for e in self.events if e["kind"] in _FAIL_KINDS and not e.get("dry_run")), None)
        if ev is None and self.final_error is None:
            return None
        ev = ev or {"kind": "final"}
        text = _DIGITS.sub("N", str(self.final_error or ev.get("line") or ""))[:160]
        return (f"{ev['kind']}/{ev.get('engine') or ev.get('backend') or ''}/{ev.get('device') or ''}/"
                f"{ev.get('phase') or ev.get('stage') or ''}: {text}")

    def fold(self) -> None:
        """Count the current (failed) run in :attr:`repeats` and start the facts of a new run (line counts, repeats
        and runs are kept). Memory then does not grow with the number of failures in a log."""
        self.count_run(self.run_key())
        snap = LogFacts.__new__(LogFacts)
        snap.__dict__ = dict(self.__dict__)
        snap.last_failed = None
        self._take(LogFacts())
        self.last_failed = snap

    def _take(self, other: LogFacts) -> None:
        """The per-run facts of ``other`` become this run's (what :data:`_ACROSS_RUNS` names is kept)."""
        keep = {k: getattr(self, k) for k in _ACROSS_RUNS}
        for fl in fields(self):
            setattr(self, fl.name, getattr(other, fl.name))
        for k, v in keep.items():
            setattr(self, k, v)

    def finish_runs(self, failed_run: LogFacts | None = None) -> None:
        """At the end of the log: when the last run did not fail but an earlier one did, that failed run is the one
        to diagnose — its facts come back (``failed_run``, or the snapshot :meth:`fold` kept) and it leaves the
        count of earlier failures; the engine hints of the later run are added to its own. Memory stays at two runs'
        facts."""
        prev = failed_run if failed_run is not None else self.last_failed
        self.last_failed = None
        if prev is None or self.run_failed():
            return
        key = prev.run_key() or "no failure"
        key = key if key in self.repeats else "other"
        if self.repeats.get(key):
            self.repeats[key] -= 1
            if not self.repeats[key]:
                del self.repeats[key]
        hints, lines = self.engine_hints, self.engine_lines
        self._take(prev)
        self.last_failed = None
        # the later run's lines still tell which engine wrote the log
        self.engine_hints = self.engine_hints + hints
        for name, where in lines.items():
            self.engine_lines.setdefault(name, where)

    def count_run(self, key: str | None) -> None:
        """Count one earlier run that ended with the failure ``key`` (see :meth:`fold`)."""
        key = key or "no failure"
        if key not in self.repeats and len(self.repeats) >= REPEAT_KEYS:
            key = "other"
        self.repeats[key] = self.repeats.get(key, 0) + 1
        self.runs += 1

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


_STATE = ("stage", "in_fit", "kv_section", "py_stage", "prev_key", "n_events", "last_failed")
"""Parser state, left out of :meth:`LogFacts.to_dict`."""
_ACROSS_RUNS = ("line_count", "key_line_count", "repeats", "runs", "last_failed")
"""What :meth:`LogFacts.fold` keeps from one run to the next."""
