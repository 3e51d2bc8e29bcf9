"""Schemathesis against the app's own OpenAPI schema: no 5xx, and every response conforms to the schema.

Bounded examples per operation keep this to seconds. One check is left out:
``positive_data_acceptance`` expects every schema-valid body to be accepted,
but a JSON schema cannot say that query, key and value shapes must agree, or
that a tensor's data must match its declared shape, so such bodies rightly get
422. Everything else runs: no server errors, documented statuses, content types,
headers and bodies, and schema-invalid bodies rejected.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from service.app import create_app
from service.settings import Settings

APP = create_app(Settings(enable_onnx=False))
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)

pytestmark = pytest.mark.slow  # many examples per operation (about 20 s on 2 cores)

KEY = "schemathesis-test-key-0001"
KEYED_APP = create_app(Settings(enable_onnx=False, api_keys=[KEY]))
keyed_schema = schemathesis.openapi.from_asgi("/openapi.json", KEYED_APP, headers={"X-API-Key": KEY})


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case: schemathesis.Case) -> None:
    case.call_and_validate(excluded_checks=[positive_data_acceptance])


@keyed_schema.parametrize()
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_with_keys_conforms_and_refuses_requests_without_one(case: schemathesis.Case) -> None:
    """With ATTN_API_KEYS the schema declares the security schemes; ``ignored_auth`` checks that a request
    without the key is refused with 401 on every protected operation.
    """
    case.call_and_validate(headers={"X-API-Key": KEY}, excluded_checks=[positive_data_acceptance])
