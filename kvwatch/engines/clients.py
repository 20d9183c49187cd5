"""HTTP clients for monitored endpoints: one small connection pool per endpoint.

One client shared by a whole fleet made every request pay for the whole fleet: httpcore's
pool rescans all of its connections (and polls each idle socket) whenever a request is
added or a response closed, and its keep-alive cap counts every connection, not the idle
ones, so a busy pool closed and reopened connections all the time. At 1,000 endpoints that
scan was half of kvwatch's CPU (issue 13). An endpoint runs one probe at a time, so its own
pool holds a connection or two and the scan costs nothing.

The clients share one TLS context (httpx builds a fresh one, with the CA bundle loaded,
for every client that brings none: ~1 MB and ~70 ms each).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable

import httpx

from kvwatch import __version__
from kvwatch.httpcycles import event_hooks

# A probe holds one connection at a time and an endpoint runs one probe at a time; the
# headroom is for `kvwatch probe` and tests, which may overlap calls to one endpoint.
PER_ENDPOINT_LIMITS = httpx.Limits(max_connections=10, max_keepalive_connections=2)
# A client shared by many endpoints (check-config --live, tests driving a fleet at once).
SHARED_LIMITS = httpx.Limits(max_connections=200, max_keepalive_connections=50)


def build_http_client(
    *,
    limits: httpx.Limits = SHARED_LIMITS,
    verify: ssl.SSLContext | bool = True,
) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        limits=limits,
        # No overall timeout: every probe brings its own deadline (a 1M-token prefill may
        # legitimately take minutes).
        timeout=httpx.Timeout(None, connect=10.0),
        # Canaries never follow redirects (a redirect to another host would judge that host's
        # answer as the endpoint's); tokenize and discovery calls do the same. Configure the
        # final URL.
        follow_redirects=False,
        headers={"User-Agent": f"kvwatch/{__version__}"},
        verify=verify,
        event_hooks=event_hooks(),
    )


class EndpointClients:
    """The HTTP client of each endpoint, by name, for the life of the process.

    A changed endpoint keeps its client (a probe of its old spec may still be using it); a
    removed one is closed once the probes still running for it are done.
    """

    def __init__(self) -> None:
        self._tls = httpx.create_ssl_context()
        # One client per configured endpoint (retire pops a removed one's); _closing holds the
        # removed ones still waiting for their last probe, each gone once it is closed.
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._clients)

    def for_endpoint(self, name: str) -> httpx.AsyncClient:
        client = self._clients.get(name)
        if client is None:
            client = self._clients[name] = build_http_client(
                limits=PER_ENDPOINT_LIMITS, verify=self._tls
            )
        return client

    def retire(self, name: str, idle: Callable[[], Awaitable[object]]) -> None:
        """Close ``name``'s client once ``idle()`` returns (its running probes ended). An
        endpoint added again under the name before then gets a client of its own."""
        client = self._clients.pop(name, None)
        if client is None:
            return

        async def close() -> None:
            try:
                await idle()
            finally:
                await client.aclose()

        task = asyncio.get_running_loop().create_task(close(), name=f"close-client:{name}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        """Close every client, those waiting to be retired included."""
        for task in list(self._closing):
            task.cancel()
        for task in list(self._closing):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()
