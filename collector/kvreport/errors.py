"""Errors that reach the user as one line (the CLI prints ``kvreport: error: <message>``, exit 2).

This module imports nothing else of kvreport, so any module may raise these.
"""


class KvreportError(Exception):
    """A bad input or an unusable environment, explained in one line; CLI exit status ``exit_code``."""

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


class InputError(KvreportError):
    """A file, log, bundle or option value that cannot be used (unreadable, truncated, wrong type)."""


class ModelFileError(InputError):
    """A model file that is not GGUF, is truncated, or has an unknown GGUF version."""


class UploadError(KvreportError):
    """The server refused a bundle or could not be reached; the bundle stays on disk."""
