"""The merged, frozen view of an endpoint that the rest of kvwatch works from.

Code that runs probes never asks "did the endpoint set this, or do the defaults?": it gets
an :class:`EndpointSpec` in which every field is concrete.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from pydantic import SecretStr

from kvwatch.canary.burst import DEFAULT_PROMPT_TOKENS, DEFAULT_SIZES
from kvwatch.canary.cache import DEFAULT_DOCUMENT_TOKENS
from kvwatch.canary.model import ProbeKind
from kvwatch.config.sections import Defaults, Endpoint, EndpointSettings

T = TypeVar("T")

# A jitter nobody wrote: 30 s, but never more than a tenth of the interval, so a short
# interval alone (`interval: 10s`) is a valid configuration rather than a clash with a
# default the user never saw.
DEFAULT_JITTER_SECONDS = 30.0
DEFAULT_JITTER_FRACTION = 0.1


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

    @property
    def default_tenant(self) -> TenantSpec | None:
        """Whose key the other probes, discovery and tokenizing use: the endpoint's own
        ``api_key`` when it has one (None here), else the first tenant's."""
        if self.api_key is not None or not self.tenants:
            return None
        return self.tenants[0]


def resolve_endpoint(endpoint: Endpoint, defaults: Defaults) -> EndpointSpec:
    return resolve_settings(
        endpoint, defaults, name=endpoint.name, url=endpoint.url, model=endpoint.model
    )


def resolve_settings(
    endpoint: EndpointSettings, defaults: Defaults, *, name: str, url: str, model: str
) -> EndpointSpec:
    """The spec of the endpoint ``name`` at ``url`` serving ``model`` with these settings:
    an ``endpoints:`` entry, or what a discovery source found with its template's settings."""
    overrides = endpoint.timeouts
    timeouts = {
        kind: _pick(
            getattr(overrides, kind.value) if overrides is not None else None,
            getattr(defaults.timeouts, kind.value),
        )
        for kind in ProbeKind
    }
    interval = _pick(endpoint.interval, defaults.interval)
    jitter = endpoint.jitter if endpoint.jitter is not None else defaults.jitter
    burst = _pick(endpoint.burst, defaults.burst)
    cache = _pick(endpoint.cache, defaults.cache)
    api_key = endpoint.api_key
    if endpoint.api_key_file is not None:
        api_key = endpoint.api_key_file.value
    return EndpointSpec(
        name=name,
        url=url,
        flavour=endpoint.flavour,
        model=model,
        context_window=endpoint.context_window,
        kv_pool_tokens=endpoint.kv_pool_tokens,
        api_key=api_key,
        tokenizer=endpoint.tokenizer,
        probes=tuple(ProbeKind(kind) for kind in endpoint.probes),
        interval_seconds=interval,
        jitter_seconds=default_jitter(interval) if jitter is None else jitter,
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
        tenants=tuple(
            TenantSpec(
                name=tenant.name,
                api_key=(
                    tenant.api_key_file.value
                    if tenant.api_key_file is not None
                    else _required(tenant.api_key)
                ),
            )
            for tenant in endpoint.tenants or ()
        ),
    )


def _required(value: T | None) -> T:
    # The config model guarantees one of api_key / api_key_file per tenant.
    assert value is not None
    return value


def _pick(override: T | None, default: T) -> T:
    return default if override is None else override
