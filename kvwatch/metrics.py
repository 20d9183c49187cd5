"""Prometheus metrics for probes. Every metric lives in a registry passed in (no globals)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from kvwatch import __version__
from kvwatch.arenas import Heap
from kvwatch.canary.model import HEALTHY, INCONCLUSIVE, Verdict

# Up to 10 minutes: a 1M-token prefill on a busy engine legitimately takes minutes.
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 180, 300, 450, 600)
_LABELS = ("endpoint", "probe")
# The ``type`` label values of kvwatch_canary_tokens.
TOKEN_TYPES = ("prompt", "completion")
# The ``type`` label values of kvwatch_canary_budget_tokens.
BUDGET_TYPES = ("budget", "planned")
# The ``reason`` label values of kvwatch_endpoint_changes (kvwatch.fingerprint.Reason).
CHANGE_REASONS = ("fingerprint", "restart")


class ProbeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.success = Gauge(
            "kvwatch_probe_success",
            "1 if the last probe of this endpoint and kind was healthy (pass, or over_truncated on"
            " an engine that truncates by design), else 0.",
            _LABELS,
            registry=registry,
        )
        self.last_run = Gauge(
            "kvwatch_probe_last_run_timestamp_seconds",
            "When the last probe of this endpoint and kind finished.",
            _LABELS,
            registry=registry,
        )
        self.last_success = Gauge(
            "kvwatch_probe_last_success_timestamp_seconds",
            "When a probe of this endpoint and kind was last healthy.",
            _LABELS,
            registry=registry,
        )
        self.interval = Gauge(
            "kvwatch_probe_interval_seconds",
            "Configured interval between probes (the staleness rule compares against it).",
            _LABELS,
            registry=registry,
        )
        self.duration = Histogram(
            "kvwatch_probe_duration_seconds",
            "Time from sending a canary to its full answer.",
            _LABELS,
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.planned_tokens = Gauge(
            "kvwatch_probe_planned_prompt_tokens",
            "Prompt tokens kvwatch planned for the last probe.",
            _LABELS,
            registry=registry,
        )
        self.reported_tokens = Gauge(
            "kvwatch_probe_reported_prompt_tokens",
            "Prompt tokens the engine reported for the last probe (NaN if none).",
            _LABELS,
            registry=registry,
        )
        self.probes = Counter(
            "kvwatch_probes",
            "Probes finished, by verdict.",
            (*_LABELS, "verdict"),
            registry=registry,
        )
        self.failures = Counter(
            "kvwatch_probe_failures",
            "Probes whose verdict was a finding (not pass or over_truncated), by verdict.",
            (*_LABELS, "verdict"),
            registry=registry,
        )
        self.last_verdict = Gauge(
            "kvwatch_probe_last_verdict",
            "1 for the verdict of the last probe of this endpoint and kind, 0 for the others.",
            (*_LABELS, "verdict"),
            registry=registry,
        )
        self.canary_tokens = Counter(
            "kvwatch_canary_tokens",
            "Tokens spent by canaries, as the engine reported them.",
            (*_LABELS, "type"),
            registry=registry,
        )
        self.endpoint_info = Gauge(
            "kvwatch_endpoint_info",
            "Static facts of a monitored endpoint (always 1).",
            ("endpoint", "model", "flavour"),
            registry=registry,
        )
        # Tenant names are bounded by configuration, and only the latest pair per endpoint
        # and kind is kept: one series each, never tenants² of them.
        self.cross_tenant_leak = Gauge(
            "kvwatch_cross_tenant_leak_timestamp_seconds",
            "Unix time of the latest cross-tenant leak seen by this endpoint's probes of this "
            "kind, labelled with the tenant served and the tenant whose marker it held.",
            (*_LABELS, "source_tenant", "tenant"),
            registry=registry,
        )
        # The pair each (endpoint, kind) series is labelled with now, to replace it.
        # These three caches hold one entry per configured endpoint and kind: bounded by
        # the configuration, as forget_endpoint drops a removed endpoint's entries.
        self._leak_pairs: dict[tuple[str, str], tuple[str, str]] = {}
        self._series: dict[tuple[str, str], _KindSeries] = {}
        self._tokens: dict[tuple[str, str], tuple[Any, Any]] = {}
        # Changes in what an endpoint says about itself (kvwatch.fingerprint), counted where
        # they were recorded: sum over replicas for the fleet's count.
        self.endpoint_changes = Counter(
            "kvwatch_endpoint_changes",
            "Changes seen in an endpoint's self-report (a redeploy or restart).",
            ("endpoint", "reason"),
            registry=registry,
        )
        # Compare with rate(kvwatch_canary_tokens_total[1d]) * 86400 for what was spent.
        self.budget_tokens = Gauge(
            "kvwatch_canary_budget_tokens",
            "Canary tokens a day per endpoint: its budget (type=budget) and what its schedule "
            "plans (type=planned).",
            ("endpoint", "type"),
            registry=registry,
        )
        # The same figures by endpoint, for the web UI: reading a gauge back through
        # registry.get_sample_value collects every series (tens of thousands on a large
        # fleet) under the GIL. One entry per configured endpoint; forget_endpoint drops it.
        self._budgets: dict[str, tuple[int, int | None]] = {}
        self.interrupted = Counter(
            "kvwatch_probes_interrupted",
            "Probes marked interrupted (shutdown, crash recovery).",
            registry=registry,
        )
        build = Gauge("kvwatch_build_info", "kvwatch version.", ("version",), registry=registry)
        build.labels(__version__).set(1)

    def register_endpoint(
        self,
        endpoint: str,
        model: str,
        flavour: str,
        kinds: dict[str, float],
        budget: tuple[int, int | None] | None = None,
    ) -> None:
        """``budget``: the endpoint's tokens a day and what its schedule plans (None when
        the window is known only at run time)."""
        self.endpoint_info.labels(endpoint, model, flavour).set(1)
        for kind, interval in kinds.items():
            self.interval.labels(endpoint, kind).set(interval)
        for budget_type in BUDGET_TYPES:
            with contextlib.suppress(KeyError):
                self.budget_tokens.remove(endpoint, budget_type)
        self._budgets.pop(endpoint, None)
        if budget is not None:
            self._budgets[endpoint] = budget
            self.budget_tokens.labels(endpoint, "budget").set(budget[0])
            if budget[1] is not None:
                self.budget_tokens.labels(endpoint, "planned").set(budget[1])

    def forget_endpoint(self, endpoint: str, model: str, flavour: str, kinds: list[str]) -> None:
        """Drop a removed endpoint's series, so it does not look stale (and page) forever,
        and every child and cache kept for it, so a fleet that churns does not grow."""
        self.forget_info(endpoint, model, flavour)
        self.forget_kinds(endpoint, kinds)
        self._budgets.pop(endpoint, None)
        for budget_type in BUDGET_TYPES:
            with contextlib.suppress(KeyError):
                self.budget_tokens.remove(endpoint, budget_type)
        for reason in CHANGE_REASONS:
            with contextlib.suppress(KeyError):
                self.endpoint_changes.remove(endpoint, reason)

    def forget_info(self, endpoint: str, model: str, flavour: str) -> None:
        """Drop the endpoint's info series (a reload that changes its model or flavour
        replaces it; one that keeps them must not call this)."""
        with contextlib.suppress(KeyError):
            self.endpoint_info.remove(endpoint, model, flavour)

    def forget_kinds(self, endpoint: str, kinds: list[str]) -> None:
        """Drop every series of ``endpoint`` labelled with one of ``kinds`` (and the cached
        children behind them): ``remove`` on each labelled metric, for every label value
        the endpoint may have used."""
        per_kind, per_verdict = self._per_kind(), self._per_verdict()
        for kind in kinds:
            self._series.pop((endpoint, kind), None)
            self._tokens.pop((endpoint, kind), None)
            self._drop_leak_pair(endpoint, kind)
            for metric in per_kind:
                with contextlib.suppress(KeyError):
                    metric.remove(endpoint, kind)
            for metric in per_verdict:
                for verdict in Verdict:
                    with contextlib.suppress(KeyError):
                        metric.remove(endpoint, kind, verdict.value)
            for token_type in TOKEN_TYPES:
                with contextlib.suppress(KeyError):
                    self.canary_tokens.remove(endpoint, kind, token_type)

    def _per_kind(self) -> tuple[MetricWrapperBase, ...]:
        """The metrics labelled (endpoint, kind)."""
        return (
            self.success,
            self.last_run,
            self.last_success,
            self.interval,
            self.duration,
            self.planned_tokens,
            self.reported_tokens,
        )

    def _per_verdict(self) -> tuple[MetricWrapperBase, ...]:
        """The metrics labelled (endpoint, kind, verdict)."""
        return (self.probes, self.failures, self.last_verdict)

    def sizes(self) -> dict[str, int]:
        """Entries held per endpoint and kind (see :class:`SizesCollector`)."""
        labelled = (
            *self._per_kind(),
            *self._per_verdict(),
            self.canary_tokens,
            self.endpoint_info,
            self.cross_tenant_leak,
            self.endpoint_changes,
            self.budget_tokens,
        )
        return {
            "metric_children": sum(_children(m) for m in labelled),
            "metric_series_cache": len(self._series),
            "metric_token_cache": len(self._tokens),
            "metric_leak_pairs": len(self._leak_pairs),
            "metric_budgets": len(self._budgets),
        }

    def budget_of(self, endpoint: str) -> tuple[int, int | None] | None:
        """The endpoint's canary tokens a day and what its schedule plans, as last
        registered; None without a budget."""
        return self._budgets.get(endpoint)

    def observe_cross_tenant_leak(
        self, *, endpoint: str, kind: str, source_tenant: str, tenant: str, at: datetime
    ) -> None:
        """Record a cross-tenant leak; the series of the previous pair, if any, goes."""
        self._drop_leak_pair(endpoint, kind)
        self.cross_tenant_leak.labels(endpoint, kind, source_tenant, tenant).set(at.timestamp())
        self._leak_pairs[(endpoint, kind)] = (source_tenant, tenant)

    def _drop_leak_pair(self, endpoint: str, kind: str) -> None:
        pair = self._leak_pairs.pop((endpoint, kind), None)
        if pair is not None:
            with contextlib.suppress(KeyError):
                self.cross_tenant_leak.remove(endpoint, kind, *pair)

    def observe(
        self,
        *,
        endpoint: str,
        kind: str,
        verdict: Verdict,
        finished_at: datetime,
        duration: float | None,
        planned: int | None,
        reported: int | None,
        completion: int | None,
    ) -> None:
        ts = finished_at.timestamp()
        series = self._series_of(endpoint, kind)
        # over_truncated is what a healthy engine without a hard limit answers: counting it
        # as a failure would turn every Ollama's success gauge into a permanent 0.
        passed = verdict in HEALTHY
        series.counter(self.probes, verdict).inc()
        if not passed:
            series.counter(self.failures, verdict).inc()
        # A throttled or mis-sized probe says nothing about correctness: keep the last state.
        if verdict not in INCONCLUSIVE:
            series.success.set(1 if passed else 0)
            series.show_verdict(self.last_verdict, verdict)
        series.last_run.set(ts)
        if passed:
            series.last_success.set(ts)
        if duration is not None:
            series.duration.observe(duration)
        if planned is not None:
            series.planned.set(planned)
        series.reported.set(float("nan") if reported is None else reported)
        self.observe_tokens(endpoint=endpoint, kind=kind, reported=reported, completion=completion)

    def observe_tokens(
        self, *, endpoint: str, kind: str, reported: int | None, completion: int | None
    ) -> None:
        """Count only the tokens a probe spent. For bisect probes: their verdicts are search
        steps, and per-probe gauges (last verdict, success) would look like an incident."""
        # Only these two series: a bisect probe must not create the per-probe gauges.
        key = (endpoint, kind)
        tokens = self._tokens.get(key)
        if tokens is None:
            tokens = self._tokens[key] = (
                self.canary_tokens.labels(endpoint, kind, TOKEN_TYPES[0]),
                self.canary_tokens.labels(endpoint, kind, TOKEN_TYPES[1]),
            )
        if reported is not None:
            tokens[0].inc(reported)
        if completion is not None:
            tokens[1].inc(completion)

    def _series_of(self, endpoint: str, kind: str) -> _KindSeries:
        # ``labels()`` validates, locks and hashes on every call; at fleet scale the ~30
        # lookups per probe were a twentieth of kvwatch's CPU (issue 13), so each
        # endpoint and kind keeps its children. forget_endpoint drops them with the series.
        series = self._series.get((endpoint, kind))
        if series is None:
            series = _KindSeries(
                success=self.success.labels(endpoint, kind),
                last_run=self.last_run.labels(endpoint, kind),
                last_success=self.last_success.labels(endpoint, kind),
                duration=self.duration.labels(endpoint, kind),
                planned=self.planned_tokens.labels(endpoint, kind),
                reported=self.reported_tokens.labels(endpoint, kind),
                labels=(endpoint, kind),
            )
            self._series[(endpoint, kind)] = series
        return series


def _children(metric: Any) -> int:
    """How many labelled children ``metric`` holds (prometheus_client keeps them in
    ``_metrics``; no public API counts them)."""
    return len(getattr(metric, "_metrics", ()))


class SizesCollector(Collector):
    """``kvwatch_internal_entries``: how many entries kvwatch's long-lived maps hold.

    Read at scrape time from the callables given (``len`` of a dict: cheap). It lets a soak
    run or an operator see that a removed endpoint's entries went with it, and which map
    grows if memory does (issue 25).
    """

    def __init__(self, sizes: Callable[[], Mapping[str, int]]) -> None:
        self._sizes = sizes

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "kvwatch_internal_entries",
            "Entries held by a long-lived in-memory map of kvwatch, by map.",
            labels=["map"],
        )
        for name, size in sorted(self._sizes().items()):
            family.add_metric([name], size)
        yield family

    def describe(self) -> Iterator[Metric]:
        # Registration must not call the sizes (the daemon is not built yet).
        return iter(())


class MallocCollector(Collector):
    """``kvwatch_malloc_bytes{state}``: what malloc (glibc's, or jemalloc's when kvwatch
    runs under it) holds, read at scrape time.

    ``free`` is memory the process freed that malloc kept instead of returning it: RSS that
    grows while ``allocated`` does not is held free space, not live data (issue 25). Nothing
    is exported where the allocator gives no figures (a C library without ``mallinfo2``).
    """

    def __init__(self, heap: Callable[[], Heap | None]) -> None:
        self._heap = heap

    def collect(self) -> Iterator[Metric]:
        heap = self._heap()
        if heap is None:
            return
        family = GaugeMetricFamily(
            "kvwatch_malloc_bytes",
            "Bytes held by the C library's malloc, by state: allocated (in use), free (kept "
            "by malloc, not returned to the OS), mmapped (glibc only: large chunks with a "
            "mapping of their own, in use).",
            labels=["state"],
        )
        family.add_metric(["allocated"], heap.allocated)
        family.add_metric(["free"], heap.free)
        if heap.mmapped is not None:
            family.add_metric(["mmapped"], heap.mmapped)
        yield family

    def describe(self) -> Iterator[Metric]:
        return iter(())


class PythonBlocksCollector(Collector):
    """``kvwatch_python_allocated_blocks``: small objects alive in CPython's own allocator.

    Read at scrape time (``sys.getallocatedblocks()``, a walk over its arenas: cheap). It is
    the live part of the memory outside malloc: RSS that keeps growing while this stays flat
    is memory held in part-used arenas after a transient peak, not a leak of objects
    (issue 25). Zero where the interpreter does not use its small-object allocator.
    """

    def __init__(self, blocks: Callable[[], int]) -> None:
        self._blocks = blocks

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "kvwatch_python_allocated_blocks",
            "Memory blocks allocated by CPython's small-object allocator: live small objects.",
            value=self._blocks(),
        )

    def describe(self) -> Iterator[Metric]:
        return iter(())


@dataclass(slots=True)
class _KindSeries:
    """One endpoint and kind's labelled children (prometheus_client's, typed loosely)."""

    success: Any
    last_run: Any
    last_success: Any
    duration: Any
    planned: Any
    reported: Any
    labels: tuple[str, str]
    # Bounded: two counters times the verdicts, and one gauge child per verdict.
    counters: dict[tuple[int, Verdict], Any] = field(default_factory=dict)
    verdicts: dict[Verdict, Any] = field(default_factory=dict)
    shown: Verdict | None = None

    def counter(self, metric: Counter, verdict: Verdict) -> Any:
        key = (id(metric), verdict)
        child = self.counters.get(key)
        if child is None:
            child = self.counters[key] = metric.labels(*self.labels, verdict.value)
        return child

    def show_verdict(self, gauge: Gauge, verdict: Verdict) -> None:
        """1 for ``verdict``, 0 for every other one; only the two that change are written."""
        if not self.verdicts:
            self.verdicts = {v: gauge.labels(*self.labels, v.value) for v in Verdict}
            for child in self.verdicts.values():
                child.set(0)
        elif self.shown is not None:
            self.verdicts[self.shown].set(0)
        self.verdicts[verdict].set(1)
        self.shown = verdict


class ServedWindow(Protocol):
    """What the gauge needs of a stored served-window measurement."""

    @property
    def served_tokens(self) -> int: ...
    @property
    def advertised_tokens(self) -> int: ...


class ServedWindowCollector(Collector):
    """``kvwatch_endpoint_served_window_tokens``, read from the database at scrape time.

    The measurement lives in the store (written by whichever replica ran the search), so it is
    exported from there rather than mirrored by hand: every replica shows the same number,
    and a restart does not lose it. A database that cannot answer yields no sample (absent,
    not a stale or invented number) and never fails the scrape.
    """

    def __init__(self, read: Callable[[], Mapping[str, ServedWindow]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        served = GaugeMetricFamily(
            "kvwatch_endpoint_served_window_tokens",
            "The largest prompt the endpoint serves whole, as last measured after a window "
            "failure; the advertised window once an under probe passes again.",
            labels=["endpoint"],
        )
        advertised = GaugeMetricFamily(
            "kvwatch_endpoint_advertised_window_tokens",
            "The window the served window was measured against.",
            labels=["endpoint"],
        )
        try:
            windows = self._read()
        except Exception as exc:  # the database is down: no sample rather than no scrape
            structlog.get_logger("kvwatch.metrics").warning(
                "served_window_unavailable", error=str(exc)
            )
            windows = {}
        for endpoint, window in sorted(windows.items()):
            served.add_metric([endpoint], window.served_tokens)
            advertised.add_metric([endpoint], window.advertised_tokens)
        yield served
        yield advertised

    def describe(self) -> Iterator[Metric]:
        # Registration must not query the database (it may not be up yet).
        return iter(())


class ConfigMetrics:
    """Whether the last configuration reload worked (as Prometheus' own reload gauges)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.last_reload_ok = Gauge(
            "kvwatch_config_last_reload_successful",
            "1 if the last configuration reload succeeded, else 0.",
            registry=registry,
        )
        self.last_reload_success = Gauge(
            "kvwatch_config_last_reload_success_timestamp_seconds",
            "When the configuration was last loaded successfully.",
            registry=registry,
        )

    def loaded(self, when: datetime) -> None:
        self.last_reload_ok.set(1)
        self.last_reload_success.set(when.timestamp())

    def failed(self) -> None:
        self.last_reload_ok.set(0)


class DiscoveryMetrics:
    """Each discovery source's state, named after Prometheus' own SD metrics so the same
    alerts carry over (a source that stopped refreshing keeps its last good list)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.endpoints = Gauge(
            "kvwatch_discovery_endpoints",
            "Endpoints in the source's last good list.",
            ("source",),
            registry=registry,
        )
        self.last_ok = Gauge(
            "kvwatch_discovery_last_refresh_successful",
            "1 if the source's last refresh succeeded, else 0.",
            ("source",),
            registry=registry,
        )
        self.last_success = Gauge(
            "kvwatch_discovery_last_refresh_success_timestamp_seconds",
            "When the source's list was last fetched successfully.",
            ("source",),
            registry=registry,
        )
        self.failures = Counter(
            "kvwatch_discovery_refresh_failures",
            "Refreshes of the source that failed, by reason (unreachable, http_status, read, "
            "invalid).",
            ("source", "reason"),
            registry=registry,
        )
        self._reasons: dict[str, set[str]] = {}

    def refreshed(self, source: str, endpoints: int, when: datetime) -> None:
        self.endpoints.labels(source=source).set(endpoints)
        self.last_ok.labels(source=source).set(1)
        self.last_success.labels(source=source).set(when.timestamp())

    def failed(self, source: str, reason: str) -> None:
        self._reasons.setdefault(source, set()).add(reason)
        self.last_ok.labels(source=source).set(0)
        self.failures.labels(source=source, reason=reason).inc()

    def forget(self, source: str) -> None:
        """A source left the configuration: its series go with it."""
        for gauge in (self.endpoints, self.last_ok, self.last_success):
            with contextlib.suppress(KeyError):
                gauge.remove(source)
        for reason in self._reasons.pop(source, set()):
            self.failures.remove(source, reason)
