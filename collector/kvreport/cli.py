"""The `kvreport` command line (click). Each command is a thin shell over a module of its own.

Exit codes (design.md): ``analyze`` 0 when it diagnosed a failure, 1 when the input holds none;
``fit`` 0; ``run`` the child's status; 2 for usage and input errors (one line on stderr, never a
traceback); 3 for an internal error (one line; set ``KVREPORT_DEBUG=1`` for the traceback).

Imports are lazy so that ``kvreport --help`` loads neither the server, requests nor numpy.
"""

from __future__ import annotations

import os
import sys

import click

from kvreport import __version__
from kvreport.errors import KvreportError

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class _MiB(click.ParamType):
    """A finite amount of memory in MiB, >= 0 (``inf`` and ``nan`` are refused); a unit may follow the number
    (``8GiB``, ``8 GB``, ``512MiB``: GB and MB read as GiB and MiB, as the engines print them)."""

    name = "MiB"

    def convert(self, value, param, ctx):
        import math

        from kvreport.cmdline import (
            _size_bytes,  # (the command lines' sizes: one reading of "8g", "8 GB", "512MiB")
        )
        from kvreport.units import MIB

        size = _size_bytes(str(value), default_unit="m")
        try:
            number = size / MIB if size is not None else float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of MiB", param, ctx)
        if not math.isfinite(number) or number < 0:
            self.fail(f"{value!r} is not a finite number of MiB >= 0", param, ctx)
        return number


def _command_line(ctx, param, value: str | None) -> str | None:
    """``--command``: a shell line that splits (a quote left open is an input error, not a guess)."""
    if value is not None:
        from kvreport.cmdline import quote_problem

        problem = quote_problem(value)
        if problem:
            raise KvreportError(f"--command: {problem}")
    return value


def _fail(message: str, code: int = 2) -> None:
    click.echo(f"kvreport: error: {message}", err=True)
    sys.exit(code)


class _Group(click.Group):
    """Turns every kvreport error, click's usage errors included, into one stderr line and an exit status."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:  # plain `kvreport`: the help, not an error
            click.echo(exc.format_message())
            sys.exit(0)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else "kvreport"
            _fail(f"{exc.format_message()} (see '{where} --help')", exc.exit_code)
        except click.ClickException as exc:
            _fail(exc.format_message(), exc.exit_code)
        except click.exceptions.Abort:
            _fail("aborted", 1)
        sys.exit(rv if isinstance(rv, int) else 0)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KvreportError as exc:
            msg = str(exc)
            if exc.hint:
                msg += f" ({exc.hint})"
            _fail(msg, exc.exit_code)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, SystemExit):
            raise
        except KeyboardInterrupt:
            _fail("interrupted", 130)
        except BrokenPipeError:
            sys.exit(0)
        except Exception as exc:  # noqa: BLE001 - the last line of defence for the user
            if os.environ.get("KVREPORT_DEBUG"):
                raise
            _fail(f"internal error: {type(exc).__name__}: {exc} (set KVREPORT_DEBUG=1 for a traceback)", 3)


@click.group(cls=_Group, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, prog_name="kvreport")
def main() -> None:
    """Explain KV-cache and runtime-buffer allocation failures of llama.cpp, Ollama, vLLM and SGLang.

    \b
    kvreport run -- llama-server -m model.gguf -c 262144    run an engine; on failure, diagnose it
    kvreport collect --log server.log --command "..."      make a redacted bundle from a log
    kvreport analyze server.log                           diagnose a log or bundle offline
    kvreport fit --model model.gguf --free-mib 8192         KV bytes per token, largest context that fits
    kvreport upload kvreport-XXXX.json                    send a bundle to the team server
    kvreport known --update                               fetch the team's known fixes for offline matching
    kvreport serve                                        run the team server (SQLite by default)
    """


def _collect_options(f):
    """Options shared by `collect` and `run`."""
    opts = [
        click.option("--log", "log_path", type=click.Path(dir_okay=False, allow_dash=True),
                     help="Engine log file to read ('-' for stdin)."),
        # design.md: collect never fails because it cannot parse the command (it is stored verbatim, redacted)
        click.option("--command", "command_line",
                     help="The engine command line as you typed it."),
        click.option("--model", "model_path", type=click.Path(dir_okay=False),
                     help="GGUF model file (only its header is read)."),
        click.option("-o", "--output", "output", type=click.Path(dir_okay=False),
                     help="Where to write the bundle (default ./kvreport-<id>.json)."),
        click.option("--upload", is_flag=True, help="Upload the bundle after writing it."),
        click.option("--server", envvar="KVREPORT_SERVER", help="Server URL for --upload."),
        click.option("--token", envvar="KVREPORT_TOKEN", help="API token for --upload."),
        click.option("--show", is_flag=True, help="Print the redacted bundle before writing it."),
        click.option("--yes", "-y", is_flag=True, help="Do not ask before uploading (for scripts)."),
        click.option("--json", "as_json", is_flag=True, help="Print the diagnosis as JSON."),
        click.option("--probe-timeout", type=float, default=3.0, show_default=True,
                     help="Seconds each device/engine probe may take."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


@main.command(context_settings=CONTEXT_SETTINGS)
@_collect_options
def collect(**opts) -> None:
    """Gather a redacted bundle (machine, engine, command, log), print the diagnosis, write it."""
    from kvreport.commands import collect as collect_cmd

    sys.exit(collect_cmd.cli_collect(**opts))


@main.command(context_settings={**CONTEXT_SETTINGS, "ignore_unknown_options": True,
                                "allow_interspersed_args": False})
@_collect_options
@click.option("--keep-verbosity", is_flag=True,
              help="Do not add -lv 4 to llama.cpp commands (recent builds hide their size lines without it).")
@click.option("--always", is_flag=True, help="Collect a bundle even when the command succeeds.")
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def run(cmd, **opts) -> None:
    """Run CMD with its output passed through; on failure collect a bundle. Exits with CMD's status."""
    from kvreport import runner

    sys.exit(runner.cli_run(list(cmd), **opts))


@main.command(context_settings=CONTEXT_SETTINGS)
@click.argument("path", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--json", "as_json", is_flag=True, help="Print the diagnosis JSON.")
@click.option("--command", "command_line", callback=_command_line,
              help="The command line that produced the log, if known.")
@click.option("--model", "model_path", type=click.Path(dir_okay=False),
              help="The GGUF model file, if the log does not print its shape (KV per token, largest -c that fits).")
@click.option("--explain", is_flag=True,
              help="For every fact, the rule that produced it and the log line it read (in --json: an 'explain' list).")
def analyze(path: str, as_json: bool, command_line: str | None, model_path: str | None, explain: bool) -> None:
    """Diagnose a bundle file or a raw engine log (or '-' for stdin), offline.

    Text pasted from a GitHub issue (code fences, '> ' quotes) is accepted as it is.
    Exit 0 when a failure was diagnosed, 1 when the input holds no failure.
    """
    from kvreport import analyze_cmd

    sys.exit(analyze_cmd.cli_analyze(path, as_json=as_json, command_line=command_line, model_path=model_path,
                                     explain=explain))


@main.command(context_settings=CONTEXT_SETTINGS)
@click.option("--model", "model_path", type=click.Path(dir_okay=False), help="GGUF model file.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False, allow_dash=True),
              help="A log: its context, cache types and free memory; its print_info lines give the model when --model is not given.")
@click.option("--config", "hf_config", type=click.Path(dir_okay=False),
              help="A Hugging Face config.json (vLLM / SGLang sizing).")
@click.option("-c", "--ctx-size", "ctx_size", type=click.IntRange(min=0, max=2**32 - 1),
              help="Requested context (tokens; llama.cpp's n_ctx is a 32-bit count).")
@click.option("--free-mib", type=_MiB(), help="Free memory to fit into (MiB); default: what the --log printed for its GPUs, else local devices.")
@click.option("-np", "--parallel", "parallel", type=click.IntRange(min=1), help="Parallel sequences (slots).")
@click.option("-kvu/-no-kvu", "--kv-unified/--no-kv-unified", "kv_unified", default=None,
              help="Unified KV cache (llama-server's default with automatic --parallel).")
@click.option("-ctk", "--cache-type-k", "cache_type_k", default=None, help="K cache type (f16, q8_0, ...).")
@click.option("-ctv", "--cache-type-v", "cache_type_v", default=None, help="V cache type.")
@click.option("--swa-full", is_flag=True, default=False, help="Full-size cache for sliding-window layers.")
@click.option("--headroom-mib", type=_MiB(), default=None,
              help="Memory to keep free besides the KV (MiB); default 0 with --free-mib.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def fit(**opts) -> None:
    """KV bytes per token, the KV of the requested context, and the largest context that fits."""
    from kvreport.commands import fit as fit_cmd

    sys.exit(fit_cmd.cli_fit(**opts))


@main.command(context_settings=CONTEXT_SETTINGS)
@click.argument("path", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--server", envvar="KVREPORT_SERVER", help="Server URL (else KVREPORT_SERVER, else config file).")
@click.option("--token", envvar="KVREPORT_TOKEN", help="API token (else KVREPORT_TOKEN, else config file).")
@click.option("--json", "as_json", is_flag=True, help="Print the server's answer as JSON.")
def upload(path: str, server: str | None, token: str | None, as_json: bool) -> None:
    """Send a bundle to the team server; print its URL, its cluster and any known fix."""
    from kvreport.commands import upload as upload_cmd

    sys.exit(upload_cmd.cli_upload(path, server=server, token=token, as_json=as_json))


@main.command(context_settings=CONTEXT_SETTINGS)
@click.option("--update", "update_first", is_flag=True,
              help="First fetch the team server's known fixes into the user data directory.")
@click.option("--server", envvar="KVREPORT_SERVER", help="Server URL for --update (else KVREPORT_SERVER, else config file).")
@click.option("--token", envvar="KVREPORT_TOKEN", help="API token, for a private server (else KVREPORT_TOKEN, else config file).")
@click.option("--json", "as_json", is_flag=True, help="Print the entries as JSON.")
def known(update_first: bool, server: str | None, token: str | None, as_json: bool) -> None:
    """List the known upstream issues that analyze and collect match offline (shipped and fetched)."""
    from kvreport.commands import known as known_cmd

    sys.exit(known_cmd.cli_known(update_first=update_first, server=server, token=token, as_json=as_json))


@main.command(context_settings=CONTEXT_SETTINGS)
@click.argument("path", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--url", help="The bundle's permalink, when it was uploaded elsewhere.")
def issue(path: str, url: str | None) -> None:
    """Print a GitHub issue body (Markdown) for a bundle."""
    from kvreport import markdown

    sys.exit(markdown.cli_issue(path, url=url))


@main.command(context_settings=CONTEXT_SETTINGS)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option("--database-url", envvar="KVREPORT_DATABASE_URL",
              help="SQLAlchemy URL (default: SQLite in the user data directory).")
@click.option("--demo", is_flag=True, help="Serve a browsable demo: the bundled examples and a marked demo history, "
              "in a separate database (demo.sqlite3 in the user data directory) unless --database-url is given.")
def serve(host: str, port: int, database_url: str | None, demo: bool) -> None:
    """Run the kvreport server on this machine (migrations are applied on start)."""
    cli_entry = _server_cli()
    sys.exit(cli_entry.serve(host=host, port=port, database_url=database_url, demo=demo))


def _server_cli():
    try:
        from kvreport_server import cli_entry
    except ImportError as exc:
        raise KvreportError(f"the server is not installed ({exc.name} missing)",
                            hint="pip install 'kvreport[server]'") from None
    return cli_entry


@main.group(cls=_Group, context_settings=CONTEXT_SETTINGS)
def admin() -> None:
    """Server administration: API tokens, maintainers' accounts, re-analysis, demo removal."""


@admin.command("create-token", context_settings=CONTEXT_SETTINGS)
@click.argument("name")
@click.option("--scope", type=click.Choice(["upload", "write", "admin"]), default="upload", show_default=True)
@click.option("--database-url", envvar="KVREPORT_DATABASE_URL", help="The server's database URL.")
def create_token(name: str, scope: str, database_url: str | None) -> None:
    """Create an API token and print it once, alone on one line (stored hashed)."""
    cli_entry = _server_cli()
    sys.exit(cli_entry.create_token(name=name, scope=scope, database_url=database_url))


@admin.command("revoke-token", context_settings=CONTEXT_SETTINGS)
@click.argument("name")
@click.option("--database-url", envvar="KVREPORT_DATABASE_URL", help="The server's database URL.")
def revoke_token(name: str, database_url: str | None) -> None:
    """Revoke every active token with this name."""
    cli_entry = _server_cli()
    sys.exit(cli_entry.revoke_token(name=name, database_url=database_url))


@admin.command("create-user", context_settings=CONTEXT_SETTINGS)
@click.argument("username")
@click.option("--password", envvar="KVREPORT_PASSWORD",
              help="The password (else KVREPORT_PASSWORD, else asked twice on the terminal).")
@click.option("--database-url", envvar="KVREPORT_DATABASE_URL", help="The server's database URL.")
def create_user(username: str, password: str | None, database_url: str | None) -> None:
    """Create a maintainer who signs in to the web pages (sets known fixes, issue links, status)."""
    cli_entry = _server_cli()
    sys.exit(cli_entry.create_user(username=username, password=password, database_url=database_url))


@admin.command("reanalyze", context_settings=CONTEXT_SETTINGS)
@click.option("--batch-size", type=click.IntRange(1, 10000), default=50, show_default=True)
@click.option("--max-batches", type=click.IntRange(min=1), default=None, help="Stop after this many batches.")
@click.option("--nice", type=click.IntRange(0, 19), default=10, show_default=True,
              help="Run this many steps below normal CPU priority (uploads go first; 0: normal).")
@click.option("--database-url", envvar="KVREPORT_DATABASE_URL", help="The server's database URL.")
def reanalyze(batch_size: int, max_batches: int | None, nice: int, database_url: str | None) -> None:
    """Re-run the analyzer over stored bundles of an older analyzer version (resumable)."""
    cli_entry = _server_cli()
    sys.exit(cli_entry.reanalyze(database_url=database_url, batch_size=batch_size, max_batches=max_batches,
                                 nice=nice))


@admin.command("remove-demo", context_settings=CONTEXT_SETTINGS)
@click.option("--database-url", envvar="KVREPORT_DATABASE_URL", help="The server's database URL.")
def remove_demo(database_url: str | None) -> None:
    """Remove the demo bundles (`kvreport serve --demo`) and the clusters only they made."""
    cli_entry = _server_cli()
    sys.exit(cli_entry.remove_demo(database_url=database_url))


if __name__ == "__main__":  # pragma: no cover
    main()
