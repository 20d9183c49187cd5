"""Each probe kind has its own interval: the self-report check every minute by default."""

from __future__ import annotations

from kvwatch.canary.model import ProbeKind
from kvwatch.config import EndpointSpec, parse_config

ENDPOINT = """
endpoints:
  - name: glm-prod
    url: http://10.0.0.1:8000/v1
    model: glm-5.3
"""


def spec_of(text: str) -> EndpointSpec:
    [spec] = parse_config(text, env={}).resolved_endpoints()
    return spec


def test_the_capacity_check_runs_every_minute_while_the_canaries_keep_the_interval() -> None:
    """Without intervals, capacity runs every 1m and the prompted kinds every 15m."""
    spec = spec_of(ENDPOINT)
    assert spec.interval_for(ProbeKind.CAPACITY) == 60.0
    assert spec.interval_for(ProbeKind.UNDER) == 900.0
    assert spec.interval_for(ProbeKind.EDGE) == 60.0
    assert spec.jitter_for(ProbeKind.CAPACITY) == 1.0
    assert spec.jitter_for(ProbeKind.UNDER) == 30.0
    assert spec.explicit_intervals == frozenset()


def test_a_shorter_interval_than_a_minute_also_applies_to_the_capacity_check() -> None:
    """interval: 10s probes capacity every 10 s too (configs written before per-kind
    intervals keep their pace)."""
    spec = spec_of(ENDPOINT + "    interval: 10s\n")
    assert spec.interval_for(ProbeKind.CAPACITY) == 10.0
    assert spec.interval_for(ProbeKind.BASELINE) == 10.0


def test_per_kind_intervals_win_over_interval_and_the_endpoint_wins_over_defaults() -> None:
    """The endpoint's intervals, then its interval, then defaults.intervals, then
    defaults.interval."""
    text = (
        "defaults:\n  interval: 20m\n  intervals: {under: 1h, over: 2h, capacity: 30s}\n"
        + ENDPOINT
        + "    interval: 30m\n    intervals: {over: 3h}\n"
    )
    spec = spec_of(text)
    assert spec.interval_for(ProbeKind.OVER) == 3 * 3600.0
    assert spec.interval_for(ProbeKind.UNDER) == 1800.0
    assert spec.interval_for(ProbeKind.BASELINE) == 1800.0
    assert spec.interval_for(ProbeKind.CAPACITY) == 30.0
    assert spec.explicit_intervals == {ProbeKind.OVER, ProbeKind.CAPACITY}


def test_a_written_jitter_is_kept_below_the_implicit_one_minute_capacity_interval() -> None:
    """jitter: 2m with 15 min canaries is valid: the minute-long capacity check keeps 1 s,
    and a written jitter of 0s applies to it too."""
    spec = spec_of("defaults:\n  jitter: 2m\n" + ENDPOINT)
    assert spec.jitter_for(ProbeKind.UNDER) == 120.0
    assert spec.jitter_for(ProbeKind.CAPACITY) == 1.0
    assert spec_of("defaults:\n  jitter: 0s\n" + ENDPOINT).jitter_for(ProbeKind.CAPACITY) == 0.0


def test_an_endpoint_runs_its_listed_kinds_and_the_probes_they_start() -> None:
    """Edge runs with capacity, a served-window step with under or capacity; a kind not
    listed, and one this version does not know, do not run."""
    spec = spec_of(ENDPOINT + "    probes: [capacity, baseline]\n")
    assert [k for k in ProbeKind if spec.runs(k.value)] == [
        ProbeKind.BASELINE,
        ProbeKind.CAPACITY,
        ProbeKind.EDGE,
        ProbeKind.BISECT,
    ]
    only_over = spec_of(ENDPOINT + "    probes: [over]\n")
    assert [k for k in ProbeKind if only_over.runs(k.value)] == [ProbeKind.OVER]
    assert not spec.runs("a-kind-from-a-newer-version")
