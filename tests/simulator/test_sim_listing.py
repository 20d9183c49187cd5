"""The simulator's control of its own listings: what PUT /_sim/listing accepts and refuses."""

from __future__ import annotations

import httpx

from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import SimEndpoint


async def test_the_listing_filters_endpoints_and_refuses_a_body_it_cannot_read() -> None:
    """A list of names narrows every listing; an unknown key or a non-list is a 400."""
    fleet = [SimEndpoint("a", model="m-a"), SimEndpoint("b", model="m-b")]
    async with run_simulator(fleet) as sim, httpx.AsyncClient(base_url=sim.base_url) as client:
        assert (await client.put("/_sim/listing", json={"endpoints": ["b"]})).status_code == 200
        sd = (await client.get("/_sim/http_sd")).json()
        assert [group["labels"]["__kvwatch_name"] for group in sd] == ["b"]
        models = (await client.get("/_gateway/v1/models")).json()
        assert [card["id"] for card in models["data"]] == ["m-b"]

        refused = await client.put("/_sim/listing", json={"endpoint": ["a"]})
        assert refused.status_code == 400
        assert (await client.put("/_sim/listing", json={"endpoints": "a"})).status_code == 400
        state = (await client.get("/_sim/listing")).json()
        assert state["endpoints"] == ["b"]
        assert state["requests"] == 2
