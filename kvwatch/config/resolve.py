"""The merged, frozen view of an endpoint that the rest of kvwatch works from.

Code that runs probes never asks "did the endpoint set this, or do the defaults?": it gets
an :class:`EndpointSpec` in which every field is concrete.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from pydantic import SecretStr

from kvwatch.canary.burst import DEFAULT_PROMPT_TOKENS, DEFAULT_SIZES
from kvwatch.canary.cache import DEFAULT_DOCUMENT_TOKENS
from kvwatch.canary.model import ProbeKind
from kvwatch.canary.spend import OverBudget, RunShape, SpendPlan, fit_budget, run_tokens
from kvwatch.config.sections import Defaults, Endpoint, EndpointSettings, Intervals

T = TypeVar("T")

# A jitter nobody wrote: 30 s, but never more than a tenth of the interval, so a short
# interval alone (`interval: 10s`) is a valid configuration rather than a clash with a
# default the user never saw.
DEFAULT_JITTER_SECONDS = 30.0
DEFAULT_JITTER_FRACTION = 0.1


# The self-report check asks the engine about itself (no prompt, no GPU time), so it runs
# often enough to see a redeploy within a minute; an endpoint probed more often than that
# keeps its shorter interval.
CAPACITY_INTERVAL_SECONDS = 60.0
# Its jitter, unless written: the check is how soon a redeploy is seen, so the minute goes to
# seeing it; the hashed phase (kvwatch.phase) already spreads a fleet's checks over it.
CAPACITY_JITTER_SECONDS = 1.0


def default_jitter(interval_seconds: float) -> float:
    """The jitter of an endpoint where neither it nor ``defaults`` sets one."""
    return min(DEFAULT_JITTER_SECONDS, interval_seconds * DEFAULT_JITTER_FRACTION)


@dataclass(frozen=True, slots=True)
class TenantSpec:
    """A named credential of an endpoint. The name is stored and shown; the key never is."""

    name: str
    api_key: SecretStr = field(repr=False)


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    name: str
    url: str
    flavour: str
    model: str
    context_window: int | None  # None: discover it from the engine
    kv_pool_tokens: int | None
    api_key: SecretStr | None
    tokenizer: str  # "server", "usage", "tiktoken:<encoding>" or "hf:<absolute path>"
    probes: tuple[ProbeKind, ...]
    interval_seconds: float
    jitter_seconds: float
    timeouts: Mapping[ProbeKind, float]  # seconds, one entry per ProbeKind
    max_tokens: int
    baseline_tokens: int
    stream: bool
    marker_depths: tuple[float, ...]
    confirm: bool
    body_limit_bytes: int
    labels: Mapping[str, str]
    # Search the served window after a window failure (kvwatch.served_window).
    served_window: bool = True
    # Under and edge probes rotate through these (kvwatch.probe.model.tenant_for_slot); empty:
    # every probe uses ``api_key``.
    tenants: tuple[TenantSpec, ...] = ()
    # The discovery source that found the endpoint (None: the static ``endpoints:`` list) and
    # the window and KV pool it stated: used only when the engine states none itself
    # (kvwatch.probe.reported), while ``context_window``/``kv_pool_tokens`` always win.
    source: str | None = None
    source_context_window: int | None = None
    source_kv_pool_tokens: int | None = None
    # The burst probe: requests at once, cycle after cycle in turn, and each one's prompt.
    burst_sizes: tuple[int, ...] = DEFAULT_SIZES
    burst_prompt_tokens: int = DEFAULT_PROMPT_TOKENS
    # The cache probe: the planted document's size, and the age at which a document is asked
    # about again (None: no returning session).
    cache_document_tokens: int = DEFAULT_DOCUMENT_TOKENS
    cache_return_after: float | None = None
    # Per-kind intervals and jitters; a kind missing here uses interval_seconds/jitter_seconds.
    intervals: Mapping[ProbeKind, float] = field(default_factory=lambda: MappingProxyType({}))
    jitters: Mapping[ProbeKind, float] = field(default_factory=lambda: MappingProxyType({}))
    # Kinds whose interval the user wrote in ``intervals`` (a budget never stretches them).
    explicit_intervals: frozenset[ProbeKind] = frozenset()
    budget_tokens_per_day: int | None = None
    # Tokens a day the schedule plans to spend, when there is a budget and the window is
    # known (kvwatch.canary.spend); None otherwise.
    budget_planned_per_day: int | None = None
    on_change: bool = True
    on_change_min_gap_seconds: float = 600.0
    # The jitter the user wrote (None: each kind's follows its interval).
    written_jitter: float | None = None

    def interval_for(self, kind: ProbeKind) -> float:
        """Seconds between scheduled runs of ``kind`` (an edge probe goes with the capacity
        check that starts it)."""
        if kind is ProbeKind.EDGE:
            kind = ProbeKind.CAPACITY
        return self.intervals.get(kind, self.interval_seconds)

    def runs(self, kind: str) -> bool:
        """Whether probes of ``kind`` (a ProbeKind value, as alert states store it) run for
        this endpoint: those it lists, an edge probe with the capacity check that starts it,
        a served-window step with the probes whose window failure starts it. False for a
        kind this version does not know (a newer one's, after a downgrade): none runs."""
        try:
            probe = ProbeKind(kind)
        except ValueError:
            return False
        if probe is ProbeKind.EDGE:
            probe = ProbeKind.CAPACITY
        if probe is ProbeKind.BISECT:
            return ProbeKind.UNDER in self.probes or ProbeKind.CAPACITY in self.probes
        return probe in self.probes

    def jitter_for(self, kind: ProbeKind) -> float:
        return self.jitters.get(kind, self.jitter_seconds)

    @property
    def default_tenant(self) -> TenantSpec | None:
        """Whose key the other probes, discovery and tokenizing use: the endpoint's own
        ``api_key`` when it has one (None here), else the first tenant's."""
        if self.api_key is not None or not self.tenants:
            return None
        return self.tenants[0]


def shape_of(spec: EndpointSpec) -> RunShape:
    """What one run of ``spec``'s canaries is sized by (kvwatch.canary.spend)."""
    return RunShape(
        flavour=spec.flavour,
        window=spec.context_window,
        max_tokens=spec.max_tokens,
        baseline_tokens=spec.baseline_tokens,
        burst_sizes=spec.burst_sizes,
        burst_prompt_tokens=spec.burst_prompt_tokens,
        cache_document_tokens=spec.cache_document_tokens,
        cache_returning=spec.cache_return_after is not None,
    )


def planned_spend(spec: EndpointSpec) -> SpendPlan | None:
    """The budget's plan for ``spec`` (None without a budget, or with an unknown window);
    raises :class:`~kvwatch.canary.spend.OverBudget` when its written intervals cannot fit."""
    if spec.budget_tokens_per_day is None:
        return None
    shape = shape_of(spec)
    per_run: dict[ProbeKind, float] = {}
    for kind in spec.probes:
        spent = run_tokens(kind, shape).spent
        if spent is None:
            return None
        per_run[kind] = spent
    return fit_budget(per_run, spec.intervals, spec.explicit_intervals, spec.budget_tokens_per_day)


def within_budget(spec: EndpointSpec) -> EndpointSpec:
    """``spec`` with the expensive kinds' intervals slowed to fit its budget (unchanged
    when it has none, or when it cannot fit: the config checks report that)."""
    try:
        plan = planned_spend(spec)
    except OverBudget:
        return spec
    if plan is None:
        return spec
    intervals = dict(plan.intervals)
    jitters = {
        kind: kind_jitter(
            kind, intervals[kind], spec.written_jitter, kind in spec.explicit_intervals
        )
        for kind in intervals
    }
    return dataclasses.replace(
        spec,
        intervals=MappingProxyType(intervals),
        jitters=MappingProxyType(jitters),
        budget_planned_per_day=plan.planned_per_day,
    )


def resolve_endpoint(endpoint: Endpoint, defaults: Defaults) -> EndpointSpec:
    return resolve_settings(
        endpoint, defaults, name=endpoint.name, url=endpoint.url, model=endpoint.model
    )


def resolve_settings(
    endpoint: EndpointSettings, defaults: Defaults, *, name: str, url: str, model: str
) -> EndpointSpec:
    """The spec of the endpoint ``name`` at ``url`` serving ``model`` with these settings:
    an ``endpoints:`` entry, or what a discovery source found with its template's settings."""
    timeouts = _timeouts(endpoint, defaults)
    interval = _pick(endpoint.interval, defaults.interval)
    jitter = endpoint.jitter if endpoint.jitter is not None else defaults.jitter
    probes = tuple(ProbeKind(kind) for kind in endpoint.probes)
    intervals, explicit = kind_intervals(endpoint, defaults, interval, probes)
    burst = _pick(endpoint.burst, defaults.burst)
    cache = _pick(endpoint.cache, defaults.cache)
    budget = _pick(endpoint.budget, defaults.budget)
    api_key = endpoint.api_key
    if endpoint.api_key_file is not None:
        api_key = endpoint.api_key_file.value
    return within_budget(
        EndpointSpec(
            name=name,
            url=url,
            flavour=endpoint.flavour,
            model=model,
            context_window=endpoint.context_window,
            kv_pool_tokens=endpoint.kv_pool_tokens,
            api_key=api_key,
            tokenizer=endpoint.tokenizer,
            probes=probes,
            interval_seconds=interval,
            jitter_seconds=default_jitter(interval) if jitter is None else jitter,
            intervals=MappingProxyType(intervals),
            jitters=MappingProxyType(
                {k: kind_jitter(k, v, jitter, k in explicit) for k, v in intervals.items()}
            ),
            explicit_intervals=explicit,
            budget_tokens_per_day=budget.tokens_per_day if budget is not None else None,
            on_change=_pick(endpoint.on_change, defaults.on_change),
            on_change_min_gap_seconds=_pick(endpoint.on_change_min_gap, defaults.on_change_min_gap),
            # Read-only views, so a shared spec cannot be changed under another task's feet.
            timeouts=MappingProxyType(timeouts),
            max_tokens=_pick(endpoint.max_tokens, defaults.max_tokens),
            baseline_tokens=_pick(endpoint.baseline_tokens, defaults.baseline_tokens),
            stream=_pick(endpoint.stream, defaults.stream),
            marker_depths=tuple(_pick(endpoint.marker_depths, defaults.marker_depths)),
            confirm=_pick(endpoint.confirm, defaults.confirm),
            served_window=_pick(endpoint.served_window, defaults.served_window),
            body_limit_bytes=_pick(endpoint.body_limit_bytes, defaults.body_limit_bytes),
            labels=MappingProxyType(dict(endpoint.labels)),
            burst_sizes=tuple(burst.sizes),
            burst_prompt_tokens=burst.prompt_tokens,
            cache_document_tokens=cache.document_tokens,
            cache_return_after=cache.return_after,
            tenants=_tenants(endpoint),
            written_jitter=jitter,
        )
    )


def _timeouts(endpoint: EndpointSettings, defaults: Defaults) -> dict[ProbeKind, float]:
    overrides = endpoint.timeouts
    return {
        kind: _pick(
            getattr(overrides, kind.value) if overrides is not None else None,
            getattr(defaults.timeouts, kind.value),
        )
        for kind in ProbeKind
    }


def _tenants(endpoint: EndpointSettings) -> tuple[TenantSpec, ...]:
    return tuple(
        TenantSpec(
            name=tenant.name,
            api_key=(
                tenant.api_key_file.value
                if tenant.api_key_file is not None
                else _required(tenant.api_key)
            ),
        )
        for tenant in endpoint.tenants or ()
    )


def kind_intervals(
    endpoint: EndpointSettings,
    defaults: Defaults,
    interval: float,
    probes: tuple[ProbeKind, ...],
) -> tuple[dict[ProbeKind, float], frozenset[ProbeKind]]:
    """Each scheduled kind's interval, and the kinds whose interval was written per kind.

    The more specific scope wins: the endpoint's ``intervals``, then its ``interval``, then
    ``defaults.intervals``, then ``defaults.interval``. The capacity check is the exception:
    ``interval`` (the canaries' pace) does not slow it; it runs every minute unless a per-kind
    interval says otherwise, or the canaries run more often still.
    """
    own = endpoint.intervals or Intervals()
    chosen: dict[ProbeKind, float] = {}
    explicit: set[ProbeKind] = set()
    for kind in probes:
        written = getattr(own, kind.value, None)
        if written is None and (kind is ProbeKind.CAPACITY or endpoint.interval is None):
            written = getattr(defaults.intervals, kind.value, None)
        if written is not None:
            chosen[kind] = written
            explicit.add(kind)
        elif kind is ProbeKind.CAPACITY:
            chosen[kind] = min(CAPACITY_INTERVAL_SECONDS, interval)
        else:
            chosen[kind] = interval
    return chosen, frozenset(explicit)


def kind_jitter(kind: ProbeKind, interval: float, written: float | None, explicit: bool) -> float:
    """The jitter of one kind: the written one, else the default for its interval; the
    capacity check at its implicit one-minute pace keeps at most CAPACITY_JITTER_SECONDS
    (a jitter written for 15-minute canaries must not delay seeing a redeploy)."""
    if kind is ProbeKind.CAPACITY and not explicit:
        cap = min(CAPACITY_JITTER_SECONDS, default_jitter(interval))
        return cap if written is None else min(cap, written)
    if written is None:
        return default_jitter(interval)
    return written


def _required(value: T | None) -> T:
    # The config model guarantees one of api_key / api_key_file per tenant.
    assert value is not None
    return value


def _pick(override: T | None, default: T) -> T:
    return default if override is None else override
