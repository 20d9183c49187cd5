"""Server-rendered pages for reviewing history: overview, endpoint, probe list, probe, alerts.

Parameters arrive as text and are read here, so a bad one yields a readable 400 page rather
than a JSON validation error.
"""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from markupsafe import Markup, escape

from kvwatch import __version__
from kvwatch.canary.localise import format_depth
from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.config import format_duration
from kvwatch.store.queries import CursorError, HistoryQueries, ProbeFilter
from kvwatch.web import svg
from kvwatch.web.context import WebContext
from kvwatch.web.depthbar import depth_bar
from kvwatch.web.params import RANGES, ParamError, parse_time, parse_window
from kvwatch.web.tones import severity, tone, worst

TEMPLATES = Path(__file__).parent / "templates"
# Probes in an overview status strip: with five kind columns of long verdicts and long
# endpoint names, the table still fits a 1280 px screen (the strip's cells wrap beyond that).
STRIP = 24
PAGE = 50  # probes per list page
CHANGES_SHOWN = 20  # the endpoint page's change timeline
BUCKETS = 120  # slices of the endpoint timeline (fewer when they are whole hours or uneven)
# The shortest span a chart covers when it starts at the endpoint's first probe: a probe a few
# seconds old is not stretched over the whole width, and slices stay a second or longer.
MIN_CHART = timedelta(minutes=5)
MAX_ID = 2**63 - 1


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


# An ISO 8601 time with its offset, as reasons quote them (``issued 2026-03-01T12:03:00.1+00:00``).
_ISO_TIME = re.compile(r"\b\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})")


def _readable_times(text: str | None) -> Markup:
    """``text`` with each ISO time in it written as the page writes times (UTC, to the second).

    Only the page changes: the stored reason, which the API and CLI print, keeps the exact time.
    A time without an offset is left as it is (its zone would be a guess).
    """

    def readable(match: re.Match[str]) -> str:
        try:
            moment = datetime.fromisoformat(match[0])
        except ValueError:
            return match[0]
        return f'<time datetime="{match[0]}">{_when(moment.astimezone(UTC))}</time>'

    # The pattern matches no character that escaping changes, so it runs on the escaped text.
    return Markup(_ISO_TIME.sub(readable, str(escape(text or ""))))


def _breakable(name: str) -> Markup:
    """An endpoint name that may wrap after a ``-``, ``.`` or ``_`` and nowhere else."""
    # Browsers offer a break after a hyphen only; names like ``x.fp8_staging`` need the others.
    return Markup(re.sub(r"([-._])(?=.)", r"\1<wbr>", str(escape(name))))


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"


def _tokens(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def build_templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(TEMPLATES))
    env = templates.env
    env.globals.update(
        tone=tone,
        severity=severity,
        version=__version__,
        ranges=list(RANGES),
        depth_bar=depth_bar,
        format_depth=format_depth,
    )
    env.filters.update(
        when=_when,
        seconds=_seconds,
        tokens=_tokens,
        readable_times=_readable_times,
        breakable=_breakable,
    )
    return templates


class _Renderer:
    """Renders a page's template, or the error page with a status and a readable message."""

    def __init__(self) -> None:
        self._templates = build_templates()

    def render(self, request: Request, name: str, status: int = 200, **values: Any) -> HTMLResponse:
        # Written piece by piece into one growing buffer: template.render joins a list of
        # every piece (~10 small strings per table cell), which at 500 endpoints held the
        # overview's 1.3 MB page as 14 MB of small objects at once (issue 25: such peaks in
        # a web thread leave CPython's arenas pinned). The page is whole before it is sent,
        # so a template that fails still gives an error, never half a page with a 200.
        template = self._templates.get_template(name)
        page = io.StringIO()
        for piece in template.generate({"request": request, **values}):
            page.write(piece)
        return HTMLResponse(page.getvalue(), status_code=status)

    def problem(self, request: Request, status: int, message: str) -> HTMLResponse:
        return self.render(request, "error.html", status, title=f"{status}", message=message)


def build_pages(ctx: WebContext) -> APIRouter:
    router = APIRouter(include_in_schema=False)
    queries = HistoryQueries(ctx.store)
    pages = _Renderer()
    _endpoint_pages(router, ctx, queries, pages)
    _probe_pages(router, ctx, queries, pages)
    _alert_pages(router, ctx, queries, pages)
    return router


def _endpoint_pages(
    router: APIRouter, ctx: WebContext, queries: HistoryQueries, pages: _Renderer
) -> None:
    """The overview (``/``) and one endpoint's page with its timeline."""
    render, problem = pages.render, pages.problem

    @router.get("/", response_class=HTMLResponse)
    def overview(request: Request) -> HTMLResponse:
        overviews = queries.overview(recent=STRIP, only=ctx.shown_endpoints())
        # The header and every row are built from this one list, so a column's heading is
        # always the kind of the badges under it. Only kinds some endpoint on the page has run
        # get a column: edge runs only when a pool is short, and most fleets never see it.
        # Bisect probes are search steps, not a scheduled kind with a latest verdict.
        kinds = [
            k.value
            for k in ProbeKind
            if k is not ProbeKind.BISECT and any(k.value in o.latest for o in overviews)
        ]
        rows = []
        for o in overviews:
            latest = [(kind, o.latest.get(kind)) for kind in kinds]
            status = worst(tone(p.verdict, p.state) for _, p in latest if p is not None)
            rows.append({"o": o, "latest": latest, "status": status})
        return render(request, "overview.html", title="Overview", kinds=kinds, rows=rows)

    @router.get("/endpoints/{name}", response_class=HTMLResponse)
    def endpoint(request: Request, name: str, range: str = "24h") -> HTMLResponse:
        if range not in RANGES:
            return problem(request, 400, f"range must be one of {', '.join(RANGES)}")
        ep = queries.endpoint(name)
        if ep is None:
            return problem(request, 404, f"no endpoint named {name!r}")
        until = ctx.now()
        since = until - RANGES[range]
        # A new endpoint's few minutes of history would be one bar at the right edge of a
        # 24 h chart: when the history is shorter than the range, the chart starts with it.
        first = queries.first_started_at(name)
        start = since if first is None else max(since, min(first, until - MIN_CHART))
        chart = queries.timeline(name, start, until, BUCKETS)
        page = queries.probes(ProbeFilter(endpoint=name), limit=PAGE)
        return render(
            request,
            "endpoint.html",
            title=name,
            ep=ep,
            served=ctx.store.served_windows(name).get(name),
            calibrations=ctx.store.calibrations(name),
            range=range,
            history_from=first if start > since else None,
            summary=queries.summary(name, since, until),
            timeline=svg.timeline(chart.buckets, chart.count, chart.start, until),
            tokens=svg.tokens(chart.buckets, chart.count, chart.start, until),
            has_points=bool(chart.buckets),
            page=page,
            changes=ctx.store.list_changes(name, CHANGES_SHOWN),
            budget=_budget(ctx, name, queries, until),
        )


def _budget(
    ctx: WebContext, name: str, queries: HistoryQueries, until: datetime
) -> dict[str, int | None] | None:
    """The endpoint's token budget, what its schedule plans (both as the daemon registered
    them) and what its canaries spent in the last 24 h; None without a budget."""
    budget = ctx.budget(name)
    if budget is None:
        return None
    day = queries.summary(name, until - timedelta(days=1), until)
    return {
        "budget": budget[0],
        "planned": budget[1],
        "spent": day.prompt_tokens + day.completion_tokens,
    }


def _probe_pages(
    router: APIRouter, ctx: WebContext, queries: HistoryQueries, pages: _Renderer
) -> None:
    """The filtered probe list and one probe with its evidence."""
    render, problem = pages.render, pages.problem
    settings = ctx.settings

    @router.get("/probes", response_class=HTMLResponse)
    def probes(
        request: Request,
        endpoint: str = "",
        kind: str = "",
        verdict: str = "",
        since: str = "",
        until: str = "",
        before_id: str = "",
    ) -> HTMLResponse:
        form = {
            "endpoint": endpoint,
            "kind": kind,
            "verdict": verdict,
            "since": since,
            "until": until,
        }
        try:
            filters = _filters(form, ctx.now())
            cursor = _cursor(before_id)
            page = queries.probes(filters, limit=PAGE, before_id=cursor)
        except (ParamError, CursorError) as exc:
            return problem(request, 400, str(exc))
        names = [e.name for e in queries.endpoints()]
        return render(
            request,
            "probes.html",
            title="Probes",
            page=page,
            form=form,
            endpoints=names,
            kinds=[k.value for k in ProbeKind],
            verdicts=[v.value for v in Verdict],
            query={k: v for k, v in form.items() if v},
        )

    @router.get("/probes/{probe_id}", response_class=HTMLResponse)
    def probe(request: Request, probe_id: str) -> HTMLResponse:
        pid = int(probe_id) if probe_id.isdigit() and 0 < int(probe_id) <= MAX_ID else None
        row = None if pid is None else queries.probe(pid)
        if pid is None or row is None:
            return problem(request, 404, f"no probe {probe_id}")
        return render(
            request,
            "probe.html",
            title=f"Probe {row.id}",
            p=row,
            excerpt=settings.excerpt(row.answer_excerpt),
            withheld=row.answer_excerpt is not None and not settings.answer_excerpts,
            burst_answers=[settings.excerpt(b.answer) for b in row.burst],
            cache_answers=[settings.excerpt(c.answer) for c in row.cache],
            confirmations=queries.confirmations_of(row.id),
        )


def _alert_pages(
    router: APIRouter, ctx: WebContext, queries: HistoryQueries, pages: _Renderer
) -> None:
    """Firing, pending and recently resolved alerts."""
    render, problem = pages.render, pages.problem

    @router.get("/alerts", response_class=HTMLResponse)
    def alerts(request: Request, resolved_within: str = "24h") -> HTMLResponse:
        try:
            span = parse_window(resolved_within, "resolved_within")
        except ParamError as exc:
            return problem(request, 400, str(exc))
        listed = queries.alerts(ctx.store, ctx.now() - span)
        return render(
            request,
            "alerts.html",
            title="Alerts",
            alerts=listed,
            within=format_duration(span.total_seconds()),
        )


def _filters(form: dict[str, str], now: datetime) -> ProbeFilter:
    kind, verdict = form["kind"], form["verdict"]
    if kind and kind not in {k.value for k in ProbeKind}:
        raise ParamError(f"unknown kind {kind!r}; one of: {', '.join(k.value for k in ProbeKind)}")
    if verdict and verdict not in {v.value for v in Verdict}:
        raise ParamError(
            f"unknown verdict {verdict!r}; one of: {', '.join(v.value for v in Verdict)}"
        )
    since = parse_time(form["since"], "since", now) if form["since"] else None
    until = parse_time(form["until"], "until", now) if form["until"] else None
    if since is not None and until is not None and since >= until:
        raise ParamError("since must be before until")
    return ProbeFilter(
        endpoint=form["endpoint"] or None,
        kind=kind or None,
        verdict=verdict or None,
        since=since,
        until=until,
    )


def _cursor(text: str) -> int | None:
    if not text:
        return None
    if not text.isdigit() or not 0 < int(text) <= MAX_ID:
        raise ParamError(f"before_id {text!r} is not a probe id")
    return int(text)
