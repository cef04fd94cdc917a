"""Whether an input is a log at all: an empty file or binary data is refused before anything reads it.

``kvreport analyze``, ``kvreport collect --log`` and ``kvreport run --log`` judge the first
:data:`HEAD_BYTES` bytes of their input here, and refuse it with the same one line (exit 2):
``nothing to analyze in <source>: it is empty`` / ``…: it is gzip data, not a log (decompress it first)``.
"""

from __future__ import annotations

from kvreport.errors import InputError

HEAD_BYTES = 64 * 1024
_CONTROL = bytes(b for b in range(32) if b not in (9, 10, 12, 13, 27))
_MAGIC = ((b"\x1f\x8b", "gzip"), (b"PK\x03\x04", "zip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"BZh", "bzip2"),
          (b"\xfd7zXZ", "xz"), (b"GGUF", "a GGUF model file"), (b"\x7fELF", "an executable"))
_COMPRESSED = ("gzip", "zip", "zstd", "bzip2", "xz")


def not_a_log(head: bytes) -> str | None:
    """Why the first bytes of an input are not a log or a bundle (empty, or binary data), else None.

    Binary: a compressed or archive signature, or more than 1 % NUL bytes, or more than 10 % other control bytes
    (a log keeps tabs, newlines, CR and ANSI escapes; a stray NUL or two in a crash log is still a log), or more
    than 10 % of the bytes not UTF-8 (random or encrypted data; a Latin-1 log's accents are far fewer)."""
    if not head.strip():
        return "it is empty"
    for magic, what in _MAGIC:
        if head.startswith(magic):
            return f"it is {what} data, not a log (decompress it first)" if what in _COMPRESSED \
                else f"it is {what}, not a log"
    if _utf16(head):
        return ("it is UTF-16 text (as Windows PowerShell's > writes it): convert it to UTF-8 first "
                "(Get-Content LOG | Set-Content -Encoding utf8 LOG8, or iconv -f UTF-16 -t UTF-8)")
    n = len(head)
    if head.count(0) > n / 100 or sum(head.count(c) for c in _CONTROL) > n / 10:
        return "it is binary data, not a log"
    if head.decode("utf-8", "replace").count("\ufffd") > n / 10:
        return "it is binary data, not a log"  # mostly bytes that are no UTF-8 (a Latin-1 log has a few, not 10 %)
    return None


def _utf16(head: bytes) -> bool:
    """UTF-16 text: a byte-order mark, or ASCII text with a NUL after (or before) every character."""
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return True
    sample = head[:4096]
    if len(sample) < 16:
        return False
    odd, even = sample[1::2], sample[0::2]
    return odd.count(0) > 0.9 * len(odd) or even.count(0) > 0.9 * len(even)


def refuse(head: bytes, source: str) -> None:
    """Raise :class:`InputError` (one line) when ``head``, the first bytes of ``source``, is no log."""
    why = not_a_log(head)
    if why:
        raise InputError(f"nothing to analyze in {source}: {why}")


def check_file(path: str) -> None:
    """:func:`refuse` on the first bytes of the file at ``path`` (OSError when it cannot be read)."""
    with open(path, "rb") as fh:
        refuse(fh.read(HEAD_BYTES), path)
