"""The ``kvreport`` console script: answers ``kvreport``, ``--help`` and ``--version`` without importing click.

Everything else goes to the click group :func:`kvreport.cli.main`. Importing click alone takes about as
long as starting Python, so the top-level help, the one page people open first, is printed from
the text below: click's own rendering of that page for the two widths nearly every terminal gets
(a terminal of 100 columns or more, and 80 columns, click's fallback when output is not a terminal),
and click renders it for any other width. ``tests/test_launch.py`` fails when the text below is not
what click prints for the current commands; regenerate it with ``python -m kvreport.launch --regenerate``.
"""

from __future__ import annotations

import os
import sys

from kvreport import __version__

PROG = "kvreport"
HELP = {
    98: (
        'Usage: kvreport [OPTIONS] COMMAND [ARGS]...\n'
        '\n'
        '  Explain KV-cache and runtime-buffer allocation failures of llama.cpp, Ollama, vLLM and SGLang.\n'
        '\n'
        '  kvreport run -- llama-server -m model.gguf -c 262144    run an engine; on failure, diagnose it\n'
        '  kvreport collect --log server.log --command "..."      make a redacted bundle from a log\n'
        '  kvreport analyze server.log                           diagnose a log or bundle offline\n'
        '  kvreport fit --model model.gguf --free-mib 8192         KV bytes per token, largest context that fits\n'
        '  kvreport upload kvreport-XXXX.json                    send a bundle to the team server\n'
        '  kvreport serve                                        run the team server (SQLite by default)\n'
        '\n'
        'Options:\n'
        '  --version   Show the version and exit.\n'
        '  -h, --help  Show this message and exit.\n'
        '\n'
        'Commands:\n'
        "  admin    Server administration: API tokens, maintainers' accounts, re-analysis.\n"
        "  analyze  Diagnose a bundle file or a raw engine log (or '-' for stdin), offline.\n"
        '  collect  Gather a redacted bundle (machine, engine, command, log), print the diagnosis,...\n'
        '  fit      KV bytes per token, the KV of the requested context, and the largest context that...\n'
        '  issue    Print a GitHub issue body (Markdown) for a bundle.\n'
        '  run      Run CMD with its output passed through; on failure collect a bundle.\n'
        '  serve    Run the kvreport server on this machine (migrations are applied on start).\n'
        '  upload   Send a bundle to the team server; print its URL, its cluster and any known fix.\n'
    ),
    78: (
        'Usage: kvreport [OPTIONS] COMMAND [ARGS]...\n'
        '\n'
        '  Explain KV-cache and runtime-buffer allocation failures of llama.cpp,\n'
        '  Ollama, vLLM and SGLang.\n'
        '\n'
        '  kvreport run -- llama-server -m model.gguf -c 262144    run an engine; on failure, diagnose it\n'
        '  kvreport collect --log server.log --command "..."      make a redacted bundle from a log\n'
        '  kvreport analyze server.log                           diagnose a log or bundle offline\n'
        '  kvreport fit --model model.gguf --free-mib 8192         KV bytes per token, largest context that fits\n'
        '  kvreport upload kvreport-XXXX.json                    send a bundle to the team server\n'
        '  kvreport serve                                        run the team server (SQLite by default)\n'
        '\n'
        'Options:\n'
        '  --version   Show the version and exit.\n'
        '  -h, --help  Show this message and exit.\n'
        '\n'
        'Commands:\n'
        "  admin    Server administration: API tokens, maintainers' accounts,...\n"
        "  analyze  Diagnose a bundle file or a raw engine log (or '-' for stdin),...\n"
        '  collect  Gather a redacted bundle (machine, engine, command, log),...\n'
        '  fit      KV bytes per token, the KV of the requested context, and the...\n'
        '  issue    Print a GitHub issue body (Markdown) for a bundle.\n'
        '  run      Run CMD with its output passed through; on failure collect a...\n'
        '  serve    Run the kvreport server on this machine (migrations are...\n'
        '  upload   Send a bundle to the team server; print its URL, its cluster...\n'
    ),
}


def _columns() -> int:
    """The terminal width as click reads it (``shutil.get_terminal_size``, without importing shutil)."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns if columns > 0 else 80


def fast_text(args: list[str], columns: int) -> str | None:
    """What ``kvreport ARGS`` prints when it is the help or the version page; None for anything else."""
    if args == ["--version"]:
        return f"{PROG}, version {__version__}\n"
    if args in ([], ["--help"], ["-h"]):
        return HELP.get(max(min(columns, 100) - 2, 50))
    return None


def main() -> int:
    args = sys.argv[1:]
    prog = os.path.basename(sys.argv[0]).removesuffix(".exe") if sys.argv else ""
    text = fast_text(args, _columns()) if prog == PROG else None
    if text is not None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return 0
    from kvreport.cli import main as click_main

    return click_main()


def _regenerate() -> None:  # pragma: no cover - a maintainer's tool
    from click.testing import CliRunner

    from kvreport.cli import main as click_main

    for width in sorted(HELP, reverse=True):
        print(f"--- width {width}")
        print(CliRunner().invoke(click_main, ["--help"], prog_name=PROG, terminal_width=width).output, end="")


if __name__ == "__main__":  # pragma: no cover
    if sys.argv[1:] == ["--regenerate"]:
        _regenerate()
    else:
        sys.exit(main())
