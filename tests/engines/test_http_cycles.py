"""A closed httpx response is freed by reference counting: kvwatch's clients leave no
response, request or pool object for the cyclic garbage collector (issue 25)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import httpx
import pytest

from kvwatch.alerting.alertmanager import AlertmanagerSettings
from kvwatch.alerting.alertmanager import build_http_client as alertmanager_client
from kvwatch.engines.clients import PER_ENDPOINT_LIMITS, build_http_client
from kvwatch.engines.openai import OpenAIEngine
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import SimEndpoint
from tests.engines.wire import canary_messages


@pytest.fixture
def no_gc() -> Iterator[None]:
    """The cyclic collector off: whatever is freed, reference counting freed."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _watch(client: httpx.AsyncClient) -> list[weakref.ref[httpx.Response]]:
    """Weak references to every response ``client`` receives from now on."""
    seen: list[weakref.ref[httpx.Response]] = []

    async def record(response: httpx.Response) -> None:
        seen.append(weakref.ref(response))

    hooks = client.event_hooks
    hooks["response"] = [*hooks["response"], record]
    client.event_hooks = hooks
    return seen


@pytest.mark.usefixtures("no_gc")
@pytest.mark.parametrize("stream", [False, True])
async def test_a_probes_requests_leave_no_response_behind(marker: str, stream: bool) -> None:
    """A canary chat and tokenize calls through an endpoint's client: once each call has
    returned, every response it received is already gone, its elapsed time still read."""
    async with (
        run_simulator([SimEndpoint("ok")]) as sim,
        build_http_client(limits=PER_ENDPOINT_LIMITS) as client,
    ):
        seen = _watch(client)
        engine = OpenAIEngine(client, base_url=sim.url_for("ok"), model="sim-1", api_key=None)
        exchange = await engine.chat(
            canary_messages(marker), max_tokens=32, stream=stream, timeout=30
        )
        counted = await engine.count_prompt_tokens(canary_messages(marker))
    assert exchange.status == 200 and exchange.answer and marker in exchange.answer
    assert counted is not None and counted > 0
    assert len(seen) >= 2
    assert [ref for ref in seen if ref() is not None] == []


@pytest.mark.usefixtures("no_gc")
async def test_a_stream_closed_before_its_end_leaves_no_response_behind() -> None:
    """A body abandoned part way (a size limit, a discovery page cut short) is freed on close,
    and a response read whole by a plain request is freed too, elapsed set on both."""
    async with (
        run_simulator([SimEndpoint("ok")]) as sim,
        build_http_client() as client,
    ):
        seen = _watch(client)
        models = f"{sim.url_for('ok')}/models"
        async with client.stream("GET", models) as response:
            async for _chunk in response.aiter_raw(1):
                break
        assert response.elapsed.total_seconds() >= 0
        whole = await client.get(models)
        assert whole.status_code == 200 and whole.json()["data"]
        assert whole.elapsed.total_seconds() >= 0
        del response, whole
    assert len(seen) == 2
    assert [ref for ref in seen if ref() is not None] == []


@pytest.mark.usefixtures("no_gc")
async def test_alertmanagers_client_leaves_no_response_behind() -> None:
    """The client that posts alerts is built the same way."""
    async with (
        run_simulator([SimEndpoint("ok")]) as sim,
        alertmanager_client(AlertmanagerSettings(urls=(sim.url_for("ok"),))) as client,
    ):
        seen = _watch(client)
        response = await client.get(f"{sim.url_for('ok')}/models")
        assert response.status_code == 200
        del response
    assert len(seen) == 1 and seen[0]() is None
