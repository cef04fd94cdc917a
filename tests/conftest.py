"""Fixtures shared by every test module. Paths and case helpers live in ``tests.paths``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.paths import ROOT

# Strict mode (kvreport.strict): every catch-all of the analysis core re-raises in tests, so a parser or a rule that
# raises fails its test instead of hiding behind "never raises". Set in the environment so the CLI subprocesses the
# tests start inherit it; a test of the user-facing fallback turns it off with monkeypatch.delenv.
os.environ["KVREPORT_STRICT"] = "1"


@pytest.fixture(autouse=True)
def strict_mode(monkeypatch):
    monkeypatch.setenv("KVREPORT_STRICT", "1")


@pytest.fixture(autouse=True)
def private_data_dir(monkeypatch, tmp_path_factory):
    """Every test (and the CLI it starts) keeps its client data (uploads.json, the local record of runs,
    kvreport.record) in a folder of its own, never in the user's data directory."""
    path = tmp_path_factory.mktemp("kvreport-data")
    monkeypatch.setenv("KVREPORT_DATA_DIR", str(path))
    return path


# --- the tests stand on the repository alone -------------------------------------------------------
# An audit hook refuses every open() of a path beside the repository (a sibling folder of the clone,
# which exists on the developers' machines and in CI but not in a fresh clone). Reads of the
# interpreter, site-packages, /tmp, /proc and the like are not "beside the repository" and pass.
import os as _os  # noqa: E402
import sys as _sys  # noqa: E402

_BESIDE = str(ROOT.parent.resolve()) + _os.sep
_INSIDE = str(ROOT.resolve()) + _os.sep
_ALLOWED = tuple({str(Path(p).resolve()) + _os.sep for p in (_sys.prefix, _sys.base_prefix, *_sys.path) if p})
# a clone inside the temporary directory (e.g. /tmp/clone) still lets the tests use their own temporary files there
# (pytest's basetemp, tempfile's "tmp..." files, kvreport's own "kvreport-..." spools), not a sibling checkout
import tempfile as _tempfile  # noqa: E402

_TEMP_DIR = str(Path(_tempfile.gettempdir()).resolve()) + _os.sep
_TEMP_OWN = tuple(_TEMP_DIR + prefix for prefix in ("pytest-of-", "tmp", "kvreport-"))


def _outside_reads(event: str, args: tuple) -> None:
    if event != "open" or not args or not isinstance(args[0], (str, bytes, _os.PathLike)):
        return
    try:
        path = _os.path.abspath(_os.fsdecode(args[0]))
    except (TypeError, ValueError):
        return
    p = path + _os.sep
    if p == _TEMP_DIR:  # tempfile opens the folder itself (its O_TMPFILE probe)
        return
    if p.startswith(_BESIDE) and not p.startswith(_INSIDE) and not p.startswith(_ALLOWED + _TEMP_OWN):
        raise PermissionError(f"test read {path}: beside the repository (copy it into tests/data)")


if ROOT.parent.resolve() != Path("/"):
    _sys.addaudithook(_outside_reads)
