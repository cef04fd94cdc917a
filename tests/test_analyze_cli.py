"""`kvreport analyze` through click's CliRunner: exit 0 diagnosed, 1 no failure, 2 unreadable input."""

from __future__ import annotations

import json

from click.testing import CliRunner

from kvreport.cli import main
from tests.paths import SHARED_CASES

FAIL = SHARED_CASES / "loc-15-fail-huge-ctx-fit-default" / "log.txt"
OK = SHARED_CASES / "loc-04-success-np4-kv-unified" / "log.txt"


def run(*args, input=None):
    return CliRunner().invoke(main, ["analyze", *args], input=input)


def test_diagnosed_failure_exits_0_with_text():
    r = run(str(FAIL))
    assert r.exit_code == 0, r.output
    assert "KV cache" in r.output and "reduce-ctx" in r.output


def test_json_output_and_command():
    r = run(str(FAIL), "--json", "--command", "llama-server -m /models/tiny-fatkv.gguf -c 131072")
    assert r.exit_code == 0
    d = json.loads(r.output)
    assert d["failure"]["phase"] == "kv_cache"
    assert d["suggestions"][0]["command"].startswith("llama-server -m /models/tiny-fatkv.gguf -c ")


def test_no_failure_exits_1_and_json_still_has_memory():
    r = run(str(OK), "--json")
    assert r.exit_code == 1
    d = json.loads(r.output)
    assert d["failure"]["phase"] == "none" and d["memory"]["kv_required_mib"] == 64.0


def test_unreadable_path_exits_2_with_one_line(tmp_path):
    r = CliRunner().invoke(main, ["analyze", str(tmp_path / "missing.log")])
    assert r.exit_code == 2
    assert "Traceback" not in r.output


def test_cli_analyze_unreadable_one_stderr_line(tmp_path, capsys):
    from kvreport.analyze_cmd import cli_analyze

    assert cli_analyze(str(tmp_path / "nope.log")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvreport: error: cannot read")


def test_stdin_with_pasted_github_text():
    pasted = "> ```\n" + "".join("> " + line + "\n" for line in FAIL.read_text().splitlines()) + "> ```\n"
    r = run("-", "--json", input=pasted)
    assert r.exit_code == 0
    assert json.loads(r.output)["failure"]["requested_mib"] == 65536.0


def test_bundle_file(tmp_path):
    from kvreport.excerpt import Excerpt

    bundle = {"schema": "kvreport/bundle@1", "id": "01J00000000000000000000000", "created_at": "2026-11-30T00:00:00Z",
              "log": Excerpt().feed_all(FAIL.read_text().splitlines()).to_log("file")}
    p = tmp_path / "b.json"
    p.write_text(json.dumps(bundle))
    r = run(str(p), "--json")
    assert r.exit_code == 0 and json.loads(r.output)["failure"]["phase"] == "kv_cache"
