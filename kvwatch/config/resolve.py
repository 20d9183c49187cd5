"""The merged, frozen view of an endpoint that the rest of kvwatch works from.

Code that runs probes never asks "did the endpoint set this, or do the defaults?": it gets
an :class:`EndpointSpec` in which every field is concrete.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, TypeVar

from pydantic import SecretStr

from kvwatch.canary.model import ProbeKind

if TYPE_CHECKING:
    from kvwatch.config.model import Defaults, Endpoint

T = TypeVar("T")


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


def resolve_endpoint(endpoint: Endpoint, defaults: Defaults) -> EndpointSpec:
    overrides = endpoint.timeouts
    timeouts = {
        kind: _pick(
            getattr(overrides, kind.value) if overrides is not None else None,
            getattr(defaults.timeouts, kind.value),
        )
        for kind in ProbeKind
    }
    api_key = endpoint.api_key
    if endpoint.api_key_file is not None:
        api_key = endpoint.api_key_file.value
    return EndpointSpec(
        name=endpoint.name,
        url=endpoint.url,
        flavour=endpoint.flavour,
        model=endpoint.model,
        context_window=endpoint.context_window,
        kv_pool_tokens=endpoint.kv_pool_tokens,
        api_key=api_key,
        tokenizer=endpoint.tokenizer,
        probes=tuple(ProbeKind(kind) for kind in endpoint.probes),
        interval_seconds=_pick(endpoint.interval, defaults.interval),
        jitter_seconds=_pick(endpoint.jitter, defaults.jitter),
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
    )


def _pick(override: T | None, default: T) -> T:
    return default if override is None else override
