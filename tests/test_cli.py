"""The CLI's promise: usage and input errors are one line on stderr with exit 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

KVREPORT = [sys.executable, "-m", "kvreport.cli"]


@pytest.mark.parametrize("args, words", [
    (["analyze", "/"], "is a directory"),
    (["analyze"], "Missing argument"),
    (["fit", "--free-mib", "inf", "--log", "x"], "finite number of MiB"),
    (["fit", "--free-mib", "nan", "--log", "x"], "finite number of MiB"),
    (["fit", "--free-mib", "-5", "--log", "x"], "finite number of MiB"),
    (["fit", "-c", "-5"], "-c"),
    (["serve", "--port", "70000"], "70000"),
    (["nosuch"], "No such command"),
    (["upload"], "Missing argument"),
    (["admin", "create-token"], "Missing argument"),
])
def test_usage_errors_are_one_line_exit_2(args, words):
    r = subprocess.run(KVREPORT + args, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("kvreport: error: ") and words in r.stderr
    assert "Traceback" not in r.stderr


def test_no_arguments_prints_the_help_and_exits_0():
    r = subprocess.run(KVREPORT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "Commands:" in r.stdout


def test_help_and_version_exit_0():
    for args in (["--help"], ["--version"], ["analyze", "--help"]):
        r = subprocess.run(KVREPORT + args, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout


def test_run_exits_with_the_childs_status(tmp_path):
    r = subprocess.run(KVREPORT + ["run", "-o", str(tmp_path / "b.json"), "--", "sh", "-c", "exit 7"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 7
