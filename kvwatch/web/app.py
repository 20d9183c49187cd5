"""The HTTP surface: /metrics, /healthz, /readyz, the JSON API (/api/v1) and the review pages.

``create_app`` is the only thing the composition root calls; everything it serves reads the
store through :class:`WebContext`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from fastapi import Depends, FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST

from kvwatch import __version__
from kvwatch.exposition import render
from kvwatch.store.errors import StoreError
from kvwatch.web.api import build_api
from kvwatch.web.auth import RequireAuth
from kvwatch.web.context import WebContext
from kvwatch.web.pages import build_pages
from kvwatch.web.settings import WebSettings

STATIC = Path(__file__).parent / "static"

__all__ = ["WebContext", "WebSettings", "create_app"]


OPENAPI_URL = "/api/v1/openapi.json"


def create_app(ctx: WebContext) -> FastAPI:
    # No Swagger UI or ReDoc: both load their code from a CDN. The document itself is served,
    # by a route of our own (openapi_url=None): FastAPI's would answer without credentials.
    app = FastAPI(
        title="kvwatch",
        version=__version__,
        description="Boundary-canary results of LLM serving endpoints. A 200 is not a pass.",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    guard = [Depends(RequireAuth(ctx.settings))] if ctx.settings.auth_required else []
    ops_guard = guard if ctx.settings.protect_metrics else []

    @app.get(OPENAPI_URL, include_in_schema=False, dependencies=guard)
    def openapi() -> JSONResponse:
        # The API's own description is part of the API: the same credentials guard it.
        return JSONResponse(app.openapi())

    @app.exception_handler(StoreError)
    async def store_unavailable(request: Request, exc: StoreError) -> Response:
        # A database outage is the server's problem, said plainly, never a traceback.
        message = f"the database is unavailable: {exc}"
        if request.url.path.startswith("/api/"):
            return JSONResponse({"detail": message}, status_code=503)
        return HTMLResponse(f"<h1>503</h1><p>{message}</p>", status_code=503)

    @app.get("/metrics", include_in_schema=False, dependencies=ops_guard)
    def metrics() -> Response:
        return Response(render(ctx.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", include_in_schema=False, dependencies=ops_guard)
    def healthz() -> PlainTextResponse:
        if ctx.alive():
            return PlainTextResponse("ok\n")
        return PlainTextResponse("scheduler is not running\n", status_code=503)

    @app.get("/readyz", include_in_schema=False, dependencies=ops_guard)
    async def readyz() -> PlainTextResponse:
        ok, detail = await asyncio.to_thread(ctx.store.readiness)
        return PlainTextResponse(detail + "\n", status_code=200 if ok else 503)

    @app.post("/-/reload", include_in_schema=False, dependencies=guard)
    async def reload() -> PlainTextResponse:
        # As Prometheus: 200 when the new configuration is running, 500 with the reason when
        # it was refused (the old one keeps running).
        if ctx.reload is None:
            return PlainTextResponse("reload is not available here\n", status_code=503)
        ok, message = await ctx.reload()
        return PlainTextResponse(message + "\n", status_code=200 if ok else 500)

    app.include_router(build_api(ctx), dependencies=guard)
    app.include_router(build_pages(ctx), dependencies=guard)
    # Static files carry no data; they stay open so a login prompt page can still be styled.
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app
