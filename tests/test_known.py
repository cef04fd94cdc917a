"""Known upstream issues, offline (issue 14, item 2): the shipped catalog is well formed, its entries match the
real cases they describe (and not the others), analyze and collect print the match with no network, and a
fetched catalog is read alongside the shipped one."""

from __future__ import annotations

import json
import re
import socket

import pytest
from click.testing import CliRunner

from kvreport import known
from kvreport.analyze import _parse_command, diagnose
from kvreport.cli import main
from kvreport.logs import parse_file
from tests.paths import CASE_DIR

REPOS = ("ggml-org/llama.cpp", "ollama/ollama", "vllm-project/vllm", "sgl-project/sglang")
ENGINE_REPO = {"llama.cpp": "ggml-org/llama.cpp", "ollama": "ollama/ollama", "vllm": "vllm-project/vllm",
               "sglang": "sgl-project/sglang"}


def _case(prefix: str):
    found = [p for p in CASE_DIR.iterdir() if p.name.startswith(prefix)]
    assert len(found) == 1, prefix
    return found[0]


@pytest.fixture(autouse=True)
def _no_fetched_catalog(tmp_path, monkeypatch):
    """Every test reads the shipped catalog alone unless it writes a fetched one into its own data dir."""
    monkeypatch.setenv("KVREPORT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("KVREPORT_CONFIG_DIR", str(tmp_path / "config"))


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt fails the test: the catalog answers offline."""

    def refuse(*a, **k):
        raise AssertionError("kvreport tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


# --- the shipped catalog ----------------------------------------------------------------------------------

def test_shipped_catalog_is_well_formed():
    from kvreport import cmdline

    doc = known.read_catalog(known.SHIPPED, curated=True)
    entries = doc["entries"]
    assert len(entries) >= 20
    assert len({e["id"] for e in entries}) == len(entries)
    llama_flags = set(cmdline._LLAMA_BY_CANON)
    ollama_flags = set(cmdline._OLLAMA_ENV.values())
    for e in entries:
        m = re.match(r"^https://github\.com/([^/]+/[^/]+)/(issues|pull)/(\d+)$", e["url"])
        assert m and m.group(1) in REPOS, e["url"]
        patterns = e["match"]["signature"]
        for pattern in patterns if isinstance(patterns, list) else [patterns]:
            engine = pattern.split("/")[0]
            # an entry links the tracker of the engine it matches
            assert ENGINE_REPO[engine] == m.group(1), (e["id"], pattern)
            for flag in (e["match"].get("flags") or {}):
                allowed = llama_flags if engine == "llama.cpp" else ollama_flags if engine == "ollama" else None
                assert allowed is None or flag in allowed, (e["id"], flag)
        assert e["workaround"].strip() and e["title"].strip()
        for url in [e.get("fix_url"), *e.get("related", [])]:
            assert url is None or re.match(r"^https://github\.com/[^/]+/[^/]+/(issues|pull)/\d+$", url)
        assert e.get("status") in ("open", "fixed", "partly-fixed", "closed", "by-design")


def test_every_shipped_entry_names_one_engine_and_is_reachable_by_its_conditions():
    """No entry is dead: its signature names a real engine and every condition key is one the matcher reads."""
    for e in known.read_catalog(known.SHIPPED, True)["entries"]:
        assert set(e["match"]) <= set(known.CONDITIONS)
        assert not e["match"]["signature"].startswith("*")


@pytest.mark.parametrize("bad, words", [
    ({"url": "https://example.com/issues/1"}, "github.com"),
    ({"url": "https://github.com/ggml-org/llama.cpp/issues/abc"}, "github.com"),
    ({"match": {"signature": "llama.cpp/kv_cache"}}, "three parts"),
    ({"match": {"signature": "llama.cpp/kv/cuda"}}, "phase 'kv'"),
    ({"match": {"signature": "llama.cpp/*/*", "colour": "red"}}, "unknown condition"),
    ({"match": {"signature": "llama.cpp/*/*", "error": "(unclosed"}}, "RE2"),
    ({"match": {"signature": "llama.cpp/*/*", "error": "(a)\\1"}}, "RE2"),
    ({"match": {"signature": "llama.cpp/*/*", "build": {"min": "b4000"}}}, "build number"),
    ({"match": {"signature": "llama.cpp/*/*", "version": {"min": "new"}}}, "dotted version"),
    ({"match": {"signature": "llama.cpp/*/*", "flags": {"-ngl": True}}}, "canonical flag"),
    ({"id": "Bad Id"}, "id"),
    ({"workaround": ""}, "workaround"),
])
def test_validator_refuses_malformed_entries(bad, words):
    good = {"id": "x", "title": "t", "url": "https://github.com/ggml-org/llama.cpp/issues/1", "workaround": "w",
            "match": {"signature": "llama.cpp/*/*"}}
    assert known.entry_problem(good) is None
    problem = known.entry_problem({**good, **bad})
    assert problem and words in problem


def test_catalog_document_errors_are_one_line():
    with pytest.raises(known.CatalogError, match="schema"):
        known.validate_catalog({"entries": []})
    entry = {"id": "x", "title": "t", "url": "https://github.com/a/b/issues/1", "workaround": "w",
             "match": {"signature": "vllm/*/*"}}
    with pytest.raises(known.CatalogError, match="appears twice"):
        known.validate_catalog({"schema": known.SCHEMA, "entries": [entry, entry]})


# --- matching real cases ----------------------------------------------------------------------------------

EXPECTED = {
    "pub-043": ["ollama-vulkan-buffer-limit"],
    "pub-054": ["llamacpp-vulkan-compute-over-alloc-limit", "llamacpp-vulkan-strix-halo-context-ceiling"],
    "pub-104": ["llamacpp-openvino-max-alloc"],
    "pub-102": ["llamacpp-metal-recommended-working-set"],
    "pub-006": ["vllm-nonmonotonic-profiling"],
    "pub-008": ["vllm-negative-kv-memory-gptoss"],
    "pub-110": ["vllm-no-cache-blocks"],
    "pub-011": ["sglang-increase-mem-fraction"],
    "pub-024": ["sglang-hicache-pinned-over-4gb"],
    "pub-115": ["sglang-rocm-dp-negative-profiled-tokens"],
    # negatives: other failures of the same engines and backends match nothing
    "pub-001": [], "pub-012": [], "pub-016": [], "pub-105": [], "pub-107": [], "pub-113": [],
    "loc-21": [], "loc-29": [],
    # an explicit -c equal to the training context is not the old default
    "loc-15": [],
}


def _match_case(prefix: str, command: str | None = None) -> list[str]:
    case = _case(prefix)
    facts = parse_file(case / "log.txt")
    if command is None and (case / "command.txt").is_file():
        command = (case / "command.txt").read_text().strip()
    extra = {"command": _parse_command(command)} if command else {}
    diagnosis = diagnose(facts, extra)

    def lines():
        with open(case / "log.txt", encoding="utf-8", errors="replace") as fh:
            yield from fh

    return [m["id"] for m in known.match(diagnosis, extra, facts, log_lines=lines)]


@pytest.mark.parametrize("prefix", sorted(EXPECTED))
def test_catalog_matches_the_real_cases_it_describes(prefix):
    assert _match_case(prefix) == EXPECTED[prefix]


def test_flag_conditions_read_the_parsed_command():
    # the same Vulkan log with -ngl 0 on the command line: the 'even with -ngl 0' issue joins in
    ids = _match_case("pub-054", "llama-server -m /m/q.gguf -c 70016 -ngl 0")
    assert "llamacpp-vulkan-alloc-limit-at-ngl0" in ids
    assert "llamacpp-vulkan-alloc-limit-at-ngl0" not in _match_case("pub-054", "llama-server -m /m/q.gguf -ngl 99")
    # without a command line no flag condition holds
    assert "llamacpp-vulkan-alloc-limit-at-ngl0" not in _match_case("pub-054")


def test_versions_and_ranges():
    v = known.parse_version
    assert v("0.6.4.post1") > v("0.6.4") > v("0.6.4rc1") > v("0.6.4.dev3") > v("0.6.3")
    assert v("v0.15.5") == v("0.15.5") and v("0.5.13-rc2") < v("0.5.13")
    assert v("no version") is None
    # a lower bound needs evidence; an upper bound alone ("until fixed") holds for an unknown version
    assert not known._range_ok({"min": "0.15.5"}, None, v)
    assert known._range_ok({"max": "0.7.0"}, None, v)
    assert known._range_ok({"min": "0.15.5"}, "0.15.5", v) and not known._range_ok({"min": "0.15.5"}, "0.15.4", v)
    assert not known._range_ok({"above": "0.11.2"}, "0.11.2", v) and known._range_ok({"above": "0.11.2"}, "0.14.1", v)
    assert not known._range_ok({"min": 4069, "max": 4100}, 4100, int) and known._range_ok({"min": 4069}, 4069, int)


def test_build_and_version_come_from_the_bundle_engine_section():
    case = _case("pub-103")  # SYCL compute buffer, the b4069 regression; the log itself names no build
    facts = parse_file(case / "log.txt")
    diagnosis = diagnose(facts, {})
    assert "llamacpp-sycl-b4069-half-context" not in [m["id"] for m in known.match(diagnosis, {}, facts)]
    for build, hit in ((4100, True), (4000, False)):
        ids = [m["id"] for m in known.match(diagnosis, {"engine": {"name": "llama.cpp", "build_number": build}}, facts)]
        assert ("llamacpp-sycl-b4069-half-context" in ids) is hit


def test_nothing_failed_matches_nothing():
    case = _case("loc-02")
    facts = parse_file(case / "log.txt")
    assert known.match(diagnose(facts, {}), {}, facts) == []


# --- the CLI, offline -------------------------------------------------------------------------------------

def test_analyze_prints_a_catalog_match_offline(no_network):
    log = _case("pub-043") / "log.txt"
    r = CliRunner().invoke(main, ["analyze", str(log)])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.stdout.splitlines() if x.startswith("known: "))
    assert "https://github.com/ollama/ollama/issues/13029" in line and "workaround: " in line
    r = CliRunner().invoke(main, ["analyze", "--json", str(log)])
    out = json.loads(r.stdout)
    assert [k["id"] for k in out["known"]] == ["ollama-vulkan-buffer-limit"]
    assert set(out) - {"known"} == {"analyzer_version", "engine", "failure", "memory", "findings", "signature",
                                    "suggestions"}


def test_analyze_of_a_log_without_a_known_issue_prints_no_known_line(no_network):
    r = CliRunner().invoke(main, ["analyze", str(_case("loc-21") / "log.txt")])
    assert r.exit_code == 0 and "known: " not in r.stdout
    r = CliRunner().invoke(main, ["analyze", "--json", str(_case("loc-21") / "log.txt")])
    assert json.loads(r.stdout)["known"] == []


def test_collect_and_analyze_of_the_bundle_print_the_match(tmp_path, no_network):
    log = _case("pub-054") / "log.txt"
    out = tmp_path / "b.json"
    r = CliRunner().invoke(main, ["collect", "--log", str(log), "-o", str(out), "--probe-timeout", "1"])
    assert r.exit_code == 0, r.output
    assert "known: Vulkan refuses a single compute buffer" in r.stdout
    assert "https://github.com/ggml-org/llama.cpp/issues/12728" in r.stdout
    assert "partly fixed by https://github.com/ggml-org/llama.cpp/pull/16354" in r.stdout
    r = CliRunner().invoke(main, ["collect", "--log", str(log), "-o", str(tmp_path / "c.json"), "--json",
                                  "--probe-timeout", "1"])
    assert "llamacpp-vulkan-compute-over-alloc-limit" in [k["id"] for k in json.loads(r.stdout)["known"]]
    r = CliRunner().invoke(main, ["analyze", str(out)])
    assert r.exit_code == 0 and "https://github.com/ggml-org/llama.cpp/issues/12728" in r.stdout


def test_fetched_catalog_matches_too_and_a_broken_one_is_a_note(tmp_path, no_network):
    path = known.fetched_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {"id": "cluster-7", "title": "ROCm KV cache on RX 9060 XT", "url": "https://tracker.example/7",
             "cluster_url": "http://team.example/clusters/7", "status": "known_fix",
             "workaround": "Use -ngl 20 on these cards.", "match": {"signature": "llama.cpp/kv_cache/rocm"}}
    path.write_text(json.dumps({"schema": known.SCHEMA, "server": "http://team.example", "entries": [entry]}))
    log = str(_case("pub-105") / "log.txt")
    r = CliRunner().invoke(main, ["analyze", log])
    assert "known: ROCm KV cache on RX 9060 XT — https://tracker.example/7" in r.stdout
    assert "[from http://team.example]" in r.stdout
    listed = CliRunner().invoke(main, ["known"])
    assert "cluster-7  [llama.cpp/kv_cache/rocm]" in listed.stdout and "from http://team.example" in listed.stdout
    path.write_text("{not json")
    r = CliRunner().invoke(main, ["analyze", log])
    assert r.exit_code == 0 and "known: " not in r.stdout
    assert "is not JSON" in r.stderr and "kvreport known --update" in r.stderr


def test_known_update_without_a_server_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("KVREPORT_SERVER", raising=False)
    r = CliRunner().invoke(main, ["known", "--update"])
    assert r.exit_code == 2
    assert r.stderr.count("\n") == 1 and "no server configured" in r.stderr and "KVREPORT_SERVER" in r.stderr
    r = CliRunner().invoke(main, ["known", "--update", "--server", "ftp://nowhere"])
    assert r.exit_code == 2 and "not an http(s) URL" in r.stderr and "from --server" in r.stderr
    assert "Invalid" not in r.stderr and "Error" not in r.stderr


def test_catalog_ships_in_the_package_data():
    import tomllib

    from tests.paths import ROOT

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["kvreport"]
    assert "data/*.json" in cfg and known.SHIPPED.parent.name == "data"
