"""The composition root: config → store → metrics → HTTP clients → runner → scheduler → web.

Everything kvwatch runs is built here and passed down; no module keeps mutable state of its
own. ``Daemon`` owns the lifecycle: start-up (migrate, recover interrupted probes, register
endpoints), the main wait, and the graceful shutdown on SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import sys
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import structlog
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from kvwatch import __version__, arenas, jemalloc
from kvwatch.alerting.alertmanager import AlertmanagerSettings, TLSSettings
from kvwatch.alerting.delivery import Delivery
from kvwatch.alerting.evaluator import KEEP_RETIRED, AlertEvaluator
from kvwatch.alerting.policy import default_policy
from kvwatch.canary.counting import TokenCounter
from kvwatch.canary.model import ProbeKind
from kvwatch.changes import ChangeWatcher
from kvwatch.config import Config, ConfigError, EndpointSpec, capacity_violations, load_config
from kvwatch.discovery.endpoints import merge
from kvwatch.discovery.loop import DiscoveryLoop
from kvwatch.discovery.sources import Source, build_source
from kvwatch.engines.base import Engine
from kvwatch.engines.clients import EndpointClients
from kvwatch.engines.factory import build_engine
from kvwatch.engines.tracing import TraceFormat, TraceSettings, instrument
from kvwatch.httpcycles import event_hooks
from kvwatch.metrics import (
    ConfigMetrics,
    DiscoveryMetrics,
    MallocCollector,
    ProbeMetrics,
    PythonBlocksCollector,
    ServedWindowCollector,
    SizesCollector,
)
from kvwatch.probe.model import EndpointState, Target
from kvwatch.probe.runner import ProbeRunner
from kvwatch.retention import retention_loop
from kvwatch.scheduler import ProbeScheduler
from kvwatch.store import migrate
from kvwatch.store.engine import create_engine_for
from kvwatch.store.errors import StoreError
from kvwatch.store.lock import sqlite_lock_for
from kvwatch.store.records import AlertStateRecord
from kvwatch.store.repository import Store
from kvwatch.tokens.factory import build_counter
from kvwatch.tokens.server import PieceCache
from kvwatch.web.app import WebContext, WebSettings, create_app
from kvwatch.web.server import EmbeddedServer, embedded_server, split_listen
from kvwatch.writebehind import ResultBuffer

log = structlog.get_logger("kvwatch.daemon")

# Settings bound at start: a reload reports their change as needing a restart.
RESTART_SETTINGS = ("database", "listen", "replica", "region", "alertmanager", "retention", "web")


@dataclass
class Built:
    store: Store
    registry: CollectorRegistry
    metrics: ProbeMetrics
    clients: EndpointClients
    runner: ProbeRunner
    targets: list[Target]
    delivery: Delivery | None = None
    alerts: AlertEvaluator | None = None
    # Filler piece counts by (flavour, model), kept across reloads: one entry per model some
    # target serves (a reload drops the others).
    piece_caches: dict[tuple[str, str], PieceCache] = field(default_factory=dict)


def alertmanager_settings(config: Config) -> AlertmanagerSettings | None:
    am = config.alertmanager
    if not am.urls:
        return None
    bearer = am.bearer_token or (am.bearer_token_file.value if am.bearer_token_file else None)
    password = None
    if am.basic_auth is not None:
        auth = am.basic_auth
        password = auth.password or (auth.password_file.value if auth.password_file else None)
    return AlertmanagerSettings(
        urls=tuple(am.urls),
        timeout=am.timeout,
        resend_interval=am.resend_interval,
        username=am.basic_auth.username if am.basic_auth else None,
        password=password.get_secret_value() if password else None,
        bearer_token=bearer.get_secret_value() if bearer else None,
        tls=TLSSettings(
            ca_file=str(am.tls.ca_file) if am.tls.ca_file else None,
            cert_file=str(am.tls.cert_file) if am.tls.cert_file else None,
            key_file=str(am.tls.key_file) if am.tls.key_file else None,
            insecure_skip_verify=am.tls.insecure_skip_verify,
        ),
    )


def web_settings(config: Config) -> WebSettings:
    web = config.web
    bearer = web.bearer_token or (web.bearer_token_file.value if web.bearer_token_file else None)
    basic = None
    if web.basic_auth is not None:
        auth = web.basic_auth
        password = auth.password or (auth.password_file.value if auth.password_file else None)
        if password is not None:
            basic = (auth.username, password.get_secret_value())
    return WebSettings(
        bearer_token=bearer.get_secret_value() if bearer else None,
        basic_auth=basic,
        protect_metrics=web.protect_metrics,
        answer_excerpts=web.answer_excerpts,
        excerpt_chars=web.answer_excerpt_chars,
        external_url=config.alertmanager.external_url,
    )


def trace_settings(config: Config) -> TraceSettings:
    """The trace context probes send, from ``trace:``."""
    return TraceSettings(format=TraceFormat(config.trace.format), header=config.trace.header)


def excerpt_chars(config: Config) -> int:
    """Characters of each answer kept as evidence; 0 stores none."""
    return config.web.answer_excerpt_chars if config.web.answer_excerpts else 0


def public_base_url(config: Config) -> str:
    """Where people reach this kvwatch: alerts link to probe pages under it."""
    if config.alertmanager.external_url:
        return config.alertmanager.external_url.rstrip("/")
    return f"http://{config.listen}"


def endpoint_engines(
    spec: EndpointSpec, client: httpx.AsyncClient
) -> tuple[Engine, dict[str, Engine]]:
    """The endpoint's adapter and one per tenant (cheap: they share ``client``), so a
    tenant's key is only ever sent on that tenant's canaries. The endpoint's own adapter
    (discovery, planning, probes without a tenant) sends its api_key, or the first tenant's
    when it has none.

    Every adapter of every flavour sends through ``client``: instrumenting it here is what
    puts the probe's trace context on each request they make (kvwatch.engines.tracing)."""
    instrument(client)

    def engine_with(key: SecretStr | None) -> Engine:
        return build_engine(
            flavour=spec.flavour,
            url=spec.url,
            model=spec.model,
            api_key=key.get_secret_value() if key else None,
            body_limit_bytes=spec.body_limit_bytes,
            client=client,
        )

    tenant_engines = {tenant.name: engine_with(tenant.api_key) for tenant in spec.tenants}
    default = spec.default_tenant
    engine = tenant_engines[default.name] if default is not None else engine_with(spec.api_key)
    return engine, tenant_engines


def token_counter(
    spec: EndpointSpec, engine: Engine, cache: PieceCache | None = None
) -> TokenCounter:
    """How the endpoint's tokens are counted (``tokenizer:``), through ``engine``."""
    return build_counter(spec.tokenizer, engine, cache)


@contextlib.contextmanager
def history_store(database: str) -> Iterator[Store]:
    """The store for a one-shot command (results, show, served-window, prune) on the
    ``database`` URL: not scoped to a region, so its reads see every region's history;
    closed on exit."""
    store = Store(create_engine_for(database))
    try:
        yield store
    finally:
        store.engine.dispose()


def build_targets(
    specs: Sequence[EndpointSpec],
    store: Store,
    client_for: Callable[[str], httpx.AsyncClient],
    metrics: ProbeMetrics,
    piece_caches: dict[tuple[str, str], PieceCache] | None = None,
) -> list[Target]:
    """Register ``specs`` and build their targets; ``client_for(name)``: the endpoint's HTTP
    client (:meth:`EndpointClients.for_endpoint` in the daemon); ``piece_caches``: the
    daemon's, so endpoints a reload adds share their model's counts (one of its own
    otherwise)."""
    targets = []
    # The served window measured before a restart or reload: the streak it belongs to goes on,
    # and the next page of that streak must describe it (the runner reads it again anyway).
    served = store.served_windows(among=[spec.name for spec in specs]) if specs else {}
    # Filler piece counts are shared by every endpoint serving the same model.
    caches = {} if piece_caches is None else piece_caches
    for spec in specs:
        endpoint_id = store.upsert_endpoint(
            spec.name,
            spec.url,
            spec.flavour,
            spec.model,
            spec.context_window,
            spec.kv_pool_tokens,
            dict(spec.labels),
        )
        engine, tenant_engines = endpoint_engines(spec, client_for(spec.name))
        cache = caches.setdefault((spec.flavour, spec.model), PieceCache())
        counter = token_counter(spec, engine, cache)
        metrics.register_endpoint(
            spec.name,
            spec.model,
            spec.flavour,
            {kind.value: spec.interval_for(kind) for kind in spec.probes},
            budget=(
                None
                if spec.budget_tokens_per_day is None
                else (spec.budget_tokens_per_day, spec.budget_planned_per_day)
            ),
        )
        targets.append(
            Target(
                spec=spec,
                endpoint_id=endpoint_id,
                engine=engine,
                counter=counter,
                tenant_engines=tenant_engines,
                state=EndpointState(served=served.get(spec.name)),
            )
        )
    return targets


async def build(config: Config, *, upgrade: bool = True, alerting: bool = True) -> Built:
    """Build every long-lived object from a validated config (shared by run and probe).

    ``alerting=False`` (the one-shot ``probe`` command) leaves alert state alone: only the
    daemon, which also delivers, may move it.
    """
    if upgrade:
        await asyncio.to_thread(migrate.upgrade, config.database)
    store = Store(create_engine_for(config.database), region=config.region)
    registry = CollectorRegistry()
    metrics = ProbeMetrics(registry)
    registry.register(ServedWindowCollector(store.served_windows))
    clients = EndpointClients()
    piece_caches: dict[tuple[str, str], PieceCache] = {}
    targets = await asyncio.to_thread(
        build_targets,
        config.resolved_endpoints(),
        store,
        clients.for_endpoint,
        metrics,
        piece_caches,
    )
    runner = ProbeRunner(
        store=store,
        metrics=metrics,
        replica=config.replica_id,
        excerpt_chars=excerpt_chars(config),
        trace=trace_settings(config),
    )
    delivery = None
    if alerting:
        base = public_base_url(config)
        settings = alertmanager_settings(config)
        alerts = AlertEvaluator(
            policy=default_policy(region=config.region),
            states=await asyncio.to_thread(store.load_alert_states),
            probe_url=lambda probe_id: f"{base}/probes/{probe_id}",
            # A removed endpoint's resolutions are kept for as long as delivery re-sends them.
            keep_retired=(
                KEEP_RETIRED if settings is None else timedelta(seconds=settings.resolved_retention)
            ),
        )
        runner.alert_hook = alerts
        if settings is not None:

            async def current_states() -> list[AlertStateRecord]:
                return alerts.records()

            delivery = Delivery(settings=settings, load_states=current_states, registry=registry)
            alerts.wake = delivery.notify
        return Built(
            store, registry, metrics, clients, runner, targets, delivery, alerts, piece_caches
        )
    return Built(store, registry, metrics, clients, runner, targets, piece_caches=piece_caches)


class Daemon:
    def __init__(
        self, config: Config, *, config_path: Path | None = None, grace_seconds: float = 30.0
    ) -> None:
        self.config = config
        self.config_path = config_path
        self.grace_seconds = grace_seconds
        self.stop = asyncio.Event()
        self._reload_lock = asyncio.Lock()
        self._built: Built | None = None
        self._scheduler: ProbeScheduler | None = None
        self._config_metrics: ConfigMetrics | None = None
        self._discovery: DiscoveryLoop | None = None
        self._discovery_client: httpx.AsyncClient | None = None
        # The probe kinds of each endpoint with alert states read back at start: those this
        # process does not run are retired once the configuration and every discovery source
        # have been read (then emptied).
        self._held_at_start: dict[str, set[str]] = {}

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        loop.add_signal_handler(signal.SIGHUP, self._on_sighup)

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("signal", signal=sig.name)
        self.stop.set()

    def _on_sighup(self) -> None:
        log.info("signal", signal="SIGHUP")
        task = asyncio.get_running_loop().create_task(self.reload(), name="reload")
        task.add_done_callback(lambda t: t.exception())  # outcome is logged by reload()

    async def reload(self) -> tuple[bool, str]:
        """Re-read the config file and apply endpoint changes without a restart.

        An invalid new config (or one the capacity gate refuses) is rejected whole and the
        running one stays. Settings that are bound at start (database, listen, replica,
        region, alertmanager, retention) are reported as needing a restart and not applied.
        """
        async with self._reload_lock:
            ok, message = await self._reload()
        if self._config_metrics is not None:
            if ok:
                self._config_metrics.loaded(datetime.now(UTC))
            else:
                self._config_metrics.failed()
        (log.info if ok else log.error)("reload", ok=ok, result=message)
        return ok, message

    async def _reload(self) -> tuple[bool, str]:
        if self.config_path is None:
            return False, "no configuration file to reload (demo mode)"
        if self._built is None or self._scheduler is None:
            return False, "kvwatch is not running yet"
        try:
            new = await asyncio.to_thread(load_config, self.config_path)
        except ConfigError as exc:
            return False, "\n".join(exc.errors)
        violations = capacity_violations(new)
        if violations:
            return False, "\n".join(violations)
        fixed = [key for key in RESTART_SETTINGS if getattr(new, key) != getattr(self.config, key)]
        ok, summary = await self._apply(new.resolved_endpoints())
        if not ok:
            return False, summary
        sources_changed = (new.discovery, new.defaults) != (
            self.config.discovery,
            self.config.defaults,
        )
        self.config = new.model_copy(update={key: getattr(self.config, key) for key in fixed})
        # The next probe carries the new trace format; those in flight keep theirs.
        assert self._built is not None
        self._built.runner.trace = trace_settings(new)
        if sources_changed and self._discovery is not None:
            # A removed source's endpoints are retired by this second apply; a new or
            # changed source has been fetched once already, so its list applies now.
            await self._discovery.replace(self._sources(self.config))
            ok, sources = await self._apply(self.config.resolved_endpoints())
            if not ok:
                return False, sources
            summary += f"; with the discovery sources now: {sources}"
        if fixed:
            summary += f"; restart to apply changes to: {', '.join(fixed)}"
        return True, summary

    async def _discovered(self) -> bool:
        """A discovery source's list changed: apply it as a reload would; False if that
        failed (the loop tries again)."""
        async with self._reload_lock:
            ok, summary = await self._apply(self.config.resolved_endpoints())
        (log.info if ok else log.error)("discovery_applied", ok=ok, result=summary)
        return ok

    async def _apply(self, static: Sequence[EndpointSpec]) -> tuple[bool, str]:
        """Probe exactly ``static`` and what the discovery sources list now: the one path by
        which endpoints start, change and stop being probed (reload and discovery)."""
        built, scheduler = self._built, self._scheduler
        assert built is not None and scheduler is not None
        discovered = self._discovery.endpoints() if self._discovery is not None else []
        merged, clashing = merge(static, discovered)
        for spec in clashing:
            # What the user wrote wins; the discovered one is not probed under that name.
            log.warning("discovered_name_taken", endpoint=spec.name, source=spec.source)
        old = {t.spec.name: t for t in built.targets}
        specs = {spec.name: spec for spec in merged}
        removed = [name for name in old if name not in specs]
        changed = [s for name, s in specs.items() if name not in old or old[name].spec != s]
        try:
            fresh = await asyncio.to_thread(
                build_targets,
                changed,
                built.store,
                built.clients.for_endpoint,
                built.metrics,
                built.piece_caches,
            )
        except StoreError as exc:
            return False, f"could not register endpoints: {exc}"
        for name in removed:
            await _retire(
                built, scheduler, old[name].spec, _removal_reason(old[name].spec, self.config)
            )
        for target in fresh:
            previous = old.get(target.spec.name)
            if previous is not None:
                _changed(built, scheduler, previous, target)
            elif built.alerts is not None:
                built.alerts.revive(target.spec.name)
            scheduler.add(target)
        fresh_names = {t.spec.name for t in fresh}
        # One assignment: the web layer's threads read this list (WebContext.probed).
        built.targets = [
            t for t in built.targets if t.spec.name in specs and t.spec.name not in fresh_names
        ] + fresh
        drop_unused_piece_caches(built.piece_caches, built.targets)
        if self._discovery is None or self._discovery.listed_all():
            await self._retire_unconfigured()
        return True, (
            f"{len(specs)} endpoints: {len([n for n in specs if n not in old])} added, "
            f"{len([s for s in changed if s.name in old])} changed, {len(removed)} removed"
        )

    async def _retire_unconfigured(self) -> None:
        """Resolve the alerts of endpoints an earlier process alerted on and this one does
        not probe, or of their probe kinds it does not run (removed from the file, or no
        longer listed, while kvwatch was stopped; a restart is how many deployments apply a
        new configuration): held from the database as they were, a firing one would be
        re-sent to Alertmanager for as long as this process runs, with nothing left to
        resolve it."""
        built = self._built
        if not self._held_at_start or built is None:
            return
        held, self._held_at_start = self._held_at_start, {}
        probed = {t.spec.name: t.spec for t in built.targets}
        gone = sorted(name for name in held if name not in probed)
        if gone:
            log.info("unconfigured_endpoints_retired", endpoints=gone)
        for name in gone:
            await _retire_alerts(built, name, UNCONFIGURED_AT_START)
        for name in sorted(held.keys() & probed.keys()):
            await _retire_stopped_probes(built, name, held[name])

    def _sources(self, config: Config) -> list[Source]:
        assert self._discovery_client is not None
        return [
            build_source(source, config.defaults, self._discovery_client)
            for source in config.discovery
        ]

    async def run(self) -> None:
        config = self.config
        async with AsyncExitStack() as stack:
            lock = sqlite_lock_for(config.database)
            if lock is not None:
                lock.acquire()
                stack.callback(lock.release)
            built = await build(config)
            self._built = built
            self._config_metrics = ConfigMetrics(built.registry)
            self._config_metrics.loaded(datetime.now(UTC))
            stack.push_async_callback(built.clients.aclose)
            stack.callback(built.store.engine.dispose)
            recovered = await _recover(built, config.replica_id)
            if built.delivery is not None:
                delivery_task = asyncio.create_task(built.delivery.run(), name="alert-delivery")
                stack.push_async_callback(_stop_delivery, built.delivery, delivery_task)
            watcher = ChangeWatcher(built.store, built.metrics, replica=config.replica_id)
            scheduler = ProbeScheduler(built.runner, watcher=watcher)
            self._scheduler = scheduler
            built.registry.register(SizesCollector(functools.partial(_sizes, built, scheduler)))
            built.registry.register(MallocCollector(_malloc_figures()))
            built.registry.register(PythonBlocksCollector(sys.getallocatedblocks))
            scheduler.start(built.targets)
            _start_loops(stack, built, scheduler, config)
            if built.alerts is not None:
                self._held_at_start = built.alerts.held()
            await self._start_discovery(stack, built)
            if self._discovery is None or self._discovery.listed_all():  # no sources
                await self._retire_unconfigured()
            web = self._web_server(built, scheduler)
            web_task = asyncio.create_task(web.serve(), name="web")
            log.info(
                "started",
                version=__version__,
                replica=config.replica_id,
                region=config.region,
                endpoints=[t.spec.name for t in built.targets],
                listen=config.listen,
                database=_safe_url(config.database),
                recovered_interrupted=recovered,
                malloc="jemalloc" if jemalloc.active() else "libc",
            )
            stop_task = asyncio.create_task(self.stop.wait(), name="stop")
            done, _ = await asyncio.wait({web_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
            if web_task in done and web_task.exception() is not None:
                log.error("web_server_failed", error=str(web_task.exception()))
            log.info("stopping", grace_seconds=self.grace_seconds)
            if self._discovery is not None:
                # No list change may add endpoints to a scheduler shutting down.
                await self._discovery.stop()
            await scheduler.shutdown(self.grace_seconds)
            web.should_exit = True
            await asyncio.wait({web_task}, timeout=5)
            stop_task.cancel()
            log.info("stopped")
            if web_task.done() and web_task.exception() is not None:
                raise SystemExit(f"web server failed: {web_task.exception()}")

    def _web_server(self, built: Built, scheduler: ProbeScheduler) -> EmbeddedServer:
        """The UI, API and /metrics, served inside the daemon's event loop."""
        host, port = split_listen(self.config.listen)
        context = WebContext(
            store=built.store,
            registry=built.registry,
            alive=lambda: scheduler.running,
            settings=web_settings(self.config),
            reload=self.reload,
            budget=built.metrics.budget_of,
            # built.targets is replaced whole by a reload, never changed in place: a page's
            # thread reads one list or the other.
            probed=lambda: {t.spec.name for t in built.targets},
        )
        return embedded_server(create_app(context), host, port)

    async def _start_discovery(self, stack: AsyncExitStack, built: Built) -> None:
        """Follow the discovery sources; their endpoints join through :meth:`_apply`."""
        client = httpx.AsyncClient(follow_redirects=True, event_hooks=event_hooks())
        stack.push_async_callback(client.aclose)
        self._discovery_client = client
        self._discovery = DiscoveryLoop(
            self._sources(self.config),
            on_change=self._discovered,
            metrics=DiscoveryMetrics(built.registry),
        )
        self._discovery.start()
        stack.push_async_callback(self._discovery.stop)


async def _recover(built: Built, replica: str) -> int:
    """What a previous process of this replica left: its running probes are marked
    interrupted (returned: how many), and its slot claims freed for the first runs."""
    recovered = await asyncio.to_thread(
        built.store.interrupt_running,
        replica=replica,
        reason="kvwatch stopped before the probe finished (recovered at start)",
    )
    if recovered:
        built.metrics.interrupted.inc(recovered)
    await asyncio.to_thread(built.store.expire_claims, replica)
    return recovered


def _start_loops(
    stack: AsyncExitStack, built: Built, scheduler: ProbeScheduler, config: Config
) -> None:
    """The loops beside the scheduler (expired-claim sweep, buffered-result flush,
    retention, malloc trim), each stopped by ``stack`` on the way out."""
    sweeping = asyncio.create_task(scheduler.sweep_expired(built.store), name="sweep")
    stack.push_async_callback(_cancel, sweeping)
    watching = asyncio.create_task(scheduler.watch_changes(), name="changes")
    stack.push_async_callback(_cancel, watching)
    flushing = asyncio.create_task(built.runner.results.run(), name="flush")
    stack.push_async_callback(_flush_and_cancel, built.runner.results, flushing)
    pruning = asyncio.create_task(retention_loop(built.store, config.retention), name="retention")
    stack.push_async_callback(_cancel, pruning)
    if not jemalloc.active():  # jemalloc returns its free pages itself (kvwatch/jemalloc.py)
        trimming = asyncio.create_task(arenas.trim_loop(), name="malloc-trim")
        stack.push_async_callback(_cancel, trimming)


def _malloc_figures() -> Callable[[], arenas.Heap | None]:
    """What kvwatch_malloc_bytes reads: jemalloc's statistics when it is the process's
    malloc, glibc's otherwise."""
    return jemalloc.heap if jemalloc.active() else arenas.heap


def _changed(built: Built, scheduler: ProbeScheduler, previous: Target, target: Target) -> None:
    """``target`` replaces ``previous`` (same name): unschedule the kinds it dropped, and once
    the endpoint's probes in flight have ended drop their series and resolve their alerts."""
    dropped = [k for k in previous.spec.probes if k not in target.spec.probes]
    scheduler.remove(target.spec.name, dropped)
    scheduler.when_idle(
        target.spec.name,
        functools.partial(_forget_dropped, built, scheduler, target.spec.name, dropped),
    )
    if dropped:
        # Once its probes in flight have ended, none of a kind it no longer runs can report
        # again: that kind's alerts resolve, or they would be re-sent for good.
        scheduler.when_idle(
            target.spec.name, functools.partial(_retire_stopped_probes, built, target.spec.name)
        )
    # build_targets has just set the info series of the new spec: removing the old one when
    # it has the same labels would remove that one.
    was, now = previous.spec, target.spec
    if (was.model, was.flavour) != (now.model, now.flavour):
        built.metrics.forget_info(was.name, was.model, was.flavour)


async def _retire_stopped_probes(
    built: Built, name: str, held: Collection[str] | None = None
) -> None:
    """Resolve the alerts of ``name``'s probe kinds that its configuration no longer runs
    (see :meth:`EndpointSpec.runs`), in memory and in the database; ``held``: the kinds it
    has states of, when the caller knows them (else read from the evaluator)."""
    spec = next((t.spec for t in built.targets if t.spec.name == name), None)
    if built.alerts is None or spec is None:  # removed meanwhile: _retire took all of it
        return
    kinds = built.alerts.held().get(name, set()) if held is None else held
    stopped = sorted(k for k in kinds if not spec.runs(k))
    if not stopped:
        return
    log.info("stopped_probes_retired", endpoint=name, probes=stopped)
    retired = built.alerts.retire_probes(name, stopped, STOPPED_PROBES)
    await _save_retired(built, name, retired)


STOPPED_PROBES = "kvwatch no longer runs this probe on the endpoint (removed from its probes)"

UNCONFIGURED_AT_START = (
    "kvwatch restarted without the endpoint in its configuration or discovery lists"
)


def _removal_reason(spec: EndpointSpec, config: Config) -> str:
    """Why ``spec`` is no longer probed (``config``: the configuration now applied): said on
    the alerts its removal resolves."""
    if spec.source is None:
        return "the endpoint was removed from the configuration"
    if spec.source not in {source.name for source in config.discovery}:
        return f"discovery source {spec.source} was removed from the configuration"
    return f"discovery source {spec.source} no longer lists the endpoint"


async def _retire(built: Built, scheduler: ProbeScheduler, spec: EndpointSpec, reason: str) -> None:
    """An endpoint is no longer probed: unschedule it, close its client once idle, resolve
    its alerts with ``reason`` and drop its series, and once it is idle drop them again (a
    probe in flight made them anew). Its history stays in the database."""
    name = spec.name
    scheduler.remove(name, spec.probes)
    built.clients.retire(name, idle=functools.partial(_idle_then_forget, built, scheduler, spec))
    await _retire_alerts(built, name, reason)
    built.metrics.forget_endpoint(name, spec.model, spec.flavour, [k.value for k in spec.probes])


async def _retire_alerts(built: Built, name: str, reason: str) -> None:
    """Resolve ``name``'s firing alerts with ``reason`` and clear its pending ones, in
    memory (what delivery sends) and in the database."""
    if built.alerts is None:
        return
    await _save_retired(built, name, built.alerts.retire(name, reason))


async def _save_retired(built: Built, name: str, retired: list[AlertStateRecord]) -> None:
    """Store the states a retirement ended, then adopt them (what delivery sends); kept as
    they were if the database refuses (tried again by the next retirement or restart)."""
    assert built.alerts is not None
    if not retired:
        return
    try:
        await asyncio.to_thread(built.store.save_alert_states, retired)
    except StoreError as exc:
        log.warning("retire_alerts_failed", endpoint=name, error=str(exc))
    else:
        built.alerts.committed(retired)


async def _idle_then_forget(built: Built, scheduler: ProbeScheduler, spec: EndpointSpec) -> None:
    """Wait for a removed endpoint's last running probe, then drop its series again: that
    probe's result, recorded after the removal, made them anew (for good: no later removal
    would come for them). Its alert states, stored with it, went over the resolved rows
    retire wrote: those are written again."""
    await scheduler.idle(spec.name)
    if scheduler.schedules(spec.name):  # added again meanwhile
        return
    kinds = [k.value for k in spec.probes]
    built.metrics.forget_endpoint(spec.name, spec.model, spec.flavour, kinds)
    if built.alerts is None:
        return
    corrections = built.alerts.corrections(spec.name)
    if not corrections:
        return
    try:
        await asyncio.to_thread(built.store.save_alert_states, corrections)
    except StoreError as exc:
        # Delivery reads the evaluator, which kept the resolution: only the history's
        # alerts page shows the late row until the endpoint comes back.
        log.warning("retire_alerts_failed", endpoint=spec.name, error=str(exc))


def _forget_dropped(
    built: Built, scheduler: ProbeScheduler, name: str, dropped: Sequence[ProbeKind]
) -> None:
    """Drop the series of the kinds a reload took from ``name``, once its probes in flight
    ended (one of a dropped kind would make them anew), unless a later reload put the kind
    back meanwhile."""
    gone = [k.value for k in dropped if k not in scheduler.kinds(name)]
    if gone:
        built.metrics.forget_kinds(name, gone)


def drop_unused_piece_caches(
    caches: dict[tuple[str, str], PieceCache], targets: Sequence[Target]
) -> None:
    """Forget the piece counts of models no target serves any more (a probe of a removed
    endpoint still running keeps its own reference)."""
    served = {(t.spec.flavour, t.spec.model) for t in targets}
    for key in [key for key in caches if key not in served]:
        del caches[key]


def _sizes(built: Built, scheduler: ProbeScheduler) -> dict[str, int]:
    """What kvwatch_internal_entries exports: the long-lived maps kept per endpoint."""
    sizes = {
        "targets": len(built.targets),
        "piece_caches": len(built.piece_caches),
        "http_clients": len(built.clients),
        "results_buffered": len(built.runner.results),
        **built.metrics.sizes(),
        **scheduler.sizes(),
    }
    if built.alerts is not None:
        sizes["alert_states"] = built.alerts.state_count
    return sizes


async def _flush_and_cancel(results: ResultBuffer, task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    if len(results) and not await results.flush():
        log.error("results_lost_at_exit", count=len(results))


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _stop_delivery(delivery: Delivery, task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await delivery.aclose()


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
