"""``kvreport collect``: print the summary and diagnosis, write the bundle, upload it when asked
(after the user saw the summary and confirmed at a terminal). The bundle itself is built by the
plain functions of :mod:`kvreport.collect`; ``kvreport run`` finishes with the same :func:`finish`.
"""

from __future__ import annotations

import json
import sys

import click

from kvreport.collect import (
    build_bundle,
    diagnose_bundle,
    read_log,
    redaction_summary,
    render_diagnosis,
    write_bundle,
)
from kvreport.errors import UploadError


def _print_diagnosis(bundle: dict, show: bool, as_json: bool) -> dict | None:
    """The bundle (``--show``), then the diagnosis as JSON or text; human lines to stderr with ``--json``.
    Returns the diagnosis (None when it failed)."""
    diagnosis, problem = diagnose_bundle(bundle)
    known = _known(diagnosis, bundle) if diagnosis is not None else []
    if show:
        click.echo(json.dumps(bundle, indent=1, ensure_ascii=False), err=as_json)
    if as_json:
        click.echo(json.dumps({**diagnosis, "known": known} if diagnosis is not None else {"error": problem},
                              indent=1, ensure_ascii=False))
    elif diagnosis is not None:
        from kvreport.known import render

        click.echo(render_diagnosis(diagnosis, bundle) + render(known), nl=False)
    if problem:
        click.echo(f"kvreport: {problem}", err=True)
    return diagnosis


def _follow_up(bundle: dict, diagnosis: dict | None, *, confirm_success: bool, server: str | None,
               token: str | None) -> None:
    """Remember a memory failure in the local record; with ``confirm_success``, a log that shows the
    engine came up (and no failure) confirms the fix of an earlier failure (:mod:`kvreport.confirm`)."""
    from kvreport import confirm

    if diagnosis is None:
        return
    if confirm.remember_failure(bundle, diagnosis):
        return
    phase = (diagnosis.get("failure") or {}).get("phase")
    command = bundle.get("command") or {}
    lines = [t for _n, t in ((bundle.get("log") or {}).get("lines") or [])]
    if confirm_success and phase == "none" and confirm.log_shows_success(command.get("engine"), lines):
        confirm.confirm(command, bundle.get("host"), bundle.get("devices"), server=server, token=token)


def _known(diagnosis: dict, bundle: dict) -> list[dict]:
    """The known upstream issues that match (offline catalogs, :mod:`kvreport.known`)."""
    from kvreport.analyze_cmd import known_matches

    return known_matches(diagnosis, bundle)


def _confirmed(bundle: dict, path, server: str | None, yes: bool, interactive: bool | None) -> bool:
    """Whether to upload: ``--yes``, or a "y" at a terminal (stdin and stderr both terminals)."""
    if yes:
        return True
    interactive = (sys.stdin.isatty() and sys.stderr.isatty()) if interactive is None else interactive
    if not interactive:
        click.echo(f"not uploading: no terminal to confirm on; check the bundle, then run "
                   f"`kvreport upload {path}` (or pass --yes)", err=True)
        return False
    if not click.confirm(f"Upload this bundle ({redaction_summary(bundle)}) to "
                         f"{server or 'the configured server'}?", default=False, err=True):
        click.echo(f"not uploaded; later: kvreport upload {path}", err=True)
        return False
    return True


def _upload(bundle: dict, path, server: str | None, token: str | None, err: bool) -> int:
    try:
        from kvreport.upload import describe_answer, upload_bundle

        answer = upload_bundle(bundle, server, token)
    except UploadError as exc:
        from kvreport.commands.upload import retry_command

        hint = f" ({exc.hint})" if exc.hint else ""
        click.echo(f"kvreport: error: upload failed: {exc}{hint}; the bundle is kept at {path}; "
                   f"retry with: {retry_command(path, server=server, token=token)}", err=True)
        return exc.exit_code
    try:
        from kvreport.config import remember_upload

        if answer.get("url"):
            remember_upload(bundle["id"], answer["url"])
    except Exception:  # noqa: BLE001
        pass
    click.echo(describe_answer(answer), err=err)
    send_pending_outcomes(bundle["id"], server, token)
    return 0


def send_pending_outcomes(bundle_id: str, server: str | None, token: str | None) -> None:
    """After an upload: the outcomes recorded for this bundle that waited for it go to the server too."""
    from kvreport import confirm, record

    opened = record.open_record(create=False)
    if opened is None:
        return
    with opened as conn:
        confirm.send_pending(conn, bundle_id, server=server, token=token,
                             echo=lambda text: click.echo(text, err=True))


def finish(bundle: dict, *, output: str | None = None, upload: bool = False, server: str | None = None,
           token: str | None = None, show: bool = False, yes: bool = False, as_json: bool = False,
           interactive: bool | None = None, confirm_success: bool = True) -> int:
    """Print the summary and diagnosis, write ``bundle`` atomically, upload it if asked.

    A memory failure is remembered in the local record; a log of a run that worked confirms the
    fix of an earlier failure (``confirm_success``; ``kvreport run`` confirms while it runs instead).
    Human lines go to stderr when ``as_json`` (stdout then holds only the diagnosis JSON).
    Returns 0, or the :class:`UploadError` exit status when an upload failed (the file stays).
    """
    diagnosis = _print_diagnosis(bundle, show, as_json)
    path = write_bundle(bundle, output)
    click.echo(redaction_summary(bundle), err=True)
    click.echo(f"wrote {path}", err=True)
    _follow_up(bundle, diagnosis, confirm_success=confirm_success, server=server, token=token)
    if not upload or not _confirmed(bundle, path, server, yes, interactive):
        return 0
    return _upload(bundle, path, server, token, err=as_json)


def cli_collect(log_path: str | None = None, command_line: str | None = None, model_path: str | None = None,
                output: str | None = None, upload: bool = False, server: str | None = None,
                token: str | None = None, show: bool = False, yes: bool = False, as_json: bool = False,
                probe_timeout: float = 3.0, **_ignored) -> int:
    """`kvreport collect`: returns the exit status (0; 2 for an unreadable --log or a failed upload)."""
    excerpt = read_log(log_path) if log_path else None
    source = "stdin" if log_path == "-" else ("file" if log_path else "none")
    bundle = build_bundle(None, command_line, model_path, probe_timeout, excerpt=excerpt, log_source=source)
    return finish(bundle, output=output, upload=upload, server=server, token=token, show=show, yes=yes,
                  as_json=as_json)
