"""The tier's own instruments: the printed-facts reader against the real logs of the same llama.cpp
build in tests/data/cases (loc-*), and the tiny models' shapes as llama.cpp reads them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from . import harness, models

ROOT = Path(__file__).resolve().parents[2]
from tests.paths import CASE_DIR  # noqa: E402


def _loc_cases():
    if not CASE_DIR.is_dir():
        return []
    return sorted(p for p in CASE_DIR.glob("loc-*") if (p / "case.json").is_file())


@pytest.mark.parametrize("case", _loc_cases(), ids=lambda p: p.name)
def test_printed_facts_on_real_logs(case):
    facts = json.loads((case / "case.json").read_text())
    p = harness.printed_facts((case / "log.txt").read_text(errors="replace"))
    real = [k for k in facts.get("kv_printed") or [] if k.get("phase") == "real"]
    assert [(s["total"], s["cells"], s["streams"]) for s in p.kv_sizes] == [
        (k["total_mib"], k["cells"], k["streams"]) for k in real]
    assert p.kv_failed == bool(facts.get("is_kv_failure"))
    if facts.get("requested_bytes"):
        assert p.failed_bytes[-1] == facts["requested_bytes"]


def test_loc_cases_present():
    assert _loc_cases(), f"no loc-* cases under {CASE_DIR}"


@pytest.mark.parametrize("name", sorted(models.ALL_MODELS))
def test_tiny_model_header(tiny_models, name):
    """The written header reads back (gguf.GGUFReader) with the spec's hyperparameters."""
    import gguf

    spec = models.ALL_MODELS[name]
    r = gguf.GGUFReader(str(tiny_models[name]))
    f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("tokenizer.")}
    a = spec.arch
    assert f["general.architecture"] == a
    assert f[f"{a}.block_count"] == spec.n_layer
    assert f[f"{a}.attention.head_count_kv"] == spec.n_head_kv
    assert f[f"{a}.attention.key_length"] == spec.head_dim
    assert f.get(f"{a}.attention.sliding_window") == spec.sliding_window


def test_models_are_deterministic(tmp_path):
    a = models.write_model(models.TINY_LLAMA, tmp_path / "a.gguf").read_bytes()
    b = models.write_model(models.TINY_LLAMA, tmp_path / "b.gguf").read_bytes()
    assert a == b


def _size_line(total, cells, layers, seqs, streams, tk, k, tv, v, prefix):
    # src/llama-kv-cache.cpp: "%s: size = %7.2f MiB (%6u cells, %3d layers, %2u/%u seqs), K (%s): %7.2f MiB, V (%s): %7.2f MiB"
    body = (f"llama_kv_cache: size = {total:7.2f} MiB ({cells:6d} cells, {layers:3d} layers, {seqs:2d}/{streams} seqs), "
            f"K ({tk}): {k:7.2f} MiB, V ({tv}): {v:7.2f} MiB")
    return prefix + body


_mib = st.integers(min_value=0, max_value=10**8).map(lambda x: x / 100)


@given(total=_mib, cells=st.integers(1, 2**26), layers=st.integers(1, 512), seqs=st.integers(1, 256),
       streams=st.integers(1, 256), tk=st.sampled_from(["f16", "q8_0", "q4_0", "f32", "bf16"]), k=_mib,
       tv=st.sampled_from(["f16", "q8_0", "q4_0"]), v=_mib,
       prefix=st.sampled_from(["", "0.00.078.689 I ", "12.34.567.890 I "]))
def test_size_line_round_trip(total, cells, layers, seqs, streams, tk, k, tv, v, prefix):
    p = harness.printed_facts(_size_line(total, cells, layers, seqs, streams, tk, k, tv, v, prefix) + "\n")
    assert p.kv_sizes == [{"total": total, "cells": cells, "layers": layers, "seqs": seqs, "streams": streams,
                           "type_k": tk, "type_v": tv, "k": k, "v": v}]


@given(st.text())
def test_printed_facts_never_raises(text):
    p = harness.printed_facts(text)
    assert isinstance(p.kv_sizes, list)


def test_quoted_lines_not_counted():
    """kvreport's own summary may quote a line; only lines that start like llama.cpp's count."""
    line = "0.00.042.326 E ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 68719476736"
    p = harness.printed_facts(f"{line}\n  allocator: {line}\n")
    assert p.failed_bytes == [68719476736]
