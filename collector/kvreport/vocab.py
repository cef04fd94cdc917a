"""The vocabulary of a diagnosis, one copy: engines, phases, backends, verdicts, their titles, and
the table that maps ggml device names to backends.

Every module that prints, stores or checks one of these words reads it from here: the analyzer,
the signature, the text and Markdown renderers, the server's pages and filters.
"""

from __future__ import annotations

import re

from kvreport.engines import REGISTRY  # noqa: E402 - the engines are the registry's
from kvreport.units import fmt_mib  # noqa: E402

ENGINES = (*(e.name for e in REGISTRY), "unknown")
PHASES = ("kv_cache", "compute_buffer", "model_weights", "context", "kv_capacity", "memory_budget", "none", "unknown")
BACKENDS = ("cuda", "rocm", "vulkan", "metal", "sycl", "cpu", "openvino", "cann", "musa", "opencl", "unknown")
VERDICTS = ("exceeds_free", "exceeds_alloc_limit", "fits_but_failed", "unknown")

ENGINE_TITLE = {**{e.name: e.title for e in REGISTRY}, "unknown": "unknown engine"}
PHASE_TITLE = {"kv_cache": "KV cache", "compute_buffer": "compute buffer", "model_weights": "model weights",
               "context": "context creation", "kv_capacity": "KV pool too small", "memory_budget": "memory budget check",
               "none": "no failure", "unknown": "unplaced failure"}
BACKEND_TITLE = {"cuda": "CUDA", "rocm": "ROCm", "vulkan": "Vulkan", "metal": "Metal", "sycl": "SYCL", "cpu": "CPU",
                 "openvino": "OpenVINO", "cann": "CANN", "musa": "MUSA", "opencl": "OpenCL",
                 "unknown": "unknown backend"}
VERDICT_TITLE = {"exceeds_free": "request exceeded free memory",
                 "exceeds_alloc_limit": "request exceeded an allocation or process memory limit",
                 "fits_but_failed": "request fit the free memory but failed",
                 "unknown": "free memory not known"}
PHASE_SENTENCE = {
    "kv_cache": "the KV cache allocation failed",
    "compute_buffer": "a compute (graph) buffer allocation failed",
    "model_weights": "loading the model weights failed",
    "context": "the context could not be created (the log does not say which buffer)",
    "kv_capacity": "the engine's KV pool is too small for its maximum request length",
    "memory_budget": "the engine refused to start: its own memory check failed",
    "none": "no failure found in this log",
    "unknown": "a failure that is not about memory, or that the log does not place",
}
"""What failed, as a sentence (the ``what:`` line of ``kvreport analyze``)."""
MEMORY_UNPLACED = "memory could not be had, and the log does not say for which buffer"
REQUEST_REFUSED = "a request longer than the context was refused: the context (and its KV cache) is too small for it"
"""The ``what`` of a ``kv_capacity`` failure that is a refused request (kvreport.logs.oom.REQUEST_RULES)."""
"""The ``what`` of an ``unknown`` phase whose line is a memory error (kvreport.logs.oom)."""
_MEMORY_FINDINGS = ("memory_error", "unrecognized_memory_error", "summary_line", "alloc_limit", "pool_size")


def what_failed(diagnosis: dict, short: bool = False) -> str:
    """The sentence for what failed; an ``unknown`` phase says whether a memory error was read (an allocator
    line, a failure-layer finding) or the failure is not about memory."""
    f = diagnosis.get("failure") or {}
    phase = f.get("phase") or "unknown"
    if phase == "unknown" and (f.get("allocator_error") or any(
            x.get("kind") in _MEMORY_FINDINGS for x in diagnosis.get("findings") or [])):
        return "memory error, buffer not named" if short else MEMORY_UNPLACED
    if phase == "kv_capacity" and any(x.get("kind") == "request_refused" for x in diagnosis.get("findings") or []):
        return "request longer than the context" if short else REQUEST_REFUSED
    final = f.get("final_error") or ""
    for phase_of, words, sentence in MESSAGE_SENTENCE:
        if phase == phase_of and words in final and not short:
            return sentence
    return PHASE_SENTENCE.get(phase, phase)


MESSAGE_SENTENCE = (
    ("kv_capacity", "No available memory for the cache blocks",
     "nothing was left for the KV cache: the weights and the profiled activations used the whole memory budget"),
)
"""(phase, words of the engine's final message, sentence): a sharper sentence than the phase's when the message
says more (vLLM's "No available memory for the cache blocks" is an empty pool, not a small one)."""

SETTING_TITLE = {"context": "Context", "parallel": "Parallel", "cache_types": "Cache types", "gpu_layers": "GPU layers",
                 "flash_attention": "Flash attention", "memory_fraction": "Memory fraction",
                 "split": "Split across devices"}
"""Titles of the memory settings (:data:`kvreport.engines.SETTINGS`; each engine's own word follows them)."""

PYTHON_ENGINES = ("vllm", "sglang", "tgi")
"""Engines whose version kvreport reads from the Python packages of their interpreter (``probes.pyengines``)."""
KV_PHASES = ("kv_cache", "kv_capacity")
"""Phases that count as a KV failure (``is_kv_failure``)."""

# ggml device name prefix -> backend (``CUDA0``, ``CUDA_Host``, ``ROCm1``, ``MTL0``, ``CPU_Mapped``...), longest first
DEVICE_PREFIX_BACKEND = (("OpenVINO", "openvino"), ("OPENVINO", "openvino"), ("Vulkan", "vulkan"),
                         ("Metal", "metal"), ("OpenCL", "opencl"), ("CUDA", "cuda"), ("ROCm", "rocm"),
                         ("MUSA", "musa"), ("SYCL", "sycl"), ("CANN", "cann"), ("MTL", "metal"), ("GPU", None),
                         ("CPU", "cpu"))
BACKEND_DEVICE_PREFIX = {"cuda": "CUDA", "rocm": "ROCm", "musa": "MUSA", "vulkan": "Vulkan", "metal": "MTL",
                         "sycl": "SYCL", "openvino": "OPENVINO", "cann": "CANN", "opencl": "OpenCL"}
"""backend -> the prefix of its ggml device names (index appended: ``CUDA0``)."""


def backend_of_device(name: str | None) -> str | None:
    """``CUDA0`` -> "cuda", ``ROCm_Host`` -> "rocm", ``CPU_Mapped`` -> "cpu"; None when not a ggml name."""
    if not name:
        return None
    for prefix, backend in DEVICE_PREFIX_BACKEND:
        if name.startswith(prefix):
            return backend
    return None


def free_words(diagnosis: dict) -> str | None:
    """The failing device's free memory in words: ``free_mib`` is what it had before loading (design.md); when the
    engine had already placed buffers there, what was left at the failure too ("11,822 MiB free at load, 1,034 MiB
    left when it failed"). None when the free memory is not known."""
    free = (diagnosis.get("failure") or {}).get("free_mib")
    if free is None:
        return None
    left = next((m.group(1) for x in diagnosis.get("findings") or [] if isinstance(x, dict)
                 and x.get("kind") == "free_after_allocations" and (m := _LEFT.search(str(x.get("text") or "")))), None)
    return (f"{fmt_mib(free)} MiB free at load, {left} MiB left when it failed" if left is not None
            else f"{fmt_mib(free)} MiB free")


_LEFT = re.compile(r"left ([\d,.]+) MiB$")
"""The end of analyze's ``free_after_allocations`` finding ("... already allocated there left 1,034 MiB"): findings
carry kind, text and line only (design.md), so the figure is read from the text kvreport itself wrote."""
