"""The JSON API under ``/api/v1``: endpoints, probes, one probe, alerts, summaries.

Handlers are plain ``def``: FastAPI runs them in its thread pool, so the synchronous store
never blocks the event loop the probes run in.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query
from pydantic import AwareDatetime, BeforeValidator

from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.store.queries import MAX_PAGE, CursorError, HistoryQueries, ProbeFilter
from kvwatch.store.records import CalibrationRecord
from kvwatch.web import schemas
from kvwatch.web.context import WebContext
from kvwatch.web.params import ParamError, parse_window, to_utc, window_start

MAX_ID = 2**63 - 1  # PostgreSQL BIGINT: larger ids cannot exist and must not reach the driver
# Free text reaches the database as a bound parameter; NUL is the one character PostgreSQL
# refuses in text, so it is rejected here with a 422 instead of failing there.
NO_NUL = r"^[^\x00]*$"
# The shape of a duration (30s, 15m, 24h, 1h30m, 7d); its range is checked in code.
DURATION = r"^[0-9][0-9a-z.]*$"

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": schemas.Error, "description": "A parameter that cannot be used."},
    401: {"model": schemas.Error, "description": "Credentials missing or wrong."},
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": schemas.Error, "description": "No such object."}
}

EndpointName = Annotated[str, Path(max_length=200, pattern=NO_NUL)]
RegionFilter = Annotated[
    str | None,
    Query(
        max_length=63,
        pattern=NO_NUL,
        description="Only probes run in this region (multi-region mode).",
    ),
]
TenantFilter = Annotated[
    str | None,
    Query(
        max_length=63,
        pattern=NO_NUL,
        description="Only probes sent with this tenant's credentials (its name).",
    ),
]


def _iso_only(value: object) -> object:
    # pydantic would read a bare number as a Unix timestamp; the schema promises ISO 8601.
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?\s*", value):
        raise ValueError("must be an ISO 8601 time with a timezone, e.g. 2026-03-01T12:00:00Z")
    return value


Time = Annotated[AwareDatetime, BeforeValidator(_iso_only)]


def _bad(exc: Exception) -> HTTPException:
    return HTTPException(status_code=400, detail=str(exc))


def _window(
    since: datetime | None, until: datetime | None
) -> tuple[datetime | None, datetime | None]:
    try:
        s = None if since is None else to_utc(since, "since")
        u = None if until is None else to_utc(until, "until")
    except ParamError as exc:
        raise _bad(exc) from None
    if s is not None and u is not None and s >= u:
        raise HTTPException(status_code=400, detail="since must be before until")
    return s, u


def build_api(ctx: WebContext) -> APIRouter:
    router = APIRouter(prefix="/api/v1", tags=["api"], responses=ERRORS)
    queries = HistoryQueries(ctx.store)
    # Registered in this order, which is the order of the OpenAPI document's paths.
    _endpoint_routes(router, ctx, queries)
    _change_routes(router, ctx, queries)
    _probe_routes(router, ctx, queries)
    _alert_routes(router, ctx, queries)
    return router


def _endpoint_routes(router: APIRouter, ctx: WebContext, queries: HistoryQueries) -> None:
    """``/endpoints`` and ``/endpoints/{name}/summary``."""
    settings = ctx.settings

    @router.get("/endpoints", summary="Endpoints with their latest verdict per probe kind")
    def endpoints() -> list[schemas.Endpoint]:
        shown = ctx.shown_endpoints()
        served = ctx.store.served_windows(among=shown)
        calibrations: dict[str, list[CalibrationRecord]] = {}
        for record in ctx.store.calibrations(among=shown):
            calibrations.setdefault(record.endpoint, []).append(record)
        return [
            schemas.endpoint(
                settings,
                o,
                served.get(o.endpoint.name),
                calibrations.get(o.endpoint.name, ()),
            )
            for o in queries.overview(recent=0, only=shown)
        ]

    @router.get(
        "/endpoints/{name}/summary",
        summary="What an endpoint's probes did within a window",
        responses=NOT_FOUND,
    )
    def endpoint_summary(
        name: EndpointName,
        window: Annotated[
            str,
            Query(
                max_length=32,
                pattern=DURATION,
                description="Look-back window, e.g. 1h, 24h, 7d (at most 90d).",
            ),
        ] = "24h",
        until: Annotated[
            Time | None, Query(description="End of the window (default: now).")
        ] = None,
    ) -> schemas.EndpointSummary:
        try:
            span = parse_window(window)
            end = ctx.now() if until is None else to_utc(until, "until")
            start = window_start(end, span)
        except ParamError as exc:
            raise _bad(exc) from None
        if queries.endpoint(name) is None:
            raise HTTPException(status_code=404, detail=f"no endpoint named {name!r}")
        return schemas.summary(queries.summary(name, start, end))


def _change_routes(router: APIRouter, ctx: WebContext, queries: HistoryQueries) -> None:
    """``/endpoints/{name}/changes``: what the endpoint's self-report said changed."""

    @router.get(
        "/endpoints/{name}/changes",
        summary="Changes in what an endpoint says about itself, newest first",
        responses=NOT_FOUND,
    )
    def endpoint_changes(
        name: EndpointName,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="At most this many.")] = 50,
    ) -> list[schemas.EndpointChange]:
        if queries.endpoint(name) is None:
            raise HTTPException(status_code=404, detail=f"no endpoint named {name!r}")
        return [schemas.endpoint_change(c) for c in ctx.store.list_changes(name, limit)]


def _probe_routes(router: APIRouter, ctx: WebContext, queries: HistoryQueries) -> None:
    """``/probes``, filtered and paged, and ``/probes/{probe_id}`` with its evidence."""
    settings = ctx.settings

    @router.get("/probes", summary="Probes, newest first, filtered, a page at a time")
    def probes(
        endpoint: Annotated[str | None, Query(max_length=200, pattern=NO_NUL)] = None,
        kind: ProbeKind | None = None,
        verdict: Verdict | None = None,
        region: RegionFilter = None,
        tenant: TenantFilter = None,
        since: Annotated[Time | None, Query(description="Started at or after (inclusive).")] = None,
        until: Annotated[Time | None, Query(description="Started before (exclusive).")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
        before_id: Annotated[
            int | None,
            Query(ge=1, le=MAX_ID, description="Cursor: the `next` of the previous page."),
        ] = None,
    ) -> schemas.ProbePage:
        s, u = _window(since, until)
        filters = ProbeFilter(
            endpoint=endpoint,
            kind=None if kind is None else kind.value,
            verdict=None if verdict is None else verdict.value,
            region=region,
            tenant=tenant,
            since=s,
            until=u,
        )
        try:
            page = queries.probes(filters, limit=limit, before_id=before_id)
        except CursorError as exc:
            raise _bad(exc) from None
        return schemas.ProbePage(
            probes=[schemas.probe(settings, r, []) for r in page.probes],
            next=page.next_before_id,
        )

    @router.get(
        "/probes/{probe_id}", summary="One probe with all its evidence", responses=NOT_FOUND
    )
    def probe(probe_id: Annotated[int, Path(ge=1, le=MAX_ID)]) -> schemas.Probe:
        row = queries.probe(probe_id)
        if row is None:
            raise HTTPException(status_code=404, detail=f"no probe {probe_id}")
        confirmations = [p.id for p in queries.confirmations_of(probe_id)]
        return schemas.probe(settings, row, confirmations)


def _alert_routes(router: APIRouter, ctx: WebContext, queries: HistoryQueries) -> None:
    """``/alerts``: firing, pending and recently resolved."""
    settings = ctx.settings

    @router.get("/alerts", summary="Firing and pending alerts, and recently resolved ones")
    def alerts(
        resolved_within: Annotated[
            str,
            Query(
                max_length=32,
                pattern=DURATION,
                description="Include alerts resolved within this window (at most 90d).",
            ),
        ] = "24h",
    ) -> schemas.Alerts:
        try:
            span = parse_window(resolved_within, "resolved_within")
            since = window_start(ctx.now(), span, "resolved_within")
        except ParamError as exc:
            raise _bad(exc) from None
        return schemas.Alerts(
            alerts=[schemas.alert(settings, a) for a in queries.alerts(ctx.store, since)]
        )


__all__ = ["build_api"]
