"""Strict mode: the catch-alls that keep users from tracebacks re-raise instead (tests turn it on).

A catch-all in the analysis core (a parser that raised on a line, a diagnosis step that raised) logs a warning
or an ``analyzer_error`` finding for users. Under ``KVREPORT_STRICT=1`` (set by the test suite's autouse
fixture, inherited by the CLI subprocesses it starts) :func:`check` re-raises the exception being handled, so a
bug cannot hide behind "never raises".
"""

from __future__ import annotations

import os


def enabled() -> bool:
    """True when catch-alls must re-raise (``KVREPORT_STRICT`` is set to 1)."""
    return os.environ.get("KVREPORT_STRICT") == "1"


def check() -> None:
    """Call inside an ``except Exception`` catch-all: re-raises the exception being handled in strict mode."""
    if enabled():
        raise  # noqa: PLE0704 - re-raises the exception the caller is handling
