"""Regular expressions that run in linear time on untrusted text (RE2), with one-character look-around.

Python's ``re`` backtracks: ``name[ \\t]*=`` tried at every ``a`` of ``"a-" * 8000`` rescans the rest
of the line each time, so one crafted log line can keep the collector or the server busy for
minutes (issue 13, item 1). RE2 (``google-re2``) guarantees time linear in the text, but has no
look-around, back-references or conditionals. This module gives the redaction patterns what they
used from those, in a form RE2 can run:

* ``before``: a one-character look-behind, written as what the character before the match must be
  (``"^|[^\\w.]"``: the start of the text or any character but a word character or a dot). It is
  matched and consumed in front of the match, and the next search starts one character before the
  previous match's end, so two matches can still touch (``a=1 b=2``), as with a look-behind.
* ``after``: a look-ahead of what follows the match (``"$|[^\\w-]"``); consumed, then searched again.

The match reported is the part between the two (its own group 0, named groups as usual).

**Text seen by the patterns.** RE2 reads the text as ASCII bytes of the same length as the
``str`` (so every offset is an index into the ``str``): a non-ASCII character becomes ``\\x01``
when Python's ``re`` counts it as a word character (``é``, ``٣``), a space when it is white
space, and ``\\x02`` otherwise; ``\\v`` and ``\\x1c``–``\\x1f`` (white space to Python) become
spaces. Patterns write a word character as ``[\\w\\x01]`` where Python's ``\\w`` matched Unicode
letters. Lone surrogates (from JSON) are just ``\\x02``: no encoding error can stop redaction.
"""

from __future__ import annotations

import re as _re
import threading
from collections.abc import Callable, Iterator

__all__ = ["Match", "Pattern", "Subject", "compile"]

# Python's str.isspace() in ASCII: RE2's \s lacks \v and \x1c-\x1f
_ASCII_SPACES = {0x0B, 0x1C, 0x1D, 0x1E, 0x1F}


class _Shadow(dict):
    """``str.translate`` table from a code point to its stand-in (filled on first use)."""

    def __missing__(self, cp: int) -> int:
        if cp == 0x01:
            value = 0x02
        elif cp in _ASCII_SPACES:
            value = 0x20
        elif cp < 0x80:
            value = cp
        else:
            ch = chr(cp)
            value = 0x20 if ch.isspace() else 0x01 if ch.isalnum() else 0x02
        self[cp] = value
        return value


_SHADOW = _Shadow()
# the ASCII that the stand-in changes; Python's re on one character class (no backtracking possible)
_ODD_ASCII = _re.compile(rb"[\x01\x0b\x1c-\x1f]")


def shadow(text: str) -> bytes:
    """The ASCII bytes RE2 reads for ``text`` (same length; see the module docstring)."""
    if text.isascii():
        data = text.encode("ascii")
        if _ODD_ASCII.search(data) is None:
            return data
    return text.translate(_SHADOW).encode("ascii")


class Subject:
    """A text and its ASCII stand-in, made once and searched by several patterns."""

    __slots__ = ("text", "data")

    def __init__(self, text: str):
        self.text = text
        self.data = shadow(text)

    def __len__(self) -> int:
        return len(self.text)


_LAST = threading.local()


def _subject(text: str | Subject) -> Subject:
    """``text``'s :class:`Subject`; the last one made in this thread is reused for the same string
    object (a text searched by several patterns in a row is shadowed once)."""
    if isinstance(text, Subject):
        return text
    last = getattr(_LAST, "subject", None)
    if last is not None and last.text is text:
        return last
    subj = _LAST.subject = Subject(text)
    return subj


class Match:
    """The part of ``Match.string`` a :class:`Pattern` found (``re.Match``-like: ``group``,
    ``start``, ``end``, ``span`` by index or name)."""

    __slots__ = ("string", "_spans", "_index")

    def __init__(self, string: str, spans: list[tuple[int, int]], index: dict[str, int]):
        self.string = string
        self._spans = spans
        self._index = index

    def _g(self, group: int | str) -> int:
        return self._index[group] if isinstance(group, str) else group

    def span(self, group: int | str = 0) -> tuple[int, int]:
        return self._spans[self._g(group)]

    def start(self, group: int | str = 0) -> int:
        return self._spans[self._g(group)][0]

    def end(self, group: int | str = 0) -> int:
        return self._spans[self._g(group)][1]

    def group(self, group: int | str = 0) -> str | None:
        s, e = self._spans[self._g(group)]
        return None if s < 0 else self.string[s:e]

    def __getitem__(self, group: int | str) -> str | None:
        return self.group(group)

    def __repr__(self) -> str:
        return f"<linre.Match {self.span()} {self.group()!r}>"


class Pattern:
    """``body`` (RE2 syntax; ``flags`` any of ``i``, ``m``, ``s``) with optional one-character
    ``before`` / ``after`` context (see the module docstring)."""

    def __init__(self, body: str, flags: str = "", before: str | None = None, after: str | None = None):
        self.pattern = body
        self.before = before
        self.after = after
        full = f"(?P<m__>{body})"
        if before is not None:
            full = f"(?:{before}){full}"
        if after is not None:
            full = f"{full}(?:{after})"
        if flags:
            full = f"(?{flags}){full}"
        self._full = full

    def __getattr__(self, name: str):
        """The compiled pattern and its group tables, made on first use: importing a module full of
        patterns compiles none of them (and imports ``re2`` only when one runs)."""
        if name not in ("_rx", "_order", "_index", "groupindex"):
            raise AttributeError(name)
        import re2

        rx = re2.compile(self.__dict__["_full"])
        names = dict(rx.groupindex)
        # our group 0 is m__ (what lies between before and after); the others keep RE2's numbers
        self._order = [names.pop("m__")] + list(range(1, rx.groups + 1))
        self._index = names
        self.groupindex = dict(names)
        self._rx = rx
        return getattr(self, name)

    def _wrap(self, subj: Subject, m) -> Match:
        return Match(subj.text, [m.span(g) for g in self._order], self._index)

    def finditer(self, text: str | Subject, pos: int = 0, endpos: int | None = None) -> Iterator[Match]:
        """Non-overlapping matches, left to right (as ``re.finditer``)."""
        subj = _subject(text)
        data = subj.data
        end = len(data) if endpos is None else endpos
        while pos <= end:
            m = self._rx.search(data, pos, end)
            if m is None:
                return
            found = self._wrap(subj, m)
            yield found
            s, e = found.span()
            if e == s:
                pos = e + 1
            elif self.before is not None:
                pos = max(e - 1, s + 1)  # the last character may be the context of the next match
            else:
                pos = e

    def search(self, text: str | Subject, pos: int = 0, endpos: int | None = None) -> Match | None:
        return next(self.finditer(text, pos, endpos), None)

    def match(self, text: str | Subject, pos: int = 0, endpos: int | None = None) -> Match | None:
        """A match that starts at ``pos`` (patterns without ``before`` only)."""
        assert self.before is None, "anchored match with a look-behind"
        subj = _subject(text)
        m = self._rx.match(subj.data, pos, len(subj.data) if endpos is None else endpos)
        return None if m is None else self._wrap(subj, m)

    def fullmatch(self, text: str | Subject) -> Match | None:
        assert self.before is None and self.after is None
        subj = _subject(text)
        m = self._rx.fullmatch(subj.data)
        return None if m is None else self._wrap(subj, m)

    def findall(self, text: str | Subject) -> list[str]:
        return [m.group() for m in self.finditer(text)]

    def subn(self, repl: str | Callable[[Match], str], text: str | Subject, count: int = 0) -> tuple[str, int]:
        subj = _subject(text)
        out: list[str] = []
        last = n = 0
        for m in self.finditer(subj):
            s, e = m.span()
            out += [subj.text[last:s], repl(m) if callable(repl) else repl]
            last = e
            n += 1
            if count and n >= count:
                break
        if not n:
            return subj.text, 0
        out.append(subj.text[last:])
        return "".join(out), n

    def sub(self, repl: str | Callable[[Match], str], text: str | Subject, count: int = 0) -> str:
        return self.subn(repl, text, count)[0]


def compile(body: str, flags: str = "", before: str | None = None, after: str | None = None) -> Pattern:  # noqa: A001
    return Pattern(body, flags, before, after)
