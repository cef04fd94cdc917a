"""The tests stand on the repository alone: nothing beside the clone may be read."""

from __future__ import annotations

import pytest

from tests.paths import CAPTURE_DIR, CASE_DIR, ROOT


def test_reading_beside_the_repository_is_refused():
    with pytest.raises(PermissionError, match="beside the repository"):
        open(ROOT.parent / "shared" / "design.md", encoding="utf-8")  # noqa: SIM115


def test_reading_inside_the_repository_passes():
    assert (ROOT / "pyproject.toml").read_text(encoding="utf-8")


def test_every_case_names_its_source():
    for case in sorted(CASE_DIR.iterdir()):
        if (case / "log.txt").is_file():
            assert (case / "case.json").is_file() or (case / "source.md").is_file(), case.name
    assert any(CAPTURE_DIR.iterdir())
