"""Python engines: vLLM, SGLang, torch, transformers and the CUDA/ROCm versions torch was built
for, read with :mod:`importlib.metadata` only (importing torch takes seconds and may touch the GPU).

torch's CUDA build is taken from the distribution's version suffix (``2.5.1+cu124``) or, for the
default PyPI wheels, from its ``nvidia-cuda-runtime-cu12`` requirement. The facts describe the
interpreter kvreport runs in (``python``); an engine installed in another environment is not seen.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata

from kvreport.probes._util import Absent

PACKAGES = ("vllm", "sglang", "torch", "transformers", "flashinfer-python", "xformers", "triton",
            "llama_cpp_python", "text-generation-server")


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - a broken installation
        return None


def probe(timeout: float = 3.0) -> dict:
    """``{"python_engines": {"python": version, package: version, "torch_cuda": "12.4"?}}``;
    :class:`Absent` when none of the packages is installed."""
    found = {name: v for name in PACKAGES if (v := _version(name))}
    if not found:
        raise Absent("no Python engine installed")
    facts: dict = {"python": sys.version.split()[0], **found}
    torch = found.get("torch")
    if torch:
        m = re.search(r"\+(cu|rocm)([\d.]+)", torch)
        if m:
            digits = m.group(2)
            facts["torch_" + ("cuda" if m.group(1) == "cu" else "rocm")] = (
                f"{digits[:-1]}.{digits[-1]}" if m.group(1) == "cu" and "." not in digits else digits)
        else:
            try:
                for req in metadata.requires("torch") or []:
                    rm = re.match(r"nvidia-cuda-runtime-cu(\d+)\s*[=<>!~]*\s*([\d.]*)", req)
                    if rm:
                        facts["torch_cuda"] = rm.group(2) or rm.group(1)
                        break
            except Exception:  # noqa: BLE001
                pass
    return {"python_engines": facts}
