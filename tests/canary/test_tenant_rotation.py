"""Which tenant a probe is sent as: under and edge slots rotate, the rest use the default."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from kvwatch.canary.model import ProbeKind
from kvwatch.config import TenantSpec, parse_config
from kvwatch.metrics import ProbeMetrics
from kvwatch.probe.model import Target, tenant_for_slot

ACME = TenantSpec("acme", SecretStr("sk-a"))
GLOBEX = TenantSpec("globex", SecretStr("sk-b"))
INITECH = TenantSpec("initech", SecretStr("sk-c"))


def test_consecutive_slots_go_to_consecutive_tenants() -> None:
    """Slot k (a multiple of the interval since the epoch) runs under tenant k mod n."""
    tenants = (ACME, GLOBEX, INITECH)
    turns = [tenant_for_slot(tenants, k * 900, 900.0).name for k in range(100, 106)]
    assert turns == ["globex", "initech", "acme", "globex", "initech", "acme"]  # 100 % 3 == 1


def test_every_replica_computes_the_same_tenant_for_a_slot() -> None:
    """The turn depends on the slot only, so replicas and regions agree without talking."""
    tenants = (ACME, GLOBEX)
    slot = 980_411 * 1800  # an odd slot number: the second tenant
    assert {tenant_for_slot(tenants, slot, 1800.0) for _ in range(10)} == {GLOBEX}


def _target(**endpoint: object) -> Target:
    entry = {"name": "ep", "url": "http://x/v1", "model": "m", "interval": "15m", **endpoint}
    [spec] = parse_config(
        "endpoints: [" + repr(entry).replace("'", '"') + "]", source="<test>"
    ).resolved_endpoints()
    return Target(spec=spec, endpoint_id=1, engine=None, counter=None)  # type: ignore[arg-type]


TENANTS = [{"name": "acme", "api_key": "sk-a"}, {"name": "globex", "api_key": "sk-b"}]


def test_under_and_edge_rotate_while_other_kinds_use_the_first_tenant_without_api_key() -> None:
    """No api_key: over, baseline and capacity go as the first tenant; under/edge rotate."""
    target = _target(tenants=TENANTS)
    slot = 7 * 900  # odd slot: the second tenant
    assert target.tenant_of(ProbeKind.UNDER, slot) == target.spec.tenants[1]
    assert target.tenant_of(ProbeKind.EDGE, slot) == target.spec.tenants[1]
    for kind in (ProbeKind.OVER, ProbeKind.BASELINE, ProbeKind.CAPACITY):
        assert target.tenant_of(kind, slot) == target.spec.tenants[0]


def test_with_an_api_key_the_other_kinds_use_it_and_a_one_shot_under_too() -> None:
    """The endpoint's own key stays kvwatch's identity outside the rotation."""
    target = _target(tenants=TENANTS, api_key="sk-own")
    assert target.tenant_of(ProbeKind.BASELINE, 900) is None
    assert target.tenant_of(ProbeKind.UNDER, None) is None
    chosen = target.spec.tenants[0]
    assert target.tenant_of(ProbeKind.UNDER, 900, chosen) == chosen


def test_without_tenants_every_probe_uses_the_endpoint_key() -> None:
    """Nothing changes for an endpoint without tenants."""
    target = _target(api_key="sk-own")
    assert target.tenant_of(ProbeKind.UNDER, 900) is None
    assert dataclasses.replace(target.spec).tenants == ()


def test_the_leak_metric_keeps_one_series_per_endpoint_and_kind() -> None:
    """A new tenant pair replaces the previous pair's series: bounded whatever the tenants."""
    registry = CollectorRegistry()
    metrics = ProbeMetrics(registry)
    name = "kvwatch_cross_tenant_leak_timestamp_seconds"
    at = datetime(2026, 12, 3, 5, 0, tzinfo=UTC)
    metrics.observe_cross_tenant_leak(
        endpoint="ep", kind="under", source_tenant="acme", tenant="globex", at=at
    )
    metrics.observe_cross_tenant_leak(
        endpoint="ep", kind="under", source_tenant="initech", tenant="acme", at=at
    )
    first = {"endpoint": "ep", "probe": "under", "source_tenant": "acme", "tenant": "globex"}
    latest = {"endpoint": "ep", "probe": "under", "source_tenant": "initech", "tenant": "acme"}
    assert registry.get_sample_value(name, first) is None
    assert registry.get_sample_value(name, latest) == at.timestamp()
