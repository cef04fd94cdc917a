"""The GitHub issue body: every report field, the diagnosis, the permalink, safe with hostile text."""

from __future__ import annotations

import json

from click.testing import CliRunner

from kvreport.analyze import analyze
from kvreport.cli import main
from kvreport.cmdline import parse_command
from kvreport.markdown import issue_body, issue_title
from tests.helpers import minimal_bundle
from tests.paths import CASE_DIR

CASE = CASE_DIR / "loc-17-fail-huge-ctx-verbose"


def _case_bundle(**extra):
    log = (CASE / "log.txt").read_text()
    command = parse_command((CASE / "command.txt").read_text().strip())
    return minimal_bundle(log, command=command, **extra)


def test_issue_body_holds_the_report_fields_and_the_diagnosis():
    bundle = _case_bundle(engine={"name": "llama.cpp", "version": "b7000", "build_number": 7000,
                                  "commit": "abc1234", "binary": "/usr/local/bin/llama-server"})
    diagnosis = analyze(bundle)
    body = issue_body(bundle, diagnosis, url="https://kv.example/bundles/X")
    assert "### Name and Version" in body
    assert "b7000" in body and "abc1234" in body and "/usr/local/bin/llama-server" in body
    assert "https://kv.example/bundles/X" in body
    assert diagnosis["failure"]["allocator_error"].strip() in body
    assert "65,536 MiB" in body  # the failed KV buffer, in MiB
    assert "reduce-ctx" in body
    assert "| Context (-c) | 131072 |" in body
    assert body.count("<details>") == 1
    assert diagnosis["signature"]["key"] in body


def test_title_names_engine_phase_device_and_numbers():
    bundle = _case_bundle()
    title = issue_title(bundle, analyze(bundle))
    assert title.startswith("llama.cpp: KV cache allocation failed on CPU (65,536 MiB requested")


def test_hostile_text_cannot_break_the_table_or_the_fence():
    bundle = minimal_bundle("llama_kv_cache: size = 4.00 MiB\n```\n<script>alert(1)</script>",
                            host={"cpu_model": "Evil | CPU\nwith newline"})
    body = issue_body(bundle, analyze(bundle))
    assert "| CPU | ` Evil \\| CPU with newline ` |" in body
    # the log holds a ``` line, so the log fence must be longer than three backticks
    assert "````\n" in body


def test_long_logs_are_cut_around_the_errors_first():
    filler = "\n".join(f"llama_model_loader: - kv {i}: some.key str = value" for i in range(2000))
    log = (CASE / "log.txt").read_text()
    bundle = minimal_bundle(filler + "\n" + log)
    diagnosis = analyze(bundle)
    body = issue_body(bundle, diagnosis, max_log_lines=50)
    assert diagnosis["failure"]["allocator_error"] in body
    log_part = body.split("<details>")[1]
    assert log_part.count("\n") < 70


def test_cli_issue_prints_the_body_and_remembers_the_upload(tmp_path, monkeypatch):
    monkeypatch.setenv("KVREPORT_DATA_DIR", str(tmp_path))
    bundle = _case_bundle()
    path = tmp_path / "b.json"
    path.write_text(json.dumps(bundle))
    from kvreport.config import remember_upload

    remember_upload(bundle["id"], "https://kv.example/bundles/" + bundle["id"])
    result = CliRunner().invoke(main, ["issue", str(path)])
    assert result.exit_code == 0, result.output
    assert "https://kv.example/bundles/" + bundle["id"] in result.stdout


def test_cli_issue_bad_file_is_one_line(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("not json")
    result = CliRunner().invoke(main, ["issue", str(path)])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "not JSON" in result.stderr


def _md_tokens(body: str):
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable("table").parse(body)


def _inline_kinds(tokens) -> set[str]:
    """Token types of a parsed body; our own <details>/<summary> HTML block is left out."""
    kinds = set()
    for t in tokens:
        if not (t.type == "html_block" and t.content.startswith(("<details><summary>log (", "</details>"))):
            kinds.add(t.type)
        for c in t.children or []:
            kinds.add(c.type)
    return kinds


def test_a_newline_in_the_allocator_error_stays_inside_its_code_span():
    """Issue 13, item 8: the allocator-error line cannot leave its inline code (no fake heading)."""
    bundle = _case_bundle()
    diagnosis = analyze(bundle)
    evil = "ggml_backend_cuda_buffer_type_alloc_buffer: ``x``\n### Maintainer note\n[download](https://evil.example/x.exe)"
    diagnosis["failure"]["allocator_error"] = evil
    diagnosis["failure"]["final_error"] = "done`\r\n<img src=https://evil.example/t.gif>"
    body = issue_body(bundle, diagnosis)
    line = next(x for x in body.splitlines() if x.startswith("- Allocator error:"))
    assert "### Maintainer note" in line and "```" in line  # same line, fenced by three backticks
    assert "\n### Maintainer note" not in body and "\n<img" not in body
    tokens = _md_tokens(body)
    assert not any(t.type == "heading_open" and "Maintainer" in tokens[i + 1].content for i, t in enumerate(tokens))
    kinds = _inline_kinds(tokens)
    assert not {"link_open", "image", "html_inline", "html_block"} & kinds


def test_table_cells_cannot_emit_a_link_an_image_a_heading_or_html():
    hostile = {"cpu_model": "[click](https://evil.example) ![t](https://evil.example/t.gif) <b>x</b> `a` | b\n# H",
               "os": "Ubuntu\r\n## Maintainer note", "kernel": "www.evil.example \\| x", "container": "<script>"}
    bundle = minimal_bundle("llama_kv_cache: size = 4.00 MiB", host=hostile,
                            model={"file_name": "![img](https://evil.example/a.png)"})
    body = issue_body(bundle, analyze(bundle))
    table = [x for x in body.splitlines() if x.startswith("| ")]
    assert all(x.count(" |") >= 2 for x in table)
    for row in table:
        assert "\n" not in row
    tokens = _md_tokens(body)
    kinds = _inline_kinds(tokens)
    assert not {"link_open", "image", "html_inline", "html_block"} & kinds, kinds
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert not [h for h in headings if "Maintainer" in h or h == "H"]
    # each hostile row stays one row of two cells
    cells = [t for t in tokens if t.type == "td_open"]
    assert len(cells) % 2 == 0
    assert "| Model | ` ![img](https://evil.example/a.png) ` |" in body


def test_a_fence_is_longer_than_any_backtick_run_inside():
    bundle = minimal_bundle("llama_kv_cache: size = 4.00 MiB\n`````\n### Maintainer note")
    body = issue_body(bundle, analyze(bundle))
    assert "``````\n" in body
    tokens = _md_tokens(body)
    assert not [t for i, t in enumerate(tokens) if t.type == "heading_open" and "Maintainer" in tokens[i + 1].content]


def test_bidi_overrides_are_shown_not_obeyed():
    """A right-to-left override in a log line would reorder what a maintainer reads: it is shown as a marker."""
    from kvreport.markdown import issue_body
    from kvreport.textsafe import visible_controls

    assert visible_controls("a\u202eb\u2066c") == "a<U+202E>b<U+2066>c"
    bundle = {"log": {"lines": [[1, "ggml_aligned_malloc: insufficient memory \u202egnp.exe"]]}}
    from kvreport.analyze import analyze

    body = issue_body(bundle, analyze(bundle))
    assert "\u202e" not in body and "<U+202E>" in body


# --- the failure line, the GPU rows, the engine's own words (kvreport.engines settings) -----------------

def _real(name: str, **extra) -> tuple[dict, dict]:
    case = CASE_DIR / name
    command = (case / "command.txt").read_text().strip() if (case / "command.txt").is_file() else None
    bundle = minimal_bundle((case / "log.txt").read_text(errors="replace"),
                            command=parse_command(command) if command else {}, **extra)
    return bundle, analyze(bundle)


def _rows(body: str) -> dict[str, list[str]]:
    env = body.split("### Environment")[1].split("###")[0]
    rows: dict[str, list[str]] = {}
    for line in env.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")] if line.startswith("| ") else []
        if len(cells) == 2 and cells[0]:
            rows.setdefault(cells[0], []).append(cells[1])
    return rows


def test_an_unplaced_failure_says_its_device_is_not_named():
    bundle, diagnosis = _real("pub-114-ollama-0182-memory-layout-num-gpu-26")
    assert diagnosis["failure"]["failing_device"] is None and diagnosis["failure"]["phase"] != "none"
    body = issue_body(bundle, diagnosis)
    assert "failing device: not named in the log" in body
    assert "None" not in body.split("### Environment")[0]


def test_gpu_rows_come_from_the_log_when_nothing_was_probed():
    bundle, diagnosis = _real("pub-012-llamacpp-rocm-2x7900xtx-weights-on-gpu0-only")
    assert _rows(issue_body(bundle, diagnosis))["GPU"] == ["` ROCm0: Radeon RX 7900 XTX `",
                                                           "` ROCm1: Radeon RX 7900 XTX `"]
    bundle, diagnosis = _real("pub-103-llamacpp-sycl-a770-compute-buffer-joined-lines")
    assert _rows(issue_body(bundle, diagnosis))["GPU"] == ["` SYCL0: Intel Arc A770 Graphics (16,704 MiB) `"]


def test_a_probed_gpu_and_its_ggml_name_in_the_log_are_one_row():
    """vLLM's log names only ``CUDA0``; the probe measured an RTX 3090 as cuda index 0: one row, not two."""
    probed = [{"backend": "cuda", "index": 0, "name": "NVIDIA GeForce RTX 3090", "total_mib": 24576.0,
               "free_mib": 23000.0, "source": "nvml"}]
    bundle, diagnosis = _real("pub-109-vllm-3090-gate-utilization-097", devices=probed)
    assert _rows(issue_body(bundle, diagnosis))["GPU"] == ["` CUDA0: NVIDIA GeForce RTX 3090 (24,576 MiB) `"]
    # two identical probed GPUs named by the log by product name stay two rows
    twin = [{**probed[0], "name": "Radeon RX 7900 XTX", "backend": "rocm", "index": i} for i in (0, 1)]
    bundle, diagnosis = _real("pub-012-llamacpp-rocm-2x7900xtx-weights-on-gpu0-only", devices=twin)
    assert len(_rows(issue_body(bundle, diagnosis))["GPU"]) == 2


def test_ollama_rows_use_ollamas_words():
    bundle, diagnosis = _real("pub-114-ollama-0182-memory-layout-num-gpu-26")
    bundle["command"] = parse_command("OLLAMA_CONTEXT_LENGTH=8192 OLLAMA_NUM_PARALLEL=2 OLLAMA_KV_CACHE_TYPE=q8_0 "
                                      "ollama serve")
    rows = _rows(issue_body(bundle, diagnosis))
    assert rows["Context (num_ctx)"] == ["8192"] and rows["Parallel (OLLAMA_NUM_PARALLEL)"] == ["2"]
    assert rows["Cache types (OLLAMA_KV_CACHE_TYPE)"] == ["` q8_0 `"]
    assert "GPU layers (num_gpu)" in rows
    assert not [k for k in rows if "-c)" in k or "-np" in k or "-ngl" in k]


def test_every_engine_shows_its_settings_in_its_own_words():
    """The rows come from the engine registry: each engine's words, never another engine's flags."""
    from kvreport.engines import REGISTRY

    for engine in REGISTRY:
        bundle = minimal_bundle("", engine={"name": engine.name})
        rows = _rows(issue_body(bundle, {"engine": engine.name}))
        shown = [k for k in rows if k.endswith(")") and k.split(" (")[0] not in ("Engine",)]
        assert [k.split(" (", 1)[1][:-1] for k in shown] == [s.word for s in engine.settings], engine.name
