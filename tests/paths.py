"""Where the real cases and captures live (importable as ``tests.paths`` from any test module)."""

from __future__ import annotations

import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
SHARED = Path(os.environ.get("KVREPORT_SHARED", ROOT.parent / "shared")).resolve()
SHARED_CASES = SHARED / "cases"
SHARED_CAPTURES = SHARED / "captures"


def case_dirs() -> list[Path]:
    """Every real case folder of ../shared/cases (and tests/data/cases), sorted by name."""
    dirs = []
    for base in (SHARED_CASES, DATA / "cases"):
        if base.is_dir():
            dirs.extend(p for p in base.iterdir() if (p / "log.txt").is_file())
    if not dirs:
        raise RuntimeError(f"no real cases found under {SHARED_CASES}: set KVREPORT_SHARED")
    return sorted(dirs, key=lambda p: p.name)


def load_expected(case: Path) -> dict:
    """The case's expected.json as a dict."""
    return json.loads((case / "expected.json").read_text())
