"""The real-report corpus: its table (engine, backend, year) and kvreport's score on it, per field.

    python scripts/corpus.py                 # tuning set: counts and the score per field
    python scripts/corpus.py --holdout       # also the set-aside quarter (score it once, at the end)
    python scripts/corpus.py --misses        # every wrong fact of the tuning set, one line each
    python scripts/corpus.py --json          # the same figures as JSON

Cases: tests/data/cases (copied from ../shared/cases and earlier harvests) and tests/data/corpus
(harvested from public threads; labelled from the thread before kvreport ran, see each case.json).
The set-aside quarter is chosen by THREAD (the case.json ``source`` up to its first space), with a
fixed seed, among the corpus cases only: sha256(SEED + thread) mod 4 == 0. Cases from one thread are
always on the same side, and adding cases never moves an old one. Rounds 3 and 5 (:data:`UNTUNED_ROUNDS`) are set
aside whole.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "collector")]

from kvreport.analyze import analyze_text  # noqa: E402
from kvreport.logs import parse_log  # noqa: E402

SEED = "kvreport-corpus-2026-12-01"
CASES = ROOT / "tests" / "data" / "cases"
CORPUS = ROOT / "tests" / "data" / "corpus"
KV_PHASES = ("kv_cache", "kv_capacity")
FIELDS = ("engine", "phase", "backend", "failing_device", "requested_mib", "free_mib", "verdict",
          "kv_printed_mib", "is_kv_failure")


def thread_of(case: Path) -> str:
    src = json.loads((case / "case.json").read_text()).get("source") or case.name
    return src.split(" ")[0].replace("https://github.com/", "").replace("/issues/", "#").replace("/pull/", "#")


UNTUNED_ROUNDS = {3, 5, 9}
"""Harvest rounds no rule was tuned on: every case of them is set aside, not only the seeded quarter."""


def is_holdout(case: Path) -> bool:
    if case.parent != CORPUS:
        return False
    if harvest_round(case) in UNTUNED_ROUNDS:
        return True
    return int(hashlib.sha256((SEED + thread_of(case)).encode()).hexdigest(), 16) % 4 == 0


def harvest_round(case: Path) -> int:
    """The harvest round a case came in (case.json ``harvest_round``; the first corpus and the shared cases are 1)."""
    meta = case / "case.json"
    return int(json.loads(meta.read_text()).get("harvest_round") or 1) if meta.is_file() else 1


def all_cases(rounds: set[int] | None = None) -> list[Path]:
    out = []
    for base in (CASES, CORPUS):
        if base.is_dir():
            out += sorted(p for p in base.iterdir() if (p / "log.txt").is_file() and (p / "expected.json").is_file()
                          and (p / "case.json").is_file())
    return [c for c in out if rounds is None or harvest_round(c) in rounds]


def diagnose(case: Path) -> dict:
    cmd = case / "command.txt"
    return analyze_text((case / "log.txt").read_text(errors="replace"),
                        cmd.read_text(errors="replace").strip() if cmd.is_file() else None)


def _close(a, b, rel):
    return a is not None and b is not None and abs(a - b) <= rel * max(abs(b), 1e-9)


def check(exp: dict, d: dict) -> dict[str, bool]:
    """field -> right? for every field the label judges (non-null)."""
    f, mem = d["failure"], d["memory"]
    got = {"engine": d["engine"], "phase": f["phase"], "backend": f["backend"], "failing_device": f["failing_device"],
           "verdict": f["verdict"], "is_kv_failure": f["phase"] in KV_PHASES}
    out = {}
    for k in FIELDS:
        want = exp.get(k)
        if want is None:
            continue
        if k == "requested_mib":
            out[k] = _close(f["requested_mib"], want, 0.01)
        elif k == "free_mib":
            out[k] = _close(f["free_mib"], want, 0.01)
        elif k == "kv_printed_mib":
            out[k] = _close(mem["kv_required_mib"], want, 0.005)
        elif k == "failing_device" and isinstance(want, str):
            out[k] = (got[k] or "").lower() in {want.lower(), want.lower().replace("metal", "mtl0")}
        else:
            out[k] = got[k] == want
    if exp.get("top_suggestions_ok"):
        out["first_suggestion"] = bool(d["suggestions"]) and d["suggestions"][0]["id"] in exp["top_suggestions_ok"]
    return out


def score(cases: list[Path]) -> dict:
    per = Counter()
    right = Counter()
    misses = []
    silent = []
    for case in cases:
        exp = json.loads((case / "expected.json").read_text())
        d = diagnose(case)
        for k, ok in check(exp, d).items():
            per[k] += 1
            right[k] += ok
            if not ok:
                misses.append(f"{case.name}: {k}")
        if exp.get("phase") not in (None, "none") and d["failure"]["phase"] == "none":
            silent.append(case.name)
    facts = sum(v for k, v in per.items() if k != "first_suggestion")
    facts_ok = sum(v for k, v in right.items() if k != "first_suggestion")
    return {"cases": len(cases), "facts": facts, "facts_right": facts_ok,
            "facts_pct": round(100 * facts_ok / facts, 1) if facts else None,
            "first_suggestion": [right["first_suggestion"], per["first_suggestion"]],
            "per_field": {k: [right[k], per[k]] for k in sorted(per)},
            "silent_over_failure": silent, "misses": misses}


def unread_memory_lines(cases: list[Path]) -> list[str]:
    """Memory-error lines that no specific rule read: the failure layer's net (``memory-words``) caught them."""
    out = []
    for case in cases:
        facts = parse_log((case / "log.txt").read_text(errors="replace").splitlines())
        out += [f"{case.name}:{e['lineno']}: {e['line'][:120]}" for e in facts.events
                if e["kind"] == "oom" and e.get("rule") == "memory-words"]
    return out


def table(cases: list[Path]) -> dict:
    eng, back, year = Counter(), Counter(), Counter()
    for case in cases:
        exp = json.loads((case / "expected.json").read_text())
        meta = json.loads((case / "case.json").read_text())
        eng[exp.get("engine") or "?"] += 1
        back[exp.get("backend") or meta.get("backend") or "?"] += 1
        year[str(meta.get("year") or "?")] += 1
    return {"engine": dict(eng.most_common()), "backend": dict(back.most_common()), "year": dict(sorted(year.items()))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--holdout", action="store_true", help="also score the set-aside quarter")
    ap.add_argument("--misses", action="store_true", help="list every wrong fact of the tuning set")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--round", type=int, action="append",
                    help="only the cases of this harvest round (repeatable; default: every round)")
    a = ap.parse_args(argv)
    cases = all_cases(set(a.round) if a.round else None)
    tune = [c for c in cases if not is_holdout(c)]
    hold = [c for c in cases if is_holdout(c)]
    out = {"table": table(cases), "n_cases": len(cases), "n_tuning": len(tune), "n_holdout": len(hold),
           "threads_holdout": len({thread_of(c) for c in hold}),
           "tuning": score(tune), "unread_memory_lines": unread_memory_lines(tune)}
    if a.holdout:
        out["unread_memory_lines_holdout"] = unread_memory_lines(hold)
    if a.holdout:
        out["holdout"] = score(hold)
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"corpus: {len(cases)} cases ({len(tune)} tuning, {len(hold)} set aside from "
          f"{out['threads_holdout']} threads)")
    for k, v in out["table"].items():
        print(f"  by {k}: " + ", ".join(f"{n} {c}" for n, c in v.items()))
    print(f"memory-error lines no specific rule read (the failure layer's net caught them), tuning set: "
          f"{len(out['unread_memory_lines'])}"
          + (f", set-aside quarter: {len(out['unread_memory_lines_holdout'])}" if a.holdout else ""))
    for line in out["unread_memory_lines"][:20] if a.misses else []:
        print("   unread", line)
    for name in ("tuning", "holdout"):
        s = out.get(name)
        if not s:
            continue
        fs = s["first_suggestion"]
        print(f"{name}: {s['facts_right']}/{s['facts']} facts right ({s['facts_pct']} %), first suggestion "
              f"{fs[0]}/{fs[1]}, 'no failure' over a failure: {len(s['silent_over_failure'])}")
        for k, (r, n) in s["per_field"].items():
            print(f"    {k:18s} {r:4d}/{n:<4d} {100 * r / n:5.1f} %")
        if a.misses and name == "tuning":
            for m in s["misses"]:
                print("   miss", m)
    return 0


if __name__ == "__main__":
    sys.exit(main())
