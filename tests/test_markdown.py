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
