"""Rules that span several fields, checked once each field is valid on its own.

They work on the merged view of each endpoint, because a jitter from ``defaults`` can clash
with an interval set on one endpoint.
"""

from __future__ import annotations

from kvwatch.config.durations import format_duration
from kvwatch.config.expand import KeyPath
from kvwatch.config.model import Config

Problem = tuple[KeyPath, str]


def cross_field_problems(config: Config) -> list[Problem]:
    problems: list[Problem] = []
    defaults = config.defaults
    # Only a jitter the user wrote can clash: the default one follows the interval.
    if defaults.jitter is not None and defaults.jitter >= defaults.interval:
        problems.append(
            (("defaults", "jitter"), _jitter_sentence(defaults.jitter, defaults.interval))
        )
    seen: set[str] = set()
    for index, (endpoint, spec) in enumerate(
        zip(config.endpoints, config.resolved_endpoints(), strict=True)
    ):
        here: KeyPath = ("endpoints", index)
        if endpoint.name in seen:
            problems.append(((*here, "name"), f'duplicate endpoint name "{endpoint.name}"'))
        seen.add(endpoint.name)
        if config.region is not None and "region" in endpoint.labels:
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
                            "is reserved: kvwatch sets it on cross-tenant alerts when tenants "
                            "are set",
                        )
                    )

        # A clash that comes only from `defaults` is reported once, above, not per endpoint.
        if spec.jitter_seconds >= spec.interval_seconds:
            if endpoint.jitter is not None:
                problems.append(
                    (
                        (*here, "jitter"),
                        _jitter_sentence(spec.jitter_seconds, spec.interval_seconds),
                    )
                )
            elif endpoint.interval is not None:
                problems.append(
                    (
                        (*here, "interval"),
                        f"must be longer than the jitter {format_duration(spec.jitter_seconds)}"
                        f" (got {format_duration(spec.interval_seconds)})",
                    )
                )

        window = spec.context_window
        if window is not None and spec.baseline_tokens + spec.max_tokens > window:
            problems.append(
                (
                    (*here, "context_window"),
                    f"{window} tokens cannot hold the baseline prompt of {spec.baseline_tokens}"
                    f" tokens plus max_tokens {spec.max_tokens}",
                )
            )
    return problems


def _jitter_sentence(jitter: float, interval: float) -> str:
    return (
        f"must be shorter than the interval {format_duration(interval)}"
        f" (got {format_duration(jitter)})"
    )
