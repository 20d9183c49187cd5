"""What a source lists, made into endpoints with its template: pure, no I/O.

Reserved labels set endpoint fields, as Prometheus' ``__address__``/``__scheme__`` and
``__meta_*`` labels drive its relabelling: ``__kvwatch_name``, ``__kvwatch_model``,
``__kvwatch_flavour``, ``__kvwatch_context_window``, ``__kvwatch_kv_pool_tokens``,
``__kvwatch_path`` and ``__scheme__``. Other labels starting with ``__`` are dropped (as
Prometheus drops them after relabelling); the rest become the endpoint's labels, over the
template's.

The window and pool a source states are the *source's* figures (``source_context_window``),
used only when the engine states none; the template's ``context_window`` is configuration and
always wins (kvwatch.probe.reported).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import get_args
from urllib.parse import urlsplit

from kvwatch.config.discovery import DiscoverySource
from kvwatch.config.resolve import EndpointSpec, resolve_settings
from kvwatch.config.sections import Defaults, Flavour
from kvwatch.config.types import RESERVED_LABELS
from kvwatch.discovery.formats import ListedModel, ListError, TargetGroup

NAME = "__kvwatch_name"
MODEL = "__kvwatch_model"
FLAVOUR = "__kvwatch_flavour"
CONTEXT_WINDOW = "__kvwatch_context_window"
KV_POOL_TOKENS = "__kvwatch_kv_pool_tokens"
PATH = "__kvwatch_path"
SCHEME = "__scheme__"
KVWATCH_LABELS = frozenset({NAME, MODEL, FLAVOUR, CONTEXT_WINDOW, KV_POOL_TOKENS, PATH})
# Where an OpenAI-compatible engine serves its API under a bare host:port.
DEFAULT_PATH = "/v1"

MAX_NAME = 63
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_FLAVOURS: tuple[str, ...] = get_args(Flavour)


def endpoint_name(*parts: str) -> str:
    """A valid endpoint name from ``parts`` joined by '-': unsafe characters become '-', and a
    name over 63 characters is cut and given a hash of the whole, so two long names that
    share a beginning stay apart."""
    whole = "-".join(parts)
    name = _UNSAFE.sub("-", whole).strip("-._") or "endpoint"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(whole.encode()).hexdigest()[:8]
    return f"{name[: MAX_NAME - 9].rstrip('-._')}-{digest}"


def from_groups(
    source: DiscoverySource, defaults: Defaults, groups: Sequence[TargetGroup]
) -> list[EndpointSpec]:
    """The endpoints of an SD list; :class:`ListError` for a target that cannot be one."""
    specs = []
    for number, group in enumerate(groups, start=1):
        for address in group.targets:
            try:
                specs.append(_target(source, defaults, address, group.labels))
            except ListError as exc:
                raise ListError(f'group {number}, target "{address}": {exc}') from None
    return _unique(specs)


def from_models(
    source: DiscoverySource, defaults: Defaults, models: Iterable[ListedModel]
) -> list[EndpointSpec]:
    """The endpoints of a gateway's model list, filtered by the source's include/exclude."""
    gateway = source.gateway
    assert gateway is not None
    specs = []
    for listed in models:
        if gateway.include and not _matches(listed.model, gateway.include):
            continue
        if _matches(listed.model, gateway.exclude):
            continue
        spec = resolve_settings(
            source.template,
            defaults,
            name=endpoint_name(source.name, listed.model),
            url=gateway.url,
            model=listed.model,
        )
        specs.append(
            dataclasses.replace(
                spec, source=source.name, source_context_window=listed.context_window
            )
        )
    return _unique(specs)


def _target(
    source: DiscoverySource, defaults: Defaults, address: str, labels: Mapping[str, str]
) -> EndpointSpec:
    host, port = _address(address)
    own: dict[str, str] = {}
    for label, value in labels.items():
        if label.startswith("__kvwatch_") and label not in KVWATCH_LABELS:
            # A misspelt reserved label would silently become nothing.
            raise ListError(f'unknown reserved label "{label}"')
        if label.startswith("__"):
            continue
        if not _LABEL.fullmatch(label):
            raise ListError(f'"{label}" is not a valid label name')
        if label in RESERVED_LABELS:
            raise ListError(f'label "{label}" is reserved: kvwatch sets it on every alert')
        own[label] = value
    model = labels.get(MODEL, "").strip()
    if not model:
        raise ListError(f"needs the {MODEL} label (the model to probe)")
    flavour = labels.get(FLAVOUR, source.template.flavour)
    if flavour not in _FLAVOURS:
        raise ListError(f"{FLAVOUR} must be one of: {', '.join(_FLAVOURS)}")
    scheme = labels.get(SCHEME, "http")
    if scheme not in ("http", "https"):
        raise ListError(f"{SCHEME} must be http or https")
    path = labels.get(PATH, DEFAULT_PATH)
    if not path.startswith("/") or "?" in path or "#" in path:
        raise ListError(f"{PATH} must be a path starting with '/'")
    name = labels.get(NAME)
    if name is None:
        name = endpoint_name(source.name, host, *([str(port)] if port else []))
    elif not _NAME.fullmatch(name):
        raise ListError(
            f"{NAME} must be 1 to 63 letters, digits, '_', '.' or '-', starting with a letter "
            "or digit"
        )
    settings = source.template.model_copy(update={"flavour": flavour})
    spec = resolve_settings(
        settings, defaults, name=name, url=f"{scheme}://{address}{path}".rstrip("/"), model=model
    )
    return dataclasses.replace(
        spec,
        labels=MappingProxyType({**spec.labels, **own}),
        source=source.name,
        source_context_window=_tokens(labels, CONTEXT_WINDOW),
        source_kv_pool_tokens=_tokens(labels, KV_POOL_TOKENS),
    )


def _address(address: str) -> tuple[str, int | None]:
    try:
        parts = urlsplit(f"//{address}")
        port = parts.port
    except ValueError:
        raise ListError('must be "host:port"') from None
    if not parts.hostname or parts.path or parts.query or parts.username or port == 0:
        raise ListError('must be "host:port"')
    return parts.hostname, port


def _tokens(labels: Mapping[str, str], label: str) -> int | None:
    value = labels.get(label)
    if value is None:
        return None
    if not value.strip().isdigit() or int(value) <= 0:
        raise ListError(f"{label} must be a positive integer, not {value!r}")
    return int(value)


def _matches(model: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(model, pattern) for pattern in patterns)


def _unique(specs: list[EndpointSpec]) -> list[EndpointSpec]:
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise ListError(f'two targets make the endpoint "{spec.name}"; set {NAME} on them')
        seen.add(spec.name)
    return specs


def merge(
    static: Sequence[EndpointSpec], discovered: Sequence[EndpointSpec]
) -> tuple[list[EndpointSpec], list[EndpointSpec]]:
    """The endpoints to probe, and the discovered ones set aside because an endpoint listed
    before them (a static one, or one of an earlier source) has their name: the static
    configuration is what the user wrote, so it wins."""
    names = {spec.name for spec in static}
    kept, clashing = list(static), []
    for spec in discovered:
        if spec.name in names:
            clashing.append(spec)
            continue
        names.add(spec.name)
        kept.append(spec)
    return kept, clashing
