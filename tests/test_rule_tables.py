"""Log rules as data: parsers written as rule tables derive their prefilter keywords from the table, and over every
real log in the repository every line a rule's pattern matches passes the prefilter (so the excerpt, the grep path
and the Python path all select it)."""

from __future__ import annotations

import pytest

from kvreport.logs import KEYWORDS, is_key_line, llamacpp, oom, sglang
from tests.paths import CASE_DIR, CORPUS_DIR


class _Rule:
    def __init__(self, name, pattern):
        self.name, self.pattern, self.keywords = name, pattern, ("-",)


TABLES = {"oom": (*oom.RULES, oom.FATAL), "sglang": sglang.RULES,
          "llamacpp failure chain": tuple(_Rule(name, rx) for name, _lit, rx, _h in llamacpp.FAILURE_RULES)}
LOGS = sorted(p / "log.txt" for base in (CASE_DIR, CORPUS_DIR) for p in base.iterdir() if (p / "log.txt").is_file())


@pytest.mark.parametrize("name", ["oom", "sglang"])
def test_keywords_come_from_the_table(name):
    module = {"oom": oom, "sglang": sglang}[name]
    derived = {k for r in TABLES[name] for k in r.keywords}
    assert derived <= set(module.KEYWORDS) <= set(KEYWORDS) | derived
    assert all(r.keywords for r in TABLES[name])


def test_every_line_a_rule_matches_passes_the_prefilter():
    missed = []
    for log in LOGS:
        for line in log.read_text(errors="replace").splitlines():
            if is_key_line(line):
                continue  # (a key line passes whatever rule matches it: only the others are searched)
            for name, rules in TABLES.items():
                for r in rules:
                    if r.pattern.search(line):
                        missed.append((log.parent.name, name, getattr(r, "id", getattr(r, "name", "?")), line[:100]))
    assert not missed, missed[:10]


def test_llamacpp_keywords_come_from_its_sections():
    assert set(llamacpp.KEYWORDS) == {k for section in llamacpp.SECTIONS for k in section.keywords}
    assert set(llamacpp.FAILURE_KEYWORDS) <= set(llamacpp.KEYWORDS)
