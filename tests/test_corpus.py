"""The real-report corpus (tests/data/corpus, labelled from the threads): its shape, and floors on the tuning
set's score so that a rule change that loses facts fails here (scripts/corpus.py prints the same figures)."""

from __future__ import annotations

import json
import sys

from tests.paths import CORPUS_DIR, ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import corpus  # noqa: E402


def test_every_case_names_its_thread_and_was_labelled_before_the_run():
    cases = [p for p in CORPUS_DIR.iterdir() if (p / "log.txt").is_file()]
    assert len(cases) + len([p for p in (ROOT / "tests" / "data" / "cases").iterdir() if p.is_dir()]) >= 250
    for case in cases:
        meta = json.loads((case / "case.json").read_text())
        exp = json.loads((case / "expected.json").read_text())
        assert meta.get("source") and meta.get("labelled_before_run") is True, case.name
        assert {"engine", "phase", "top_suggestions_ok", "is_kv_failure"} <= set(exp), case.name


def test_the_set_aside_quarter_is_chosen_by_thread():
    cases = corpus.all_cases()
    by_thread: dict[str, set[bool]] = {}
    for c in cases:
        by_thread.setdefault(corpus.thread_of(c), set()).add(corpus.is_holdout(c))
    assert all(len(v) == 1 for v in by_thread.values())
    tuned = [c for c in cases if c.parent == CORPUS_DIR and corpus.harvest_round(c) not in corpus.UNTUNED_ROUNDS]
    share = sum(corpus.is_holdout(c) for c in tuned) / len(tuned)
    assert 0.15 < share < 0.35
    # the rounds no rule was tuned on are set aside whole
    assert all(corpus.is_holdout(c) for c in cases if corpus.harvest_round(c) in corpus.UNTUNED_ROUNDS)


def test_tuning_set_floors():
    s = corpus.score([c for c in corpus.all_cases() if not corpus.is_holdout(c)])
    assert s["facts_pct"] >= 88.0, s["per_field"]
    right, total = s["first_suggestion"]
    # (0.70 until rounds 19-20 added 19 cases whose first fixes are mostly other engines' own knobs -- TPU, Tenstorrent,
    # Hexagon, MLC, FreeToken -- right on 4/19; 0.68 until round 23 added 6 whose fixes the log does not point at (a
    # trainer's script, an NPU context, an `ollama ps` table), right on 1/6: the floor guards against regressions at the
    # measured level, 150/221 after round 23)
    assert right / total >= 0.67
