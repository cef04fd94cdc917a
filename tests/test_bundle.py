import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvreport.bundle import BundleError, looks_like_bundle, validate_bundle
from kvreport.excerpt import Excerpt
from tests.helpers import minimal_bundle


def test_minimal_bundle_validates_and_round_trips_through_json():
    bundle = minimal_bundle("line one\nllama_kv_cache: size = 4.00 MiB")
    again = validate_bundle(json.loads(json.dumps(bundle)))
    assert again["id"] == bundle["id"]
    assert again["log"]["line_count"] == 2


@pytest.mark.parametrize(
    "change, path",
    [
        ({"schema": "kvreport/bundle@2"}, "schema"),
        ({"id": "not-a-ulid"}, "id"),
        ({"devices": [{"total_mib": "lots"}]}, "devices.0.total_mib"),
        ({"devices": [{"free_mib": float("nan")}]}, "devices.0.free_mib"),
        ({"diagnosis": {"phase": "none"}}, "diagnosis"),
        ({"log": {"line_count": 1, "lines": [["x", "y"]]}}, "log.lines"),
    ],
)
def test_invalid_bundles_name_the_field(change, path):
    bundle = minimal_bundle()
    bundle.update(change)
    with pytest.raises(BundleError) as err:
        validate_bundle(bundle)
    assert path in str(err.value)


def test_missing_required_fields_are_named():
    with pytest.raises(BundleError) as err:
        validate_bundle({"schema": "kvreport/bundle@1"})
    assert "id" in str(err.value) and "created_at" in str(err.value)


def test_not_an_object():
    with pytest.raises(BundleError):
        validate_bundle(["a", "list"])


def test_unknown_keys_inside_sections_are_kept():
    bundle = minimal_bundle(host={"os": "Linux", "future_fact": 7})
    assert validate_bundle(bundle)["host"]["future_fact"] == 7


def test_looks_like_bundle():
    assert looks_like_bundle(json.dumps(minimal_bundle()))
    assert not looks_like_bundle("llama_kv_cache: size = 4.00 MiB")
    assert not looks_like_bundle('{"schema": "other"}')
    assert not looks_like_bundle("{not json")


@given(st.lists(st.text(max_size=50), max_size=200))
def test_excerpt_keeps_line_numbers_in_order_and_counts_every_line(lines):
    ex = Excerpt(max_key_lines=20, tail_lines=10)
    ex.feed_all(lines)
    log = ex.to_log("test")
    assert log["line_count"] == len(lines)
    numbers = [n for n, _ in log["lines"]]
    assert numbers == sorted(set(numbers))
    assert len(numbers) <= 30
    # the tail is always there
    tail = list(range(max(1, len(lines) - 9), len(lines) + 1))
    assert set(tail) <= set(numbers)


def test_excerpt_cuts_huge_lines():
    ex = Excerpt(max_line_chars=100)
    ex.feed("x" * 10_000)
    (n, text), = ex.lines()
    assert n == 1 and len(text) < 120 and text.endswith("[cut]")
