"""Optional bearer/basic auth for UI and API; metrics and health protected only on request."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.routing import Mount

try:
    from fastapi.routing import iter_route_contexts
except ImportError:  # an older FastAPI: app.routes is flat, included routers copied in

    def iter_route_contexts(routes: Sequence[Any]) -> Iterator[Any]:  # type: ignore[misc]
        return iter(routes)


from kvwatch.web.settings import WebSettings
from tests.web.conftest import AppFactory


def _basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def test_a_bearer_token_guards_ui_and_api_but_not_metrics(make_app: AppFactory) -> None:
    """Without the token: 401 with a challenge; with it: 200; /metrics and /healthz stay open."""
    client = TestClient(make_app(WebSettings(bearer_token="s3cret")))
    for path in ("/", "/api/v1/endpoints", "/alerts"):
        response = client.get(path)
        assert response.status_code == 401, path
        assert response.headers["www-authenticate"] == 'Bearer realm="kvwatch"'
        assert client.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get(path, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert client.get("/metrics").status_code == 200
    assert client.get("/healthz").status_code == 200


def test_basic_auth_and_protected_metrics(make_app: AppFactory) -> None:
    """Basic credentials open everything; protect_metrics also guards /metrics and health."""
    settings = WebSettings(basic_auth=("ops", "pw"), protect_metrics=True)
    client = TestClient(make_app(settings))
    for path in ("/", "/api/v1/probes", "/metrics", "/healthz", "/readyz"):
        response = client.get(path)
        assert response.status_code == 401, path
        assert response.headers["www-authenticate"] == 'Basic realm="kvwatch", charset="UTF-8"'
        assert client.get(path, headers=_basic("ops", "nope")).status_code == 401
        assert client.get(path, headers={"Authorization": "Basic !!"}).status_code == 401
        assert client.get(path, headers=_basic("ops", "pw")).status_code == 200, path


def test_the_openapi_document_describes_the_api_only(make_app: AppFactory) -> None:
    """The served document lists the six /api/v1 operations and no page or metrics route."""
    schema = TestClient(make_app()).get("/api/v1/openapi.json").json()
    assert sorted(schema["paths"]) == [
        "/api/v1/alerts",
        "/api/v1/endpoints",
        "/api/v1/endpoints/{name}/changes",
        "/api/v1/endpoints/{name}/summary",
        "/api/v1/probes",
        "/api/v1/probes/{probe_id}",
    ]


def test_pages_answer_bad_parameters_with_a_400_page(
    client: TestClient, history: dict[str, int]
) -> None:
    """A bad range, filter or cursor on a page is a readable 400; unknown ids are 404."""
    bad = {
        "/endpoints/alpha?range=2h": (400, "range must be one of 1h, 24h, 7d, 30d"),
        "/probes?verdict=fine": (400, "unknown verdict &#39;fine&#39;"),
        "/probes?before_id=abc": (400, "before_id &#39;abc&#39; is not a probe id"),
        "/probes/abc": (404, "no probe abc"),
        "/endpoints/nobody": (404, "no endpoint named &#39;nobody&#39;"),
    }
    for path, (status, text) in bad.items():
        response = client.get(path)
        assert response.status_code == status, path
        assert text in response.text, path


# Answering without credentials on purpose, whatever the settings: static files (CSS) carry
# no data, and stay open so a login prompt can still be styled.
ALWAYS_OPEN = {"/static"}
# Prometheus and kubelets rarely carry credentials: open unless web.protect_metrics (README).
OPS = {"/metrics", "/healthz", "/readyz"}


def _requests(app: FastAPI) -> list[tuple[str, str, str]]:
    """(route path, method, URL) for every method of every route the app serves, with path
    parameters filled in: taken from the app itself, so a new route is covered by itself."""
    requests = []
    for route in iter_route_contexts(app.routes):
        path = route.path
        assert isinstance(path, str), route
        if isinstance(getattr(route, "original_route", route), Mount):
            requests.append((path, "GET", f"{path}/anything"))
            continue
        url = re.sub(r"\{[^}]+\}", "1", path)
        methods = route.methods or {"GET"}
        requests.extend((path, method, url) for method in sorted(methods))
    return requests


@pytest.mark.parametrize("protect_metrics", [False, True])
def test_every_route_the_app_serves_asks_for_credentials_when_auth_is_set(
    make_app: AppFactory, protect_metrics: bool
) -> None:
    """Walking the app's own routes: 401 without credentials, except the allow-listed few."""
    settings = WebSettings(basic_auth=("ops", "pw"), protect_metrics=protect_metrics)
    app = make_app(settings)
    requests = _requests(app)
    assert "/api/v1/openapi.json" in {path for path, _, _ in requests}
    open_paths = ALWAYS_OPEN | (set() if protect_metrics else OPS)
    client = TestClient(app)
    for path, method, url in requests:
        status = client.request(method, url).status_code
        if path in open_paths:
            assert status != 401, f"{method} {url} is listed as open but asks for credentials"
        else:
            assert status == 401, f"{method} {url} answered {status} without credentials"


def test_the_openapi_document_is_served_with_the_credentials(make_app: AppFactory) -> None:
    """Behind the guard, the document still describes the API to whoever may call it."""
    client = TestClient(make_app(WebSettings(bearer_token="s3cret")))
    response = client.get("/api/v1/openapi.json", headers={"Authorization": "Bearer s3cret"})
    assert response.status_code == 200
    assert "/api/v1/probes" in response.json()["paths"]
