"""Fixtures shared by every test module. Paths and case helpers live in ``tests.paths``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.paths import (  # noqa: F401 - re-exported for older imports
    DATA,
    ROOT,
    SHARED,
    SHARED_CAPTURES,
    SHARED_CASES,
    case_dirs,
    load_expected,
)


@pytest.fixture(scope="session")
def shared_cases() -> list[Path]:
    return case_dirs()
