"""Bounded capture of an engine log: every key line plus the tail, with the total line count.

`kvreport run` feeds a child's output through :class:`Excerpt` line by line, so memory stays
bounded for a process that logs for days; `kvreport collect --log` feeds a file the same way.
Which lines are "key" is decided by :func:`kvreport.logs.is_key_line` (the lines any parser
uses), so ``analyze(bundle)`` sees every line that analyzing the whole log would use.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from kvreport.logs import is_key_line

DEFAULT_MAX_KEY_LINES = 3000
DEFAULT_TAIL_LINES = 400
DEFAULT_MAX_LINE_CHARS = 4000


class Excerpt:
    """Accumulates a log: at most ``max_key_lines`` key lines and the last ``tail_lines`` lines.

    Lines longer than ``max_line_chars`` characters are cut (with a ``…[cut]`` mark). Line numbers
    are 1-based and refer to the whole log.
    """

    def __init__(self, max_key_lines: int = DEFAULT_MAX_KEY_LINES, tail_lines: int = DEFAULT_TAIL_LINES,
                 max_line_chars: int = DEFAULT_MAX_LINE_CHARS):
        self.max_key_lines = max_key_lines
        self.max_line_chars = max_line_chars
        self.line_count = 0
        self.key: list[tuple[int, str]] = []
        self.key_dropped = 0
        self.tail: deque[tuple[int, str]] = deque(maxlen=tail_lines)

    def feed(self, line: str) -> None:
        """Add one line (a trailing newline or CR is removed)."""
        line = line.rstrip("\r\n")
        if len(line) > self.max_line_chars:
            line = line[: self.max_line_chars] + "…[cut]"
        self.line_count += 1
        item = (self.line_count, line)
        if is_key_line(line):
            if len(self.key) < self.max_key_lines:
                self.key.append(item)
            else:
                self.key_dropped += 1
        self.tail.append(item)

    def feed_all(self, lines: Iterable[str]) -> Excerpt:
        for line in lines:
            self.feed(line)
        return self

    def lines(self) -> list[tuple[int, str]]:
        """Key lines and tail merged in log order, without duplicates."""
        merged = {n: t for n, t in self.key}
        merged.update({n: t for n, t in self.tail})
        return sorted(merged.items())

    def to_log(self, source: str) -> dict:
        """The bundle's ``log`` section (see ``kvreport.bundle``)."""
        kept = self.lines()
        return {
            "line_count": self.line_count,
            "truncated": len(kept) < self.line_count,
            "source": source,
            "lines": [[n, t] for n, t in kept],
        }
