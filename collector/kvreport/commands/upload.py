"""``kvreport upload PATH``: send a bundle file and print the server's answer (plain functions in
:mod:`kvreport.upload`)."""

from __future__ import annotations

import json
import os
import shlex

import click

from kvreport import (
    upload as _upload,  # looked up at call time: the domain module's functions, never a stale copy
)
from kvreport.config import remember_upload
from kvreport.errors import UploadError


def retry_command(path: str, *, server: str | None = None, token: str | None = None, as_json: bool = False) -> str:
    """The command to run again, with the options that were given (the token as a placeholder:
    it is never printed)."""
    parts = ["kvreport", "upload", shlex.quote(str(path))]
    if server and server != os.environ.get("KVREPORT_SERVER"):
        parts += ["--server", shlex.quote(server)]
    if token and token != os.environ.get("KVREPORT_TOKEN"):
        parts += ["--token", "<token>"]
    if as_json:
        parts.append("--json")
    return " ".join(parts)


def cli_upload(path: str, server: str | None, token: str | None, as_json: bool = False) -> int:
    """`kvreport upload PATH`: exit 0 when stored; :class:`UploadError` (exit 2) otherwise."""
    bundle = _upload.read_bundle_file(path)
    try:
        answer = _upload.upload_bundle(bundle, server, token)
    except UploadError as exc:
        retry = retry_command(path, server=server, token=token, as_json=as_json)
        exc.hint = "; ".join(h for h in (exc.hint, f"the bundle is unchanged at {path}; retry with: {retry}") if h)
        raise
    if answer.get("url"):
        remember_upload(bundle["id"], answer["url"])
    if as_json:
        click.echo(json.dumps(answer, indent=1, ensure_ascii=False))
    else:
        click.echo(_upload.describe_answer(answer))
    from kvreport.commands.collect import send_pending_outcomes

    send_pending_outcomes(bundle["id"], server, token)
    return 0
