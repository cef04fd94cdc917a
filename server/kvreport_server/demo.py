"""The data of ``kvreport serve --demo``: the example bundles kvreport ships (real cases, real
facts), plus a demo history built from them and marked as such in every bundle
(``collector.demo``) so that each page has something to show: several reports per cluster over
the last weeks from several machines, the engine builds the public reports name (a regression
view), the fixes that worked and the upstream issues (statuses, known fixes, issue links), and a
cluster where one OS stands out (correlations).

What is real: each copy's log, command, devices, diagnosis and signature (the shipped example
unchanged), the upstream issue, the build the reporter named and the fix that worked
(``examples/history/demo_history.json``, from each case's ``case.json``). What is invented and
says so in ``collector.demo``: when the copies were received, the machines they came from, and
the OS of a machine where the report does not give one.

``kvreport admin remove-demo`` removes all of it (``store.remove_demo``).
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
from pathlib import Path

from kvreport_server import store
from kvreport_server.db import Database
from kvreport_server.models import Bundle, Cluster, utcnow

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
COPIES = {"pub-043": 5, "pub-054": 3, "pub-036": 3, "pub-001": 2, "pub-012": 2, "pub-015": 2, "pub-026": 3,
          "loc-17": 4, "loc-29": 2, "pub-040": 2, "pub-006": 1, "pub-016": 1}
"""How many demo copies each case gets (by the prefix of its case name; others get none)."""


def history_path(examples: Path) -> Path:
    return examples / "history" / "demo_history.json"


def demo_id(*parts) -> str:
    """A stable bundle id (ULID alphabet) for a demo copy, so a second ``--demo`` start adds nothing."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    n = int.from_bytes(digest[:17], "big")
    chars = []
    for _ in range(26):
        n, r = divmod(n, 32)
        chars.append(CROCKFORD[r])
    chars[-1] = "0"  # first character (after the reverse) below 8, as in a real ULID
    return "".join(reversed(chars))


def _os_of(entry: dict) -> tuple[str, bool]:
    """The OS of the report when its devices say so (real), else Linux (invented, marked)."""
    for d in entry.get("devices") or []:
        name = str((d or {}).get("name") or "")
        if "Windows" in name:
            return "Windows", True
    return "Linux", False


def _copy(example: dict, entry: dict, k: int) -> dict:
    b = copy.deepcopy(example)
    case = entry["case"]
    os_name, os_real = _os_of(entry)
    b["id"] = demo_id("kvreport-demo", case, k)
    b["host"] = {"os": os_name, "machine": "x86_64", "cpu_model": f"demo machine {k + 1} for {case[:30]}"}
    engine = dict(b.get("engine") or {})
    invented = ["when it was received", "the machine it came from"] + ([] if os_real else ["its OS"])
    if entry.get("build_number") is not None and not engine.get("build_number"):
        engine.update({"version": f"b{entry['build_number']}", "build_number": entry["build_number"],
                       "version_source": "report"})
    b["engine"] = engine
    source = entry.get("source") or "a local run"
    b["collector"] = {**(b.get("collector") or {}), "example_of": case,
                      "demo": (f"demo history: a copy of the real case {case} ({source}); the log, command and "
                               f"devices are the report's{', the engine build is the one the report names' if engine.get('version_source') == 'report' else ''}; "
                               f"invented: {', '.join(invented)}.")}
    return b


def _maintainer_state(entry: dict) -> dict:
    """Known fix / issue link / status a maintainer would set, from the public report."""
    url = entry.get("source_url")
    if entry.get("fix_that_worked"):
        fix = (f"{entry['fix_that_worked']}\n\n_Demo: the fix from the public report "
               f"[{entry['source']}]({url}) ({entry.get('fix_source')})._" if url else entry["fix_that_worked"])
        return {"known_fix": fix, "issue_url": url, "status": "known_fix"}
    if url and entry["case"].startswith(("pub-043", "pub-008", "pub-040")):
        return {"issue_url": url, "status": "linked_issue"}
    return {}


def load_demo(db: Database, examples: Path, now: dt.datetime | None = None) -> dict:
    """Store the shipped examples and the demo history; returns ``{"examples", "history", "clusters"}``
    counts of what was added (0 on a second run)."""
    from kvreport.bundle import validate_bundle

    now = now or utcnow()
    path = history_path(examples)
    entries = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
    added = {"examples": 0, "history": 0, "clusters": 0}
    for i, entry in enumerate(entries):
        file = examples / entry["example"]
        if not file.is_file():
            continue
        example = validate_bundle(json.loads(file.read_text(encoding="utf-8")))
        # the shipped example itself: the newest report of its cluster
        if store.ingest(db, example, size_bytes=file.stat().st_size,
                        received_at=now - dt.timedelta(hours=2 + i)).status == 201:
            added["examples"] += 1
        n = next((v for prefix, v in COPIES.items() if entry["case"].startswith(prefix)), 0)
        for k in range(n):
            b = validate_bundle(_copy(example, entry, k))
            t = now - dt.timedelta(days=(3 + 5 * k + 2 * i) % 29 + 1, hours=(7 * k + i) % 23)
            result = store.ingest(db, b, size_bytes=len(json.dumps(b)), received_at=t)
            added["history"] += result.status == 201
        state = _maintainer_state(entry)
        if state:
            added["clusters"] += _set_state(db, example["id"], state)
    return added


def _set_state(db: Database, bundle_id: str, state: dict) -> int:
    """Set a demo cluster's known fix / issue / status unless a maintainer already set one."""
    with db.write_lock(), db.Session() as session, session.begin():
        row = session.get(Bundle, bundle_id)
        c = session.get(Cluster, row.cluster_id, with_for_update=True) if row is not None else None
        if c is None or c.known_fix or c.issue_url or c.status != "new":
            return 0
        c.known_fix = state.get("known_fix")
        c.issue_url = state.get("issue_url")
        c.status = state.get("status", c.status)
        c.updated_at = utcnow()
        return 1
