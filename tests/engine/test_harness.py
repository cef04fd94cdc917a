"""The tier's own instruments: the printed-facts reader against the real logs of the same llama.cpp
build in ../shared/cases (loc-*), and the tiny models' shapes as llama.cpp reads them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from . import harness, models

ROOT = Path(__file__).resolve().parents[2]
SHARED_CASES = Path(os.environ.get("KVREPORT_SHARED", ROOT.parent / "shared")).resolve() / "cases"


def _loc_cases():
    if not SHARED_CASES.is_dir():
        return []
    return sorted(p for p in SHARED_CASES.glob("loc-*") if (p / "case.json").is_file())


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
    assert _loc_cases(), f"no loc-* cases under {SHARED_CASES}"


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
