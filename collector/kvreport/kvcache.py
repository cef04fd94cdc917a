"""The KV memory model: how many bytes llama.cpp allocates for the KV cache and recurrent state.

Units: token counts are tokens (= KV cells), sizes are bytes unless a name ends in ``_mib``
(MiB = 2^20 bytes, as in every llama.cpp log line).

The rules follow llama.cpp (ggml-org/llama.cpp, master around build b10108; older behaviour
selected with ``KVConfig.build``) and are cited per function:

* cells: ``src/llama-context.cpp`` (n_ctx = 0 -> n_ctx_train, GGML_PAD(n_ctx, 256) since b6975,
  the non-unified per-stream rule) and ``src/llama-kv-cache.cpp`` (n_stream = kv_unified ? 1 :
  n_seq_max; K/V tensors are ``[n_embd_{k,v}_gqa(il), kv_size, n_stream]``);
* per-layer widths: ``src/llama-hparams.cpp`` (n_embd_k_gqa(il) = n_embd_head_k(il) * n_head_kv(il));
* row sizes: ``ggml/src/ggml.c`` ``ggml_row_size`` with the block sizes of ``ggml-common.h``;
* sliding-window layers: ``src/llama-kv-cache-iswa.cpp`` and ``set_swa_pattern`` in
  ``src/llama-hparams.cpp``;
* MLA: ``src/llama-kv-cache.cpp`` (no V tensor since b7832, ``has_v = !is_mla``);
* recurrent state: ``src/llama-memory-recurrent.cpp`` (one f32 state per sequence, independent of
  n_ctx) with ``n_embd_r`` / ``n_embd_s`` of ``src/llama-hparams.cpp``;
* placement: ``src/llama-model.cpp`` ``load_tensors`` (the first layers stay on the CPU).

This module imports nothing heavy (no numpy): ``kvreport --help`` must stay fast.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from kvreport.units import CACHE_TYPES, GIB, MIB, PY_CACHE_TYPES  # noqa: F401 - one copy of the units, re-exported

#: llama.cpp pads n_ctx (and n_ctx_seq) up to a multiple of this since b6975
#: (``src/llama-context.cpp``, "for CUDA").
CTX_PAD = 256

#: The build this model describes when ``KVConfig.build`` is None.
CURRENT_BUILD = 10108

# Default SWA period per architecture when the GGUF carries no scalar
# ``{arch}.attention.sliding_window_pattern`` (``src/llama-model.cpp`` / ``src/models/*.cpp``,
# ``hparams.set_swa_pattern(p)``; dense_first = false: layer il is SWA iff il % p < p - 1).
SWA_DEFAULT_PERIOD: dict[str, int] = {
    "gemma2": 2,
    "gemma3": 6,
    "gpt-oss": 2,
    "llama4": 4,
    "cohere2": 4,
    "gemma3n": 5,
    "exaone4": 4,
    "smallthinker": 4,
}
# Architectures whose pattern puts the full-attention layer first in each group
# (``set_swa_pattern(p, dense_first=true)``: SmallThinker, period 4, window forced to 4096).
SWA_DENSE_FIRST = frozenset({"smallthinker"})
# Default window when the GGUF has none (``src/llama-model.cpp``: gemma2 4096, llama4 chunk 8192).
SWA_DEFAULT_WINDOW: dict[str, int] = {"gemma2": 4096, "llama4": 8192, "smallthinker": 4096}

# Architectures whose every layer is recurrent (``llama_model::create_memory``: llama_memory_recurrent).
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
# Hybrids where a layer is recurrent iff its head_count_kv is 0 (``src/llama-model.cpp``
# ``hparams.recurrent_layer_arr[il] = hparams.n_head_kv(il) == 0``).
HYBRID_HEADKV0_ARCHS = frozenset({"jamba", "granitehybrid", "plamo2", "lfm2", "lfm2moe", "kimi-linear"})
# Hybrids whose recurrent layers follow full_attention_interval (attention iff (il+1) % k == 0).
HYBRID_INTERVAL_ARCHS = frozenset({"qwen3next", "qwen35", "qwen35moe"})
# Falcon-H1: every layer has both an attention cache and an SSM state.
HYBRID_BOTH_ARCHS = frozenset({"falcon-h1"})
# Nemotron-H: attention iff n_head_kv > 0 and n_ff == 0; recurrent iff n_head_kv == 0 and n_ff == 0.
HYBRID_NEMOTRON_ARCHS = frozenset({"nemotron_h", "nemotron_h_moe"})
MAMBA_STATE_ARCHS = frozenset({"mamba", "mamba2", "jamba", "falcon-h1", "granitehybrid", "plamo2",
                               "nemotron_h", "nemotron_h_moe"}) | HYBRID_INTERVAL_ARCHS
RWKV_ARCHS = frozenset({"rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
# Models without any memory (``create_memory`` returns null).
NO_MEMORY_ARCHS = frozenset({"bert", "jina-bert-v2", "jina-bert-v3", "nomic-bert", "nomic-bert-moe",
                             "neo-bert", "eurobert", "modern-bert", "wavtokenizer-dec",
                             "gemma-embedding", "dream", "llada", "llada-moe", "rnd1"})


def normalize_type(name: str | None) -> str:
    """Lower-case a cache type name as llama.cpp accepts it (``F16`` -> ``f16``); None -> ``f16``."""
    return (name or "f16").strip().lower()


def is_known_type(name: str | None) -> bool:
    """Whether kvreport knows the size of this cache type (forks add others, e.g. ``turbo3``)."""
    return normalize_type(name) in CACHE_TYPES or normalize_type(name) in PY_CACHE_TYPES


def row_bytes(type_name: str, n_elements: int) -> int | None:
    """Bytes of one row of ``n_elements`` values of ``type_name``: ggml_row_size.

    ``ggml_row_size(t, n) = n / blck_size(t) * type_size(t)`` (``ggml/src/ggml.c``). Returns None
    for a type name kvreport does not know (fork-specific types), never raises for that.
    """
    t = CACHE_TYPES.get(normalize_type(type_name)) or PY_CACHE_TYPES.get(normalize_type(type_name))
    if t is None:
        return None
    blck, size = t
    return (int(n_elements) // blck) * size


def bytes_per_element(type_name: str) -> float | None:
    """Average bytes per element (f16 2, q8_0 1.0625, q4_0 0.5625); None when unknown."""
    t = CACHE_TYPES.get(normalize_type(type_name))
    return None if t is None else t[1] / t[0]


def pad(x: int, n: int) -> int:
    """GGML_PAD: round ``x`` up to a multiple of ``n`` (``ggml/include/ggml.h``)."""
    return ((int(x) + n - 1) // n) * n


def floor_to(x: int, n: int) -> int:
    """Round ``x`` down to a multiple of ``n``."""
    return (int(x) // n) * n


def mib(n_bytes: float) -> float:
    """Bytes -> MiB (2^20 bytes)."""
    return n_bytes / MIB


# --------------------------------------------------------------------------------------------
# Model shape


@dataclass(frozen=True)
class ModelShape:
    """The geometry of a model that decides its KV-cache and recurrent-state bytes.

    Per-layer tuples have ``n_layer`` entries (``n_layer`` = llama.cpp's ``n_layer_all`` =
    GGUF ``{arch}.block_count``, MTP/NextN layers included):

    * ``n_head_kv[il]``: KV heads (0 for recurrent, MLP-only and NextN layers);
    * ``head_dim_k[il]`` / ``head_dim_v[il]``: n_embd_head_k(il) / n_embd_head_v(il) (SWA layers
      use the ``*_swa`` head size when the model has one);
    * ``is_swa[il]``: sliding-window layer (``src/llama-hparams.cpp`` ``is_swa``);
    * ``is_recurrent[il]``: the layer keeps a recurrent state (``is_recurrent``);
    * ``has_kv[il]``: the layer owns an attention K/V cache (not recurrent-only, not reusing
      another layer's cache, not NextN);
    * ``n_embd_r[il]`` / ``n_embd_s[il]``: recurrent state widths in f32 elements (0 when not
      recurrent), ``src/llama-hparams.cpp`` ``n_embd_r()`` / ``n_embd_s()``.

    MLA (DeepSeek-V2/V3 style): ``is_mla`` with ``kv_lora_rank`` and the ``n_embd_head_{k,v}_mla``
    sizes; its cache stores ``head_dim_k`` (= kv_lora_rank + rope dim) values per layer per token
    in K and, since b7832, no V.

    ``source`` says where the shape came from: "gguf", "log", "hf_config" or "assumed";
    ``notes`` lists every assumption made while building it.
    """

    arch: str
    n_layer: int
    n_head_kv: tuple[int, ...]
    head_dim_k: tuple[int, ...]
    head_dim_v: tuple[int, ...]
    is_swa: tuple[bool, ...] = ()
    is_recurrent: tuple[bool, ...] = ()
    has_kv: tuple[bool, ...] = ()
    n_swa: int = 0
    n_ctx_train: int = 0
    n_embd: int = 0
    is_mla: bool = False
    kv_lora_rank: int = 0
    n_embd_head_k_mla: int = 0
    n_embd_head_v_mla: int = 0
    n_embd_r: tuple[int, ...] = ()
    n_embd_s: tuple[int, ...] = ()
    n_layer_nextn: int = 0
    source: str = "assumed"
    name: str | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        n = int(self.n_layer)
        if n < 0:
            raise ValueError("n_layer must be >= 0")
        defaults = {
            "is_swa": (False,) * n,
            "is_recurrent": (False,) * n,
            "n_embd_r": (0,) * n,
            "n_embd_s": (0,) * n,
        }
        for name, default in defaults.items():
            if not getattr(self, name):
                object.__setattr__(self, name, default)
        if not self.has_kv:
            object.__setattr__(self, "has_kv", tuple(
                (not r) and h > 0 for r, h in zip(self.is_recurrent, self.n_head_kv, strict=False)))
        for name in ("n_head_kv", "head_dim_k", "head_dim_v", "is_swa", "is_recurrent", "has_kv",
                     "n_embd_r", "n_embd_s"):
            value = tuple(getattr(self, name))
            object.__setattr__(self, name, value)
            if len(value) != n:
                raise ValueError(f"ModelShape.{name} has {len(value)} entries for {n} layers")

    # Widths (elements) of one K / V row of layer il: n_embd_k_gqa(il) / n_embd_v_gqa(il).
    def n_embd_k_gqa(self, il: int) -> int:
        """K elements per token of layer ``il`` = n_embd_head_k(il) * n_head_kv(il) (llama-hparams.cpp)."""
        return self.head_dim_k[il] * self.n_head_kv[il]

    def n_embd_v_gqa(self, il: int) -> int:
        """V elements per token of layer ``il`` = n_embd_head_v(il) * n_head_kv(il) (llama-hparams.cpp)."""
        return self.head_dim_v[il] * self.n_head_kv[il]

    @property
    def n_layer_kv(self) -> int:
        """Layers that own an attention cache."""
        return sum(self.has_kv)

    @property
    def is_swa_any(self) -> bool:
        return any(s and k for s, k in zip(self.is_swa, self.has_kv, strict=False))

    @property
    def is_recurrent_any(self) -> bool:
        return any(self.is_recurrent)

    @property
    def is_hybrid(self) -> bool:
        return self.is_recurrent_any and self.n_layer_kv > 0

    def to_dict(self) -> dict:
        """A JSON-ready summary (compact: per-layer lists collapse to one value when uniform)."""
        def squash(t):
            return t[0] if t and all(x == t[0] for x in t) else list(t)
        return {
            "arch": self.arch, "n_layer": self.n_layer, "n_layer_kv": self.n_layer_kv,
            "n_head_kv": squash(self.n_head_kv), "head_dim_k": squash(self.head_dim_k),
            "head_dim_v": squash(self.head_dim_v), "n_swa": self.n_swa,
            "n_layer_swa": sum(1 for s, k in zip(self.is_swa, self.has_kv, strict=False) if s and k),
            "n_layer_recurrent": sum(self.is_recurrent), "is_mla": self.is_mla,
            "n_ctx_train": self.n_ctx_train, "source": self.source, "notes": list(self.notes),
        }


def dense_shape(n_layer: int, n_head_kv: int, head_dim: int, *, arch: str = "llama",
                n_ctx_train: int = 0, head_dim_v: int | None = None, source: str = "assumed",
                name: str | None = None) -> ModelShape:
    """A plain full-attention model: every layer has ``n_head_kv`` KV heads of ``head_dim``."""
    hv = head_dim if head_dim_v is None else head_dim_v
    return ModelShape(arch=arch, n_layer=n_layer, n_head_kv=(n_head_kv,) * n_layer,
                      head_dim_k=(head_dim,) * n_layer, head_dim_v=(hv,) * n_layer,
                      n_ctx_train=n_ctx_train, source=source, name=name)


def swa_layers(n_layer: int, period: int, dense_first: bool = False) -> tuple[bool, ...]:
    """Which layers slide for a period ``p`` (``llama_hparams::set_swa_pattern``, llama-hparams.cpp).

    dense_first false: SWA iff ``il % p < p - 1`` (the last layer of each group is full);
    dense_first true: SWA iff ``il % p != 0``; ``p == 0``: every layer is SWA; ``p == 1``: none.
    """
    if period <= 0:
        return (True,) * n_layer
    if dense_first:
        return tuple(il % period != 0 for il in range(n_layer))
    return tuple(il % period < period - 1 for il in range(n_layer))


# --------------------------------------------------------------------------------------------
# Configuration and sizes


@dataclass(frozen=True)
class KVConfig:
    """The context options that decide KV bytes (llama.cpp names).

    * ``n_ctx``: ``-c/--ctx-size`` in tokens as requested; 0 means the model's n_ctx_train;
    * ``n_seq``: ``n_seq_max`` = ``-np/--parallel`` (llama-server's auto mode is 4 slots, unified);
    * ``kv_unified``: ``-kvu``; one stream shared by all sequences (False: one stream per sequence);
    * ``cache_type_k`` / ``cache_type_v``: ``-ctk`` / ``-ctv``;
    * ``flash_attn``: flash attention not disabled (``-fa auto`` counts as on at cache creation;
      with it off V is stored transposed and padded to the widest layer);
    * ``swa_full``: ``--swa-full``;
    * ``n_ubatch``: ``-ub`` (the SWA cache holds n_swa + n_ubatch tokens);
    * ``n_rs_seq``: recurrent rollback snapshots per sequence (b9180+, 0 unless speculative);
    * ``build``: llama.cpp build number whose rules apply (None = current; selects the padding
      era, V-less MLA and the pre-b8025 hybrid sizing).
    """

    n_ctx: int = 0
    n_seq: int = 1
    kv_unified: bool = True
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: bool = True
    swa_full: bool = False
    n_ubatch: int = 512
    n_rs_seq: int = 0
    build: int | None = None

    def with_(self, **changes) -> KVConfig:
        """A copy with some fields changed."""
        return replace(self, **changes)


@dataclass(frozen=True)
class KVSize:
    """What ``kv_size`` computes. Bytes unless noted; cells and n_ctx in tokens.

    * ``n_ctx``: effective context after padding (llama_context: n_ctx);
    * ``n_ctx_seq``: tokens per sequence (llama_context: n_ctx_seq);
    * ``n_stream``: KV streams (1 when unified, else n_seq);
    * ``cells``: cells per stream of the full-attention cache (``size = ... (N cells`` line);
    * ``swa_cells``: cells per stream of the SWA cache (0 when the model has no SWA layer);
    * ``kv_bytes`` = ``kv_full_bytes + kv_swa_bytes`` = ``k_bytes + v_bytes`` (attention KV);
    * ``rs_bytes`` = ``r_bytes + s_bytes`` (recurrent state, f32, independent of n_ctx);
    * ``bytes_per_token``: marginal bytes for one more token of context (the full-attention
      layers; SWA layers too with --swa-full);
    * ``unknown_types``: cache type names kvreport could not size (sized as f16 instead).
    """

    n_ctx: int
    n_ctx_seq: int
    n_stream: int
    n_seq: int
    cells: int
    swa_cells: int
    kv_full_bytes: int
    kv_swa_bytes: int
    k_bytes: int
    v_bytes: int
    r_bytes: int
    s_bytes: int
    bytes_per_token: int
    n_layer_full: int
    n_layer_swa: int
    n_layer_recurrent: int
    unknown_types: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    layer_bytes: tuple[int, ...] = field(default=(), repr=False)

    @property
    def kv_bytes(self) -> int:
        return self.kv_full_bytes + self.kv_swa_bytes

    @property
    def rs_bytes(self) -> int:
        return self.r_bytes + self.s_bytes

    @property
    def total_bytes(self) -> int:
        """KV + recurrent state: the context memory llama.cpp allocates for this config."""
        return self.kv_bytes + self.rs_bytes

    @property
    def kv_mib(self) -> float:
        return mib(self.kv_bytes)

    @property
    def kv_full_mib(self) -> float:
        return mib(self.kv_full_bytes)

    @property
    def kv_swa_mib(self) -> float:
        return mib(self.kv_swa_bytes)

    @property
    def k_mib(self) -> float:
        return mib(self.k_bytes)

    @property
    def v_mib(self) -> float:
        return mib(self.v_bytes)

    @property
    def rs_mib(self) -> float:
        return mib(self.rs_bytes)

    @property
    def total_mib(self) -> float:
        return mib(self.total_bytes)

    def to_dict(self) -> dict:
        """JSON-ready numbers (bytes and MiB)."""
        return {
            "n_ctx": self.n_ctx, "n_ctx_seq": self.n_ctx_seq, "n_stream": self.n_stream,
            "n_seq": self.n_seq, "cells": self.cells, "swa_cells": self.swa_cells,
            "kv_bytes": self.kv_bytes, "kv_full_bytes": self.kv_full_bytes,
            "kv_swa_bytes": self.kv_swa_bytes, "k_bytes": self.k_bytes, "v_bytes": self.v_bytes,
            "rs_bytes": self.rs_bytes, "bytes_per_token": self.bytes_per_token,
            "kv_mib": round(self.kv_mib, 2), "rs_mib": round(self.rs_mib, 2),
            "total_mib": round(self.total_mib, 2), "unknown_types": list(self.unknown_types),
            "notes": list(self.notes),
        }


def effective_ctx(shape: ModelShape, cfg: KVConfig) -> tuple[int, int, int]:
    """(n_ctx, n_ctx_seq, n_stream) as llama.cpp computes them (``src/llama-context.cpp``).

    n_ctx 0 -> n_ctx_train; since b6975 n_ctx is padded up to 256; unified: n_ctx_seq = n_ctx;
    not unified: n_ctx_seq = GGML_PAD(n_ctx / n_seq_max, 256) (integer division first) and
    n_ctx = n_ctx_seq * n_seq_max. Builds before b6975 used n_ctx / n_seq_max unpadded here
    (the cache itself padded its size, see ``kv_size``).
    """
    build = cfg.build or CURRENT_BUILD
    n_seq = max(1, int(cfg.n_seq))
    n_ctx = int(cfg.n_ctx) if cfg.n_ctx else int(shape.n_ctx_train)
    if n_ctx <= 0:
        n_ctx = 4096  # no n_ctx_train known: llama.cpp would refuse; keep a sane number
    new_pad = build >= 6975
    if new_pad:
        n_ctx = pad(n_ctx, CTX_PAD)
    if cfg.kv_unified:
        return n_ctx, n_ctx, 1
    n_ctx_seq = n_ctx // n_seq
    if new_pad:
        n_ctx_seq = pad(n_ctx_seq, CTX_PAD)
    return n_ctx_seq * n_seq, n_ctx_seq, n_seq


def _cache_pad(cfg: KVConfig) -> int:
    """Padding the KV cache applied to its own size (``llama_kv_cache::get_padding``).

    <= b6867: 256 with flash attention, else 32; b6868+: 1 (n_ctx is padded instead from b6975).
    """
    build = cfg.build or CURRENT_BUILD
    if build <= 6867:
        return 256 if cfg.flash_attn else 32
    return 1


def swa_cells(shape: ModelShape, cfg: KVConfig, size_base: int) -> int:
    """Cells per stream of the SWA cache (``src/llama-kv-cache-iswa.cpp``).

    ``--swa-full``: size_base. Since b6975:
    ``GGML_PAD(min(size_base, n_swa * (unified ? n_seq_max : 1) + n_ubatch), 256)``;
    b5913..b6974: ``min(size_base, GGML_PAD(n_swa * (unified ? n_seq_max : 1) + n_ubatch, n_pad))``.
    """
    if cfg.swa_full or shape.n_swa <= 0:
        return size_base
    build = cfg.build or CURRENT_BUILD
    n_seq = max(1, int(cfg.n_seq))
    want = shape.n_swa * (n_seq if cfg.kv_unified else 1) + int(cfg.n_ubatch)
    if build >= 6975:
        return pad(min(size_base, want), CTX_PAD)
    if build < 5913:
        want = shape.n_swa * n_seq + int(cfg.n_ubatch)
    return min(size_base, pad(want, _cache_pad(cfg)))


def _row(type_name: str, n: int, unknown: set[str]) -> int:
    r = row_bytes(type_name, n)
    if r is None:
        unknown.add(normalize_type(type_name))
        r = n * 2  # sized as f16
    return r


def kv_size(shape: ModelShape, cfg: KVConfig) -> KVSize:
    """KV-cache and recurrent-state bytes llama.cpp allocates for ``shape`` under ``cfg``.

    Attention layers (``src/llama-kv-cache.cpp``): per stream, K is ``row(type_k, n_embd_k_gqa(il))``
    bytes per cell and V ``row(type_v, n_embd_v_gqa(il))`` (padded to the widest layer when
    flash attention is off and widths differ: ``v_trans``); MLA has no V since b7832. Full layers
    get ``n_ctx_seq`` cells, SWA layers ``swa_cells`` (``src/llama-kv-cache-iswa.cpp``); the
    total multiplies by the number of streams.
    Recurrent layers (``src/llama-memory-recurrent.cpp``): ``max(1, n_seq) * (1 + n_rs_seq)``
    rows of ``4 * n_embd_r`` + ``4 * n_embd_s`` bytes (always f32).
    Hybrid models before b8025 sized their attention part with n_ctx per stream (a bug fixed at
    ``@bb96bfd``); ``cfg.build`` reproduces it.
    """
    build = cfg.build or CURRENT_BUILD
    n_ctx, n_ctx_seq, n_stream = effective_ctx(shape, cfg)
    n_seq = max(1, int(cfg.n_seq))
    notes: list[str] = []
    size_base = n_ctx_seq
    if build <= 6974:
        size_base = pad(n_ctx_seq, _cache_pad(cfg))
    if shape.is_hybrid and build < 8025 and not cfg.kv_unified:
        size_base = pad(n_ctx, _cache_pad(cfg))
        notes.append("hybrid model before b8025: attention cache sized with n_ctx per stream")
    swa_present = shape.is_swa_any and shape.n_swa > 0
    n_swa_cells = swa_cells(shape, cfg, size_base) if swa_present else 0

    unknown: set[str] = set()
    type_k, type_v = normalize_type(cfg.cache_type_k), normalize_type(cfg.cache_type_v)
    v_less = shape.is_mla and build >= 7832
    v_widths = [shape.n_embd_v_gqa(il) for il in range(shape.n_layer) if shape.has_kv[il]]
    v_max = max(v_widths, default=0)
    v_pad = (not cfg.flash_attn) and len(set(v_widths)) > 1
    if v_pad:
        notes.append(f"flash attention off and V widths differ: V padded to {v_max} per layer")

    k_total = v_total = full_total = swa_total = 0
    per_token = 0
    n_full = n_swa_layers = n_rec = 0
    layer_bytes = [0] * shape.n_layer
    rows = n_seq * (1 + max(0, int(cfg.n_rs_seq)))
    r_total = s_total = 0
    for il in range(shape.n_layer):
        if shape.has_kv[il]:
            rk = _row(type_k, shape.n_embd_k_gqa(il), unknown)
            rv = 0 if v_less else _row(type_v, v_max if v_pad else shape.n_embd_v_gqa(il), unknown)
            is_swa = swa_present and shape.is_swa[il]
            cells = n_swa_cells if is_swa else size_base
            kb, vb = rk * cells * n_stream, rv * cells * n_stream
            k_total += kb
            v_total += vb
            layer_bytes[il] += kb + vb
            if is_swa:
                swa_total += kb + vb
                n_swa_layers += 1
                if cfg.swa_full:
                    per_token += rk + rv
            else:
                full_total += kb + vb
                n_full += 1
                per_token += rk + rv
        if shape.is_recurrent[il]:
            rb = 4 * shape.n_embd_r[il] * rows
            sb = 4 * shape.n_embd_s[il] * rows
            r_total += rb
            s_total += sb
            layer_bytes[il] += rb + sb
            n_rec += 1
    if unknown:
        notes.append("unknown cache type(s) " + ", ".join(sorted(unknown)) + " sized as f16")
    return KVSize(
        n_ctx=n_ctx, n_ctx_seq=n_ctx_seq, n_stream=n_stream, n_seq=n_seq, cells=size_base,
        swa_cells=n_swa_cells, kv_full_bytes=full_total, kv_swa_bytes=swa_total,
        k_bytes=k_total, v_bytes=v_total, r_bytes=r_total, s_bytes=s_total,
        bytes_per_token=per_token, n_layer_full=n_full, n_layer_swa=n_swa_layers,
        n_layer_recurrent=n_rec, unknown_types=tuple(sorted(unknown)),
        notes=tuple(shape.notes) + tuple(notes), layer_bytes=tuple(layer_bytes),
    )


def bytes_per_token(shape: ModelShape, cache_type_k: str = "f16", cache_type_v: str = "f16",
                    swa_full: bool = False) -> int:
    """Marginal KV bytes per extra token of context (full-attention layers; SWA ones with --swa-full)."""
    cfg = KVConfig(n_ctx=CTX_PAD, cache_type_k=cache_type_k, cache_type_v=cache_type_v,
                   swa_full=swa_full)
    return kv_size(shape, cfg).bytes_per_token


#: More layers than any model has: a parse error, not a model.
MAX_LAYERS = 4096

#: The largest n_ctx llama.cpp accepts (uint32 cells), rounded down to 256.
MAX_CTX = floor_to((1 << 32) - 1, CTX_PAD)


def no_fa_budget(shape: ModelShape, cfg: KVConfig, budget_mib: float, headroom_mib: float, n_ubatch: int,
                 n_head: int, n_vocab: int, share: float = 1.0, steps: int = 4) -> tuple[float, float]:
    """Without flash attention llama.cpp's compute buffer holds the attention scores of a micro-batch against the whole
    cache (n_kv x n_ubatch x n_head x 4 B) and the logits (n_ubatch x n_vocab x 4 B): at the context that fits the KV
    budget it can exceed the headroom kept for it. Lowers the budget until the headroom covers that buffer at the
    context the budget gives (a few steps; each only shrinks the context). ``share``: the failing device's share of
    the KV. Returns (KV budget MiB, compute headroom MiB); ``kvreport analyze`` and ``kvreport fit --log`` both use it."""
    c16 = cfg.with_(cache_type_k="f16", cache_type_v="f16")
    head = headroom_mib
    for _ in range(steps):
        n = int(max_ctx_fit(shape, budget_mib * MIB / share, c16))
        need = (n * n_ubatch * n_head + n_ubatch * n_vocab) * 4 / MIB
        if need <= head or n == 0:
            break
        budget_mib = max(0.0, budget_mib - (need - head))
        head = need
    return budget_mib, head


def max_ctx_fit(shape: ModelShape, budget_bytes: float, cfg: KVConfig | None = None,
                include_rs: bool = True) -> int:
    """The largest requested n_ctx (tokens, a multiple of 256) whose context memory fits ``budget_bytes``.

    Counts the attention KV (and, with ``include_rs``, the recurrent state) of ``kv_size`` for
    ``cfg`` with ``n_ctx`` varied. llama.cpp pads n_ctx UP to 256 (``src/llama-context.cpp``), so
    the answer is rounded DOWN to a multiple of 256. 0 when not even 256 tokens fit. When the
    memory does not grow with n_ctx (pure recurrent models) the answer is ``MAX_CTX`` if the
    fixed part fits. Not capped at n_ctx_train (the caller decides).
    """
    cfg = cfg or KVConfig()
    budget = float(budget_bytes)

    def need(n: int) -> int:
        s = kv_size(shape, cfg.with_(n_ctx=n))
        return s.total_bytes if include_rs else s.kv_bytes

    if budget <= 0 or need(CTX_PAD) > budget:
        return 0
    lo, hi = 1, MAX_CTX // CTX_PAD  # in units of 256 tokens; need(lo*256) fits
    if need(hi * CTX_PAD) <= budget:
        return hi * CTX_PAD
    # Tighten hi from the marginal rate so the search stays short (a hint only).
    per = kv_size(shape, cfg.with_(n_ctx=CTX_PAD)).bytes_per_token
    if per > 0:
        guess = int(budget // per) // CTX_PAD + 2
        if guess < hi and need(guess * CTX_PAD) > budget:
            hi = guess
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if need(mid * CTX_PAD) <= budget:
            lo = mid
        else:
            hi = mid
    return lo * CTX_PAD


# --------------------------------------------------------------------------------------------
# Placement


def layer_devices(n_layer: int, n_gpu_layers: int | None, device_names: Sequence[str],
                  split_mode: str = "layer", tensor_split: Sequence[float] | None = None,
                  main_gpu: int = 0, device_free_mib: Sequence[float] | None = None) -> list[str]:
    """The device of each repeating layer (``src/llama-model.cpp``, ``llama_model::load_tensors``).

    ``n_gpu_layers`` None or negative = all (``-ngl auto`` with --fit off / ``all``). With
    ``n_layer`` repeating layers plus the output layer, ``i_gpu_start = max(n_layer + 1 - ngl, 0)``:
    layers below it stay on "CPU" (the FIRST layers stay on the CPU). GPU layer ``il`` goes to
    ``upper_bound(splits, (il - i_gpu_start) / act_gpu_layers)`` where ``splits`` are the cumulative
    normalized ``--tensor-split`` values, else each device's free memory, else equal shares.
    ``split_mode`` "none" puts every GPU layer on ``main_gpu``; "row" keeps the layer rule.
    """
    names = list(device_names)
    if not names:
        return ["CPU"] * n_layer
    total = n_layer + 1
    ngl = total if n_gpu_layers is None or n_gpu_layers < 0 else min(int(n_gpu_layers), total)
    i_gpu_start = max(total - ngl, 0)
    act = ngl
    if split_mode == "none":
        mg = names[main_gpu] if 0 <= main_gpu < len(names) else names[0]
        return ["CPU" if il < i_gpu_start else mg for il in range(n_layer)]
    weights = None
    if tensor_split and any(float(x) > 0 for x in tensor_split):
        weights = [float(x) for x in list(tensor_split)[: len(names)]]
        weights += [0.0] * (len(names) - len(weights))
    elif device_free_mib and len(device_free_mib) == len(names) and sum(device_free_mib) > 0:
        weights = [float(x) for x in device_free_mib]
    else:
        weights = [1.0] * len(names)
    s = sum(weights)
    splits, acc = [], 0.0
    for w in weights:
        acc += w / s
        splits.append(acc)
    out = []
    for il in range(n_layer):
        if il < i_gpu_start or act <= 0:
            out.append("CPU")
            continue
        p = (il - i_gpu_start) / act
        idx = next((i for i, x in enumerate(splits) if x > p), len(splits) - 1)
        out.append(names[idx])
    return out


def kv_per_device(shape: ModelShape, cfg: KVConfig, n_gpu_layers: int | None = None,
                  split_mode: str = "layer", tensor_split: Sequence[float] | None = None,
                  main_gpu: int = 0, no_kv_offload: bool = False,
                  device_names: Sequence[str] = (), device_free_mib: Sequence[float] | None = None,
                  ) -> dict[str, int]:
    """KV + recurrent-state bytes per device name (kv-facts.md §2.7).

    A layer's K/V (and R/S) tensors live on that layer's device (``src/llama-kv-cache.cpp``,
    ``dev_layer(il)``) when KV offload is on; ``-nkvo`` (``no_kv_offload``) puts all of them in the
    "CPU" buffer. Layers are assigned by ``layer_devices`` (first layers on the CPU). Split mode
    "tensor" spreads every layer's KV over the devices in proportion to ``tensor_split`` (or equally).
    Devices that get nothing are left out; CPU-held bytes are under "CPU".
    """
    sizes = kv_size(shape, cfg)
    out: dict[str, int] = {}
    if no_kv_offload or not device_names:
        return {"CPU": sizes.total_bytes}
    if split_mode == "tensor":
        names = list(device_names)
        w = [float(x) for x in (tensor_split or [])][: len(names)] or [1.0] * len(names)
        w += [0.0] * (len(names) - len(w))
        s = sum(w) or 1.0
        assigned = 0
        for i, name in enumerate(names):
            part = sizes.total_bytes * w[i] // s if i < len(names) - 1 else sizes.total_bytes - assigned
            part = int(part)
            assigned += part
            if part:
                out[name] = part
        return out
    devs = layer_devices(shape.n_layer, n_gpu_layers, device_names, split_mode, tensor_split,
                         main_gpu, device_free_mib)
    for il, dev in enumerate(devs):
        if sizes.layer_bytes[il]:
            out[dev] = out.get(dev, 0) + sizes.layer_bytes[il]
    return out


# --------------------------------------------------------------------------------------------
# From the parameters llama.cpp prints


_NUM_RE = re.compile(r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?", re.I)


def parse_num_list(value: str | int | float | Sequence | None) -> list[float] | None:
    """``"8"`` -> [8]; ``"[0, 0, 8, 8]"`` -> [0, 0, 8, 8]; a trailing ``...`` is kept as a marker
    by returning None for a truncated list; anything unparsable -> None."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [float(value)]
    if isinstance(value, bool):
        return [1.0 if value else 0.0]
    if isinstance(value, (list, tuple)):
        try:
            return [float(x) for x in value]
        except (TypeError, ValueError):
            return None
    text = str(value).strip().lower().replace("true", "1").replace("false", "0")
    if "..." in text:
        return None
    nums = _NUM_RE.findall(text)
    if not nums:
        return None
    return [float(x) for x in nums]


def _int(value, default: int | None = None) -> int | None:
    nums = parse_num_list(value)
    if not nums or len(nums) != 1:
        return default
    return int(nums[0])


def _per_layer(value, n_layer: int, n_main: int, default: int | None, notes: list[str],
               what: str) -> tuple[int, ...] | None:
    """A scalar or a list value -> one int per layer (NextN layers past ``n_main`` get 0)."""
    if value is None:
        return None if default is None else (default,) * n_layer
    nums = parse_num_list(value)
    if nums is None:
        if isinstance(value, str) and "..." in value:
            vals = [int(float(x)) for x in _NUM_RE.findall(value)]
            if vals:
                notes.append(f"{what} list truncated in the log; the largest value {max(vals)} used for every layer")
                return (max(vals),) * n_layer
        return None if default is None else (default,) * n_layer
    vals = [int(x) for x in nums]
    if len(vals) == 1:
        return tuple(vals[0] if il < n_main else 0 for il in range(n_layer))
    if len(vals) == n_layer:
        return tuple(vals)
    if len(vals) == n_main:
        return tuple(vals) + (0,) * (n_layer - n_main)
    notes.append(f"{what} has {len(vals)} entries for {n_layer} layers; the largest used for every layer")
    return (max(vals),) * n_layer


def _kv_lookup(gguf_kv: Mapping[str, str] | None, arch: str, suffix: str):
    if not gguf_kv:
        return None
    return gguf_kv.get(f"{arch}.{suffix}")


def _layer_counts(hp: Mapping[str, str], gguf_kv: Mapping[str, str] | None, arch: str) -> tuple[int, int] | None:
    """(main layers, all layers incl. NextN/MTP ones) from ``n_layer`` / ``n_layer_all`` or the GGUF block count."""
    n_main = _int(hp.get("n_layer"))
    n_all = _int(hp.get("n_layer_all"), n_main)
    if n_main is None and n_all is None and arch:
        n_all = _int(_kv_lookup(gguf_kv, arch, "block_count"))
        n_main = n_all
    if not n_all or n_all <= 0 or n_all > MAX_LAYERS:
        return None
    return (n_main if n_main and n_main <= n_all else n_all), n_all


def _head_sizes(hp: Mapping[str, str], n_embd: int, n_head, notes: list[str]) -> tuple[int, int, int, int] | None:
    """(head size K, V, K of SWA layers, V of SWA layers); n_embd / n_head when the K size is not printed."""
    hk = _int(hp.get("n_embd_head_k"))
    hv = _int(hp.get("n_embd_head_v"))
    n_head0 = max(n_head or (0,)) if n_head else 0
    if hk is None and n_embd and n_head0:
        hk = n_embd // n_head0
        notes.append("n_embd_head_k not printed: n_embd / n_head assumed")
    if hv is None:
        hv = hk
    if hk is None:
        return None
    return hk, hv, _int(hp.get("n_embd_head_k_swa"), hk), _int(hp.get("n_embd_head_v_swa"), hv)


def _rec_interval(arch, hp, gguf_kv, n_all, n_main, n_head_kv, notes) -> list[bool]:
    rec_arr = parse_num_list(_kv_lookup(gguf_kv, arch, "attention.recurrent_layers"))
    if rec_arr and len(rec_arr) >= n_main:
        return [il < n_main and bool(rec_arr[il]) for il in range(n_all)]
    k = _int(_kv_lookup(gguf_kv, arch, "full_attention_interval"), 4) or 4
    return [il < n_main and (il + 1) % k != 0 for il in range(n_all)]


def _rec_nemotron(arch, hp, gguf_kv, n_all, n_main, n_head_kv, notes) -> list[bool]:
    n_ff = _per_layer(hp.get("n_ff"), n_all, n_main, 0, notes, "n_ff") or (0,) * n_all
    return [il < n_main and n_head_kv[il] == 0 and n_ff[il] == 0 for il in range(n_all)]


# architecture family -> which layers are recurrent (``src/llama-model.cpp``), and whether those layers
# keep an attention cache too (Falcon-H1)
_RECURRENT_RULES = (
    (RECURRENT_ARCHS, lambda arch, hp, kv, n_all, n_main, hkv, notes: [il < n_main for il in range(n_all)], False),
    (HYBRID_HEADKV0_ARCHS,
     lambda arch, hp, kv, n_all, n_main, hkv, notes: [il < n_main and hkv[il] == 0 for il in range(n_all)], False),
    (HYBRID_INTERVAL_ARCHS, _rec_interval, False),
    (HYBRID_BOTH_ARCHS, lambda arch, hp, kv, n_all, n_main, hkv, notes: [il < n_main for il in range(n_all)], True),
    (HYBRID_NEMOTRON_ARCHS, _rec_nemotron, False),
)


def _recurrent_layers(arch, hp, gguf_kv, n_all, n_main, n_head_kv, notes) -> tuple[list[bool], bool]:
    """(per-layer recurrent flag, whether recurrent layers also keep an attention cache)."""
    for archs, rule, both in _RECURRENT_RULES:
        if arch in archs:
            return rule(arch, hp, gguf_kv, n_all, n_main, n_head_kv, notes), both
    return [False] * n_all, False


def _swa_window(arch: str, hp: Mapping[str, str], gguf_kv) -> tuple[int, bool]:
    """(window size, whether the model has sliding-window layers at all)."""
    n_swa = _int(hp.get("n_swa"), 0) or 0
    if not n_swa:
        n_swa = _int(_kv_lookup(gguf_kv, arch, "attention.sliding_window"), 0) or 0
    swa_any = _int(hp.get("is_swa_any"))
    if arch == "phi3":
        swa_any, n_swa = 0, 0  # llama-model.cpp: "Phi SWA is currently disabled"
    has_pattern = _kv_lookup(gguf_kv, arch, "attention.sliding_window_pattern") is not None
    wants_swa = bool(swa_any) if swa_any is not None else (
        n_swa > 0 and (arch in SWA_DEFAULT_PERIOD or has_pattern))
    if wants_swa and not n_swa:
        n_swa = SWA_DEFAULT_WINDOW.get(arch, 0)
    return n_swa, wants_swa


def _swa_pattern(arch: str, hp: Mapping[str, str], gguf_kv, n_all: int, is_rec: list[bool]) -> tuple[list[bool], int | None]:
    """(per-layer SWA flags from a per-layer array or the LFM2 rule, else the period of the pattern or None)."""
    is_swa = [False] * n_all
    raw_pattern = _kv_lookup(gguf_kv, arch, "attention.sliding_window_pattern")
    pattern = parse_num_list(raw_pattern)
    period = int(pattern[0]) if pattern and len(pattern) == 1 and not isinstance(raw_pattern, list) else None
    if pattern and (len(pattern) > 1 or isinstance(raw_pattern, list)):
        # per-layer bool array (gemma4, mimo2, step35, ...), tiled when shorter than n_layer
        is_swa = [bool(pattern[il % len(pattern)]) for il in range(n_all)]
    if period is None and not any(is_swa):
        period = _int(hp.get("n_swa_pattern"))
    if any(is_swa):
        pass
    elif period is None and arch in ("lfm2", "lfm2moe"):
        is_swa = [not r for r in is_rec]
    elif period is None and arch in SWA_DEFAULT_PERIOD:
        period = SWA_DEFAULT_PERIOD[arch]
    return is_swa, period


def _swa_layers(arch, hp, gguf_kv, n_all, n_main, n_head_kv, is_rec, hk, hk_swa, notes) -> tuple[list[bool], int]:
    """(per-layer sliding-window flags, window size)."""
    n_swa, wants_swa = _swa_window(arch, hp, gguf_kv)
    if not wants_swa:
        return [False] * n_all, n_swa
    is_swa, period = _swa_pattern(arch, hp, gguf_kv, n_all, is_rec)
    if period is not None:
        is_swa = list(swa_layers(n_all, period, dense_first=arch in SWA_DENSE_FIRST))
        if arch == "smallthinker":
            n_swa = 4096  # llama-model.cpp overrides the GGUF window for this arch
    elif not any(is_swa):
        # Unknown pattern: use differing head sizes if the log shows them, else count all
        # layers as full attention (an upper bound).
        kg = _per_layer(hp.get("n_embd_k_gqa"), n_all, n_main, None, notes, "n_embd_k_gqa")
        if kg and hk_swa != hk:
            is_swa = [n_head_kv[il] > 0 and kg[il] == hk_swa * n_head_kv[il] for il in range(n_all)]
        if not any(is_swa):
            notes.append(f"{arch}: sliding-window layers unknown; all layers counted as full attention")
    return is_swa, n_swa


def _kv_layers(arch, gguf_kv, n_all, n_main, n_head_kv, is_rec, both, notes) -> tuple[bool, ...]:
    """Which layers own a KV cache: attention layers of the main model, less those that reuse another's."""
    has_kv = tuple(il < n_main and n_head_kv[il] > 0 and (both or not is_rec[il]) for il in range(n_all))
    # Layers that reuse another layer's cache own none (llama-model.cpp n_layer_kv_from_start):
    # Gemma 3n keeps the first 20, Gemma 4 all but {arch}.attention.shared_kv_layers.
    kv_from_start = None
    if arch == "gemma3n":
        kv_from_start = 20
    shared = _int(_kv_lookup(gguf_kv, arch, "attention.shared_kv_layers"))
    if shared:
        kv_from_start = n_all - shared
    if kv_from_start is not None and 0 < kv_from_start < n_all:
        has_kv = tuple(h and il < kv_from_start for il, h in enumerate(has_kv))
    if arch in NO_MEMORY_ARCHS:
        has_kv = (False,) * n_all
        notes.append(f"{arch} keeps no KV cache")
    return has_kv


def shape_from_hparams(hparams: Mapping[str, str], gguf_kv: Mapping[str, str] | None = None,
                       ) -> ModelShape | None:
    """A ``ModelShape`` from the model parameters a llama.cpp log prints.

    ``hparams``: the ``print_info:`` (older ``llm_load_print_meta:``) keys as printed
    (``src/llama-model.cpp`` ``llama_model::print_info``), values raw strings: arch, n_layer,
    n_layer_all, n_head, n_head_kv (``"8"`` or ``"[0, 0, 8, ...]"``), n_embd_head_k/_v,
    n_embd_k_gqa/_v_gqa, n_swa, is_swa_any, n_swa_pattern (b4885-b5466), n_embd_head_k_swa/_v_swa,
    n_ctx_train, n_embd, n_ff, ssm_d_conv, ssm_d_inner, ssm_d_state, ssm_n_group, n_lora_kv,
    n_embd_head_k_mla, n_embd_head_v_mla.
    ``gguf_kv``: the ``llama_model_loader: - kv`` values (truncated to 40 characters by the
    loader), used for keys print_info does not show: ``{arch}.attention.sliding_window_pattern``,
    ``{arch}.attention.sliding_window``, ``{arch}.full_attention_interval``,
    ``{arch}.shortconv.l_cache``, ``{arch}.wkv.head_size``, ``{arch}.token_shift_count``,
    ``{arch}.nextn_predict_layers``, ``{arch}.attention.recurrent_layers``.
    Returns None when too little is known (no layer count, or no way to get head sizes).
    """
    hp = {str(k).strip(): v for k, v in (hparams or {}).items()}
    arch = str(hp.get("arch") or (gguf_kv or {}).get("general.architecture") or "").strip()
    counts = _layer_counts(hp, gguf_kv, arch)
    if counts is None:
        return None
    n_main, n_all = counts
    notes: list[str] = []
    n_embd = _int(hp.get("n_embd"), 0) or 0
    n_head = _per_layer(hp.get("n_head"), n_all, n_main, None, notes, "n_head")
    n_head_kv = _per_layer(hp.get("n_head_kv"), n_all, n_main, None, notes, "n_head_kv")
    if n_head_kv is None:
        n_head_kv = n_head
    if n_head_kv is None:
        return None
    sizes = _head_sizes(hp, n_embd, n_head, notes)
    if sizes is None:
        return None
    hk, hv, hk_swa, hv_swa = sizes
    n_head0 = max(n_head or (0,)) if n_head else 0
    n_ctx_train = _int(hp.get("n_ctx_train"), 0) or _int(_kv_lookup(gguf_kv, arch, "context_length"), 0) or 0
    is_rec, both = _recurrent_layers(arch, hp, gguf_kv, n_all, n_main, n_head_kv, notes)
    is_swa, n_swa = _swa_layers(arch, hp, gguf_kv, n_all, n_main, n_head_kv, is_rec, hk, hk_swa, notes)
    head_dim_k = tuple((hk_swa if is_swa[il] else hk) for il in range(n_all))
    head_dim_v = tuple((hv_swa if is_swa[il] else hv) for il in range(n_all))
    # MLA (llama-hparams.cpp is_mla: both *_mla sizes non-zero).
    k_mla = _int(hp.get("n_embd_head_k_mla"), 0) or 0
    v_mla = _int(hp.get("n_embd_head_v_mla"), 0) or 0
    # Recurrent widths.
    n_embd_r = [0] * n_all
    n_embd_s = [0] * n_all
    if any(is_rec):
        r, s = _state_widths(arch, hp, gguf_kv, n_embd, n_head0, notes)
        n_embd_r = [r if x else 0 for x in is_rec]
        n_embd_s = [s if x else 0 for x in is_rec]
    has_kv = _kv_layers(arch, gguf_kv, n_all, n_main, n_head_kv, is_rec, both, notes)
    return ModelShape(
        arch=arch or "unknown", n_layer=n_all, n_head_kv=tuple(n_head_kv), head_dim_k=head_dim_k,
        head_dim_v=head_dim_v, is_swa=tuple(is_swa), is_recurrent=tuple(is_rec), has_kv=has_kv,
        n_swa=n_swa if any(is_swa) else 0, n_ctx_train=n_ctx_train, n_embd=n_embd, is_mla=k_mla > 0 and v_mla > 0,
        kv_lora_rank=_int(hp.get("n_lora_kv"), 0) or 0, n_embd_head_k_mla=k_mla, n_embd_head_v_mla=v_mla,
        n_embd_r=tuple(n_embd_r), n_embd_s=tuple(n_embd_s), n_layer_nextn=n_all - n_main,
        source="log", name=(str(hp["general.name"]).strip() if hp.get("general.name") else None),
        notes=tuple(notes),
    )


def _state_widths(arch: str, hp: Mapping, gguf_kv: Mapping | None, n_embd: int, n_head: int,
                  notes: list[str]) -> tuple[int, int]:
    """(n_embd_r, n_embd_s) of a recurrent layer, in f32 elements (``src/llama-hparams.cpp``)."""
    if arch in RWKV_ARCHS:
        shift = _int(_kv_lookup(gguf_kv, arch, "token_shift_count"), 2) or 2
        head = _int(_kv_lookup(gguf_kv, arch, "wkv.head_size"), 64) or 64
        if _kv_lookup(gguf_kv, arch, "wkv.head_size") is None:
            notes.append("RWKV head size not known: 64 assumed")
        return shift * n_embd, n_embd * head
    if arch in ("lfm2", "lfm2moe"):
        l_cache = _int(hp.get("shortconv_l_cache")) or _int(_kv_lookup(gguf_kv, arch, "shortconv.l_cache"))
        if l_cache is None:
            l_cache = 3
            notes.append("lfm2 shortconv.l_cache not known: 3 assumed")
        return n_embd * (l_cache - 1), 0
    if arch == "kimi-linear":
        d_conv = _int(hp.get("ssm_d_conv"), 4) or 4
        head = _int(_kv_lookup(gguf_kv, arch, "kda.head_dim"), 128) or 128
        return 3 * (d_conv - 1) * n_head * head, head * head * n_head
    d_conv = _int(hp.get("ssm_d_conv"), 0) or 0
    d_inner = _int(hp.get("ssm_d_inner"), 0) or 0
    d_state = _int(hp.get("ssm_d_state"), 0) or 0
    n_group = _int(hp.get("ssm_n_group"), 0) or 0
    if not (d_conv and d_inner):
        notes.append(f"{arch}: ssm sizes not printed; recurrent state not counted")
        return 0, 0
    return (d_conv - 1) * (d_inner + 2 * n_group * d_state), d_state * d_inner
