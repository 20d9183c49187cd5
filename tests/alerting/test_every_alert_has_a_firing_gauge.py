"""Every alert the policy can raise has its firing gauge from the start."""

from prometheus_client import CollectorRegistry

from kvwatch.alerting.alertmanager import AlertmanagerSettings
from kvwatch.alerting.delivery import Delivery
from kvwatch.alerting.policy import ALERTNAMES, default_policy
from kvwatch.store.records import AlertStateRecord


async def _no_states() -> list[AlertStateRecord]:
    return []


def test_alertnames_lists_every_alert_of_the_shipped_policy() -> None:
    """The names delivery pre-zeroes are exactly the shipped policy's alerts."""
    assert set(ALERTNAMES) == set(default_policy().alerts)


async def test_the_cross_tenant_leak_gauge_exists_before_it_first_fires() -> None:
    """kvwatch_alerts_firing{alertname="KVWatchCrossTenantLeak"} reads 0, not absent."""
    registry = CollectorRegistry()
    delivery = Delivery(
        settings=AlertmanagerSettings(urls=("http://127.0.0.1:9",)),
        load_states=_no_states,
        registry=registry,
    )
    try:
        value = registry.get_sample_value(
            "kvwatch_alerts_firing", {"alertname": "KVWatchCrossTenantLeak"}
        )
        assert value == 0.0
    finally:
        await delivery.aclose()
