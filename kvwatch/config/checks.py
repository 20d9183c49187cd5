"""Rules that span several fields, checked once each field is valid on its own.

They work on the merged view of each endpoint, because a jitter from ``defaults`` can clash
with an interval set on one endpoint.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvwatch.canary import cache
from kvwatch.canary.burst import ANSWER_TOKENS, fits
from kvwatch.canary.model import ProbeKind
from kvwatch.canary.planning import ANSWER_TOKENS_PER_CODE
from kvwatch.canary.spend import OverBudget
from kvwatch.config.durations import format_duration
from kvwatch.config.expand import KeyPath
from kvwatch.config.model import Config
from kvwatch.config.resolve import EndpointSpec, planned_spend, resolve_settings
from kvwatch.config.sections import Defaults, EndpointSettings, Intervals

Problem = tuple[KeyPath, str]


def cross_field_problems(config: Config) -> list[Problem]:
    problems = _defaults_problems(config.defaults)
    seen: set[str] = set()
    for index, (endpoint, spec) in enumerate(
        zip(config.endpoints, config.resolved_endpoints(), strict=True)
    ):
        here: KeyPath = ("endpoints", index)
        if endpoint.name in seen:
            problems.append(((*here, "name"), f'duplicate endpoint name "{endpoint.name}"'))
        seen.add(endpoint.name)
        problems += _settings_problems(config, here, endpoint, spec)
    for index, source in enumerate(config.discovery):
        # A template is checked as the endpoints it will make: its clashes are found at
        # load time, not at the first refresh.
        template = source.template
        spec = resolve_settings(
            template, config.defaults, name=source.name, url="http://template", model="template"
        )
        problems += _settings_problems(config, ("discovery", index, "template"), template, spec)
    return problems


def _settings_problems(
    config: Config, here: KeyPath, endpoint: EndpointSettings, spec: EndpointSpec
) -> list[Problem]:
    """What is wrong with one endpoint's (or template's) settings once merged with defaults."""
    return (
        _reserved_labels(here, endpoint, multi_region=config.region is not None)
        + _timing_problems(here, endpoint, spec)
        + _size_problems(here, endpoint, spec)
        + _budget_problems(here, endpoint, spec)
    )


def _defaults_problems(defaults: Defaults) -> list[Problem]:
    problems: list[Problem] = []
    # Only a jitter the user wrote can clash: the default one follows the interval.
    if defaults.jitter is not None and defaults.jitter >= defaults.interval:
        problems.append(
            (("defaults", "jitter"), _jitter_sentence(defaults.jitter, defaults.interval))
        )
    for kind, interval in _written(defaults.intervals):
        jitter = defaults.jitter
        if jitter is not None and jitter >= interval:
            problems.append((("defaults", "intervals", kind), _interval_sentence(jitter, interval)))
    if _answer_too_short(defaults.max_tokens, len(defaults.marker_depths)):
        problems.append(
            (
                ("defaults", "max_tokens"),
                _room_sentence(defaults.max_tokens, defaults.marker_depths),
            )
        )
    return problems


def _reserved_labels(
    here: KeyPath, endpoint: EndpointSettings, *, multi_region: bool
) -> list[Problem]:
    problems: list[Problem] = []
    if multi_region and "region" in endpoint.labels:
        # The region label is kvwatch's in multi-region mode; a static one would hide
        # which region saw the failure.
        problems.append(
            ((*here, "labels", "region"), "is reserved: kvwatch sets it when region is set")
        )
    if endpoint.tenants:
        # The cross-tenant alert names both tenants in these labels; a static one would
        # hide whose data leaked where.
        for label in ("source_tenant", "tenant"):
            if label in endpoint.labels:
                problems.append(
                    (
                        (*here, "labels", label),
                        "is reserved: kvwatch sets it on cross-tenant alerts when tenants are set",
                    )
                )
    return problems


def _written(intervals: Intervals | None) -> list[tuple[str, float]]:
    if intervals is None:
        return []
    return [(kind, value) for kind, value in intervals.model_dump().items() if value is not None]


def _timing_problems(
    here: KeyPath, endpoint: EndpointSettings, spec: EndpointSpec
) -> list[Problem]:
    problems: list[Problem] = []
    for kind, interval in _written(endpoint.intervals):
        jitter = spec.jitter_for(ProbeKind(kind))
        # Only a kind the endpoint probes runs on this interval; and a clash with a jitter
        # only `defaults` wrote against an interval only `defaults` wrote is reported there.
        if ProbeKind(kind) in spec.probes and jitter >= interval:
            problems.append(((*here, "intervals", kind), _interval_sentence(jitter, interval)))
    return problems + _shared_timing_problems(here, endpoint, spec)


def _shared_timing_problems(
    here: KeyPath, endpoint: EndpointSettings, spec: EndpointSpec
) -> list[Problem]:
    # A clash that comes only from `defaults` is reported once, there, not per endpoint.
    if spec.jitter_seconds < spec.interval_seconds:
        return []
    if endpoint.jitter is not None:
        return [((*here, "jitter"), _jitter_sentence(spec.jitter_seconds, spec.interval_seconds))]
    if endpoint.interval is not None:
        return [
            (
                (*here, "interval"),
                _interval_sentence(spec.jitter_seconds, spec.interval_seconds),
            )
        ]
    return []


def _size_problems(here: KeyPath, endpoint: EndpointSettings, spec: EndpointSpec) -> list[Problem]:
    problems: list[Problem] = []
    # As with the jitter, a clash that comes only from `defaults` is reported there.
    own = endpoint.max_tokens is not None or endpoint.marker_depths is not None
    if own and _answer_too_short(spec.max_tokens, len(spec.marker_depths)):
        key = "max_tokens" if endpoint.max_tokens is not None else "marker_depths"
        problems.append(((*here, key), _room_sentence(spec.max_tokens, spec.marker_depths)))
    window = spec.context_window
    if window is not None and spec.baseline_tokens + spec.max_tokens > window:
        problems.append(
            (
                (*here, "context_window"),
                f"{window} tokens cannot hold the baseline prompt of {spec.baseline_tokens}"
                f" tokens plus max_tokens {spec.max_tokens}",
            )
        )
    burst = ProbeKind.BURST in spec.probes
    if window is not None and burst and not fits(spec.burst_prompt_tokens, window):
        problems.append(
            (
                (*here, "context_window"),
                f"{window} tokens cannot hold the burst prompt of {spec.burst_prompt_tokens}"
                f" tokens plus its {ANSWER_TOKENS} answer tokens",
            )
        )
    documents = ProbeKind.CACHE in spec.probes
    if window is not None and documents and not cache.fits(spec.cache_document_tokens, window):
        problems.append(
            (
                (*here, "context_window"),
                f"{window} tokens cannot hold the cache document of "
                f"{spec.cache_document_tokens} tokens plus its {cache.ANSWER_TOKENS} answer "
                "tokens",
            )
        )
    return problems


def _budget_problems(
    here: KeyPath, endpoint: EndpointSettings, spec: EndpointSpec
) -> list[Problem]:
    if spec.budget_tokens_per_day is None:
        return []
    # Reported where the budget was written; the sentence names the endpoint, since a budget
    # in `defaults` fits one endpoint and not another.
    at: KeyPath = (*here, "budget") if endpoint.budget is not None else ("defaults", "budget")
    if spec.context_window is None:
        return [
            (
                at,
                f"{spec.name}: a budget needs context_window, to size the canaries it plans "
                "(the window is otherwise discovered only at run time)",
            )
        ]
    try:
        planned_spend(spec)
    except OverBudget as exc:
        return [((*at, "tokens_per_day"), f"{spec.name}: {exc}")]
    return []


def _answer_too_short(max_tokens: int, depths: int) -> bool:
    # One marker per depth must all fit in the answer, or a whole prompt fails as if cut.
    return depths > 1 and max_tokens < ANSWER_TOKENS_PER_CODE * depths


def _room_sentence(max_tokens: int, depths: Sequence[float]) -> str:
    return (
        f"max_tokens {max_tokens} leaves no room to answer the {len(depths)} codes of "
        f"marker_depths; use at least {ANSWER_TOKENS_PER_CODE * len(depths)}"
    )


def _interval_sentence(jitter: float, interval: float) -> str:
    return (
        f"must be longer than the jitter {format_duration(jitter)}"
        f" (got {format_duration(interval)})"
    )


def _jitter_sentence(jitter: float, interval: float) -> str:
    return (
        f"must be shorter than the interval {format_duration(interval)}"
        f" (got {format_duration(jitter)})"
    )
