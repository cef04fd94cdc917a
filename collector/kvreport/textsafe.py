"""Untrusted text made safe to show: bidirectional-override controls become visible markers.

A log line may carry U+202E (right-to-left override) and its kin; shown as they are, they reorder what a reader sees
(a filename or a command that reads differently than it is). The pages, the Markdown issue body and the terminal
text show them as ``<U+202E>``. Escaping HTML and Markdown is the renderers' job; this is only the bidi controls.
"""

from __future__ import annotations

import re

_BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def visible_controls(text: str) -> str:
    """``text`` with every bidirectional control character replaced by ``<U+XXXX>``."""
    if not isinstance(text, str):
        return text
    return _BIDI.sub(lambda m: f"<U+{ord(m.group(0)):04X}>", text)
