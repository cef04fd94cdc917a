"""Shared plumbing of the probes: safe executable lookup, bounded subprocess runs, status words.

A probe never raises to its caller: :func:`kvreport.probes.run_all` turns :class:`Absent`
into ``"absent"`` and anything else into ``"failed: <reason>"``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from kvreport.units import MIB  # noqa: F401 - one copy of the units, re-exported for the probes


class Absent(Exception):
    """The tool, library or service is not on this machine (not an error)."""


class ProbeFailed(Exception):
    """The tool exists but did not give usable output; the message says why (one line)."""


def safe_path(path: str | None = None) -> str:
    """``PATH`` without ``.``, empty and relative entries (so a binary in the current folder is never run)."""
    raw = os.environ.get("PATH", "") if path is None else path
    keep = []
    for entry in raw.split(os.pathsep):
        if not entry or entry == "." or not os.path.isabs(entry):
            continue
        keep.append(entry)
    return os.pathsep.join(keep)


def which(name: str) -> str | None:
    """Absolute path of executable ``name`` on the safe PATH (basename only; None when absent)."""
    if not name or os.sep in name or (os.altsep and os.altsep in name):
        return None
    found = shutil.which(name, path=safe_path())
    if found is None:
        return None
    found = os.path.abspath(found)
    if os.path.dirname(found) == os.path.abspath(os.getcwd()) and os.getcwd() not in safe_path().split(os.pathsep):
        return None
    return found


@dataclass
class ToolOutput:
    """What a tool printed (decoded as UTF-8 with replacement) and its exit status."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def run_tool(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> ToolOutput:
    """Run ``argv`` (no shell; ``argv[0]`` an absolute path) with stdin closed and a deadline.

    Raises :class:`ProbeFailed` on timeout (the whole process group is killed) or when the
    program cannot be started. A non-zero exit status is returned, not raised.
    """
    start = time.monotonic()
    kwargs: dict = {}
    if os.name == "posix":
        kwargs["start_new_session"] = True
    elif sys.platform == "win32":  # pragma: no cover
        kwargs["creationflags"] = getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0) | getattr(
            subprocess, "CREATE_NO_WINDOW", 0)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                shell=False, env=env, **kwargs)
    except OSError as exc:
        raise ProbeFailed(f"cannot start {os.path.basename(argv[0])}: {exc.strerror or exc}") from None
    try:
        out, err = proc.communicate(timeout=max(0.05, timeout))
    except subprocess.TimeoutExpired:
        _kill(proc)
        try:
            proc.communicate(timeout=1.0)
        except (subprocess.TimeoutExpired, OSError, ValueError):
            pass
        raise ProbeFailed(f"{os.path.basename(argv[0])} timed out after {timeout:g} s") from None
    return ToolOutput(argv, proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                      time.monotonic() - start)


def _kill(proc: subprocess.Popen) -> None:
    try:
        if os.name == "posix":
            os.killpg(proc.pid, signal.SIGKILL)
        else:  # pragma: no cover
            proc.kill()
    except (ProcessLookupError, PermissionError, OSError):
        try:
            proc.kill()
        except OSError:
            pass


class Deadline:
    """A probe's time budget shared by the several tools it runs one after the other."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self, minimum: float = 0.1) -> float:
        """Seconds left (at least ``minimum``, so a last call still gets a short chance)."""
        return max(minimum, self.end - time.monotonic())


def run_named(name: str, args: list[str], timeout: float) -> ToolOutput:
    """Find ``name`` on the safe PATH and run it with ``args``; :class:`Absent` when not found."""
    path = which(name)
    if path is None:
        raise Absent(name)
    return run_tool([path, *args], timeout)


def to_mib(value: float | int | None, unit_bytes: float = 1.0) -> float | None:
    """``value`` (in units of ``unit_bytes`` bytes) as MiB rounded to 0.01, or None."""
    if value is None:
        return None
    try:
        return round(float(value) * unit_bytes / MIB, 2)
    except (TypeError, ValueError):
        return None


def one_line(text: str, limit: int = 160) -> str:
    """The first non-empty line of ``text``, cut to ``limit`` characters (for status reasons)."""
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line[:limit]
    return ""
