"""Every real case of ../shared/cases (and tests/data/cases) as a test of the analyzer.

Asserts every non-null fact of the case's expected.json (cases/README.md):
engine, phase, backend, failing_device, requested_mib (±1 %), verdict, the first suggestion (any
id of ``top_suggestions_ok`` when that list is not empty), ``kv_printed_mib`` against
``memory.kv_required_mib`` (±0.5 %), and ``is_kv_failure``.

``is_kv_failure`` mapping (documented here and in kvreport.analyze): a failure is a KV failure when
its phase is ``kv_cache`` (a KV/RS buffer could not be allocated) or ``kv_capacity`` (the
engine's KV pool cannot hold its configured maximum length); every other phase is not.
"""

from __future__ import annotations

import json

import pytest

from kvreport.analyze import analyze, analyze_text
from kvreport.cmdline import parse_command
from kvreport.excerpt import Excerpt
from tests.paths import case_dirs, load_expected

CASES = case_dirs()
KV_PHASES = ("kv_cache", "kv_capacity")


def _command(case):
    p = case / "command.txt"
    return p.read_text(errors="replace").strip() if p.is_file() else None


def _diagnose(case):
    return analyze_text((case / "log.txt").read_text(errors="replace"), _command(case))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_matches_expected(case):
    exp = load_expected(case)
    d = _diagnose(case)
    f, mem = d["failure"], d["memory"]
    if exp.get("engine") is not None:
        assert d["engine"] == exp["engine"]
    if exp.get("phase") is not None:
        assert f["phase"] == exp["phase"]
    if exp.get("backend") is not None:
        assert f["backend"] == exp["backend"]
    if exp.get("failing_device") is not None:
        assert f["failing_device"] == exp["failing_device"]
    if exp.get("requested_mib") is not None:
        assert f["requested_mib"] == pytest.approx(exp["requested_mib"], rel=0.01)
    if exp.get("verdict") is not None:
        assert f["verdict"] == exp["verdict"]
    if exp.get("top_suggestions_ok"):
        assert d["suggestions"], "a fix was expected"
        assert d["suggestions"][0]["id"] in exp["top_suggestions_ok"], [s["id"] for s in d["suggestions"]]
    if exp.get("kv_printed_mib") is not None:
        assert mem["kv_required_mib"] == pytest.approx(exp["kv_printed_mib"], rel=0.005)
    if exp.get("is_kv_failure") is not None:
        assert (f["phase"] in KV_PHASES) == exp["is_kv_failure"]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_diagnosis_shape(case):
    d = _diagnose(case)
    assert set(d) == {"analyzer_version", "engine", "failure", "memory", "findings", "signature", "suggestions"}
    assert set(d["failure"]) == {"phase", "backend", "failing_device", "requested_mib", "free_mib",
                                 "allocator_error", "final_error", "verdict"}
    assert set(d["memory"]) == {"kv_required_mib", "rs_required_mib", "kv_mib_per_1k_tokens", "max_ctx_fit",
                                "fit", "inputs"}
    assert d["memory"]["inputs"]["source"] in ("gguf", "log", "assumed")
    assert set(d["signature"]) == {"id", "key", "title", "scheme", "notes"}
    for s in d["suggestions"]:
        assert set(s) == {"id", "title", "change", "command", "expected", "why"}
    if d["failure"]["phase"] == "none":
        assert d["suggestions"] == []
    # kvreport's own arithmetic agrees with every KV size the engine printed
    assert not [x for x in d["findings"] if x["kind"] == "kv_model_mismatch"]
    # types, units and vocabularies of design.md's diagnosis contract
    f, m = d["failure"], d["memory"]
    assert d["engine"] in ("llama.cpp", "ollama", "vllm", "sglang", "tgi", "unknown")
    assert f["phase"] in ("kv_cache", "compute_buffer", "model_weights", "context", "kv_capacity", "memory_budget",
                          "none", "unknown")
    assert f["backend"] in ("cuda", "rocm", "vulkan", "metal", "sycl", "cpu", "openvino", "cann", "unknown")
    assert f["verdict"] in ("exceeds_free", "exceeds_alloc_limit", "fits_but_failed", "unknown")
    for key in ("requested_mib", "free_mib"):
        assert f[key] is None or isinstance(f[key], float)
    for key in ("kv_required_mib", "rs_required_mib", "kv_mib_per_1k_tokens"):
        assert m[key] is None or isinstance(m[key], float)
    if m["max_ctx_fit"] is not None:
        assert set(m["max_ctx_fit"]) == {"f16", "q8_0", "q4_0"}
        assert all(isinstance(v, int) and v % 256 == 0 for v in m["max_ctx_fit"].values())
    if m["fit"] is not None:
        assert set(m["fit"]) == {"ran", "status", "changed"} and isinstance(m["fit"]["ran"], bool)
        assert all(isinstance(v, list) and len(v) == 2 for v in m["fit"]["changed"].values())
    assert set(m["inputs"]) == {"n_ctx", "n_seq", "n_layer", "n_head_kv", "head_dim_k", "head_dim_v", "cache_type_k",
                                "cache_type_v", "n_swa", "source"}
    assert all(set(x) == {"kind", "text", "line"} for x in d["findings"])
    assert isinstance(d["signature"]["scheme"], int) and d["signature"]["key"].count("/") == 3
    from kvreport.fixes import SUGGESTION_IDS

    assert all(s["id"] in SUGGESTION_IDS and isinstance(s["change"], dict) for s in d["suggestions"])
    json.dumps(d)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bundle_excerpt_gives_same_diagnosis(case):
    """analyze(bundle) with the bounded excerpt equals analyzing the whole log (design.md)."""
    text = (case / "log.txt").read_text(errors="replace")
    cmd = _command(case)
    whole = analyze_text(text, cmd)
    bundle = {"log": Excerpt().feed_all(text.splitlines()).to_log("file"),
              "command": parse_command(cmd) if cmd else {}}
    assert analyze(bundle) == whole


def test_recovered_pinned_fallback_is_a_finding_not_the_failure():
    case = next(c for c in CASES if c.name.startswith("pub-023"))
    d = _diagnose(case)
    assert d["failure"]["phase"] == "none"
    assert [x for x in d["findings"] if x["kind"] == "recovered_allocation"]


def test_retry_without_pipeline_parallelism_that_worked_is_recovered():
    case = next(c for c in CASES if c.name.startswith("pub-039"))
    d = _diagnose(case)
    assert d["failure"]["phase"] == "none"
    assert any("pipeline parallelism" in x["text"] for x in d["findings"])


def _strip_text_fields(d):
    d = {**d, "failure": {**d["failure"], "allocator_error": None, "final_error": None}}
    d["findings"] = [{**x, "line": None} for x in d["findings"]]
    return d


@pytest.mark.parametrize("variant", ["no_prefix", "crlf", "github_quote", "ansi", "jsonl", "docker"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_framing_variants_give_the_same_diagnosis(case, variant):
    """The same log without timestamps/levels, with CRLF, quoted from a GitHub comment, coloured,
    as --log-jsonl records or behind a docker-compose column gives the same diagnosis."""
    import json
    import re

    text = (case / "log.txt").read_text(errors="replace")
    cmd = _command(case)
    base = _strip_text_fields(analyze_text(text, cmd))
    lines = text.splitlines()
    prefix = re.compile(r"^\d+\.\d+\.\d+\.\d+ ([IWED]) ")
    if variant == "no_prefix":
        out = "\n".join(prefix.sub("", ln) for ln in lines)
    elif variant == "crlf":
        out = "\r\n".join(lines)
    elif variant == "github_quote":
        out = "> ```\n" + "\n".join("> " + ln for ln in lines) + "\n> ```"
    elif variant == "ansi":
        out = "\n".join(f"\x1b[3{i % 7}m{ln}\x1b[0m" for i, ln in enumerate(lines))
    elif variant == "jsonl":
        levels = {"I": "info", "W": "warn", "E": "error", "D": "debug"}
        rec = []
        for ln in lines:
            m = prefix.match(ln)
            rec.append(json.dumps({"type": "log", "time": 1, "level": levels[m.group(1)], "msg": ln[m.end():] + "\n"})
                       if m else ln)
        out = "\n".join(rec)
    else:
        out = "\n".join(f"llama-1  | {ln}" for ln in lines)
    assert _strip_text_fields(analyze_text(out, cmd)) == base
