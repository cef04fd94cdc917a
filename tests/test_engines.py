"""The engine registry is the one place an engine is declared; the vocabulary, the command-line tables, the log
parsers and the fix families are derived from it."""

from __future__ import annotations

import importlib

import pytest

from kvreport import engines, fixes, vocab
from kvreport.cmdline import parse_command
from kvreport.engines import REGISTRY


def test_vocabulary_is_the_registry():
    assert vocab.ENGINES == (*(e.name for e in REGISTRY), "unknown")
    assert all(vocab.ENGINE_TITLE[e.name] == e.title for e in REGISTRY)


@pytest.mark.parametrize("engine", REGISTRY, ids=[e.name for e in REGISTRY])
def test_every_entry_is_complete(engine):
    assert engine.title and engine.grammar and engine.devices
    assert engine.fix_family in fixes.FAMILIES
    assert engine.programs or engine.modules
    if engine.parser:
        module = importlib.import_module(f"kvreport.logs.{engine.parser}")
        assert callable(module.feed) and module.KEYWORDS


@pytest.mark.parametrize(("line", "engine"), [
    ("llama-server -m m.gguf -c 4096", "llama.cpp"), ("koboldcpp --model m.gguf --contextsize 8192", "llama.cpp"),
    ("ollama run llama3", "ollama"), ("vllm serve meta-llama/Llama-3.1-8B --max-model-len 8192", "vllm"),
    ("python -m sglang.launch_server --model-path m", "sglang"), ("text-generation-launcher --model-id m", "tgi"),
    ("lmdeploy serve api_server m --session-len 8192", "lmdeploy"), ("python -m mlx_lm.server --model m", "mlx-lm"),
    ("docker run --gpus all vllm/vllm-openai --model m", "vllm"),
    ("docker run ghcr.io/ggml-org/llama.cpp:server -m m.gguf", "llama.cpp"),
])
def test_programs_modules_and_images_name_their_engine(line, engine):
    assert parse_command(line)["engine"] == engine


def test_fix_family_comes_from_the_registry():
    assert engines.fix_family("ollama") == "llama.cpp-family" and engines.fix_family("mlx-lm") == "mlx"
    assert fixes.family_of(fixes.Situation(engine="lmdeploy")) == "python"
