"""parse_log / analyze never raise: random bytes, random text lines, real logs cut anywhere; and memory-failure words
in any capitalisation and wrapping are never "no failure"."""

from __future__ import annotations

import io

from hypothesis import given, settings
from hypothesis import strategies as st

from kvreport.analyze import analyze, analyze_text
from kvreport.logs import parse_log, parse_stream
from tests.paths import case_dirs

LOGS = [(c / "log.txt").read_bytes() for c in case_dirs()]
SETTINGS = settings(max_examples=150, deadline=None)


@SETTINGS
@given(st.binary(max_size=4000))
def test_random_bytes(data):
    parse_log(data.split(b"\n"))
    parse_stream(io.BytesIO(data), chunk_bytes=97)
    analyze_text(data.decode("utf-8", "replace"))


@SETTINGS
@given(st.lists(st.text(max_size=200), max_size=40))
def test_random_lines(lines):
    parse_log(lines)
    analyze({"log": {"lines": [[i, t] for i, t in enumerate(lines, 1)]}})


@SETTINGS
@given(st.sampled_from(LOGS), st.integers(min_value=0), st.integers(min_value=0))
def test_real_logs_cut_anywhere(log, a, b):
    a, b = sorted((a % (len(log) + 1), b % (len(log) + 1)))
    piece = log[a:b]
    d = analyze_text(piece.decode("utf-8", "replace"))
    assert d["failure"]["phase"] in ("kv_cache", "compute_buffer", "model_weights", "context", "kv_capacity",
                                     "memory_budget", "none", "unknown")


@SETTINGS
@given(st.sampled_from(LOGS), st.integers(min_value=1, max_value=5000))
def test_chunked_stream_equals_line_parse(log, chunk):
    whole = parse_log(log.decode("utf-8", "replace").splitlines())
    streamed = parse_stream(io.BytesIO(log), chunk_bytes=chunk)
    assert streamed.events == whole.events
    assert streamed.hparams == whole.hparams and streamed.kv_caches == whole.kv_caches


@SETTINGS
@given(st.dictionaries(st.sampled_from(["log", "command", "devices", "memory_before_launch", "model", "host"]),
                       st.one_of(st.none(), st.integers(), st.text(max_size=20), st.lists(st.integers(), max_size=3),
                                 st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3))))
def test_odd_bundles(bundle):
    d = analyze(bundle)
    assert d["engine"] in ("llama.cpp", "ollama", "vllm", "sglang", "tgi", "unknown")


# The failure layer's promise (issue 12): a line in the words of a memory failure is a failure, however the engine
# capitalises the words and whatever it prints around them (a timestamp, a level, a quote, a prefix of its own).
_FAILURE_PHRASES = ("out of memory", "insufficient memory", "not enough memory", "failed to allocate",
                    "unable to allocate", "could not allocate", "cannot allocate", "allocation failed")
_PREFIXES = ("", "ERROR ", "[2026-01-01 12:00:00] ", 'time=2026-01-01T12:00:00Z level=ERROR msg="', "E ", "> ",
             "    ", "RuntimeError: ", "Error: ", "[worker 3] ", "ggml_backend: ")
_SUFFIXES = ("", ".", "!", ": cudaMalloc", " (requested 512 MiB)", '"', " on device 0", " while loading")


@st.composite
def _failure_lines(draw):
    words = draw(st.sampled_from(_FAILURE_PHRASES)).split(" ")
    if draw(st.booleans()) and draw(st.booleans()):
        phrase = " ".join(words).upper()
    else:
        phrase = " ".join(w[:1].upper() + w[1:] if draw(st.booleans()) else w for w in words)
    return draw(st.sampled_from(_PREFIXES)) + phrase + draw(st.sampled_from(_SUFFIXES))


@SETTINGS
@given(_failure_lines())
def test_memory_failure_words_are_never_no_failure(line):
    assert analyze_text(line + "\n")["failure"]["phase"] != "none", line


def test_a_line_of_megabytes_is_read_by_its_ends_in_bounded_time():
    # a 20 MB line whose failure is at its end (QA): clean_line keeps its head and tail, so every search over it is
    # bounded and the failure is still read
    from kvreport.logs.common import LINE_KEEP, clean_line

    raw = b"x" * (20 << 20) + b" cudaMalloc failed: out of memory\n"
    line = clean_line(raw)
    assert len(line) <= 2 * LINE_KEEP + 8 and line.endswith("cudaMalloc failed: out of memory")
    assert analyze_text(raw.decode())["failure"]["phase"] != "none"
