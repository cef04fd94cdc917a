"""Build the demo bundles shipped in collector/kvreport/examples/ from the real shared cases.

Each example is what `kvreport collect --log <case>/log.txt --command "<case>/command.txt"`
writes, keeping only the facts the public log itself gives (engine version and devices with
``source: "log"``) and removing what describes *this* machine (host, probed devices, probes,
engine binary): it was not part of the public report the log comes from. ``collector.example_of``
names the case. Run from the repository root::

    python scripts/make_examples.py [--shared ../shared]
    python scripts/make_examples.py --history-only --shared tests/data   # only history/demo_history.json

``history/demo_history.json`` holds, per example, the facts of its public report that a log does not
carry (the upstream issue, the engine build the reporter named, the fix that worked and who said
so), read from each case's ``case.json``. ``kvreport serve --demo`` builds its marked demo history
from them (``kvreport_server/demo.py``).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

CASES = [
    "loc-17-fail-huge-ctx-verbose",
    "loc-29-fail-np256-no-kv-unified-c4096",
    "loc-54-fail-swa-gemma2-huge-ctx",
    "pub-001-llamacpp-cpu-1m-ctx-kv-128gib",
    "pub-012-llamacpp-rocm-2x7900xtx-weights-on-gpu0-only",
    "pub-015-llamacpp-cuda-weights-144gb-negative",
    "pub-016-llamacpppython-cuda-5gpu-compute-buffer-small-gpu",
    "pub-021-koboldcpp-cuda-2gpu-150k-ctx-compute-buffer",
    "pub-026-llamacpp-cpu-deepseekv2-default-ctx-805gb-kv",
    "pub-035-llamacpppython-4xa100-deepseekv3-kv-200gib-on-gpu0",
    "pub-036-llamacpp-cuda-8x3090-dsv4-compute-buffer-cuda2",
    "pub-043-ollama-vulkan-rx6750xt-compute-buffer-exceeds-buffer-limit",
    "pub-054-llamacpp-vulkan-strix-halo-70k-ctx-compute-over-4gb",
    "pub-006-vllm-llama31-8b-29k-nonmonotonic-profiling",
    "pub-008-vllm-gptoss120b-h100-negative-kv-memory",
    "pub-040-vllm-a6000-other-processes-free-31of47",
]


_SOURCE = re.compile(r"^([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)#(\d+)")
_BUILD = re.compile(r"^b?(\d{3,6})\b")


def history_entry(name: str, facts: dict) -> dict:
    """The report facts of one case for the demo history (nothing invented here)."""
    source = str(facts.get("source") or "")
    m = _SOURCE.match(source)
    version = str(facts.get("engine_version") or "")
    b = _BUILD.match(version) if facts.get("engine") in ("llama.cpp",) and not name.startswith("loc-") else None
    fix = facts.get("fix_that_worked")
    return {
        "example": f"{name[:40]}.json", "case": name, "source": source or None,
        "source_url": f"https://github.com/{m.group(1)}/issues/{m.group(2)}" if m else None,
        "engine_version": version or None, "build_number": int(b.group(1)) if b else None,
        "fix_that_worked": fix if fix and fix_is_confirmed(facts) else None,
        "fix_source": facts.get("fix_source"), "devices": facts.get("devices") or [],
    }


def fix_is_confirmed(facts: dict) -> bool:
    return str(facts.get("fix_source") or "") in ("maintainer said", "reporter confirmed", "confirmed")


def write_history(cases: Path, out: Path) -> None:
    entries = []
    for name in CASES:
        path = cases / name / "case.json"
        facts = json.loads(path.read_text()) if path.is_file() else {}
        entries.append(history_entry(name, facts))
    (out / "history").mkdir(parents=True, exist_ok=True)
    (out / "history" / "demo_history.json").write_text(json.dumps(entries, indent=1, ensure_ascii=False) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = Path(__file__).resolve().parents[1]
    ap.add_argument("--shared", type=Path, default=root.parent / "shared")
    ap.add_argument("--out", type=Path, default=root / "collector" / "kvreport" / "examples")
    ap.add_argument("--history-only", action="store_true", help="write history/demo_history.json only")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    write_history(args.shared / "cases", args.out)
    if args.history_only:
        return 0
    for old in args.out.glob("*.json"):
        old.unlink()
    for name in CASES:
        case = args.shared / "cases" / name
        cmd = [sys.executable, "-m", "kvreport.cli", "collect", "--log", str(case / "log.txt"), "--yes"]
        if (case / "command.txt").is_file():
            cmd += ["--command", (case / "command.txt").read_text().strip()]
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "b.json"
            subprocess.run(cmd + ["-o", str(path)], check=True, capture_output=True, text=True)
            bundle = json.loads(path.read_text())
        # Keep only what the public log itself says (source "log"); drop this machine's probes.
        bundle["host"], bundle["probes"] = {}, {}
        bundle["devices"] = [d for d in bundle.get("devices") or [] if d.get("source") == "log"]
        bundle["memory_before_launch"] = []
        engine = bundle.get("engine") or {}
        keep = ("name", "program") + (("version", "build_number", "commit", "version_source")
                                      if engine.get("version_source") == "log" else ())
        bundle["engine"] = {k: engine[k] for k in keep if k in engine}
        bundle["collector"]["example_of"] = name
        (args.out / f"{name[:40]}.json").write_text(json.dumps(bundle, indent=1, ensure_ascii=False) + "\n")
        print(f"{name}: {bundle['id']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
