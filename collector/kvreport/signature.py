"""Failure signatures: the key that groups bundles into clusters on the server (scheme 2).

The key is ``<engine>/<phase>/<backend>``, e.g. ``llama.cpp/kv_cache/cuda``:

* ``engine``: the program family that failed ("llama.cpp", "ollama", "vllm", "sglang", "tgi",
  "unknown"). Ollama keeps its own part although it runs llama.cpp: its users change other knobs.
* ``phase``: which runtime buffer failed, in design.md's vocabulary (kv_cache, compute_buffer,
  model_weights, context, kv_capacity, memory_budget, none, unknown). It comes from what the
  engine says the buffer was for, never from the wording of one build, so the same failure
  printed by an old (``llama_kv_cache_init: failed to allocate buffer for kv cache``) and a new
  build (``llama_init_from_model: failed to initialize the context: failed to allocate buffer for
  kv cache``) gets one key.
* ``backend``: the backend family (cuda, rocm, vulkan, metal, sycl, cpu, openvino, cann, unknown);
  host buffers of a GPU backend (``CUDA_Host``) belong to that backend's family.

The verdict (exceeds_free, exceeds_alloc_limit, fits_but_failed, unknown) is NOT part of the key since
scheme 2: it depends on whether the log happened to print the free memory (llama.cpp hides its device
list below ``-lv 4``), so one failure would land in two clusters at two verbosities. It stays in the
diagnosis, the bundle row and the cluster's facets. Scheme 1 keys had it as a fourth part.

Never part of the key: numbers (sizes, contexts, build numbers), paths, device indices, model
names, host names. ``id`` is the first 12 hex digits of SHA-256 over ``"kvreport-sig/<scheme>:<key>"``,
stable across runs and machines. A change to the rules that would move existing bundles to other
keys must raise :data:`SCHEME`.
"""

from __future__ import annotations

import hashlib

SCHEME = 2
"""Version of the signature rules; bump it whenever a key part changes meaning."""

from kvreport.vocab import BACKEND_TITLE as _BACKEND_TITLE  # noqa: E402
from kvreport.vocab import BACKENDS, ENGINES, PHASES, VERDICTS  # noqa: E402,F401
from kvreport.vocab import ENGINE_TITLE as _ENGINE_TITLE  # noqa: E402
from kvreport.vocab import PHASE_TITLE as _PHASE_TITLE  # noqa: E402


def _norm(value, allowed: tuple[str, ...]) -> str:
    v = str(value or "unknown").strip().lower()
    if v == "llama.cpp":
        return v
    return v if v in allowed else "unknown"


def signature(facts: dict) -> dict:
    """The signature of a diagnosis.

    ``facts``: a dict with ``engine``, ``phase``, ``backend``, ``verdict`` (a diagnosis'
    ``failure`` section plus its ``engine`` works). Missing or unknown values become ``unknown``.
    Returns ``{"id", "key", "title", "scheme", "notes"}``.
    """
    engine = _norm(facts.get("engine"), ENGINES)
    phase = _norm(facts.get("phase"), PHASES)
    backend = _norm(facts.get("backend"), BACKENDS)
    verdict = _norm(facts.get("verdict"), VERDICTS)
    if phase == "none":
        backend, verdict = "unknown", "unknown"
    key = f"{engine}/{phase}/{backend}"
    sid = hashlib.sha256(f"kvreport-sig/{SCHEME}:{key}".encode()).hexdigest()[:12]
    # (nothing failed: the key leaves the backend out, and so does the title -- "unknown backend" would contradict the
    # backend the diagnosis names)
    title = " · ".join((_ENGINE_TITLE[engine], _PHASE_TITLE[phase])
                       + (() if phase == "none" else (_BACKEND_TITLE[backend],)))
    notes = [
        f"engine '{engine}': the program family whose log this is (Ollama keeps its own part: its knobs differ)",
        f"phase '{phase}': the buffer the engine says failed, independent of how a given build words it",
        f"backend '{backend}': the backend family of the failing buffer (host buffers of a GPU backend count as that backend)",
        f"verdict '{verdict}' is not part of the key: whether the log printed the free memory must not split one "
        "failure into two clusters (it is a facet of the cluster)",
        "numbers, paths, device indices and model names are left out so that the same failure groups together",
    ]
    if phase == "none":
        notes.append("nothing failed, so the backend is not part of the key")
    return {"id": sid, "key": key, "title": title, "scheme": SCHEME, "notes": notes}
