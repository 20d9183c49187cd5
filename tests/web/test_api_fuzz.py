"""The API, fuzzed from its own OpenAPI document, never answers 5xx and always matches it."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from kvwatch.web.settings import WebSettings
from tests.web.conftest import AppFactory

EXAMPLES = 40  # per operation and mode: a few hundred requests, well under a minute


def test_the_api_never_fails_and_matches_its_schema(
    make_app: AppFactory, history: dict[str, int]
) -> None:
    """Every generated request (valid and invalid) gets a documented, non-5xx answer."""
    app = make_app(WebSettings(excerpt_chars=20))
    schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} == {
        "/api/v1/endpoints",
        "/api/v1/endpoints/{name}/summary",
        "/api/v1/endpoints/{name}/changes",
        "/api/v1/probes",
        "/api/v1/probes/{probe_id}",
        "/api/v1/alerts",
    }
    for operation in operations:
        modes = [schemathesis.GenerationMode.POSITIVE]
        if list(operation.iter_parameters()):
            # Without parameters there is no invalid request to generate.
            modes.append(schemathesis.GenerationMode.NEGATIVE)
        for mode in modes:

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            )
            def check(case: schemathesis.Case) -> None:
                # Some rules cannot be said in OpenAPI (a window of at most 90d, since before
                # until, a cursor that still exists): breaking them is a documented 400.
                case.call_and_validate(excluded_checks=[positive_data_acceptance])

            check()
