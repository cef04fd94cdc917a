"""Every real case of tests/data/cases (each case.json names its public source or local run) as a test of the analyzer.

Asserts every non-null fact of the case's expected.json (cases/README.md):
engine, phase, backend, failing_device, requested_mib (±1 %), verdict, the first suggestion (any
id of ``top_suggestions_ok`` when that list is not empty), ``kv_printed_mib`` against
``memory.kv_required_mib`` (±0.5 %), and ``is_kv_failure``.

``is_kv_failure`` mapping (documented here and in kvreport.analyze): a failure is a KV failure when
its phase is ``kv_cache`` (a KV/RS buffer could not be allocated) or ``kv_capacity`` (the
engine's KV pool cannot hold its configured maximum length); every other phase is not.
"""

from __future__ import annotations

import json

import pytest

from kvreport import vocab
from kvreport.analyze import analyze, analyze_text
from kvreport.cmdline import parse_command
from kvreport.excerpt import Excerpt
from kvreport.logs import parse_log
from tests.paths import case_dirs, load_expected

CASES = case_dirs()
KV_PHASES = ("kv_cache", "kv_capacity")


def _command(case):
    p = case / "command.txt"
    return p.read_text(errors="replace").strip() if p.is_file() else None


def _diagnose(case):
    return analyze_text((case / "log.txt").read_text(errors="replace"), _command(case))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_matches_expected(case):
    exp = load_expected(case)
    d = _diagnose(case)
    f, mem = d["failure"], d["memory"]
    if exp.get("engine") is not None:
        assert d["engine"] == exp["engine"]
    if exp.get("phase") is not None:
        assert f["phase"] == exp["phase"]
    if exp.get("backend") is not None:
        assert f["backend"] == exp["backend"]
    if exp.get("failing_device") is not None:
        assert f["failing_device"] == exp["failing_device"]
    if exp.get("requested_mib") is not None:
        assert f["requested_mib"] == pytest.approx(exp["requested_mib"], rel=0.01)
    if exp.get("verdict") is not None:
        assert f["verdict"] == exp["verdict"]
    if exp.get("top_suggestions_ok"):
        assert d["suggestions"], "a fix was expected"
        assert d["suggestions"][0]["id"] in exp["top_suggestions_ok"], [s["id"] for s in d["suggestions"]]
    if exp.get("kv_printed_mib") is not None:
        assert mem["kv_required_mib"] == pytest.approx(exp["kv_printed_mib"], rel=0.005)
    if exp.get("is_kv_failure") is not None:
        assert (f["phase"] in KV_PHASES) == exp["is_kv_failure"]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_diagnosis_shape(case):
    d = _diagnose(case)
    assert set(d) == {"analyzer_version", "engine", "failure", "memory", "findings", "signature", "suggestions"}
    assert set(d["failure"]) == {"phase", "backend", "failing_device", "requested_mib", "free_mib",
                                 "allocator_error", "final_error", "verdict"}
    assert set(d["memory"]) == {"kv_required_mib", "rs_required_mib", "kv_mib_per_1k_tokens", "max_ctx_fit",
                                "fit", "inputs"}
    assert d["memory"]["inputs"]["source"] in ("gguf", "log", "assumed")
    assert set(d["signature"]) == {"id", "key", "title", "scheme", "notes"}
    for s in d["suggestions"]:
        assert set(s) == {"id", "title", "change", "command", "expected", "why"}
    if d["failure"]["phase"] == "none":
        assert d["suggestions"] == []
    # strict mode: no step fell back, no parser skipped a line
    assert not [x for x in d["findings"] if x["kind"] == "analyzer_error"]
    assert not [w for w in parse_log((case / "log.txt").read_text(errors="replace").splitlines()).warnings
                if "skipped line" in w]
    # kvreport's own arithmetic agrees with every KV size the engine printed
    assert not [x for x in d["findings"] if x["kind"] == "kv_model_mismatch"]
    # types, units and vocabularies of design.md's diagnosis contract
    f, m = d["failure"], d["memory"]
    assert d["engine"] in vocab.ENGINES
    assert f["phase"] in vocab.PHASES
    assert f["backend"] in vocab.BACKENDS
    assert f["verdict"] in vocab.VERDICTS
    for key in ("requested_mib", "free_mib"):
        assert f[key] is None or isinstance(f[key], float)
    for key in ("kv_required_mib", "rs_required_mib", "kv_mib_per_1k_tokens"):
        assert m[key] is None or isinstance(m[key], float)
    if m["max_ctx_fit"] is not None:
        assert set(m["max_ctx_fit"]) == {"f16", "q8_0", "q4_0"}
        assert all(isinstance(v, int) and v % 256 == 0 for v in m["max_ctx_fit"].values())
    if m["fit"] is not None:
        assert set(m["fit"]) == {"ran", "status", "changed"} and isinstance(m["fit"]["ran"], bool)
        assert all(isinstance(v, list) and len(v) == 2 for v in m["fit"]["changed"].values())
    assert set(m["inputs"]) == {"n_ctx", "n_seq", "n_layer", "n_head_kv", "head_dim_k", "head_dim_v", "cache_type_k",
                                "cache_type_v", "n_swa", "source"}
    assert all(set(x) == {"kind", "text", "line"} for x in d["findings"])
    assert isinstance(d["signature"]["scheme"], int) and d["signature"]["key"].count("/") == 2
    from kvreport.fixes import SUGGESTION_IDS

    assert all(s["id"] in SUGGESTION_IDS and isinstance(s["change"], dict) for s in d["suggestions"])
    json.dumps(d)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bundle_excerpt_gives_same_diagnosis(case):
    """analyze(bundle) with the bounded excerpt equals analyzing the whole log (design.md)."""
    text = (case / "log.txt").read_text(errors="replace")
    cmd = _command(case)
    whole = analyze_text(text, cmd)
    bundle = {"log": Excerpt().feed_all(text.splitlines()).to_log("file"),
              "command": parse_command(cmd) if cmd else {}}
    assert analyze(bundle) == whole


_PROBE_DEVICES = [{"backend": b, "index": i, "name": f"probe {b}{i}", "total_mib": 500000.0, "free_mib": 400000.0,
                   "source": "nvidia-smi"} for b in ("cuda", "rocm", "vulkan", "metal", "sycl") for i in range(4)]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_collect_time_probes_do_not_change_the_verdict(case):
    """Free memory probed when the bundle is collected (after the crash) is not "before launch": a
    bundle whose host/devices claim lots of free memory gives the failure, verdict, signature and
    suggestions of the bare log (QA #2)."""
    text = (case / "log.txt").read_text(errors="replace")
    cmd = _command(case)
    whole = analyze_text(text, cmd)
    bundle = {"log": Excerpt().feed_all(text.splitlines()).to_log("file"),
              "command": parse_command(cmd) if cmd else {},
              "host": {"ram_total_mib": 1000000.0, "ram_free_mib": 900000.0},
              "devices": _PROBE_DEVICES}
    d = analyze(bundle)
    assert d["failure"] == whole["failure"]
    assert d["signature"] == whole["signature"]
    assert d["memory"] == whole["memory"]
    assert d["suggestions"] == whole["suggestions"]
    extra = [x for x in d["findings"] if x not in whole["findings"]]
    assert all(x["kind"] == "free_at_collection" and "collection time" in x["text"] for x in extra)


def test_memory_before_launch_is_used_when_the_log_has_no_free_figure():
    log = ["ggml_backend_cuda_buffer_type_alloc_buffer: allocating 8192.00 MiB on device 0: cudaMalloc failed: "
           "out of memory",
           "alloc_tensor_range: failed to allocate CUDA0 buffer of size 8589934592",
           "llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache"]
    bare = analyze({"log": {"lines": [[i + 1, t] for i, t in enumerate(log)]}})
    assert bare["failure"]["free_mib"] is None
    d = analyze({"log": {"lines": [[i + 1, t] for i, t in enumerate(log)]},
                 "memory_before_launch": [{"device": "CUDA0", "free_mib": 6000.0, "total_mib": 8192.0}],
                 "devices": [{"backend": "cuda", "index": 0, "free_mib": 8000.0}]})
    assert d["failure"]["free_mib"] == 6000.0
    assert d["failure"]["verdict"] == "exceeds_free"


def test_recovered_pinned_fallback_is_a_finding_not_the_failure():
    case = next(c for c in CASES if c.name.startswith("pub-023"))
    d = _diagnose(case)
    assert d["failure"]["phase"] == "none"
    assert [x for x in d["findings"] if x["kind"] == "recovered_allocation"]


def test_retry_without_pipeline_parallelism_that_worked_is_recovered():
    case = next(c for c in CASES if c.name.startswith("pub-039"))
    d = _diagnose(case)
    assert d["failure"]["phase"] == "none"
    assert any("pipeline parallelism" in x["text"] for x in d["findings"])


def _strip_text_fields(d):
    d = {**d, "failure": {**d["failure"], "allocator_error": None, "final_error": None}}
    d["findings"] = [{**x, "line": None} for x in d["findings"]]
    return d


@pytest.mark.parametrize("variant", ["no_prefix", "crlf", "github_quote", "ansi", "jsonl", "docker"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_framing_variants_give_the_same_diagnosis(case, variant):
    """The same log without timestamps/levels, with CRLF, quoted from a GitHub comment, coloured,
    as --log-jsonl records or behind a docker-compose column gives the same diagnosis."""
    import json
    import re

    text = (case / "log.txt").read_text(errors="replace")
    cmd = _command(case)
    base = _strip_text_fields(analyze_text(text, cmd))
    lines = text.splitlines()
    prefix = re.compile(r"^\d+\.\d+\.\d+\.\d+ ([IWED]) ")
    if variant == "no_prefix":
        out = "\n".join(prefix.sub("", ln) for ln in lines)
    elif variant == "crlf":
        out = "\r\n".join(lines)
    elif variant == "github_quote":
        out = "> ```\n" + "\n".join("> " + ln for ln in lines) + "\n> ```"
    elif variant == "ansi":
        out = "\n".join(f"\x1b[3{i % 7}m{ln}\x1b[0m" for i, ln in enumerate(lines))
    elif variant == "jsonl":
        levels = {"I": "info", "W": "warn", "E": "error", "D": "debug"}
        rec = []
        for ln in lines:
            m = prefix.match(ln)
            rec.append(json.dumps({"type": "log", "time": 1, "level": levels[m.group(1)], "msg": ln[m.end():] + "\n"})
                       if m else ln)
        out = "\n".join(rec)
    else:
        out = "\n".join(f"llama-1  | {ln}" for ln in lines)
    assert _strip_text_fields(analyze_text(out, cmd)) == base


# ---------------------------------------------------------------- every suggestion's numbers agree with the diagnosis

def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _close(a: float, b: float) -> bool:
    """Equal as the texts print them (MiB >= 100 without decimals, smaller ones with two)."""
    return abs(a - b) <= max(0.51, 0.005 * abs(b))


_KV_OF = __import__("re").compile(r"KV ([\d,.]+) MiB of ([\d,.]+) MiB")
_NOW = __import__("re").compile(r"now ([\d,.]+) MiB")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_suggestion_texts_agree_with_the_numbers(case):
    """For every case: a reduce-ctx value is <= max_ctx_fit of the cache type in force and below the current context;
    "the largest -c ... whose KV fits" is exactly max_ctx_fit; a training-context cap says so and gives the fit;
    "KV X MiB of Y MiB" has X <= Y; "now N MiB" and "instead of N MiB" are the diagnosis's kv_required_mib;
    "up to N tokens would fit at q8_0" is max_ctx_fit["q8_0"]; a q8_0 KV still over the free memory says so;
    "R MiB needed, F MiB free" has R > F (else it is worded as memory taken since); bisect-regression's request fits
    and is not a host buffer (or the failure is not about memory); raise-memory-limit only for a host buffer that fit
    (or Metal's working set)."""
    import re

    from kvreport.logs import parse_log

    text = (case / "log.txt").read_text(errors="replace")
    d = _diagnose(case)
    f, m = d["failure"], d["memory"]
    fits = m["max_ctx_fit"] or {}
    ct = m["inputs"]["cache_type_k"] if m["inputs"]["cache_type_k"] in ("f16", "q8_0", "q4_0") else "f16"
    n_train = parse_log(text.splitlines()).hparams.get("n_ctx_train")
    host = f["backend"] == "cpu" or str(f["failing_device"] or "").endswith("_Host") \
        or str(f["failing_device"] or "").startswith("CPU")
    for s in d["suggestions"]:
        sid, exp, why = s["id"], s["expected"], s["why"]
        for mm in _KV_OF.finditer(exp):
            assert _num(mm.group(1)) <= _num(mm.group(2)) * 1.001, (sid, exp)
        if sid == "reduce-ctx":
            vals = [v for v in s["change"].values() if isinstance(v, int)]
            for v in vals:
                if m["inputs"]["n_ctx"]:
                    assert v < m["inputs"]["n_ctx"], (v, m["inputs"])
                if fits:
                    assert fits[ct] > 0 and v <= fits[ct], (v, fits, ct)
                if "the largest -c" in why:
                    assert fits and v == fits[ct], (v, fits, why)
                if "training context" in why:
                    assert n_train and v == int(n_train), (v, n_train, why)
                    if fits:
                        assert f"{fits[ct]:,} tokens would fit" in why and f"{fits[ct]:,} tokens would fit" in exp
                if "starting point" in why:
                    assert not fits and "the largest" not in why
            mm = _NOW.search(exp)
            if mm and m["kv_required_mib"] is not None:
                assert _close(_num(mm.group(1)), m["kv_required_mib"]), (exp, m["kv_required_mib"])
        elif sid == "quantize-kv-cache":
            mm = re.search(r"KV ([\d,.]+) MiB instead of ([\d,.]+) MiB", exp)
            if mm:
                assert _close(_num(mm.group(2)), m["kv_required_mib"]), (exp, m["kv_required_mib"])
                q8 = _num(mm.group(1))
                if f["phase"] == "kv_cache" and f["verdict"] == "exceeds_free" and f["free_mib"] is not None \
                        and q8 > f["free_mib"]:
                    assert "still more than" in exp, exp
            mm = re.search(r"up to ([\d,]+) tokens would fit at q8_0", exp)
            if mm:
                assert int(_num(mm.group(1))) == fits["q8_0"], (exp, fits)
        elif sid == "free-device-memory":
            mm = re.search(r"([\d,.]+) MiB needed, ([\d,.]+) MiB free", exp)
            if mm:
                assert _close(_num(mm.group(1)), f["requested_mib"]) and _num(mm.group(1)) > _num(mm.group(2)), exp
        elif sid == "bisect-regression" and f["phase"] == "unknown" and ("does not know the architecture" in exp
                                                                       or "failed on something that is not memory" in exp):
            pass  # a failure that is not about memory (a crash, an architecture the build does not know)
        elif sid == "bisect-regression":
            assert not host and f["verdict"] == "fits_but_failed", (f, exp)
            mm = re.search(r"([\d,.]+) MiB requested with ([\d,.]+) MiB free", exp)
            assert mm and _num(mm.group(1)) <= _num(mm.group(2)), exp
        elif sid == "raise-memory-limit" and f["backend"] == "metal" and "iogpu.wired_limit_mb" in exp:
            pass  # macOS's cap on the GPU's share of unified memory, not a buffer's size
        elif sid == "raise-memory-limit":
            assert host and f["verdict"] in ("fits_but_failed", "exceeds_alloc_limit"), f
            assert f"{f['requested_mib']:,.0f}" in exp or f"{f['requested_mib']:,.2f}" in exp, exp


_CAPPED = [c for c in CASES if (c / "case.json").is_file()
           and json.loads((c / "case.json").read_text()).get("memory_cap_kib")
           and json.loads((c / "case.json").read_text()).get("exit_code") not in (0, None)]


@pytest.mark.parametrize("case", _CAPPED, ids=[c.name for c in _CAPPED])
def test_host_buffer_refused_under_a_memory_cap_suggests_raising_the_limit(case):
    """loc-21/23/26/41/56 ran under `ulimit -v` (case.json memory_cap_kib): a CPU buffer far under the RAM the log
    reported was refused. Their expected.json do not judge the ranking (top_suggestions_ok is empty); the reasoning
    (kvreport.fixes._raise_memory_limit) is that no regression explains it and a per-process cap does."""
    d = _diagnose(case)
    # the command's `ulimit -v` is recorded (command.limits): the verdict names the cap
    assert d["failure"]["verdict"] == "exceeds_alloc_limit" and d["failure"]["backend"] == "cpu"
    top = d["suggestions"][0]
    cap = json.loads((case / "case.json").read_text())["memory_cap_kib"]
    assert top["id"] == "raise-memory-limit" and f"ulimit -v {cap}" in top["expected"], top
    assert "/sys/fs/cgroup/memory.max" in top["why"]
    assert not any(s["id"] in ("bisect-regression", "free-device-memory") for s in d["suggestions"])


_CAUSES = {"loc-32": "n_seq_max must be <= 256", "loc-36": "does not support different K (q8_0) and V (f16)",
           "loc-38": "not within the file bounds", "loc-40": "unknown model architecture: 'tinyfoo'"}


@pytest.mark.parametrize("prefix", sorted(_CAUSES))
def test_non_memory_failure_shows_its_cause_and_no_invented_kv(prefix):
    """QA #5: the specific reason, not the generic 'exiting due to model loading error', is final_error
    and is printed; no KV line is made up when no cache was configured or sized."""
    from kvreport.render import render_text

    case = next(c for c in CASES if c.name.startswith(prefix + "-"))
    d = analyze_text((case / "log.txt").read_text(errors="replace"))
    assert d["failure"]["phase"] == "unknown"
    assert _CAUSES[prefix] in d["failure"]["final_error"]
    assert d["memory"]["kv_required_mib"] is None
    text = render_text(d)
    assert _CAUSES[prefix] in text and "KV cache:" not in text


@pytest.mark.parametrize("prefix", ["loc-21", "loc-23", "loc-41", "loc-56"])
def test_a_recorded_process_limit_makes_the_verdict_exceeds_alloc_limit(prefix):
    """QA #7 / collector limits: a host allocation refused under `ulimit -v` (command.limits) that is below the
    machine's free RAM is exceeds_alloc_limit, the limit is named in a finding and in raise-memory-limit."""
    case = next(c for c in CASES if c.name.startswith(prefix + "-"))
    d = _diagnose(case)
    assert d["failure"]["verdict"] == "exceeds_alloc_limit"
    lim = [x for x in d["findings"] if x["kind"] == "memory_limit"]
    assert lim and "ulimit -v" in lim[0]["text"]
    top = d["suggestions"][0]
    assert top["id"] == "raise-memory-limit" and "ulimit -v" in top["expected"]
    assert "bisect-regression" not in [s["id"] for s in d["suggestions"]]
    if d["failure"]["phase"] == "kv_cache":  # the cap, not the machine's RAM, bounds the KV that fits
        fits = d["memory"]["max_ctx_fit"] or {}
        assert all(n * (d["memory"]["kv_mib_per_1k_tokens"] or 0) / 1024 <= 1024 for n in fits.values())


def test_host_limits_of_the_collector_count_when_the_command_has_none():
    case = next(c for c in CASES if c.name.startswith("loc-21-"))
    text = (case / "log.txt").read_text(errors="replace")
    log = Excerpt().feed_all(text.splitlines()).to_log("file")
    d = analyze({"log": log, "host": {"address_space_limit_mib": 600.0}})
    assert d["failure"]["verdict"] == "exceeds_alloc_limit"
    assert any("600 MiB where kvreport ran" in x["text"] for x in d["findings"] if x["kind"] == "memory_limit")
    d = analyze({"log": log, "host": {"memory_limit_mib": 10_000_000.0}})
    assert d["failure"]["verdict"] == "fits_but_failed"


def test_a_request_over_the_free_ram_stays_exceeds_free_under_a_limit():
    """Raising a process cap cannot help a request larger than the machine's free RAM: exceeds_free."""
    case = next(c for c in CASES if c.name.startswith("loc-17-"))
    text = (case / "log.txt").read_text(errors="replace")
    d = analyze({"log": Excerpt().feed_all(text.splitlines()).to_log("file"),
                 "command": {"line": "llama-server -c 131072", "limits": {"address_space_limit_kib": 4194304},
                             "flags": {"n_ctx": 131072}}})
    assert d["failure"]["verdict"] == "exceeds_free"
    assert not any(x["kind"] == "memory_limit" for x in d["findings"])
