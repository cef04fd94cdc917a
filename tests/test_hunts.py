"""The format hunts (tests/data/hunts/README.md): engine output formats read from the engines' source by black-box
helper sessions. Every excerpt that is a failure gets a failure (never "no failure"), and the share of their facts
kvreport gets right stays above its floor."""

from __future__ import annotations

import json

import pytest

from kvreport.analyze import analyze_text
from tests.paths import HUNT_DIR

HUNTS = sorted(HUNT_DIR.glob("*.jsonl"))
ENTRIES = [json.loads(line) for path in HUNTS for line in path.read_text().splitlines() if line.strip()]
FIELDS = ("engine", "phase", "backend", "failing_device", "requested_mib", "free_mib", "verdict")
FLOOR = 0.89
"""Share of the hunts' judged facts kvreport gets right (0.891 when the first six hunts were added, 0.825 before their
formats were read; 0.903 with the ten of 2026-12-02)."""


def _right(want, got, field: str) -> bool:
    if field in ("requested_mib", "free_mib"):
        return got is not None and abs(got - want) <= 0.01 * max(abs(want), 1e-9)
    if field == "failing_device":
        return (got or "").lower() in {want.lower(), want.lower().replace("metal", "mtl0")}
    return got == want


def test_the_hunts_are_here():
    assert len(HUNTS) >= 11 and len(ENTRIES) > 540


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e["expect"].get("is_failure")], ids=lambda e: e["id"])
def test_a_failure_is_never_no_failure(entry):
    assert analyze_text(entry["text"])["failure"]["phase"] != "none"


def test_the_share_of_facts_right_stays_above_its_floor():
    right = judged = 0
    for e in ENTRIES:
        d = analyze_text(e["text"])
        f = {**d["failure"], "engine": d["engine"]}
        for k in FIELDS:
            want = e["expect"].get(k)
            if want is None or want == "null":
                continue
            judged += 1
            right += _right(want, f[k], k)
    assert right / judged >= FLOOR, f"{right}/{judged}"
