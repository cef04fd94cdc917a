"""The demo bundles shipped with the package are valid bundles of real failures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kvreport
from kvreport.analyze import analyze
from kvreport.bundle import validate_bundle

EXAMPLES = sorted((Path(kvreport.__file__).parent / "examples").glob("*.json"))


def test_there_are_examples_for_the_demo():
    assert len(EXAMPLES) >= 10


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_is_a_valid_bundle_of_a_real_failure(path):
    bundle = validate_bundle(json.loads(path.read_text()))
    assert bundle["collector"]["example_of"]
    assert bundle["host"] == {}  # no facts of the machine that built it
    assert all(d.get("source") == "log" for d in bundle["devices"])
    assert bundle["engine"].get("version_source", "log") == "log"
    diagnosis = analyze(bundle)
    assert diagnosis["failure"]["phase"] not in ("none",)
    assert diagnosis["signature"]["key"]
