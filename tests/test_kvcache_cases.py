"""kvreport's KV arithmetic against the sizes llama.cpp itself printed in the real cases.

For every case folder whose expected.json has ``kv_printed_mib`` (the KV size the engine printed:
the sum of its ``llama_kv_cache: size =`` lines, or the failed KV allocation), the model shape is
rebuilt from the log's ``print_info:`` / ``llama_model_loader: - kv`` lines and the context from
its ``llama_context:`` lines, and ``kv_size`` must agree within 0.5 %.

The extraction below is deliberately small and local (a few regexes over the lines before the
first KV-cache line) so that this test checks the memory model, not the log parser.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from kvreport.kvcache import KVConfig, kv_size, shape_from_hparams
from tests.paths import case_dirs, load_expected

PRINT_INFO = re.compile(r"(?:print_info|llm_load_print_meta):\s+(.+?)\s*=\s(.*)$")
LOADER_KV = re.compile(r"llama_model_loader: - kv\s+\d+:\s+(\S+)\s+\S+\s+=\s(.*)$")
CONTEXT = re.compile(r"llama_context:\s+(n_seq_max|n_ctx|n_ctx_seq|n_ubatch|flash_attn|kv_unified)\s+=\s+(\S+)")
SIZE_LINE = re.compile(r"llama_kv_cache(?:_unified)?: size =\s*[\d.]+ MiB.*K \(([\w.]+)\).*V \(([\w.]+)\)")
KV_START = re.compile(r"llama_kv_cache(?:_iswa|_unified|_unified_iswa)?:|failed to allocate buffer for kv cache")


def _kv_cases() -> list[Path]:
    return [c for c in case_dirs() if (c / "expected.json").is_file()
            and load_expected(c).get("kv_printed_mib") is not None]


def extract(log: str) -> tuple[dict, dict, dict, tuple[str, str] | None]:
    """(print_info values, loader kv values, llama_context values, (type_k, type_v) of the size line)."""
    hp: dict[str, str] = {}
    gkv: dict[str, str] = {}
    ctx: dict[str, str] = {}
    types = None
    started = False
    for line in log.splitlines():
        if m := SIZE_LINE.search(line):
            types = types or (m.group(1), m.group(2))
        if started:
            continue
        if KV_START.search(line) and "llama_context" not in line:
            started = True
            continue
        if m := PRINT_INFO.search(line):
            hp.setdefault(m.group(1).strip(), m.group(2).strip())
        elif m := LOADER_KV.search(line):
            gkv.setdefault(m.group(1), m.group(2).strip())
        elif m := CONTEXT.search(line):
            ctx[m.group(1)] = m.group(2)
    return hp, gkv, ctx, types


def command_types(case: Path) -> tuple[str, str]:
    """-ctk / -ctv of the case's command line (f16 when absent)."""
    cmd = case / "command.txt"
    tk = tv = "f16"
    if cmd.is_file():
        argv = shlex.split(cmd.read_text(), posix=True)
        for i, a in enumerate(argv[:-1]):
            if a in ("-ctk", "--cache-type-k"):
                tk = argv[i + 1]
            if a in ("-ctv", "--cache-type-v"):
                tv = argv[i + 1]
    return tk, tv


def config_from(ctx: dict, types: tuple[str, str]) -> KVConfig:
    return KVConfig(
        n_ctx=int(ctx["n_ctx"]), n_seq=int(ctx.get("n_seq_max", 1)),
        kv_unified=ctx.get("kv_unified", "true") == "true",
        cache_type_k=types[0], cache_type_v=types[1],
        flash_attn=ctx.get("flash_attn", "auto") not in ("disabled", "0"),
        n_ubatch=int(ctx.get("n_ubatch", 512)),
    )


@pytest.mark.parametrize("case", _kv_cases(), ids=lambda p: p.name)
def test_kv_size_matches_printed(case: Path):
    expected = load_expected(case)["kv_printed_mib"]
    hp, gkv, ctx, types = extract((case / "log.txt").read_text(errors="replace"))
    shape = shape_from_hparams(hp, gkv)
    assert shape is not None, f"{case.name}: no model shape from the log"
    cfg = config_from(ctx, types or command_types(case))
    got = kv_size(shape, cfg)
    assert got.n_ctx == int(ctx["n_ctx"])
    assert got.kv_mib == pytest.approx(expected, rel=0.005), (case.name, got.to_dict())


def test_there_are_kv_cases():
    assert len(_kv_cases()) >= 15


@pytest.mark.parametrize(("name", "n_ctx_seq", "n_ctx"), [
    ("loc-29-fail-np256-no-kv-unified-c4096", 256, 65536),
    ("loc-31-success-np64-no-kv-unified-ctx-inflated", 256, 16384),
])
def test_non_unified_inflation_from_the_command_line(name, n_ctx_seq, n_ctx):
    # "-c 4096 -np 256 --no-kv-unified": n_ctx_seq = PAD(4096 / 256, 256) = 256 -> n_ctx 65536,
    # printed as "n_ctx is not divisible by n_seq_max - rounding down to 65536".
    case = next((c for c in case_dirs() if c.name == name), None)
    if case is None:
        pytest.skip(f"{name} not present")
    argv = shlex.split((case / "command.txt").read_text())
    c = int(argv[argv.index("-c") + 1])
    np_ = int(argv[argv.index("-np") + 1])
    hp, gkv, _, _ = extract((case / "log.txt").read_text())
    got = kv_size(shape_from_hparams(hp, gkv), KVConfig(n_ctx=c, n_seq=np_, kv_unified=False))
    assert (got.n_ctx_seq, got.n_ctx) == (n_ctx_seq, n_ctx)
    assert got.kv_mib == pytest.approx(load_expected(case)["kv_printed_mib"], rel=0.005)


@pytest.mark.parametrize("case", _kv_cases(), ids=lambda p: p.name)
def test_kv_size_matches_printed_via_parse_log(case: Path):
    """The same check with the facts kvreport's own log parser extracts (what analyze uses)."""
    from kvreport.logs import parse_log

    with open(case / "log.txt", encoding="utf-8", errors="replace") as f:
        facts = parse_log(f)
    shape = shape_from_hparams(facts.hparams, facts.gguf_kv)
    assert shape is not None
    types = command_types(case)
    if facts.ctx.get("type_k"):
        types = (facts.ctx["type_k"], facts.ctx.get("type_v") or facts.ctx["type_k"])
    else:
        real = [k for k in facts.kv_caches if not k.get("dry_run") and k.get("type_k")]
        if real:
            types = (real[0]["type_k"], real[0].get("type_v") or real[0]["type_k"])
    got = kv_size(shape, config_from(facts.ctx, types))
    assert got.kv_mib == pytest.approx(load_expected(case)["kv_printed_mib"], rel=0.005)
