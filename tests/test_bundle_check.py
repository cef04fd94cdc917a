"""The fast bundle check (kvreport.bundle_check) against the marshmallow schema it stands in for.

Its promise: when it answers, it answers exactly what ``BundleSchema().load`` returns (same keys,
same values, same types: floats for MiB, tuples for log lines); when it is unsure it answers None and
marshmallow decides. So it never accepts a bundle the schema refuses, and never changes what is stored.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from marshmallow import ValidationError

from kvreport.bundle_check import fast_load
from kvreport.bundle_schema import BundleSchema
from tests.helpers import minimal_bundle
from tests.paths import case_dirs

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "collector" / "kvreport" / "examples").glob("*.json"))


def same(a, b) -> bool:
    """Equal values of equal types, all the way down (dict key order aside: marshmallow's is a set's)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b or (isinstance(a, float) and a != a and b != b)  # NaN kept as NaN by both paths


def marshmallow_load(data):
    try:
        return True, BundleSchema().load(copy.deepcopy(data))
    except ValidationError:
        return False, None


def check(data) -> bool:
    """The promise on one input; True when the fast path answered."""
    fast = fast_load(copy.deepcopy(data))
    if fast is None:
        return False
    ok, slow = marshmallow_load(data)
    assert ok, "fast path accepted a bundle the schema refuses"
    assert same(fast, slow)
    return True


def real_bundles() -> list[dict]:
    out = [json.loads(p.read_text()) for p in EXAMPLES]
    out += [minimal_bundle((c / "log.txt").read_text(errors="replace")) for c in case_dirs()]
    return out


def test_every_example_and_case_bundle_takes_the_fast_path_with_marshmallows_result():
    bundles = real_bundles()
    assert len(bundles) > 40
    for b in bundles:
        assert check(json.loads(json.dumps(b))), b.get("id")


@pytest.mark.parametrize("change", [
    {"host": {"ram_total_mib": 1024}},  # an integer MiB is loaded as a float
    {"host": {"wsl": None, "extra": [1, 2]}},
    {"devices": [{"index": 0, "processes": [{"name": "x", "used_mib": 3}], "new_fact": {"a": 1}}]},
    {"command": {"env": {"A": None, "B": "1"}, "flags": {"-c": 4096}, "argv": ["a", "b"]}},
    {"model": {"size_bytes": 12, "gguf": {"k": [1]}}},
    {"memory_before_launch": [{"device": "CUDA0", "free_mib": 1.5}]},
    {"log": {"line_count": 0, "lines": []}},
    {"log": {"line_count": 2, "truncated": True, "source": None, "lines": [[1, "a"], [2, "b"]], "x": 1}},
])
def test_shapes_that_take_the_fast_path(change):
    b = minimal_bundle("x")
    b.update(change)
    assert check(b)


@pytest.mark.parametrize("change", [
    {"host": {"ram_total_mib": "1024"}},  # marshmallow coerces a numeric string: it decides
    {"host": {"cpu_cores_logical": True}},
    {"host": {"wsl": 1}},
    {"devices": [{"total_mib": float("inf")}]},
    {"devices": [{}] * 65},
    {"memory_before_launch": [{"name": "no device"}]},
    {"log": {"line_count": 1, "lines": [[0, "a"]]}},
    {"log": {"line_count": 1, "lines": [[1, "a", "b"]]}},
    {"log": {"lines": []}},
    {"id": "01ARZ3NDEKTSV4RRFFQ69G5FA\n"},
    {"created_at": "2026"},
    {"redactions": {"email": 1.0}},
    {"probes": {"nvml": None}},
    {"diagnosis": {}},
])
def test_doubtful_shapes_go_to_marshmallow(change):
    b = minimal_bundle("x")
    b.update(change)
    assert fast_load(b) is None


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=5),
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3),
                    max_leaves=6)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:3]):
            yield from _paths(v, (*prefix, i))


_BASE = minimal_bundle("llama_kv_cache: size = 4.00 MiB\nggml_backend_cuda_buffer_type_alloc_buffer: allocating 1 MiB",
                       host={"ram_total_mib": 1.0, "cpu_cores_logical": 2, "wsl": False},
                       devices=[{"index": 0, "total_mib": 2.0, "processes": [{"name": "p", "used_mib": 1.0}]}],
                       command={"argv": ["a"], "env": {"K": "v"}, "flags": {"-c": "1"}},
                       model={"size_bytes": 1, "gguf": {}},
                       memory_before_launch=[{"device": "CUDA0", "free_mib": 1.0}], redactions={"email": 1})
_BASE_PATHS = [p for p in _paths(_BASE) if p]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_BASE_PATHS), JSON, st.booleans())
def test_mutated_bundles_keep_the_promise(path, value, delete):
    b = copy.deepcopy(_BASE)
    parent = b
    for key in path[:-1]:
        parent = parent[key]
    if delete and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    check(b)
