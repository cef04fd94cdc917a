"""The console script's fast pages (kvreport.launch): byte for byte what click prints, without importing click."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from click.testing import CliRunner

from kvreport import launch
from kvreport.cli import main as click_main

ROOT = Path(__file__).resolve().parents[1]


def test_the_console_script_is_the_launcher():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kvreport"] == "kvreport.launch:main"


@pytest.mark.parametrize("width", sorted(launch.HELP))
def test_stored_help_is_clicks_help(width):
    r = CliRunner().invoke(click_main, ["--help"], prog_name="kvreport", terminal_width=width)
    assert r.exit_code == 0
    assert launch.HELP[width] == r.output, "regenerate: python -m kvreport.launch --regenerate"


def _run(entry: str, args: list[str], columns: str) -> tuple[str, bool]:
    code = ("import sys\nsys.argv[0] = 'kvreport'\n"
            f"from {entry} import main\n"
            "try:\n    rc = main()\nexcept SystemExit as e:\n    rc = e.code\n"
            "sys.stderr.write('click' if 'click' in sys.modules else 'no-click')\nsys.exit(rc or 0)\n")
    env = {**os.environ, "COLUMNS": columns}
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    return p.stdout, p.stderr.endswith("no-click")


@pytest.mark.parametrize("args, columns", [(["--help"], "100"), (["-h"], "132"), ([], "80"), (["--version"], "80")])
def test_fast_pages_match_click_in_a_real_process(args, columns):
    fast, no_click = _run("kvreport.launch", args, columns)
    slow, _ = _run("kvreport.cli", args, columns)
    assert fast == slow and no_click


def test_other_widths_and_commands_go_to_click():
    assert launch.fast_text(["--help"], 60) is None
    assert launch.fast_text(["fit", "--help"], 100) is None
    out, no_click = _run("kvreport.launch", ["--help"], "60")
    assert out.startswith("Usage: kvreport") and not no_click
