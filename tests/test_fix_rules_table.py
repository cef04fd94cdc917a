"""The fix rules as a table: docs/fix-rules.md is generated from kvreport.fixes.RULES and must agree with it, every
row is well formed, the best rank per id wins, and no function of fixes.py is above McCabe complexity 15."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvreport import fixes
from kvreport.fixes import RULES, SUGGESTION_IDS, Situation, suggest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "fix-rules.md"


def test_docs_table_agrees_with_the_code():
    assert DOC.is_file(), "run: python scripts/fix_rules_table.py > docs/fix-rules.md"
    assert DOC.read_text() == fixes.rules_markdown(), (
        "docs/fix-rules.md and kvreport.fixes.RULES disagree: run python scripts/fix_rules_table.py > docs/fix-rules.md")


def test_every_row_is_well_formed():
    for r in RULES:
        assert r.sid in SUGGESTION_IDS, r
        assert r.family in fixes.FAMILIES, r
        assert r.phases and all(p in fixes.MEMORY_PHASES + ("unknown",) for p in r.phases), r
        assert callable(r.when) and (r.when.__doc__ or "").strip(), f"{r.when.__name__} needs a docstring"
        assert r.when.__name__ != "<lambda>" and callable(r.build), r
        assert isinstance(r.rank, (int, float)), r


def test_the_best_rank_for_an_id_wins():
    """A compute buffer over Vulkan's allocation limit during a KV update: work-around-alloc-limit's row gives
    reduce-ctx nothing, the KV-update row gives it rank 0, the generic row rank 2; rank 0 must win (the first rank
    given used to win silently)."""
    s = Situation(engine="llama.cpp", phase="compute_buffer", backend="vulkan", failing_device="Vulkan0",
                  verdict="exceeds_alloc_limit", requested_mib=4536.75, alloc_limit=True, n_ubatch=512,
                  kv_update=True, n_ctx=65536)
    ids = [x["id"] for x in suggest(s)]
    assert ids.index("reduce-ctx") < ids.index("reduce-batch"), ids


def test_no_function_above_mccabe_15():
    """ruff's C901 at max-complexity 15 over fixes.py (skipped where ruff is not installed)."""
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).is_file():
        pytest.skip("ruff not installed")
    out = subprocess.run([ruff, "check", "--no-cache", "--select", "C901", "--config", "lint.mccabe.max-complexity=15",
                          fixes.__file__], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
