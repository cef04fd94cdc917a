"""Write tiny but real GGUF files with gguf-py's own writer (``gguf.GGUFWriter``) for tests.

Only metadata and tensor infos matter to kvreport; tensors are written as tiny arrays, or only
declared (``declare_only``) and the file extended sparsely so a "40 GB" model costs no disk.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


def write_gguf(path: Path | str, arch: str, kv: dict | None = None, *, n_vocab: int = 0,
               tensors: dict[str, tuple[int, ...]] | None = None, declare_only: bool = False,
               sparse_size: int | None = None, name: str | None = None) -> Path:
    """Write a GGUF v3 file at ``path``.

    ``kv`` maps keys to values; a key starting with ``.`` is prefixed with ``arch`` (".block_count"
    -> "llama.block_count"). ints become uint32 (negative: int32), floats float32, bools bool,
    strs strings, lists arrays of the first element's type. ``n_vocab`` adds a tokenizer of that
    many token strings. ``tensors`` maps names to shapes (f32); with ``declare_only`` only their
    infos are written (the data section is left out), and ``sparse_size`` then extends the file
    to that many bytes with a hole (nothing written), as a real multi-GB model would be.
    """
    path = Path(path)
    w = gguf.GGUFWriter(str(path), arch)
    if name:
        w.add_name(name)
    for key, value in (kv or {}).items():
        full = arch + key if key.startswith(".") else key
        _add(w, full, value)
    if n_vocab:
        w.add_tokenizer_model("gpt2")
        w.add_token_list([f"tok{i}" for i in range(n_vocab)])
    for tname, shape in (tensors or {}).items():
        if declare_only:
            n = int(np.prod(shape))
            w.add_tensor_info(tname, shape, np.dtype(np.float32), n * 4)
        else:
            w.add_tensor(tname, np.zeros(shape, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    if declare_only:
        w.write_ti_data_to_file()
        w.close()
    else:
        w.write_tensors_to_file()
        w.close()
    if sparse_size:
        with open(path, "r+b") as f:
            f.truncate(sparse_size)
    return path


def _add(w: gguf.GGUFWriter, key: str, value) -> None:
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        (w.add_uint32 if value >= 0 else w.add_int32)(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    elif isinstance(value, (list, tuple)):
        w.add_array(key, list(value))
    else:
        raise TypeError(f"cannot write {key}={value!r}")


def dense(path, *, n_layer=4, n_head=8, n_head_kv=2, n_embd=256, ctx=4096, arch="llama", **extra):
    """A llama-style dense GQA model header (head dim = n_embd / n_head)."""
    kv = {".block_count": n_layer, ".context_length": ctx, ".embedding_length": n_embd,
          ".attention.head_count": n_head, ".attention.head_count_kv": n_head_kv}
    kv.update(extra)
    return write_gguf(path, arch, kv)
