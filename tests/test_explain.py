"""`kvreport analyze --explain`: every non-null fact of every real case names its rule and the log line it read,
or a stated basis (derived, assumed, default, command, gguf, bundle) with its reason."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvreport.analyze import analyze_text
from tests.paths import CASE_DIR, CORPUS_DIR

CASES = sorted(p for base in (CASE_DIR, CORPUS_DIR) for p in base.iterdir() if (p / "log.txt").is_file())
NOT_LOG = ("derived", "assumed", "default", "command", "gguf", "bundle")


def _facts(d: dict) -> set[str]:
    """The non-null facts a diagnosis states (the verdict only when known)."""
    out = {"engine"}
    for k, v in d["failure"].items():
        if v is not None and k not in ("allocator_error", "final_error") and not (k == "verdict" and v == "unknown"):
            out.add(f"failure.{k}")
    out |= {f"memory.inputs.{k}" for k, v in d["memory"]["inputs"].items() if v is not None and k != "source"}
    out |= {f"memory.{k}" for k in ("kv_required_mib", "kv_mib_per_1k_tokens") if d["memory"][k] is not None}
    out |= {"signature.engine", "signature.phase", "signature.backend"}
    out |= {f"suggestion.{s['id']}" for s in d["suggestions"]}
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_fact_has_a_rule_and_a_line_or_a_basis(case):
    cmd = case / "command.txt"
    d = analyze_text((case / "log.txt").read_text(errors="replace"),
                     cmd.read_text(errors="replace").strip() if cmd.is_file() else None, explain=True)
    by_fact = {e["fact"]: e for e in d["explain"]}
    missing = _facts(d) - set(by_fact)
    assert not missing, missing
    for e in d["explain"]:
        assert e["rule"], e
        if e["line"] is not None:
            n, text = e["line"]
            assert isinstance(n, int) and n >= 1 and text
        else:
            assert e["basis"] in NOT_LOG and e["why"], e


def test_explain_leaves_the_diagnosis_as_it_is():
    text = (CASE_DIR / "loc-29-fail-np256-no-kv-unified-c4096" / "log.txt").read_text()
    plain, explained = analyze_text(text), analyze_text(text, explain=True)
    assert "explain" not in plain
    assert {k: v for k, v in explained.items() if k != "explain"} == plain


def test_cli_explain_text_and_json():
    log = str(CASE_DIR / "loc-17-fail-huge-ctx-verbose" / "log.txt")
    r = subprocess.run([sys.executable, "-m", "kvreport.cli", "analyze", log, "--explain"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "Why kvreport says this" in r.stdout
    assert "failure.requested_mib = 65536.0  <- logs.llamacpp failure chain" in r.stdout
    r = subprocess.run([sys.executable, "-m", "kvreport.cli", "analyze", log, "--explain", "--json"],
                       capture_output=True, text=True, timeout=60)
    d = json.loads(r.stdout)
    assert any(e["fact"] == "failure.free_mib" and e["line"] for e in d["explain"])
