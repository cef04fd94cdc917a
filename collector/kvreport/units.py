"""Units, one copy: bytes per MiB/GiB, bytes per cached value of each cache type, MiB formatting.

MiB is 2**20 bytes; every llama.cpp "MiB" and ggml "MB" is this (kv-facts.md §0).
"""

from __future__ import annotations

MIB = 1024.0 * 1024.0
"""Bytes in one MiB (2**20)."""
GIB = 1024.0 * MIB
"""Bytes in one GiB (2**30)."""

#: ``-ctk`` / ``-ctv`` names -> (block size in elements, bytes per block).
#: Source: ``ggml/src/ggml-common.h`` block structs and ``ggml/src/ggml.c`` ``type_traits``
#: (also ``gguf-py/gguf/constants.py`` ``GGML_QUANT_SIZES``); the allowed values are
#: ``common/arg.cpp`` ``kv_cache_types``.
CACHE_TYPES: dict[str, tuple[int, int]] = {
    "f32": (1, 4),
    "f16": (1, 2),
    "bf16": (1, 2),
    "q8_0": (32, 34),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
    "iq4_nl": (32, 18),
}

PY_CACHE_TYPES: dict[str, tuple[int, int]] = {
    "fp8": (1, 1),
    "fp8_e4m3": (1, 1),
    "fp8_e5m2": (1, 1),
}
"""vLLM / SGLang ``--kv-cache-dtype`` values besides the 16-bit default ("auto" = the model's dtype, as f16)."""

BYTES_PER_VALUE = {name: size / blck for name, (blck, size) in {**CACHE_TYPES, **PY_CACHE_TYPES}.items()}
"""Bytes per cached value of each cache type (ggml block sizes: q8_0 = 34 bytes per 32 values; fp8 = 1)."""


def fmt_mib(x: float | None) -> str:
    """A MiB figure for people: ``12710.31`` -> "12,710", ``34.5`` -> "34.5", ``4.0`` -> "4";
    under 100 MiB up to two decimals, else none; "?" for None; never "-0"."""
    if x is None:
        return "?"
    x = float(x)
    s = f"{x:,.2f}".rstrip("0").rstrip(".") if abs(x) < 100 else f"{x:,.0f}"
    return "0" if s in ("-0", "-0.0") else s
