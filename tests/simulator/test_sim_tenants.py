"""The simulator tells tenants apart by their keys; stale_kv serves one another's pages."""

from __future__ import annotations

import dataclasses

import pytest
from test_sim_model import endpoint, request

from kvwatch.canary.markers import new_marker
from kvwatch.simulator.command import parse_endpoint
from kvwatch.simulator.model import Answer, EndpointState
from kvwatch.simulator.spec import FaultMode


def stale_state() -> EndpointState:
    return EndpointState(
        endpoint(window=8192, kv_pool=2048, fault=FaultMode.STALE_KV, tenant_keys=("a", "b"))
    )


def test_stale_kv_serves_a_tenant_the_pages_another_tenant_left() -> None:
    """Tenant b's over-pool prompt is answered from a's cached prefix, not b's own."""
    state = stale_state()
    a_marker, b_marker = new_marker(), new_marker()
    state.handle(dataclasses.replace(request(1000, a_marker), tenant="a"))
    state.handle(dataclasses.replace(request(1000, b_marker), tenant="b"))
    decision = state.handle(dataclasses.replace(request(4000, new_marker()), tenant="b"))
    assert isinstance(decision, Answer)
    assert decision.text == a_marker


def test_stale_kv_falls_back_to_the_own_pages_when_no_other_tenant_left_any() -> None:
    """With only its own pages cached, a tenant gets those (a same-tenant leak)."""
    state = stale_state()
    own = new_marker()
    state.handle(dataclasses.replace(request(1000, own), tenant="a"))
    decision = state.handle(dataclasses.replace(request(4000, new_marker()), tenant="a"))
    assert isinstance(decision, Answer) and decision.text == own


def test_tenant_keys_are_parsed_from_the_command_line() -> None:
    """``tenant_keys=sk-a:sk-b`` gives the endpoint one accepted key per tenant."""
    spec = parse_endpoint("name=x,fault=stale_kv,tenant_keys=sk-a:sk-b")
    assert spec.tenant_keys == ("sk-a", "sk-b")
    assert spec.keys == ("sk-a", "sk-b")
    with pytest.raises(ValueError, match="tenant keys must not be empty"):
        parse_endpoint("name=x,tenant_keys=sk-a::sk-b")
