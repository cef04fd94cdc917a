"""The code of another git revision beside this checkout, for benches that print "now" and "before"
from the same run (``--ref REV``): ``export(REV)`` unpacks its collector, server and migrations once
into ``bench/out/ref-<sha>/``; ``env_for(code)`` is an environment whose ``PYTHONPATH`` puts that
code first (the tests' helpers and ``tests.paths`` still come from this checkout)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"


def short_sha(ref: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", ref], check=True, capture_output=True,
                          text=True).stdout.strip()


def export(ref: str) -> Path:
    """The folder holding ``collector/``, ``server/``, ``migrations/`` and ``alembic.ini`` of ``ref``."""
    sha = short_sha(ref)
    dest = OUT / f"ref-{sha}"
    if not (dest / "server" / "kvreport_server" / "store.py").is_file():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", sha, "collector", "server", "migrations",
                                  "alembic.ini"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def env_for(code: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(code / "collector"), str(code / "server"), str(ROOT)])}
