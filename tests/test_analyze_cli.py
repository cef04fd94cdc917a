"""`kvreport analyze` through click's CliRunner: exit 0 diagnosed, 1 no failure, 2 unreadable input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from kvreport.cli import main
from tests.paths import CASE_DIR

FAIL = CASE_DIR / "loc-15-fail-huge-ctx-fit-default" / "log.txt"
OK = CASE_DIR / "loc-04-success-np4-kv-unified" / "log.txt"


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


# --- bundles are validated; the server's download format is accepted (QA report items 6 and 14) ---

def _bundle_file(tmp_path, name, obj):
    import json as _json

    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else _json.dumps(obj))
    return p


def test_bundle_of_another_schema_version_is_refused(tmp_path):
    from click.testing import CliRunner

    from kvreport.cli import main
    from tests.helpers import minimal_bundle

    b = minimal_bundle("x")
    b["schema"] = "kvreport/bundle@2"
    r = CliRunner().invoke(main, ["analyze", str(_bundle_file(tmp_path, "b.json", b))])
    assert r.exit_code == 2 and "schema" in r.stderr and r.stderr.count("\n") == 1


def test_bundle_with_wrong_types_is_refused(tmp_path):
    from click.testing import CliRunner

    from kvreport.cli import main
    from tests.helpers import minimal_bundle

    b = minimal_bundle("x")
    b["log"] = "hello"
    r = CliRunner().invoke(main, ["analyze", str(_bundle_file(tmp_path, "b.json", b))])
    assert r.exit_code == 2 and "log" in r.stderr


def test_deeply_nested_json_is_one_line(tmp_path):
    from click.testing import CliRunner

    from kvreport.cli import main

    deep = '{"schema": "kvreport/bundle@1", "x": ' + "[" * 100000 + "]" * 100000 + "}"
    r = CliRunner().invoke(main, ["analyze", str(_bundle_file(tmp_path, "b.json", deep))])
    assert r.exit_code == 2 and "nested" in r.stderr


def test_server_download_format_is_unwrapped(tmp_path):
    from click.testing import CliRunner

    from kvreport.cli import main
    from tests.helpers import minimal_bundle
    from tests.paths import CASE_DIR

    log = (CASE_DIR / "loc-17-fail-huge-ctx-verbose" / "log.txt").read_text()
    b = minimal_bundle(log)
    wrapped = {"id": b["id"], "url": "http://x/bundles/" + b["id"], "bundle": b,
               "diagnosis": {"failure": {"phase": "none"}}}
    r = CliRunner().invoke(main, ["analyze", "--json", str(_bundle_file(tmp_path, "d.json", wrapped))])
    assert r.exit_code == 0, r.output
    import json as _json

    assert _json.loads(r.stdout)["failure"]["phase"] == "kv_cache"  # recomputed, not the stored one


def test_stdin_takes_the_same_path_as_a_file(tmp_path):
    import subprocess
    import sys

    from tests.paths import CASE_DIR

    log = (CASE_DIR / "loc-17-fail-huge-ctx-verbose" / "log.txt").read_bytes()
    cmd = [sys.executable, "-m", "kvreport.cli", "analyze", "--json"]
    a = subprocess.run(cmd + ["-"], input=log, capture_output=True, timeout=60)
    b = subprocess.run(cmd + [str(CASE_DIR / "loc-17-fail-huge-ctx-verbose" / "log.txt")],
                       capture_output=True, timeout=60)
    assert a.returncode == b.returncode == 0
    assert a.stdout == b.stdout


@pytest.mark.parametrize(("content", "why"), [(b"", "it is empty"), (b"\n  \n", "it is empty"),
                                              (bytes(range(256)) * 40, "binary data"),
                                              (b"\x1f\x8b\x08\x00" + b"x" * 100, "gzip"),
                                              (b"GGUF\x03\x00\x00\x00" + b"\x00" * 100, "GGUF"),
                                              # PowerShell's > writes UTF-16 (with and without a byte-order mark)
                                              ("CUDA error: out of memory\r\n".encode("utf-16"), "UTF-16"),
                                              ("CUDA error: out of memory\n".encode("utf-16-le"), "UTF-16")])
def test_not_a_log_is_a_one_line_error(tmp_path, content, why):
    p = tmp_path / "in.log"
    p.write_bytes(content)
    r = subprocess.run([sys.executable, "-m", "kvreport.cli", "analyze", str(p)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and why in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("command", ["analyze"])
def test_unbalanced_quote_in_command_is_a_one_line_error(tmp_path, command):
    """analyze: a --command whose quote is never closed is refused (exit 2, one stderr line), not parsed into a guess.
    (collect keeps it as typed: design.md, tests/test_collect.py.)"""
    args = [sys.executable, "-m", "kvreport.cli", command]
    args += ["--log", str(FAIL), "-o", str(tmp_path / "b.json")] if command == "collect" else [str(FAIL)]
    r = subprocess.run([*args, "--command", 'llama-server -m "unterminated -c 4096'], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr == ('kvreport: error: --command: unbalanced quote: nothing closes the " opened before: '
                        "unterminated -c 4096\n")
    assert not (tmp_path / "b.json").exists()


def test_a_bundle_cut_short_is_refused_not_read_as_a_log(tmp_path):
    """A partly downloaded bundle ('{"schema":"kvreport/bundle@1", ... cut) is an error (exit 2), not "no failure"."""
    path = tmp_path / "cut.json"
    path.write_text('{"schema": "kvreport/bundle@1", "id": "x", "log": {')
    r = CliRunner().invoke(main, ["analyze", str(path)])
    assert r.exit_code == 2 and "not a valid bundle" in r.output


def test_random_bytes_are_refused(tmp_path):
    """Random data (few NULs, mostly bytes that are no UTF-8) is binary, exit 2."""
    import random
    rng = random.Random(7)
    path = tmp_path / "random.bin"
    path.write_bytes(bytes(rng.randrange(256) for _ in range(4096)))
    r = CliRunner().invoke(main, ["analyze", str(path)])
    assert r.exit_code == 2 and "binary" in r.output


def test_a_log_whose_lines_end_with_cr_alone(tmp_path):
    # classic Mac OS line ends (and some terminal captures): each CR ends a line, the failure is not lost (QA)
    p = tmp_path / "cr.log"
    p.write_bytes(FAIL.read_bytes().replace(b"\n", b"\r"))
    lf = json.loads(run("--json", str(FAIL)).output)
    cr = json.loads(run("--json", str(p)).output)
    assert cr["failure"]["phase"] == lf["failure"]["phase"] != "none"
    assert cr["failure"]["requested_mib"] == lf["failure"]["requested_mib"]


@pytest.mark.parametrize("text", ["{}", "[1, 2]", '{"a": [1, {"b": null}]}'])
def test_json_with_no_text_is_neither_a_bundle_nor_a_log(tmp_path, text):
    # (QA) one clear line and exit 2, not "no failure" with exit 1
    p = tmp_path / "x.json"
    p.write_text(text)
    r = run(str(p))
    assert r.exit_code == 2 and "neither a kvreport bundle nor an engine log" in r.output
