"""schemathesis over the server's own /openapi.json with response conformance on (issue
#28): the status codes, content types, headers and bodies the server answers are the ones
it declares (bounded examples; tiny model)."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis import checks
from server_harness import TINY_SERVER_ARGS, start_server

ARGS = [*TINY_SERVER_ARGS, "--max-model-len", "256", "--max-num-seqs", "32"]
# Response conformance. Not positive/negative data acceptance: the schema cannot express
# every rule (an empty prompt, a prompt over max_model_len, token ids out of the vocabulary
# are valid JSON for it and 400 for the server).
CHECKS = [checks.not_a_server_error, checks.status_code_conformance,
          checks.content_type_conformance, checks.response_headers_conformance,
          checks.response_schema_conformance, checks.unsupported_method,
          checks.allow_header_conformance]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_path):
    srv = start_server(tmp_path_factory, tiny_model_path, ARGS, name="conformance")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def api_schema(server):
    return schemathesis.openapi.from_url(f"{server.base_url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=6, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck), database=None, derandomize=True)
def test_responses_conform_to_the_declared_schema(case):
    if isinstance(case.body, dict):
        case.body.pop("model", None)
        for key in ("max_tokens", "max_completion_tokens", "n"):
            if isinstance(case.body.get(key), int) and case.body[key] > 8:
                case.body[key] = 8  # bounded work per example on a 2-core machine
        if "messages" in case.body and case.body.get("max_tokens") is None \
                and case.body.get("max_completion_tokens") is None:
            case.body["max_completion_tokens"] = 8
    case.call_and_validate(timeout=60, checks=CHECKS)


def test_declared_extras(server):
    spec = httpx.get(f"{server.base_url}/openapi.json").json()
    paths = spec["paths"]
    assert "head" in paths["/health"] and "503" in paths["/health"]["get"]["responses"]
    assert "text/plain" in paths["/metrics"]["get"]["responses"]["200"]["content"]
    post = paths["/v1/completions"]["post"]["responses"]
    assert {"400", "404", "415", "429"} <= set(post) and "422" not in post
    r = httpx.delete(f"{server.base_url}/v1/completions")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
