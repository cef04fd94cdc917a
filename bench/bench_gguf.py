"""Benchmark: metadata of a ~40 GB GGUF file comes back in well under a second.

Writes a real GGUF header with gguf-py's writer (llama-style 80-layer shape, a 152k-token
tokenizer with scores and merges like a real model, ~290 declared 128 MiB tensors), then extends the file
with a hole to ~40 GB (no data written, so no disk used) and times
``kvreport.gguf_meta.read_gguf_metadata`` / ``shape_from_gguf``. It reports the wall time, the
page faults (every mmap page the reader touched costs one), the bytes read through read(2)
(``/proc/self/io`` rchar) and, for comparison, plain ``gguf.GGUFReader`` on the same file.

    .venv/bin/python bench/bench_gguf.py [--keep PATH] [--vocab N]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path


def _io() -> dict[str, int]:
    try:
        with open("/proc/self/io") as f:
            return {k: int(v) for k, v in (line.split(": ") for line in f)}
    except OSError:
        return {}


def make_file(path: Path, vocab: int, size: int) -> None:
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("bench-70b-shape")
    w.add_block_count(80)
    w.add_context_length(131072)
    w.add_embedding_length(8192)
    w.add_head_count(64)
    w.add_head_count_kv(8)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"token_{i}" for i in range(vocab)])
    w.add_token_scores([0.0] * vocab)
    w.add_token_types([1] * vocab)
    w.add_token_merges([f"a{i} b{i}" for i in range(vocab - 256)])
    n_tensors = max(1, (size - (64 << 20)) // (8192 * 4096 * 4))  # fill the file, header aside
    for i in range(n_tensors):
        w.add_tensor_info(f"blk.{i}.weight", (8192, 4096), np.dtype(np.float32), 8192 * 4096 * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    with open(path, "r+b") as f:
        f.truncate(size)


def measure(fn):
    io0, ru0, t0 = _io(), resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    result = fn()
    dt = time.perf_counter() - t0
    io1, ru1 = _io(), resource.getrusage(resource.RUSAGE_SELF)
    faults = (ru1.ru_minflt - ru0.ru_minflt) + (ru1.ru_majflt - ru0.ru_majflt)
    rchar = io1.get("rchar", 0) - io0.get("rchar", 0)
    return result, dt, faults, rchar


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, help="write the file here and keep it")
    ap.add_argument("--vocab", type=int, default=152064)
    ap.add_argument("--size-gb", type=float, default=40.0)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collector"))
    from kvreport.gguf_meta import read_gguf_metadata, shape_from_metadata
    from kvreport.kvcache import KVConfig, kv_size

    tmpdir = None
    if args.keep:
        path = args.keep
    else:
        tmpdir = tempfile.TemporaryDirectory()
        path = Path(tmpdir.name) / "bench-40g.gguf"
    size = int(args.size_gb * 10**9)
    t0 = time.perf_counter()
    make_file(path, args.vocab, size)
    st = os.stat(path)
    header_bytes = None
    print(f"file: {path}  apparent size {st.st_size / 1e9:.1f} GB, on disk {st.st_blocks * 512 / 2**20:.1f} MiB "
          f"(written in {time.perf_counter() - t0:.2f} s)")

    import gguf  # noqa: F401  (import cost kept out of the timings)

    meta, dt, faults, rchar = measure(lambda: read_gguf_metadata(path))
    shape = shape_from_metadata(meta)
    header_bytes = st.st_blocks * 512
    print(f"kvreport read_gguf_metadata: {dt * 1000:.1f} ms, {len(meta)} keys, "
          f"{faults} page faults (~{faults * 4096 / 2**20:.1f} MiB touched, header is "
          f"{header_bytes / 2**20:.1f} MiB), read(2) bytes {rchar:,}")
    print(f"  shape: {shape.arch}, {shape.n_layer} layers, KV at 131072 f16 = "
          f"{kv_size(shape, KVConfig(n_ctx=131072)).kv_mib:,.0f} MiB")

    from gguf import GGUFReader

    reader, dt2, faults2, _ = measure(lambda: GGUFReader(str(path)))
    print(f"plain gguf.GGUFReader: {dt2 * 1000:.1f} ms, {faults2} page faults, "
          f"{len(reader.tensors)} tensor views built")
    del reader
    if tmpdir:
        tmpdir.cleanup()
    ok = dt < 1.0
    print("OK: well under a second" if dt < 0.5 else ("OK: under a second" if ok else "SLOW"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
