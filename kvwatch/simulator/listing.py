"""The simulator's lists of its own endpoints, as discovery sources serve them.

- ``GET /_sim/http_sd``: Prometheus' http_sd format, one target group per endpoint, with
  kvwatch's reserved labels saying where and what each one is
  (https://prometheus.io/docs/prometheus/latest/http_sd/).
- ``GET /_gateway/v1/models`` (vLLM's ``ModelCard`` with ``max_model_len``),
  ``GET /_gateway/model/info`` (LiteLLM: ``data[].model_name``,
  ``model_info.max_input_tokens``) and ``GET /_gateway/models`` (OpenRouter: ``id``,
  ``context_length``, ``top_provider.context_length``): a gateway's model list.
- ``PUT /_sim/listing``: what the lists hold, for tests: ``{"endpoints": [names] | null,
  "status": 200, "body": null, "windows": true}``; ``status`` and ``body`` serve a source that
  is down or broken, ``windows: false`` a gateway that drops the window fields.
  ``GET /_sim/listing`` reads it back, with the last refresh-interval header received.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kvwatch.simulator.model import Simulation
from kvwatch.simulator.spec import SimEndpoint

REFRESH_HEADER = "X-Prometheus-Refresh-Interval-Seconds"


@dataclass
class Listing:
    endpoints: list[str] | None = None  # None: every endpoint
    status: int = 200
    body: str | None = None
    windows: bool = True
    # The X-Prometheus-Refresh-Interval-Seconds header of the last list request, and how
    # many list requests came.
    last_refresh_header: str | None = None
    requests: int = 0

    def listed(self, simulation: Simulation) -> list[SimEndpoint]:
        return [
            spec
            for spec in simulation.endpoints
            if self.endpoints is None or spec.name in self.endpoints
        ]


def _listing(request: Request) -> Listing:
    listing: Listing = request.app.state.listing
    listing.requests += 1
    listing.last_refresh_header = request.headers.get(REFRESH_HEADER)
    return listing


def _serve(request: Request, render: Any) -> Response:
    listing = _listing(request)
    if listing.status != 200 or listing.body is not None:
        return Response(listing.body or "", listing.status, media_type="application/json")
    return JSONResponse(render(listing, listing.listed(request.app.state.simulation), request))


def _sd(listing: Listing, endpoints: list[SimEndpoint], request: Request) -> list[Any]:
    groups = []
    for spec in endpoints:
        labels = {
            "__kvwatch_name": spec.name,
            "__kvwatch_model": spec.model,
            "__kvwatch_flavour": spec.flavour.value,
            "__kvwatch_path": f"/{spec.name}/v1",
            "simulated": "true",
        }
        if listing.windows:
            labels["__kvwatch_context_window"] = str(spec.window)
            if spec.kv_pool is not None:
                labels["__kvwatch_kv_pool_tokens"] = str(spec.kv_pool)
        groups.append({"targets": [request.url.netloc], "labels": labels})
    return groups


def _openai(listing: Listing, endpoints: list[SimEndpoint], _request: Request) -> Any:
    cards = []
    for spec in endpoints:
        card: dict[str, Any] = {"id": spec.model, "object": "model", "owned_by": "kvwatch-sim"}
        if listing.windows:
            card["max_model_len"] = spec.window
        cards.append(card)
    return {"object": "list", "data": cards}


def _litellm(listing: Listing, endpoints: list[SimEndpoint], _request: Request) -> Any:
    entries = []
    for spec in endpoints:
        info: dict[str, Any] = {"id": spec.name, "mode": "chat"}
        # LiteLLM nulls the field for a model it has no map entry for (LiteLLM #27830).
        info["max_input_tokens"] = spec.window if listing.windows else None
        entries.append(
            {
                "model_name": spec.model,
                "litellm_params": {"model": f"hosted_vllm/{spec.model}"},
                "model_info": info,
            }
        )
    return {"data": entries}


def _openrouter(listing: Listing, endpoints: list[SimEndpoint], _request: Request) -> Any:
    window = (lambda spec: spec.window) if listing.windows else (lambda _spec: None)
    return {
        "data": [
            {
                "id": spec.model,
                "name": spec.model,
                "context_length": window(spec),
                "top_provider": {"context_length": window(spec), "is_moderated": False},
            }
            for spec in endpoints
        ]
    }


async def http_sd(request: Request) -> Response:
    return _serve(request, _sd)


async def openai_models(request: Request) -> Response:
    return _serve(request, _openai)


async def litellm_model_info(request: Request) -> Response:
    return _serve(request, _litellm)


async def openrouter_models(request: Request) -> Response:
    return _serve(request, _openrouter)


async def set_listing(request: Request) -> Response:
    listing: Listing = request.app.state.listing
    try:
        body = await request.json()
    except ValueError:
        return JSONResponse({"error": "the body must be JSON"}, 400)
    if not isinstance(body, dict) or set(body) - {"endpoints", "status", "body", "windows"}:
        return JSONResponse({"error": "keys: endpoints, status, body, windows"}, 400)
    names = body.get("endpoints")
    if names is not None and not (
        isinstance(names, list) and all(isinstance(n, str) for n in names)
    ):
        return JSONResponse({"error": "endpoints must be a list of names or null"}, 400)
    status = body.get("status", 200)
    if not isinstance(status, int) or isinstance(status, bool) or not 100 <= status <= 599:
        return JSONResponse({"error": "status must be an HTTP status code"}, 400)
    listing.endpoints = names
    listing.status = status
    listing.body = body.get("body")
    listing.windows = bool(body.get("windows", True))
    return JSONResponse(asdict(listing))


async def get_listing(request: Request) -> Response:
    return JSONResponse(asdict(request.app.state.listing))


def routes() -> list[Route]:
    return [
        Route("/_sim/http_sd", http_sd, methods=["GET"]),
        Route("/_sim/listing", set_listing, methods=["PUT"]),
        Route("/_sim/listing", get_listing, methods=["GET"]),
        Route("/_gateway/v1/models", openai_models, methods=["GET"]),
        Route("/_gateway/model/info", litellm_model_info, methods=["GET"]),
        Route("/_gateway/models", openrouter_models, methods=["GET"]),
    ]
