"""One HTTP client per endpoint: separate pools, and a removed endpoint's client closed only
after the probes still running for it."""

from __future__ import annotations

import asyncio

from kvwatch.engines.clients import EndpointClients


async def test_each_endpoint_gets_its_own_client_and_keeps_it() -> None:
    """Two names, two clients (two pools); the same name, the same client again."""
    clients = EndpointClients()
    try:
        a, b = clients.for_endpoint("a"), clients.for_endpoint("b")
        assert a is not b
        assert clients.for_endpoint("a") is a
        assert len(clients) == 2
    finally:
        await clients.aclose()
    assert a.is_closed and b.is_closed


async def test_a_retired_client_closes_only_after_its_endpoint_is_idle() -> None:
    """retire() waits for the running probe; a name added again gets a fresh client."""
    clients = EndpointClients()
    old = clients.for_endpoint("gone")
    probe_done = asyncio.Event()
    clients.retire("gone", idle=probe_done.wait)
    await asyncio.sleep(0.05)
    assert not old.is_closed, "closed under a running probe"
    again = clients.for_endpoint("gone")
    assert again is not old
    probe_done.set()
    for _ in range(100):
        if old.is_closed:
            break
        await asyncio.sleep(0.01)
    assert old.is_closed
    assert not again.is_closed
    await clients.aclose()
    assert again.is_closed


async def test_closing_all_clients_also_closes_those_waiting_to_retire() -> None:
    """Shutdown does not wait for a retiring client's endpoint to go idle."""
    clients = EndpointClients()
    old = clients.for_endpoint("gone")
    clients.retire("gone", idle=asyncio.Event().wait)  # never idle
    await asyncio.wait_for(clients.aclose(), timeout=5)
    assert old.is_closed
