"""Log understanding: one parser per engine, all reading lines into facts (owned by the analyzer).

Placeholder API kept stable for the rest of the package:

* :func:`is_key_line` — True for every line any parser uses (the excerpt keeps them all).
"""

from __future__ import annotations

import re

_KEY = re.compile(
    r"(?i)error|fail|out of memory|alloc|buffer size|MiB|GiB|print_info|llm_load|llama_context|"
    r"llama_kv_cache|llama_new_context|kv_size|n_ctx|using device|build|version|warn|"
    r"offload|projected|fit|cache|memory|cuda|rocm|vulkan|metal|sycl|device"
)


def is_key_line(line: str) -> bool:
    """True when ``line`` carries a fact some parser reads (kept in every bundle excerpt)."""
    return bool(_KEY.search(line))
