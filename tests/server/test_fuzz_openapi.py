"""schemathesis against the server's own OpenAPI document: no 5xx, every response as documented.

Runs on both databases (PostgreSQL is the one that refuses NUL in text) with an admin token so the
generated requests reach the real handlers; derandomized and sized for CI."""

from __future__ import annotations

import json

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from server_helpers import bundle_from_case

EXAMPLES_PER_OPERATION = 25
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def fuzz(op, headers: dict, failures: list[str]):
    name = f"{op.method.upper()} {op.path}"

    @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy())
    def run(case):
        response = case.call(headers=headers)
        try:
            case.validate_response(response, checks=CHECKS)
        except Exception as exc:  # noqa: BLE001 - collect every operation's failure
            failures.append(f"{name}: {str(exc)[:400]}")
            raise

    return run


def test_openapi_fuzz(app, make_token):
    admin = make_token("admin")
    client = app.test_client()
    headers = {"Authorization": f"Bearer {admin}"}
    for case in ("loc-17-fail-huge-ctx-verbose", "loc-23-fail-ulimit-compute-after-kv-800000"):
        r = client.post("/api/v1/bundles", data=json.dumps(bundle_from_case(case)),
                        headers={**headers, "Content-Type": "application/json"})
        assert r.status_code == 201
    schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 6
    failures: list[str] = []
    for op in operations:
        try:
            fuzz(op, headers, failures)()
        except Exception:  # noqa: BLE001 - failures were collected
            pass
    assert not failures, "\n".join(dict.fromkeys(failures))
