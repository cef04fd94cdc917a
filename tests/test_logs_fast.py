"""The fast file path (kvreport.logs.scan) gives parse_log's diagnosis; runs of a crash loop are folded, memory bounded.

Every real case (tests/data/cases and tests/data/corpus) is read line by line (parse_log) and by parse_file with every
prefilter backend present here (hyperscan, grep, Python); the analyze output must be identical. Then the same on the
logs of every case end to end (a crash loop: runs folded, runs remembered by their bytes).
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from kvreport.analyze import diagnose
from kvreport.logs import (
    KEYWORDS,
    LogFacts,
    _feed_one,
    _is_start_raw,
    clean_line,
    is_key_line,
    parse_file,
    parse_log,
    scan,
)
from kvreport.logs.facts import Bounded, CappedDict
from kvreport.logs.runs import LITERALS, RUN_STARTS, is_run_start
from tests.paths import CASE_DIR, CORPUS_DIR

LOGS = sorted(CASE_DIR.glob("*/log.txt")) + sorted(CORPUS_DIR.glob("*/log.txt"))
LOOP_LOGS = LOGS[::2]
"""The crash loops' logs: every other real log (sorted, so always the same half; 580+ logs of every engine and era),
which keeps the loops' three repetitions to about 10 MB as the corpus grows."""
BACKENDS = [b for b, ok in (("hyperscan", scan._have_hyperscan()), ("grep", bool(shutil.which("grep"))),
                            ("python", True)) if ok]


_REF: dict = {}


def _line_by_line(path) -> LogFacts:
    """The line-by-line parse of ``path`` and its diagnosis, made once per file for every backend compared to it
    (the references do not change; the parses under test are always made afresh)."""
    key = str(path)
    if key not in _REF:
        with open(path, "rb") as fh:
            facts = parse_log(fh)
        _REF[key] = facts
        _REF_DIAG[id(facts)] = diagnose(facts, {})
    return _REF[key]


_REF_DIAG: dict = {}


def _fast(path, backend: str) -> LogFacts:
    return parse_file(path, backend=backend, use_grep=backend != "python")


def _same(got: LogFacts, ref: LogFacts, what) -> None:
    assert diagnose(got, {}) == (_REF_DIAG.get(id(ref)) or diagnose(ref, {})), what
    assert (got.line_count, got.key_line_count, got.runs, got.repeats) == \
        (ref.line_count, ref.key_line_count, ref.runs, ref.repeats), what
    assert got.events == ref.events and got.kv_caches == ref.kv_caches and got.hparams == ref.hparams, what


def test_there_are_real_logs_and_hyperscan_is_tried_when_installed():
    assert len(LOGS) > 250
    assert "python" in BACKENDS and (("hyperscan" in BACKENDS) == scan._have_hyperscan())
    assert scan.best_backend() == BACKENDS[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_real_case_gives_the_line_by_line_diagnosis(backend):
    # (the grep fallback starts a grep per file, 20 ms of compiling its alternation each: it is compared on every other
    # real log, and on the crash loops made of them; hyperscan and python on every one)
    for path in LOGS[::2] if backend == "grep" and len(BACKENDS) > 2 else LOGS:
        _same(_fast(path, backend), _line_by_line(path), (path.parent.name, backend))


@pytest.fixture(scope="module")
def crash_loop(tmp_path_factory):
    """Every real log end to end, three times, the last line without its newline."""
    blob = b"".join(p.read_bytes().rstrip(b"\n") + b"\n" for p in LOOP_LOGS)
    path = tmp_path_factory.mktemp("loop") / "loop.log"
    path.write_bytes(blob * 3 + b"llama_new_context_with_model: failed to allocate compute buffers")
    return path


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_crash_loop_gives_the_line_by_line_diagnosis_on_every_backend(crash_loop, backend):
    _same(_fast(crash_loop, backend), _line_by_line(crash_loop), backend)


def test_runs_seen_before_are_counted_from_memory_not_parsed_again(crash_loop):
    ref = _line_by_line(crash_loop)
    forks = (False, True) if hasattr(os, "fork") else (False,)
    for backend, fork in [(b, k) for b in BACKENDS for k in forks]:
        f = LogFacts()
        with open(crash_loop, "rb") as fh:
            nl, hits, _failed = scan.parse_runs(f, fh.fileno(), os.path.getsize(crash_loop), scan.scanner(backend),
                                                _feed_one, _is_start_raw, fork=fork)
        assert nl == ref.line_count - 1  # the last line has no newline
        # the 2nd and 3rd repetitions are made of runs the 1st one parsed
        assert hits >= 2 * (ref.runs // 3) - 4, (backend, fork, hits, ref.runs)
        assert f.repeats == ref.repeats and f.key_line_count == ref.key_line_count, (backend, fork)
        assert f.events == ref.events, (backend, fork)


@pytest.fixture(scope="module")
def journal_loop(tmp_path_factory):
    """Every real log end to end, three times, as ``journalctl -u`` prints a crash-looping unit: each line behind
    "Mon DD HH:MM:SS host program[PID]: ", a new PID for every repetition and the clock one second a line; Ollama's
    own ``time=`` field (when a line has it) moving with the clock too."""
    out, t = [], 0
    for rep in range(3):
        for p in LOOP_LOGS:
            for raw in p.read_bytes().rstrip(b"\n").split(b"\n"):
                t += 1
                stamp = b"Dec %02d %02d:%02d:%02d" % (1 + t // 86400, t // 3600 % 24, t // 60 % 60, t % 60)
                line = raw.replace(b"time=2024-", b"time=20%02d-" % (24 + rep), 1) if raw.startswith(b"time=2") else raw
                out.append(b"%s node-7 ollama[%d]: %s" % (stamp, 1000 + rep, line))
    path = tmp_path_factory.mktemp("journal") / "journal.log"
    path.write_bytes(b"\n".join(out) + b"\n")
    return path


def test_a_journal_crash_loop_is_parsed_once_despite_its_changing_prefix(journal_loop):
    """The journal's timestamp, PID and Ollama's time= change with every run; the runs are still remembered (the
    2nd and 3rd repetitions are counted from memory) and the diagnosis equals the line-by-line one."""
    ref = _line_by_line(journal_loop)
    for backend in BACKENDS:
        _same(_fast(journal_loop, backend), ref, backend)
        f = LogFacts()
        with open(journal_loop, "rb") as fh:
            _nl, hits, _failed = scan.parse_runs(f, fh.fileno(), os.path.getsize(journal_loop), scan.scanner(backend),
                                                 _feed_one, _is_start_raw, fork=False)
        assert hits >= 2 * (ref.runs // 3) - 4, (backend, hits, ref.runs)


def test_only_a_journal_has_its_prefix_left_out_of_the_hash(tmp_path, journal_loop):
    plain = tmp_path / "plain.log"
    plain.write_bytes((CASE_DIR / "loc-21-fail-ulimit-kv-600000" / "log.txt").read_bytes())
    with open(plain, "rb") as fh:
        assert scan._normalizer(fh.fileno(), os.path.getsize(plain)) is None
    with open(journal_loop, "rb") as fh:
        norm = scan._normalizer(fh.fileno(), os.path.getsize(journal_loop))
    assert norm(b"Dec 01 10:00:01 node-7 ollama[1234]: time=2024-05-01T10:00:01.123Z level=INFO msg=x\n"
                b"2024-12-01T10:00:02+0000 node-7 llama-server[99]: load_tensors: x\n") == \
        b"node-7 ollama: level=INFO msg=x\nnode-7 llama-server: load_tensors: x\n"


def test_the_segment_hash_does_not_depend_on_how_the_bytes_come_with_or_without_xxhash(monkeypatch, crash_loop):
    data = (CASE_DIR / "loc-21-fail-ulimit-kv-600000" / "log.txt").read_bytes()
    ref = _line_by_line(crash_loop)
    for without_xxhash in (False, True):
        if without_xxhash:
            monkeypatch.setitem(sys.modules, "xxhash", None)  # import xxhash raises ImportError: BLAKE2b
        hasher = scan._hasher_type()
        whole, parts = hasher(), hasher()
        whole.update(data)
        for i in range(0, len(data), 777):
            parts.update(memoryview(data)[i:i + 777])
        assert whole.intdigest() == parts.intdigest() and 0 <= whole.intdigest() < 1 << 64
        assert hasher().intdigest() != whole.intdigest()
        got = _fast(crash_loop, BACKENDS[0])
        assert (got.repeats, got.events, got.line_count) == (ref.repeats, ref.events, ref.line_count), without_xxhash


@pytest.mark.skipif(not shutil.which("grep") or not hasattr(os, "fork"), reason="needs grep and fork")
def test_a_grep_that_fails_falls_back_to_python_and_a_failed_segment_reader_raises(monkeypatch, tmp_path, crash_loop):
    bad = tmp_path / "grep"
    bad.write_text("#!/bin/sh\nexit 2\n")
    bad.chmod(0o755)
    monkeypatch.setattr(scan.shutil, "which", lambda name: str(bad))
    ref = _line_by_line(crash_loop)
    _same(_fast(crash_loop, "grep"), ref, "grep failed")
    size = os.path.getsize(crash_loop)
    for fork in (False, True):
        with open(crash_loop, "rb") as fh, pytest.raises(OSError):
            scan.parse_runs(LogFacts(), fh.fileno(), size, scan.Scanner("grep", KEYWORDS, LITERALS), _feed_one,
                            _is_start_raw, fork=fork)


def test_memory_does_not_grow_with_the_failures_in_the_log(tmp_path):
    one = (CASE_DIR / "loc-21-fail-ulimit-kv-600000" / "log.txt").read_bytes()
    single = parse_log(one.split(b"\n"))
    many = tmp_path / "many.log"
    many.write_bytes((one.rstrip(b"\n") + b"\n") * 120)
    for f in [_line_by_line(many)] + [_fast(many, b) for b in BACKENDS]:
        assert f.runs == 120 and sum(f.repeats.values()) == 119 and len(f.repeats) == 1
        assert len(f.events) == len(single.events) and len(f.kv_caches) == len(single.kv_caches)
        assert [e["line"] for e in f.events] == [e["line"] for e in single.events]
        d = diagnose(f, {})
        assert d["failure"] == {**diagnose(single, {})["failure"]}
        rep = [x for x in d["findings"] if x["kind"] == "repeated_failure"]
        assert rep and "repeated 120 times" in rep[0]["text"]
    assert single.runs == 1 and not single.repeats


def test_the_failed_run_is_diagnosed_when_a_later_run_did_not_fail():
    fail = (CASE_DIR / "loc-21-fail-ulimit-kv-600000" / "log.txt").read_bytes()
    ok = (CASE_DIR / "loc-02-success-c4096-verbose" / "log.txt").read_bytes()
    f = parse_log((fail + fail + ok).split(b"\n"))
    only = parse_log(fail.split(b"\n"))
    assert f.runs == 3 and f.repeats == {only.run_key(): 1}
    assert diagnose(f, {})["failure"] == diagnose(only, {})["failure"]
    assert parse_log(ok.split(b"\n")).run_key() is None and only.run_key()


def test_a_run_start_after_no_failure_does_not_cut_the_run():
    lines = ["ggml_cuda_init: found 1 CUDA devices:", "  Device 0: NVIDIA GeForce RTX 4090, compute capability 8.9",
             "build: 5908 (538cc77f) with cc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0 for x86_64-linux-gnu"]
    f = parse_log(lines)
    assert f.runs == 1 and f.build == 5908 and f.devices


def test_every_scanner_selects_the_same_lines_a_superset_of_the_key_lines(crash_loop):
    size = os.path.getsize(crash_loop)
    picked = {}
    for backend in BACKENDS:
        got = []
        with open(crash_loop, "rb") as fh:
            nl = scan.scanner(backend).feed_range(fh.fileno(), 0, size, 0, lambda n, raw, got=got: got.append((n, raw)))
        picked[backend] = (nl, got)
    first = picked[BACKENDS[0]]
    for backend, got in picked.items():
        assert got == first, backend
    raw_lines = crash_loop.read_bytes().split(b"\n")
    chosen = {n for n, _ in first[1]}
    keys = {n for n, raw in enumerate(raw_lines, 1) if is_key_line(clean_line(raw))}
    assert keys <= chosen and len(keys) > 10000
    words = [k.encode() for k in KEYWORDS]
    assert chosen == {n for n, raw in enumerate(raw_lines, 1) if any(k in raw for k in words)}


def test_run_starts_are_key_lines_and_each_pattern_holds_its_literal():
    import re

    assert set(LITERALS) <= set(KEYWORDS)
    samples = ["build: 5908 (538cc77f) with cc (GCC) 14.2.1", "main: build = 1233 (98311c4)",
               "0.00.003.927 I cmn  common_param: common_params_print_info: build 0 (unknown) with GNU 12.2.0",
               "ggml_cuda_init: found 2 ROCm devices:", "ggml_vulkan: Found 1 Vulkan devices:",
               'time=2024-03-13T10:22:06.983+07:00 level=INFO source=routes.go:1082 msg="Listening on 127.0.0.1:11434 '
               '(version 0.1.29)"', 'level=INFO source=server.go:262 msg="starting llama server" cmd=x',
               "INFO 11-05 03:21:18 api_server.py:526] vLLM API server version 0.6.1",
               "INFO: Starting vLLM API server on http://0.0.0.0:8000"]
    assert all(is_run_start(s) and is_key_line(s) for s in samples)
    assert not is_run_start('level=ERROR msg="error starting llama server" error=x')
    assert not is_run_start("system_info: n_threads = 8 / 16 | AVX = 1")
    for _engine, literal, pattern in RUN_STARTS:
        assert literal in re.sub(r"\\.", "", pattern) or literal.strip() in pattern, (literal, pattern)


def test_bounded_lists_keep_the_first_and_the_last_items():
    b = Bounded(cap=10)
    for i in range(1000):
        b.append(i)
    assert len(b) == 10 and b[:5] == [0, 1, 2, 3, 4] and b[5:] == [995, 996, 997, 998, 999] and b.dropped == 990
    d = CappedDict(cap=3)
    for i in range(10):
        d[f"k{i}"] = i
    d["k0"] = "updated"
    assert d == {"k0": "updated", "k1": 1, "k2": 2}
    f = LogFacts()
    for i in range(5000):
        f.add_event("ggml", i, "x")
        f.warnings.append(str(i))
        f.gguf_kv[f"key{i}"] = i
    assert len(f.events) == 2000 and f.events[-1]["lineno"] == 4999 and f.events[0]["lineno"] == 0
    assert len(f.warnings) <= 400 and f.warnings[-1] == "4999" and len(f.gguf_kv) <= 400


def test_a_device_line_wrapped_before_its_free_memory_is_joined():
    """`fold -w 80` or a narrow terminal splits llama.cpp's device line before "N MiB free"."""
    from kvreport.logs import parse_log

    f = parse_log(["llama_model_load_from_file_impl: using device CUDA0 (NVIDIA GeForce RTX 4090) - ",
                   "23682 MiB free"])
    assert f.devices["CUDA0"]["free_mib"] == 23682.0


def test_a_number_wrapped_off_its_parenthesis_is_joined():
    """vLLM V0's capacity error pasted wrapped inside its bracket (vllm-project/vllm#7526)."""
    from kvreport.analyze import analyze_text

    d = analyze_text("ValueError: The model's max seq len (30000) is larger than the maximum number of tokens that can "
                     "be stored in KV cache (\n3984). Try increasing `gpu_memory_utilization` or decreasing "
                     "`max_model_len` when initializing the engine.\n")
    assert (d["engine"], d["failure"]["phase"]) == ("vllm", "kv_capacity")
