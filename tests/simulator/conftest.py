"""Fixtures for the simulator's tests: a running simulator on a real loopback socket."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import httpx
import pytest

from kvwatch.canary.markers import new_marker
from kvwatch.simulator.server import RunningSimulator, run_simulator
from kvwatch.simulator.spec import SimEndpoint


@pytest.fixture
def marker() -> str:
    return new_marker()


@pytest.fixture
async def start() -> AsyncIterator[Callable[..., Any]]:
    """``sim, client = await start([SimEndpoint(...), ...])``; everything stops after the test."""
    stack: list[Any] = []

    async def _start(
        endpoints: Sequence[SimEndpoint],
    ) -> tuple[RunningSimulator, httpx.AsyncClient]:
        manager = run_simulator(endpoints)
        sim = await manager.__aenter__()
        stack.append(manager)
        client = httpx.AsyncClient(base_url=sim.base_url, timeout=30)
        stack.append(client)
        return sim, client

    yield _start
    for item in reversed(stack):
        await item.__aexit__(None, None, None)
