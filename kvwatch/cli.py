"""The ``kvwatch`` command line. It only parses arguments, builds a config and hands over."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from kvwatch import __version__, logs
from kvwatch.canary.model import HEALTHY, DepthOutcome, ProbeKind, Verdict
from kvwatch.config import (
    Config,
    ConfigError,
    EndpointSpec,
    capacity_violations,
    format_duration,
    load_config,
)
from kvwatch.engines.base import Engine
from kvwatch.probe.chain import TENANT_KINDS
from kvwatch.probe.model import ProbeReport
from kvwatch.store.errors import StoreError

DEFAULT_CONFIG = Path("kvwatch.yaml")
# Seconds a thread waiting for the GIL waits before the running one is asked to drop it
# (CPython's default is 5 ms); see run.
GIL_SWITCH_INTERVAL = 0.0005

config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    envvar="KVWATCH_CONFIG",
    help="Configuration file (default: ./kvwatch.yaml).",
)


def _load(path: Path | None) -> Config:
    """Load and gate a config, or exit 1 naming every problem."""
    path = path or DEFAULT_CONFIG
    try:
        config = load_config(path)
    except ConfigError as exc:
        for line in exc.errors:
            click.echo(line, err=True)
        raise SystemExit(1) from None
    violations = capacity_violations(config)
    if violations:
        for line in violations:
            click.echo(line, err=True)
        raise SystemExit(1)
    return config


def _history_database(path: Path | None) -> str:
    """The database the history commands read: the configuration's, or, with no
    configuration here, the one ``kvwatch run`` writes in demo mode (./kvwatch.db)."""
    from kvwatch.demo import DEMO_DATABASE, DEMO_DATABASE_FILE

    if path is not None or DEFAULT_CONFIG.exists():
        return _load(path).database
    if not Path(DEMO_DATABASE_FILE).exists():
        click.echo(
            f"no {DEFAULT_CONFIG} here and no ./{DEMO_DATABASE_FILE} (what `kvwatch run` "
            "writes without one): give --config, or run this where kvwatch runs",
            err=True,
        )
        raise SystemExit(1)
    click.echo(
        f"no {DEFAULT_CONFIG}: reading ./{DEMO_DATABASE_FILE}, the database `kvwatch run` "
        "writes without one",
        err=True,
    )
    return DEMO_DATABASE


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kvwatch")
def main() -> None:
    """kvwatch: boundary canaries for LLM endpoints. A 200 is not a pass."""


@main.command()
@config_option
@click.option(
    "--grace", default=30.0, show_default=True, help="Seconds in-flight probes get on SIGTERM."
)
def run(config_path: Path | None, grace: float) -> None:
    """Run the monitoring daemon (demo mode with simulated endpoints when no config exists)."""
    from kvwatch.daemon import Daemon

    # Database calls run in worker threads while the event loop keeps the GIL busy; a
    # worker returning from SQLite or the PostgreSQL socket waited up to the default 5 ms
    # switch interval for it, several times per transaction, and its writer lock queued
    # every other write behind it (a 2 ms transaction took 10 ms at fleet scale, issue 13).
    sys.setswitchinterval(GIL_SWITCH_INTERVAL)

    if config_path is None and not DEFAULT_CONFIG.exists():
        from kvwatch.demo import run_demo

        logs.configure("info")
        asyncio.run(run_demo(grace_seconds=grace))
        return
    from kvwatch import arenas, jemalloc, memtrace

    # Before any thread of the daemon allocates (see kvwatch/arenas.py). Under jemalloc
    # glibc's malloc serves nothing, so there is nothing to tune (kvwatch/jemalloc.py).
    if not jemalloc.active():
        arenas.limit_arenas()
        arenas.fix_mmap_threshold()
    # Started before the config is read, so every allocation of the daemon is traced.
    trace = memtrace.start_from_env()
    config = _load(config_path)
    logs.configure(config.log_level)

    async def main_() -> None:
        daemon = Daemon(config, config_path=config_path or DEFAULT_CONFIG, grace_seconds=grace)
        daemon.install_signal_handlers()
        if trace is not None:
            trace.install(asyncio.get_running_loop())
        await daemon.run()

    try:
        asyncio.run(main_())
    except StoreError as exc:
        click.echo(f"kvwatch: {exc}", err=True)
        raise SystemExit(1) from None


@main.command("check-config")
@config_option
@click.option(
    "--live",
    is_flag=True,
    help="Also ask every endpoint for its window and KV pool (a pre-deploy gate).",
)
def check_config(config_path: Path | None, live: bool) -> None:
    """Validate a configuration (and the capacity gate); exit 0 if it is good, 1 if not."""
    path = config_path or DEFAULT_CONFIG
    click.echo(f"Checking {path}")
    try:
        config = load_config(path)
    except ConfigError as exc:
        click.echo("  FAILED:", err=True)
        for line in exc.errors:
            click.echo(line, err=True)
        raise SystemExit(1) from None
    violations = capacity_violations(config)
    if violations:
        click.echo("  FAILED:", err=True)
        for line in violations:
            click.echo(line, err=True)
        raise SystemExit(1)
    click.echo(f"  SUCCESS: {len(config.endpoints)} endpoints")
    for source in config.discovery:
        # Listed, not fetched: check-config reads the file only.
        every = format_duration(source.refresh_interval)
        click.echo(f"  DISCOVERY: {source.name} ({source.kind}, every {every})")
    for line in limit_notes(config) + cache_reporting_notes(config):
        click.echo(f"  NOTE: {line}")
    if live and not asyncio.run(_check_live(config)):
        raise SystemExit(1)


def limit_notes(config: Config) -> list[str]:
    """One sentence per endpoint whose engine cannot enforce its window, so nobody reads its
    over probe's verdict as a refusal it cannot give."""
    from kvwatch.engines.factory import has_hard_limit

    return [
        f"{spec.name}: flavour {spec.flavour} cannot enforce a context limit (it truncates an"
        " over-long prompt instead of refusing it): its over probe reports over_truncated"
        " (info, never a page), not a refusal"
        for spec in config.resolved_endpoints()
        if not has_hard_limit(spec.flavour)
    ]


# How each engine serves prompts from its prefix cache and reports it, for an endpoint that
# runs the cache probe: without a report its warm step says cache_not_exercised.
_CACHE_REPORTING = {
    "vllm": "vLLM caches prefixes by default (V1; off with --no-enable-prefix-caching) but "
    "reports usage.prompt_tokens_details.cached_tokens only when started with "
    "--enable-prompt-tokens-details",
    "sglang": "SGLang caches prefixes in its radix cache by default (off with "
    "--disable-radix-cache) but reports cached_tokens only when started with "
    "--enable-cache-report",
    "llamacpp": "llama.cpp's server caches the prompt by default (cache_prompt) and reports "
    "usage.prompt_tokens_details.cached_tokens; a model with sliding-window layers (Gemma 3) "
    "reuses a prefix only with --swa-full",
    "anthropic": "Anthropic reads its prompt cache only for blocks marked cache_control, which "
    "kvwatch does not send: expect cache_not_exercised",
}


def cache_reporting_notes(config: Config) -> list[str]:
    """One sentence per endpoint that runs the cache probe: how its engine caches prefixes
    and reports it, so a cache_not_exercised verdict says what to turn on."""
    default = (
        "the cache probe needs the engine's prefix cache on and its count of cached prompt "
        "tokens in usage.prompt_tokens_details.cached_tokens (vLLM: "
        "--enable-prompt-tokens-details; SGLang: --enable-cache-report; llama.cpp: by "
        "default)"
    )
    return [
        f"{spec.name}: {_CACHE_REPORTING.get(spec.flavour, default)}; without it the cache "
        "probe reports cache_not_exercised (info, never a page)"
        for spec in config.resolved_endpoints()
        if ProbeKind.CACHE in spec.probes
    ]


async def _check_live(config: Config) -> bool:
    """Discover each endpoint's window and pool; False if any is refused by the gate."""
    from kvwatch.capacity import FindingKind, assess
    from kvwatch.daemon import endpoint_engines
    from kvwatch.engines.base import EngineAuthError
    from kvwatch.engines.clients import build_http_client

    ok = True
    async with build_http_client() as client:
        for spec in config.resolved_endpoints():
            engine, _tenants = endpoint_engines(spec, client)
            try:
                async with asyncio.timeout(spec.timeouts[ProbeKind.CAPACITY]):
                    found = await engine.discover()
            except (EngineAuthError, TimeoutError) as exc:
                click.echo(f"{spec.name}: discovery failed: {exc or 'timed out'}", err=True)
                ok = False
                continue
            findings = assess(spec.context_window, spec.kv_pool_tokens, found)
            for finding in findings:
                refused = finding.kind is FindingKind.CAPACITY_MISMATCH
                line = f"{spec.name}: {finding.message}"
                click.echo(line, err=refused)
                ok = ok and not refused
            if not findings:
                click.echo(
                    f"{spec.name}: window {found.context_window or '-'}, "
                    f"KV pool {found.kv_pool_tokens or 'not reported'}: OK"
                )
            if spec.tokenizer != "server":
                window = spec.context_window or found.context_window
                click.echo(f"{spec.name}: {await _estimate_line(spec, engine, window)}")
    return ok


async def _estimate_line(spec: EndpointSpec, engine: Engine, window: int | None) -> str:
    """How far kvwatch's token estimate is from the engine's own count, measured now with
    one short request (a finding to read, not a failure: calibration corrects it)."""
    from kvwatch.daemon import token_counter
    from kvwatch.tokens.measure import measure

    if window is None:
        return f"tokenizer {spec.tokenizer}: no window known, cannot measure the estimate"
    try:
        counter = token_counter(spec, engine)
        found = await measure(
            engine, counter, window=window, timeout=spec.timeouts[ProbeKind.BASELINE]
        )
    except Exception as exc:  # a tokenizer that cannot load, a prompt that cannot be planned
        return f"tokenizer {spec.tokenizer}: cannot measure the estimate: {exc}"
    if found.reported is None:
        detail = found.exchange.error_detail or "no prompt token count reported"
        return (
            f"tokenizer {spec.tokenizer}: the engine reported no count for a "
            f"{found.planned}-token prompt ({detail}): it cannot be calibrated"
        )
    miss = (found.reported - found.planned) / found.planned
    return (
        f"tokenizer {spec.tokenizer}: kvwatch estimated {found.planned} prompt tokens, the "
        f"engine counted {found.reported} ({miss:+.1%}); calibration corrects this from the "
        "engine's reports"
    )


@main.command()
@config_option
@click.argument("name")
@click.option(
    "--kind",
    # Bisect probes are served-window search steps: they run after a window failure.
    type=click.Choice([*[k.value for k in ProbeKind if k is not ProbeKind.BISECT], "all"]),
    default="all",
    show_default=True,
)
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def probe(config_path: Path | None, name: str, kind: str, output: str) -> None:
    """Probe one endpoint now; exit 0 only if every verdict is healthy (a pre-deploy gate):
    pass, or over_truncated on an engine that truncates by design (Ollama)."""
    config = _load(config_path)
    # stdout is the probes' (a JSON consumer reads one probe per line); warnings say why on
    # stderr, beside the progress lines.
    logs.configure("warning", stream=sys.stderr)
    reports = asyncio.run(_probe(config, name, kind, quiet=output == "json"))
    if output == "json":
        for report in reports:
            click.echo(json.dumps(report_json(report)))
    else:
        click.echo(format_table(reports))
        if any(r.kind is ProbeKind.BISECT for r in reports):
            click.echo(_served_line(config, name))
    raise SystemExit(0 if gate_passes(reports) else 1)


def gate_passes(reports: Sequence[ProbeReport]) -> bool:
    """Whether ``kvwatch probe`` exits 0: every verdict healthy.

    A healthy Ollama cuts the over prompt as documented; failing the gate on that would make
    the gate useless for it (every deploy would be forced past a red check). A sizing miss
    re-planned by a later probe is a step of that probe, judged by it; one left standing (out
    of re-plans) means the boundary was not tested, which fails the gate.
    """
    if not reports:
        return False
    # A re-plan follows its miss at once, as the same kind (ids may be None while the
    # database is down, so they are matched by position).
    judged = [
        r
        for r, following in zip(reports, [*reports[1:], None], strict=True)
        if not (
            r.verdict is Verdict.SIZING_MISS
            and following is not None
            and following.kind is r.kind
            and following.confirms_probe_id is None
        )
    ]
    return all(r.verdict in HEALTHY for r in judged)


async def _probe(config: Config, name: str, kind: str, *, quiet: bool) -> list[ProbeReport]:
    from kvwatch.daemon import build

    built = await build(config, alerting=False)
    try:
        target = next((t for t in built.targets if t.spec.name == name), None)
        if target is None:
            names = ", ".join(t.spec.name for t in built.targets) or "none"
            raise click.UsageError(f"no endpoint named {name!r} (configured: {names})")
        kinds = target.spec.probes if kind == "all" else (ProbeKind(kind),)
        reports: list[ProbeReport] = []
        for k in kinds:
            # A gate checks every tenant: the daemon spreads them over slots, a one-shot
            # probe has one chance, so it runs the kind under each tenant in turn.
            tenants = target.spec.tenants if k in TENANT_KINDS else ()
            for tenant in tenants or (None,):
                who = "" if tenant is None else f" as {tenant.name}"

                def progress(line: str, k: ProbeKind = k, who: str = who) -> None:
                    click.echo(f"  {name} {k.value}{who}: {line}", err=True)

                if not quiet:
                    click.echo(f"probing {name} ({k.value}{who})…", err=True)
                reports += await built.runner.run_checked(
                    target, k, progress=progress, tenant=tenant
                )
        return reports
    finally:
        await built.clients.aclose()
        built.store.engine.dispose()


def report_json(r: ProbeReport) -> dict[str, Any]:
    return {
        "probe_id": r.probe_id,
        "endpoint": r.endpoint,
        "kind": r.kind.value,
        "tenant": r.tenant,
        "verdict": r.verdict.value,
        "reason": r.reason,
        "status": r.status,
        "planned_prompt_tokens": r.planned_prompt_tokens,
        "reported_prompt_tokens": r.reported_prompt_tokens,
        "marker": r.marker,
        "marker_found": r.marker_found,
        "foreign_markers": [
            {
                "marker": f.marker,
                "probe_id": f.probe_id,
                "endpoint": f.endpoint,
                "tenant": f.tenant,
                "issued_at": f.issued_at.isoformat(),
            }
            for f in r.foreign
        ],
        "duration_seconds": r.duration_seconds,
        "confirms_probe_id": r.confirms_probe_id,
        "trigger_probe_id": r.trigger_probe_id,
        "trace_id": r.trace_id,
        "finished_at": r.finished_at.isoformat(),
        # Only with several marker depths, so a single-depth object stays as it was.
        **(
            {
                "depths": [
                    {"depth": d.depth, "marker": d.marker, "outcome": d.outcome.value}
                    for d in r.depths
                ]
            }
            if r.depths
            else {}
        ),
    }


def format_table(reports: list[ProbeReport]) -> str:
    header: tuple[str, ...] = (
        "ID",
        "ENDPOINT",
        "KIND",
        "VERDICT",
        "STATUS",
        "PLANNED",
        "REPORTED",
        "MARKER",
        "REASON",
    )
    # The tenant column appears only for endpoints with tenants: other output is unchanged.
    tenanted = any(r.tenant is not None for r in reports)
    if tenanted:
        header = (*header[:3], "TENANT", *header[3:])
    rows = [header] + [
        (
            str(r.probe_id),
            r.endpoint,
            r.kind.value
            + (" (confirm)" if r.confirms_probe_id else "")
            + (f" (after {r.trigger_probe_id})" if r.trigger_probe_id else ""),
            *((r.tenant or "-",) if tenanted else ()),
            r.verdict.value,
            "-" if r.status is None else str(r.status),
            "-" if r.planned_prompt_tokens is None else str(r.planned_prompt_tokens),
            "-" if r.reported_prompt_tokens is None else str(r.reported_prompt_tokens),
            _marker_cell(r),
            r.reason,
        )
        for r in reports
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        for row in rows
    )


@main.command()
@config_option
@click.option("--endpoint", default=None, help="Only this endpoint.")
@click.option(
    "--kind", type=click.Choice([k.value for k in ProbeKind]), default=None, help="Only this kind."
)
@click.option(
    "--verdict",
    type=click.Choice([v.value for v in Verdict]),
    default=None,
    help="Only this verdict.",
)
@click.option("--region", default=None, help="Only probes run in this region (multi-region mode).")
@click.option("--tenant", default=None, help="Only probes sent with this tenant's credentials.")
@click.option(
    "--since", default=None, help="Only probes started since: a duration ago (24h) or an ISO time."
)
@click.option(
    "--until", default=None, help="Only probes started before: a duration ago or an ISO time."
)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000))
@click.option(
    "--output", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True
)
def results(
    config_path: Path | None,
    endpoint: str | None,
    kind: str | None,
    verdict: str | None,
    region: str | None,
    tenant: str | None,
    since: str | None,
    until: str | None,
    limit: int,
    output: str,
) -> None:
    """Stored probe results, newest first (json: one object per line)."""
    from datetime import UTC, datetime

    from kvwatch.daemon import history_store
    from kvwatch.store.queries import MAX_PAGE, HistoryQueries, ProbeFilter
    from kvwatch.web.params import ParamError, parse_time

    now = datetime.now(UTC)
    try:
        start = None if since is None else parse_time(since, "--since", now)
        end = None if until is None else parse_time(until, "--until", now)
    except ParamError as exc:
        raise click.UsageError(str(exc)) from None
    if start is not None and end is not None and start >= end:
        raise click.UsageError("--since must be before --until")
    database = _history_database(config_path)
    filters = ProbeFilter(
        endpoint=endpoint,
        kind=kind,
        verdict=verdict,
        region=region,
        tenant=tenant,
        since=start,
        until=end,
    )
    rows: list[Any] = []
    with history_store(database) as store:
        queries = HistoryQueries(store)
        before: int | None = None
        while len(rows) < limit:
            page = queries.probes(filters, limit=min(MAX_PAGE, limit - len(rows)), before_id=before)
            rows += page.probes
            if page.next_before_id is None:
                break
            before = page.next_before_id
    _echo_results(rows, output)


# The columns of `kvwatch results`, in order.
RESULT_FIELDS = (
    "id",
    "started_at",
    "endpoint",
    "kind",
    "state",
    "verdict",
    "http_status",
    "planned_prompt_tokens",
    "reported_prompt_tokens",
    "marker_found",
    "lost",
    "duration_seconds",
    "replica",
    "region",
    "tenant",
    "reason",
)


def _echo_results(rows: Sequence[Any], output: str) -> None:
    """``rows`` as JSON lines, CSV or an aligned table, one probe each."""
    from datetime import datetime

    records = [
        {
            f: (v.isoformat() if isinstance(v := _field(r, f), datetime) else v)
            for f in RESULT_FIELDS
        }
        for r in rows
    ]
    if output == "json":
        for record in records:
            click.echo(json.dumps(record))
    elif output == "csv":
        import csv

        writer = csv.DictWriter(sys.stdout, fieldnames=RESULT_FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)
    else:
        table = [RESULT_FIELDS] + [
            tuple("-" if r[f] is None else str(r[f]) for f in RESULT_FIELDS) for r in records
        ]
        widths = [max(len(row[i]) for row in table) for i in range(len(RESULT_FIELDS))]
        for row in table:
            click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _marker_cell(r: ProbeReport) -> str:
    if not r.depths:
        return "found" if r.marker_found else "missing"
    found = sum(1 for d in r.depths if d.outcome is DepthOutcome.FOUND)
    return f"{found}/{len(r.depths)} found"


@main.command()
@config_option
@click.argument("probe_id", type=click.IntRange(1, 2**63 - 1))
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def show(config_path: Path | None, probe_id: int, output: str) -> None:
    """All the evidence of one probe (the JSON is the API's /api/v1/probes/ID shape)."""
    from kvwatch.daemon import history_store
    from kvwatch.store.queries import HistoryQueries
    from kvwatch.web import schemas
    from kvwatch.web.settings import WebSettings

    with history_store(_history_database(config_path)) as store:
        queries = HistoryQueries(store)
        row = queries.probe(probe_id)
        confirmed_by = [] if row is None else [p.id for p in queries.confirmations_of(probe_id)]
    if row is None:
        click.echo(f"no probe {probe_id}", err=True)
        raise SystemExit(1)
    # Whoever can read the database can read the stored excerpt: show it whole.
    settings = WebSettings(excerpt_chars=len(row.answer_excerpt or ""))
    probe = schemas.probe(settings, row, confirmed_by)
    if output == "json":
        click.echo(probe.model_dump_json(indent=2))
        return
    click.echo(_probe_text(probe))


def _field(row: Any, name: str) -> Any:
    # "lost" is derived: which part of the prompt a several-depth probe lost.
    if name == "lost":
        from kvwatch.store.records import lost_part

        return lost_part(row.depths)
    return getattr(row, name)


def _burst_lines(requests: Any) -> list[str]:
    """A burst probe's requests, one line each: whose marker, right or not, and why."""
    lines = []
    for b in requests:
        if b.request == 0:
            who = "solo"
        elif b.control:
            who = f"{b.request} alone"  # a wrong member's control
        else:
            who = f"{b.request} of {b.size}"
        held = f", holds the marker of request {', '.join(map(str, b.siblings))}"
        lines.append(
            f"  request {who:<8} {b.marker} {b.outcome.upper()}: animal {b.expected}, "
            f"answered {b.answered or '-'}"
            + (held if b.siblings else "")
            + (f" ({b.detail})" if b.detail else "")
        )
    return lines


def _cache_lines(steps: Any) -> list[str]:
    """A cache probe's steps, one line each: what it asked, how much the cache served, and
    whether the right code came back."""
    lines = []
    for c in steps:
        cached = "-" if c.cached_tokens is None else f"{c.cached_tokens:,}"
        gave = f", gave the code of {', '.join(c.answered)}" if c.answered else ""
        lines.append(
            f"  step {c.step:<8} {c.document:<4} {c.key:<8} cached {cached:>6} "
            f"{c.outcome.upper()}{gave}" + (f" ({c.detail})" if c.detail else "")
        )
    return lines


def _probe_text(p: Any) -> str:
    """``kvwatch show`` as text: one labelled line per piece of evidence."""

    def n(value: int | None) -> str:
        return "-" if value is None else f"{value:,}"

    def s(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f} s"

    found = {None: "not checked", True: "found", False: "MISSING"}[p.marker_found]
    lines = [
        f"probe {p.id}: {p.verdict or p.state}"
        + (f" ({p.severity})" if p.severity not in (None, "none") else ""),
        f"  reason:        {p.reason or '-'}",
        f"  endpoint:      {p.endpoint} ({p.model})",
        f"  kind:          {p.kind}"
        + (f", confirming probe {p.confirms_probe_id}" if p.confirms_probe_id else ""),
    ]
    if p.tenant:
        lines.append(f"  tenant:        {p.tenant}")
    if p.confirmed_by:
        lines.append(f"  confirmed by:  {', '.join(f'probe {i}' for i in p.confirmed_by)}")
    lines += [
        f"  marker:        {p.marker} {found} (depth {p.marker_depth:.2f})",
    ]
    for d in p.depths:
        lines.append(f"  at depth {d.depth!r:<5}  {d.marker} {(d.outcome or 'not judged').upper()}")
    if p.lost:
        lines.append(f"  lost:          {p.lost}")
    lines += _burst_lines(p.burst)
    lines += _cache_lines(p.cache)
    for f in p.foreign_markers:
        lines.append(
            f"  LEAKED MARKER: {f.marker} of probe {f.probe_id} ({f.endpoint}, "
            + (f"tenant {f.tenant}, " if f.tenant else "")
            + f"issued {f.issued_at.isoformat()})"
        )
    lines += [
        f"  HTTP status:   {p.http_status if p.http_status is not None else '-'}"
        + (f", finish {p.finish_reason}" if p.finish_reason else "")
        + (", streamed" if p.streamed else ""),
        f"  prompt tokens: planned {n(p.planned_prompt_tokens)} (target "
        f"{n(p.target_prompt_tokens)}, {p.token_source}), reported {n(p.reported_prompt_tokens)}",
        f"  completion:    {n(p.completion_tokens)} of max {p.max_tokens}",
        f"  timings:       first byte {s(p.ttfb_seconds)}, total {s(p.duration_seconds)}",
        f"  started:       {p.started_at.isoformat()}",
        f"  finished:      {p.finished_at.isoformat() if p.finished_at else '-'} ({p.state})",
        f"  replica:       {p.replica}" + (f" (region {p.region})" if p.region else ""),
        f"  trace id:      {p.trace_id or '-'}",
    ]
    if p.answer_excerpt is not None:
        lines.append(f"  answer:        {p.answer_excerpt!r}")
    if p.error_body:
        lines.append(f"  error body:    {p.error_body}")
    if p.error_detail:
        lines.append(f"  error detail:  {p.error_detail}")
    return "\n".join(lines)


def _served_line(config: Config, name: str) -> str:
    from kvwatch.daemon import history_store
    from kvwatch.probe.model import describe_served as describe

    with history_store(config.database) as store:
        record = store.served_windows(name).get(name)
    if record is None or not record.measured:
        # Bisect steps ran, yet nothing was measured: the search was cut short.
        return "Served window: not measured (the search stopped without a result)."
    return describe(record)


@main.command("served-window")
@config_option
@click.argument("name", required=False)
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def served_window(config_path: Path | None, name: str | None, output: str) -> None:
    """What each endpoint really serves, as last measured after a window failure."""
    from kvwatch.daemon import history_store

    with history_store(_history_database(config_path)) as store:
        windows = store.served_windows(name)
    if output == "json":
        for endpoint, w in sorted(windows.items()):
            click.echo(
                json.dumps(
                    {
                        "endpoint": endpoint,
                        "source": w.source,
                        "advertised_tokens": w.advertised_tokens,
                        "served_tokens": w.served_tokens,
                        "unserved_tokens": w.unserved_tokens,
                        "exact": w.exact,
                        "probes": w.probes,
                        "prompt_tokens": w.prompt_tokens,
                        "probe_id": w.probe_id,
                        "measured_at": w.measured_at.isoformat(),
                    }
                )
            )
        return
    if not windows:
        click.echo("no served window measured yet" + (f" for {name}" if name else ""))
        return
    header = ("ENDPOINT", "ADVERTISED", "SERVED", "SOURCE", "EXACT", "PROBES", "PROBE", "MEASURED")
    rows = [header] + [
        (
            endpoint,
            f"{w.advertised_tokens:,}",
            f"{w.served_tokens:,}",
            w.source,
            "yes" if w.exact else f"< {w.unserved_tokens:,}" if w.unserved_tokens else "no",
            str(w.probes),
            "-" if w.probe_id is None else str(w.probe_id),
            w.measured_at.isoformat(timespec="seconds"),
        )
        for endpoint, w in sorted(windows.items())
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@main.command()
@config_option
def prune(config_path: Path | None) -> None:
    """Delete probe results older than the retention settings (critical ones are kept longer)."""
    from kvwatch.daemon import history_store
    from kvwatch.retention import prune_once

    config = _load(config_path)
    with history_store(config.database) as store:
        deleted = prune_once(store, config.retention)
    click.echo(f"pruned {deleted} probes")


@main.command()
@config_option
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def plan(config_path: Path | None, output: str) -> None:
    """Tokens per day the configured canaries will spend on each endpoint (prefill, answer)."""
    from dataclasses import asdict

    from kvwatch.cost import plan_costs

    config = _load(config_path)
    costs = plan_costs(config.resolved_endpoints())
    if output == "json":
        for c in costs:
            click.echo(json.dumps({**asdict(c), "kind": c.kind.value}))
        return

    def num(value: float | None) -> str:
        return "discovered at run time" if value is None else f"{value:,.0f}"

    header = ("ENDPOINT", "KIND", "PROMPT TOKENS", "PROBES/DAY", "PREFILL/DAY", "ANSWER/DAY")
    rows = [header] + [
        (
            c.endpoint,
            c.kind.value,
            num(c.prompt_tokens),
            f"{c.probes_per_day:,.0f}",
            num(c.prefill_tokens_per_day),
            f"{c.completion_tokens_per_day:,.0f}",
        )
        for c in costs
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        pairs = enumerate(zip(row, widths, strict=True))
        click.echo("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in pairs))
    known = [c.prefill_tokens_per_day for c in costs if c.prefill_tokens_per_day is not None]
    click.echo(f"total prefill per day: {sum(known):,.0f} tokens")
    budgeted = [s for s in config.resolved_endpoints() if s.budget_tokens_per_day is not None]
    spent = _spent_last_day(config.database, [s.name for s in budgeted]) if budgeted else {}
    for spec in budgeted:
        planned = spec.budget_planned_per_day
        used = spent.get(spec.name)
        click.echo(
            f"budget {spec.name}: {spec.budget_tokens_per_day:,} tokens a day; its schedule "
            f"plans {'-' if planned is None else f'{planned:,}'}; spent in the last 24 h: "
            f"{'-' if used is None else f'{used:,}'}"
        )
    for line in precision_notes(config.resolved_endpoints()) + cache_notes(costs):
        click.echo(f"NOTE: {line}")


def _spent_last_day(database: str, names: Sequence[str]) -> dict[str, int]:
    """Tokens each endpoint's canaries spent in the last 24 h, as the engines reported them;
    empty when the database cannot be read (plan needs none: it plans from the config)."""
    from datetime import UTC, datetime, timedelta

    from sqlalchemy.engine import make_url

    from kvwatch.daemon import history_store
    from kvwatch.store.errors import StoreError
    from kvwatch.store.queries import HistoryQueries

    url = make_url(database)
    if url.get_backend_name() == "sqlite" and not Path(url.database or "").is_file():
        return {}  # no history yet, and reading must not create the file
    until = datetime.now(UTC)
    try:
        with history_store(database) as store:
            queries = HistoryQueries(store)
            return {
                name: (day.prompt_tokens + day.completion_tokens)
                for name in names
                if (day := queries.summary(name, until - timedelta(days=1), until))
            }
    except StoreError:
        return {}


def cache_notes(costs: Sequence[Any]) -> list[str]:
    """Per cache probe: its tokens a cycle (prompt, of which cached, completion) and the age
    of the document its returning session asks about."""
    notes = []
    for c in costs:
        if c.cached_prompt_tokens is None:
            continue
        answer = c.completion_tokens_per_day / c.probes_per_day
        after = c.returning_after_seconds
        notes.append(
            f"{c.endpoint}: a cache cycle sends {c.prompt_tokens:,} prompt tokens, of which "
            f"about {c.cached_prompt_tokens:,} should be served from the prefix cache (only "
            f"the rest is prefilled), and up to {answer:,.0f} answer tokens; "
            + (
                "no returning session"
                if after is None
                else f"its returning session asks about a document {format_duration(after)} "
                "old (kept in memory: a restart loses them)"
            )
        )
    return notes


def precision_notes(specs: Sequence[EndpointSpec]) -> list[str]:
    """How precisely each endpoint's canaries hit the boundary: to the token with the
    engine's tokenizer; within a stated margin when kvwatch estimates."""
    from kvwatch.tokens.calibration import Calibration

    notes = []
    for spec in specs:
        if spec.tokenizer == "server":
            continue
        margin = Calibration(observations=1, error=0.0).tolerance(spec.context_window or 0)
        at = f" ({margin:,} tokens of this window)" if spec.context_window else ""
        notes.append(
            f"{spec.name}: tokens are estimated ({spec.tokenizer}): under and over land a "
            f"margin of 4x the calibrated typical miss from the boundary, at least 2 %{at}, "
            "wider until the engine's counts are learnt; verdicts use the engine's own count"
        )
    return notes


@main.group()
def db() -> None:
    """Database maintenance."""


@db.command("upgrade")
@config_option
def db_upgrade(config_path: Path | None) -> None:
    """Migrate the database schema to the latest revision."""
    from kvwatch.store import migrate

    config = _load(config_path)
    migrate.upgrade(config.database)
    click.echo(f"database at revision {migrate.head_revision()}")


def _register_commands() -> None:
    from kvwatch.healthcheck import healthcheck
    from kvwatch.simulator.command import simulate

    main.add_command(simulate)
    main.add_command(healthcheck)


_register_commands()

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
