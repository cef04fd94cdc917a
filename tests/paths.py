"""Where the real cases and captures live (importable as ``tests.paths`` from any test module).

Everything a test reads is inside the repository: the real cases are copies under tests/data/cases
(each keeps its source in case.json), the llama.cpp captures under tests/data/captures. The
``outside_reads`` guard in tests/conftest.py fails any test that opens a file beside the repository.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
CASE_DIR = DATA / "cases"
CAPTURE_DIR = DATA / "captures"
CORPUS_DIR = DATA / "corpus"
HUNT_DIR = DATA / "hunts"


def case_dirs() -> list[Path]:
    """Every real case folder of tests/data/cases, sorted by name."""
    dirs = sorted((p for p in CASE_DIR.iterdir() if (p / "log.txt").is_file()), key=lambda p: p.name)
    if not dirs:
        raise RuntimeError(f"no real cases found under {CASE_DIR}")
    return dirs


def load_expected(case: Path) -> dict:
    """The case's expected.json as a dict."""
    return json.loads((case / "expected.json").read_text())
