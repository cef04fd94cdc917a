"""The server's secret-only scan (``find_secrets`` with ``kinds=SECRET_KINDS`` stops before the identity
passes) finds exactly what the full scan finds of those kinds, on the shipped examples, every real case
and a bundle with planted secrets of each kind."""

from __future__ import annotations

import json
from pathlib import Path

from kvreport.redact import SECRET_KINDS, find_secrets
from tests.helpers import minimal_bundle
from tests.paths import case_dirs

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "collector" / "kvreport" / "examples").glob("*.json"))
PLANTED = [
    "curl -u alice:s3cr3tPassw0rd https://user:pw123456@example.com/x?token=abcdef123456",
    "Authorization: Bearer abcdefghijklmnop1234 from bob@example.com at 10.1.2.3 in /home/bob",
    "HF_TOKEN=hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ012345 --api-key sk-abcdefghijklmnopqrstuvwx",
    "AKIAABCDEFGHIJKLMNOP aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "docker login -u me -p hunter2hunter2 registry.example.com; mysql -uroot -pS3cretPass db",
]


def _bundles() -> list[dict]:
    out = [json.loads(p.read_text()) for p in EXAMPLES]
    out += [minimal_bundle((c / "log.txt").read_text(errors="replace")) for c in case_dirs()]
    out.append(minimal_bundle("\n".join(PLANTED), command={"line": PLANTED[2], "argv": PLANTED[2].split(),
                                                           "env": {"HF_TOKEN": "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ012345"}}))
    return out


def test_secret_kinds_alone_match_the_full_scan():
    planted_found = False
    for b in _bundles():
        full = [(p, k) for p, k in find_secrets(b) if k in SECRET_KINDS]
        fast = find_secrets(b, kinds=SECRET_KINDS)
        assert fast == full, b.get("id")
        planted_found = planted_found or len(fast) >= 5
    assert planted_found
