"""The upload body reader (limits.py) on arbitrary input: only ApiError, never anything PostgreSQL
cannot store; plus the server's second redaction pass and the structured request log."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from server_helpers import minimal_bundle

from kvreport_server import limits
from kvreport_server.errors import ApiError

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=20), children, max_size=5),
    max_leaves=40,
)


def _all_strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, list):
        for v in obj:
            yield from _all_strings(v)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _all_strings(v)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_check_and_clean_gives_storable_text(value):
    try:
        cleaned = limits.check_and_clean(value, max_depth=8, max_string=1000, max_log_lines=10, max_devices=4)
    except ApiError as exc:
        assert 400 <= exc.status < 500
        return
    for s in _all_strings(cleaned):
        assert "\x00" not in s
        s.encode("utf-8")  # no lone surrogates
    json.dumps(cleaned, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_parse_json_on_arbitrary_bytes(data):
    try:
        limits.parse_json(data)
    except ApiError as exc:
        assert exc.status in (400, 413, 422)


def test_depth_and_string_limits_name_the_field():
    with pytest.raises(ApiError) as e:
        limits.check_and_clean({"a": {"b": "x" * 11}}, max_depth=8, max_string=10, max_log_lines=5, max_devices=5)
    assert e.value.status == 413 and e.value.field == "a.b"
    with pytest.raises(ApiError) as e:
        limits.check_and_clean({"log": {"lines": [[1, "a"]] * 6}}, max_depth=8, max_string=10, max_log_lines=5,
                               max_devices=5)
    assert e.value.field == "log.lines"


def post(client, bundle, headers):
    return client.post("/api/v1/bundles", data=json.dumps(bundle), headers={**headers, "Content-Type": "application/json"})


def test_second_redaction_pass_refuses_obvious_secrets(client, auth_header):
    leaky = minimal_bundle(command={"line": "llama-server -m m.gguf --api-key sk-abcdefghijklmnopqrstuvwx1234",
                                    "env": {"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyzABCDEF"}})
    r = post(client, leaky, auth_header)
    assert r.status_code == 422 and r.json["error"]["code"] == "secrets_found"
    assert "sk-abcdefghijklmnopqrstuvwx1234" not in r.get_data(as_text=True)
    assert client.get(f"/api/v1/bundles/{leaky['id']}").status_code == 404


def test_secrets_policy_flag_stores_and_lists(make_app):
    from kvreport_server import auth

    app = make_app(SECRETS_POLICY="flag")
    with app.extensions["kvreport_db"].Session() as s, s.begin():
        token = auth.new_token(s, "f", "upload")
    leaky = minimal_bundle(command={"env": {"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyzABCDEF"}})
    client = app.test_client()
    r = post(client, leaky, {"Authorization": f"Bearer {token}"})
    assert r.status_code == 201 and r.json["flagged_secrets"]
    with app.extensions["kvreport_db"].Session() as s:
        from kvreport_server.models import Bundle

        stored = s.get(Bundle, leaky["id"]).flagged_secrets
    assert stored and stored[0].startswith("command.env.HF_TOKEN")
    assert "hf_abcdefghijklmnopqrstuvwxyzABCDEF" not in " ".join(stored)


def test_request_log_is_one_json_line(make_app, caplog):
    app = make_app(LOG_REQUESTS=True)
    logger = logging.getLogger("kvreport_server.request")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="kvreport_server.request"):
            app.test_client().get("/healthz")
    finally:
        logger.removeHandler(caplog.handler)
    entries = [json.loads(r.getMessage()) for r in caplog.records if r.name == "kvreport_server.request"]
    assert entries and entries[-1]["path"] == "/healthz" and entries[-1]["status"] == 200
    assert {"ts", "method", "ms", "token", "remote"} <= set(entries[-1])
