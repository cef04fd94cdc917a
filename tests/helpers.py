"""Small builders shared by tests (no fakes of kvreport's own logic)."""

from __future__ import annotations

from datetime import datetime, timezone

from kvreport.bundle import SCHEMA_ID, new_bundle_id
from kvreport.excerpt import Excerpt


def minimal_bundle(log_text: str = "", **sections) -> dict:
    """A valid bundle holding ``log_text`` as its log excerpt, plus any given sections."""
    bundle = {
        "schema": SCHEMA_ID,
        "id": new_bundle_id(),
        "created_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "collector": {"name": "kvreport", "version": "test"},
        "host": {},
        "devices": [],
        "probes": {},
        "engine": {},
        "command": {},
        "model": None,
        "log": Excerpt().feed_all(log_text.splitlines()).to_log("test") if log_text else None,
        "memory_before_launch": [],
        "redactions": {},
    }
    bundle.update(sections)
    return bundle
