"""Where a new run of an engine starts in a log (a crash-looping service's journal holds hundreds of runs).

:data:`RUN_STARTS`: the lines an engine prints once per process, near its start. When one arrives after the current
run failed (:meth:`kvreport.logs.facts.LogFacts.run_failed`), the parsers fold that run into a count
(:meth:`~kvreport.logs.facts.LogFacts.fold`) and start the facts of the new one, so only the last run's facts are kept
and earlier failures are counted by key. A start line that arrives while the run has not failed changes nothing (a
process prints several of them: ``ggml_cuda_init`` then ``build:``). ``system_info`` is not one: old builds
(``main``) print it after the context was created, so a failed allocation before it would cut one run in two.

Each rule is (engine, literal, pattern): the literal is in every line the pattern matches, so a byte scanner looking
for the literals finds a superset of the start lines, which :func:`is_run_start` then confirms.
"""

from __future__ import annotations

import re

RUN_STARTS: tuple[tuple[str, str, str], ...] = (
    # llama.cpp (common/common.cpp, examples/main): "build: 5908 (538cc77f) with cc ..." / "main: build = 1233 (98311c4)"
    ("llama.cpp", "build: ", r"(?:^|[\s:])build: \d+ \("),
    ("llama.cpp", "main: build = ", r"main: build = \d+"),
    ("llama.cpp", "common_params_print_info: build ", r"common_params_print_info: build \d+"),
    # the GPU backends initialise before the build line in recent builds (dynamic backends)
    ("llama.cpp", "ggml_cuda_init: found ", r"ggml_cuda_init: found \d+ \w+ devices"),
    ("llama.cpp", "ggml_vulkan: Found ", r"ggml_vulkan: Found \d+ Vulkan devices"),
    # Ollama (server/routes.go, llm/server.go)
    ("ollama", "Listening on", r"Listening on \S+ \(version"),
    ("ollama", "starting llama server", r"msg=\"?starting llama server"),
    # vLLM (entrypoints/openai/api_server.py)
    ("vllm", "vLLM API server version", r"vLLM API server version"),
    ("vllm", "Starting vLLM", r"Starting vLLM (?:API )?server"),
)

LITERALS: tuple[str, ...] = tuple(sorted({lit for _e, lit, _p in RUN_STARTS}))
"""The literals of :data:`RUN_STARTS` (part of :data:`kvreport.logs.KEYWORDS`, so start lines are key lines)."""

_START = re.compile("|".join(f"(?:{p})" for _e, _l, p in RUN_STARTS))


def is_run_start(line: str) -> bool:
    """True when the cleaned key line ``line`` is a :data:`RUN_STARTS` line."""
    return any(lit in line for lit in LITERALS) and _START.search(line) is not None
