"""Every memory-related message format found in the engines' own source (tests/data/source_audit): the phase and the
backend kvreport gives each rendered line, with the lines the engine prints around it."""

from __future__ import annotations

import json

import pytest

from kvreport.analyze import analyze_text
from tests.paths import DATA

ROWS = [(path.stem, json.loads(line)) for path in sorted((DATA / "source_audit").glob("*.jsonl"))
        for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize(("engine", "row"), ROWS, ids=[f"{e}:{r['source'][:60]}" for e, r in ROWS])
def test_each_format_is_read_as_its_source_says(engine, row):
    text = "\n".join([*row["context"], row["line"], *row["after"]]) + "\n"
    d = analyze_text(text)
    assert d["failure"]["phase"] == row["phase"], (row["source"], row["line"][:200], d["failure"])
    if row["backend"]:
        assert d["failure"]["backend"] == row["backend"], (row["source"], d["failure"])


def test_the_audit_covers_every_engine_family():
    assert {e for e, _r in ROWS} == {"llamacpp", "vllm-sglang", "ollama", "tgi-lmdeploy", "mlx-pybind-kobold",
                                     "torch-runtimes"}
    assert len(ROWS) >= 270
