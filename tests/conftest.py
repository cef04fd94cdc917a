"""Fixtures shared by every test module: where the real cases and captures live."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

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
    return json.loads((case / "expected.json").read_text())


@pytest.fixture(scope="session")
def shared_cases() -> list[Path]:
    return case_dirs()
