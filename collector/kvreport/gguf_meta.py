"""GGUF header reading: the metadata key/values of a model file, and its ``ModelShape``.

Only the header is read, through gguf-py's ``gguf.GGUFReader`` (PyPI ``gguf``, the reader of
``ggml-org/llama.cpp:gguf-py``). The reader memory-maps the file and walks the header, the
key/values and the tensor infos; kvreport's subclass additionally

* does not build the per-tensor numpy views (tensor data is never touched), but checks from the
  tensor infos that the data section the header promises fits in the file (truncated download);
* skips the values of long arrays (tokenizer tokens, scores, merges: 100k+ entries that the base
  reader parses one element at a time) and walks over them by their lengths, so a real model's
  metadata comes back in milliseconds.

``gguf`` (and numpy) are imported inside the functions: ``kvreport --help`` must not load them.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvreport.errors import ModelFileError
from kvreport.kvcache import ModelShape, shape_from_hparams

#: Arrays longer than this are summarized, not returned (tokenizer data).
MAX_ARRAY = 4096
#: The smallest possible GGUF header: magic, version, tensor count, kv count.
MIN_HEADER = 24

_READER_CLASS = None


def _reader_class():
    """A ``gguf.GGUFReader`` subclass that reads the header only (built on first use)."""
    global _READER_CLASS
    if _READER_CLASS is not None:
        return _READER_CLASS
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType

    class HeaderReader(GGUFReader):
        def _get_field_parts(self, orig_offs, raw_type):
            if GGUFValueType(raw_type) != GGUFValueType.ARRAY:
                return super()._get_field_parts(orig_offs, raw_type)
            raw_itype = self._get(orig_offs, np.uint32)
            alen = self._get(orig_offs + 4, np.uint64)
            n = int(alen[0])
            if n <= MAX_ARRAY:
                return super()._get_field_parts(orig_offs, raw_type)
            itype = GGUFValueType(raw_itype[0])
            offs = orig_offs + 12
            if itype == GGUFValueType.STRING:
                buf = memoryview(self.data)
                fmt = ">Q" if self.byte_order == "S" else "<Q"
                unpack = struct.Struct(fmt).unpack_from
                for _ in range(n):
                    (slen,) = unpack(buf, offs)
                    offs += 8 + slen
                if offs > len(self.data):
                    raise ValueError("truncated header (string array past the end of the file)")
            else:
                nptype = self.gguf_scalar_to_np.get(itype)
                if nptype is None:
                    raise ValueError(f"unhandled array of {itype.name}")
                offs += n * np.dtype(nptype).itemsize
            return offs - orig_offs, [raw_itype, alen], [], [GGUFValueType.ARRAY, itype]

        def _build_tensors(self, start_offs, fields):
            end = start_offs
            for field in fields:
                _name_len, _name, _n_dims, dims, raw_dtype, offset_tensor = field.parts
                try:
                    blck, size = GGML_QUANT_SIZES[GGMLQuantizationType(int(raw_dtype[0]))]
                except (KeyError, ValueError):
                    continue  # a type this gguf version does not know: cannot size it
                n_elems = int(np.prod(dims)) if len(dims) else 1
                end = max(end, start_offs + int(offset_tensor[0]) + n_elems * size // blck)
            self.tensor_count = len(fields)
            self.data_end = end
            self.tensors = []

    _READER_CLASS = HeaderReader
    return HeaderReader


def _field_value(field) -> Any:
    types = list(field.types)
    if len(types) >= 2 and types[0].name == "ARRAY" and not field.data:
        n = int(field.parts[-1][0])
        if n:  # an array HeaderReader walked over without keeping its values
            return {"array": types[-1].name.lower(), "len": n}
    value = field.contents()
    if isinstance(value, float) and value != value:  # NaN is not JSON
        return None
    return value


def read_gguf_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The metadata key/values of a GGUF file, read from its header only.

    Scalars come back as int/float/bool/str, arrays as lists; arrays longer than ``MAX_ARRAY``
    (tokenizer data) as ``{"array": <element type>, "len": N}``. Extra keys: ``GGUF.version``,
    ``GGUF.tensor_count``, ``GGUF.kv_count``, ``GGUF.file_size`` (bytes).
    Raises ``ModelFileError`` (one line) for a missing/unreadable file, a file that is not GGUF,
    an unsupported GGUF version, or a header or data section cut short (truncated file).
    """
    p = Path(path)
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        raise ModelFileError(f"model file not found: {p}") from None
    except OSError as exc:
        raise ModelFileError(f"cannot read model file {p}: {exc.strerror or exc}") from None
    if p.is_dir():
        raise ModelFileError(f"model path is a directory, not a GGUF file: {p}")
    try:
        with open(p, "rb") as f:
            head = f.read(8)
    except OSError as exc:
        raise ModelFileError(f"cannot read model file {p}: {exc.strerror or exc}") from None
    if head[:4] != b"GGUF":
        what = "an empty file" if size == 0 else f"starts with {head[:4]!r}"
        hint = " (a split model's later shard? pass the -00001-of-N file)" if "-of-" in p.name else ""
        raise ModelFileError(f"not a GGUF file: {p} ({what}){hint}")
    if size < MIN_HEADER:
        raise ModelFileError(f"truncated GGUF file: {p} ({size} bytes, shorter than a GGUF header)")
    version = int.from_bytes(head[4:8], "little")
    if version & 0xFFFF == 0:
        version = int.from_bytes(head[4:8], "big")
    if version not in (2, 3):
        raise ModelFileError(f"unsupported GGUF version {version} in {p} (kvreport reads versions 2 and 3)")

    reader_cls = _reader_class()
    try:
        reader = reader_cls(str(p), "r")
    except (ValueError, IndexError, KeyError, OverflowError, struct.error, UnicodeDecodeError) as exc:
        msg = str(exc)
        if "version" in msg:
            raise ModelFileError(f"unsupported GGUF version in {p}: {msg}") from None
        raise ModelFileError(f"truncated or corrupt GGUF header in {p} ({size} bytes): {msg or type(exc).__name__}") from None
    except OSError as exc:
        raise ModelFileError(f"cannot read model file {p}: {exc.strerror or exc}") from None
    data_end = getattr(reader, "data_end", None)
    if data_end is not None and data_end > size:
        raise ModelFileError(
            f"truncated GGUF file: {p} is {size} bytes but its tensors end at byte {data_end} "
            f"(incomplete download?)")
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        try:
            meta[key] = _field_value(field)
        except (ValueError, UnicodeDecodeError, IndexError):
            meta[key] = None
    meta["GGUF.file_size"] = size
    return meta


def _get(meta: Mapping[str, Any], arch: str, suffix: str, default=None):
    return meta.get(f"{arch}.{suffix}", default)


def _first(value) -> int | None:
    if isinstance(value, list):
        nz = [int(x) for x in value if isinstance(x, (int, float)) and x]
        return nz[0] if nz else None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return int(value)
    return None


def shape_from_metadata(meta: Mapping[str, Any]) -> ModelShape:
    """A ``ModelShape`` from GGUF metadata (as ``read_gguf_metadata`` returns it).

    Keys (``gguf-py/gguf/constants.py`` Keys, ``src/llama-arch.cpp`` LLM_KV_NAMES; ``{arch}`` =
    ``general.architecture``): ``{arch}.block_count`` (n_layer_all), ``nextn_predict_layers``,
    ``context_length``, ``embedding_length``, ``attention.head_count`` / ``head_count_kv`` (scalar
    or per-layer array; KV heads default to heads), ``attention.key_length`` / ``value_length``
    (default n_embd / n_head, ``src/llama-model.cpp``), their ``_swa`` variants,
    ``attention.sliding_window`` and ``sliding_window_pattern`` (scalar period or per-layer bools),
    ``attention.shared_kv_layers``, ``attention.kv_lora_rank``, ``key_length_mla`` /
    ``value_length_mla``, ``ssm.*``, ``wkv.head_size``, ``token_shift_count``,
    ``shortconv.l_cache``, ``full_attention_interval``, ``feed_forward_length``.
    Raises ``ModelFileError`` when the architecture or layer count is missing.
    """
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelFileError("GGUF metadata has no general.architecture")
    n_all = _first(_get(meta, arch, "block_count"))
    if not n_all:
        raise ModelFileError(f"GGUF metadata has no {arch}.block_count")
    nextn = _first(_get(meta, arch, "nextn_predict_layers")) or 0
    hp: dict[str, Any] = {"arch": arch, "n_layer": max(1, n_all - nextn), "n_layer_all": n_all}
    simple = {
        "n_ctx_train": "context_length", "n_embd": "embedding_length",
        "n_head": "attention.head_count", "n_head_kv": "attention.head_count_kv",
        "n_embd_head_k": "attention.key_length", "n_embd_head_v": "attention.value_length",
        "n_embd_head_k_swa": "attention.key_length_swa", "n_embd_head_v_swa": "attention.value_length_swa",
        "n_swa": "attention.sliding_window", "n_lora_kv": "attention.kv_lora_rank",
        "n_embd_head_k_mla": "attention.key_length_mla", "n_embd_head_v_mla": "attention.value_length_mla",
        "ssm_d_conv": "ssm.conv_kernel", "ssm_d_inner": "ssm.inner_size",
        "ssm_d_state": "ssm.state_size", "ssm_n_group": "ssm.group_count",
        "n_ff": "feed_forward_length", "shortconv_l_cache": "shortconv.l_cache",
    }
    for hp_key, suffix in simple.items():
        v = _get(meta, arch, suffix)
        if v is None:
            continue
        if isinstance(v, list):
            if len(v) == 1:
                v = v[0]
            elif hp_key not in ("n_head", "n_head_kv", "n_ff"):
                v = _first(v)
        hp[hp_key] = v
    if hp.get("n_head") is None:
        raise ModelFileError(f"GGUF metadata has no {arch}.attention.head_count")
    # llama.cpp: head sizes default to n_embd / n_head(0) (src/llama-model.cpp, load_hparams).
    n_head0 = _first(hp["n_head"])
    if "n_embd_head_k" not in hp and hp.get("n_embd") and n_head0:
        hp["n_embd_head_k"] = int(hp["n_embd"]) // n_head0
    pattern = _get(meta, arch, "attention.sliding_window_pattern")
    if pattern is not None and hp.get("n_swa"):
        hp["is_swa_any"] = 1
    if hp.get("general.name") is None and isinstance(meta.get("general.name"), str):
        hp["general.name"] = meta["general.name"]
    shape = shape_from_hparams(hp, meta)
    if shape is None:
        raise ModelFileError(f"GGUF metadata of {arch} lacks the attention sizes kvreport needs")
    return _with_source(shape, "gguf")


def _with_source(shape: ModelShape, source: str) -> ModelShape:
    from dataclasses import replace

    return replace(shape, source=source)


def shape_from_gguf(path: str | os.PathLike) -> ModelShape:
    """Read a GGUF header and return its ``ModelShape`` (source "gguf"); ``ModelFileError`` on bad files."""
    return shape_from_metadata(read_gguf_metadata(path))


def gguf_summary(meta: Mapping[str, Any], limit: int = 256) -> dict[str, Any]:
    """The metadata worth keeping in a bundle: every key except tokenizer data and long arrays."""
    out = {}
    for k, v in meta.items():
        if k.startswith("tokenizer.") and k not in ("tokenizer.ggml.model", "tokenizer.ggml.pre"):
            continue
        if isinstance(v, list) and len(v) > limit:
            v = {"array": type(v[0]).__name__ if v else "unknown", "len": len(v)}
        if isinstance(v, str) and len(v) > 1024:
            v = v[:1024] + "…"
        out[k] = v
    return out
