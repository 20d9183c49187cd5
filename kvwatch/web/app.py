"""The HTTP surface: /metrics, /healthz, /readyz (the review UI and API build on this)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import FastAPI, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from kvwatch import __version__
from kvwatch.store.repository import Store


@dataclass(frozen=True, slots=True)
class WebContext:
    store: Store
    registry: CollectorRegistry
    # Liveness is in-process only: is the scheduler still scheduling?
    alive: Callable[[], bool]


def create_app(ctx: WebContext) -> FastAPI:
    app = FastAPI(title="kvwatch", version=__version__, docs_url=None, redoc_url=None)

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(generate_latest(ctx.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> PlainTextResponse:
        if ctx.alive():
            return PlainTextResponse("ok\n")
        return PlainTextResponse("scheduler is not running\n", status_code=503)

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> PlainTextResponse:
        ok, detail = await asyncio.to_thread(ctx.store.readiness)
        return PlainTextResponse(detail + "\n", status_code=200 if ok else 503)

    return app
