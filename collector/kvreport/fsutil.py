"""Atomic file writes: a reader (or a crash) never sees a partial bundle.

The data is written to a temporary file in the destination's own directory (so that the rename
stays on one file system), flushed and fsync'ed, then moved over the destination with
:func:`os.replace`, which is atomic on POSIX and on Windows.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_bytes_atomic(path: str | os.PathLike, data: bytes, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path. Raises OSError (nothing left behind)."""
    dest = Path(path)
    directory = dest.parent if str(dest.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.chmod(tmp, mode & ~_umask())
        except OSError:  # pragma: no cover - file systems without modes
            pass
        os.replace(tmp, dest)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return dest


def write_json_atomic(path: str | os.PathLike, obj: Any, indent: int | None = 1) -> Path:
    """Serialise ``obj`` as UTF-8 JSON (sorted keys not imposed; ``ensure_ascii=False``) atomically."""
    text = json.dumps(obj, indent=indent, ensure_ascii=False, allow_nan=False) + "\n"
    return write_bytes_atomic(path, text.encode("utf-8", "replace"))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
