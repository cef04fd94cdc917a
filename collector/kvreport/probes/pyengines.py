"""Python engines: vLLM, SGLang, torch, transformers and the CUDA/ROCm versions torch was built
for, read with :mod:`importlib.metadata` only (importing torch takes seconds and may touch the GPU).

torch's CUDA build is taken from the distribution's version suffix (``2.5.1+cu124``) or, for the
default PyPI wheels, from its ``nvidia-cuda-runtime-cu12`` requirement. Without ``interpreter`` the
facts describe the Python kvreport runs in; with it (the engine's own Python, e.g. from the shebang
of a ``vllm`` console script) that interpreter is asked, with the same metadata-only code.
"""

from __future__ import annotations

import json
import os
import re
import sys

from kvreport.probes._util import Absent, ProbeFailed, one_line, run_tool, which

PACKAGES = ("vllm", "sglang", "torch", "transformers", "flashinfer-python", "xformers", "triton",
            "llama_cpp_python", "text-generation-server")


def __getattr__(name: str):
    if name == "metadata":  # imported when first used (start-up), still reachable as pyengines.metadata
        from importlib import metadata

        return metadata
    raise AttributeError(name)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _maybe_installed(names: tuple[str, ...]) -> bool:
    """False only when no directory of ``sys.path`` holds a distribution of any of ``names``.

    A cheap look at the ``*.dist-info`` / ``*.egg-info`` / ``*.egg`` names, so that the common case
    (none of the engines installed here) does not import :mod:`importlib.metadata` (tens of ms at
    start-up). Any path entry that is not a plain directory (a zip, a custom finder) answers True,
    and :mod:`importlib.metadata` decides.
    """
    wanted = {_norm(n) for n in names}
    for entry in sys.path:
        path = entry or "."
        if not os.path.isdir(path):
            if os.path.exists(path):
                return True
            continue
        try:
            with os.scandir(path) as it:
                for e in it:
                    stem, dot, ext = e.name.rpartition(".")
                    if dot and ext in ("dist-info", "egg-info", "egg") and _norm(stem.split("-")[0]) in wanted:
                        return True
        except OSError:
            return True
    return False


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - a broken installation
        return None


_REMOTE = (
    "import json, sys\n"
    "from importlib import metadata as m\n"
    "out = {'python': sys.version.split()[0]}\n"
    "for n in %r:\n"
    "    try:\n        out[n] = m.version(n)\n"
    "    except Exception:\n        pass\n"
    "try:\n    out['_torch_requires'] = m.requires('torch') or []\n"
    "except Exception:\n    pass\n"
    "print(json.dumps(out))\n"
)


def interpreter_of(program_path: str | None) -> str | None:
    """The Python that runs ``program_path``: the program itself when it is a Python, else the
    interpreter named by its ``#!`` line (console scripts such as ``vllm``); None otherwise."""
    if not program_path or not os.path.isfile(program_path):
        return None
    base = os.path.basename(program_path).lower()
    if re.fullmatch(r"python(\d+(\.\d+)?)?(\.exe)?|pypy3?", base):
        return program_path
    try:
        with open(program_path, "rb") as fh:
            first = fh.readline(512).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    words = first[2:].split()
    if not words:
        return None
    if os.path.basename(words[0]) == "env" and len(words) > 1:
        return which(words[1])
    return words[0] if os.path.isfile(words[0]) else None


def _torch_build(facts: dict, requires: list[str] | None) -> None:
    torch = facts.get("torch")
    if not torch:
        return
    m = re.search(r"\+(cu|rocm)([\d.]+)", torch)
    if m:
        digits = m.group(2)
        facts["torch_" + ("cuda" if m.group(1) == "cu" else "rocm")] = (
            f"{digits[:-1]}.{digits[-1]}" if m.group(1) == "cu" and "." not in digits else digits)
        return
    for req in requires or []:
        rm = re.match(r"nvidia-cuda-runtime-cu(\d+)\s*[=<>!~]*\s*([\d.]*)", req)
        if rm:
            facts["torch_cuda"] = rm.group(2) or rm.group(1)
            return


def probe(timeout: float = 3.0, interpreter: str | None = None) -> dict:
    """``{"python_engines": {"python": version, package: version, "torch_cuda": "12.4"?, "interpreter"?}}``;
    :class:`Absent` when none of the packages is installed."""
    if interpreter and os.path.abspath(interpreter) != os.path.abspath(sys.executable):
        out = run_tool([interpreter, "-I", "-c", _REMOTE % (PACKAGES,)], timeout)
        if out.returncode != 0:
            raise ProbeFailed(f"{os.path.basename(interpreter)}: {one_line(out.stderr or out.stdout)}")
        try:
            facts = json.loads(out.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise ProbeFailed(f"{os.path.basename(interpreter)} printed no package list") from None
        if not isinstance(facts, dict):
            raise ProbeFailed("unexpected package list")
        requires = facts.pop("_torch_requires", None)
        if not any(k in facts for k in PACKAGES):
            raise Absent("no Python engine installed in the engine's interpreter")
        facts["interpreter"] = interpreter
        _torch_build(facts, requires if isinstance(requires, list) else None)
        return {"python_engines": facts}
    if not _maybe_installed(PACKAGES):
        raise Absent("no Python engine installed")
    from importlib import metadata

    found = {name: v for name in PACKAGES if (v := _version(name))}
    if not found:
        raise Absent("no Python engine installed")
    facts: dict = {"python": sys.version.split()[0], **found}
    try:
        requires = metadata.requires("torch") if found.get("torch") else None
    except Exception:  # noqa: BLE001
        requires = None
    _torch_build(facts, requires)
    return {"python_engines": facts}
