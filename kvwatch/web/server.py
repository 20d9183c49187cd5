"""Serving an ASGI app inside kvwatch's own event loop (signals stay kvwatch's)."""

from __future__ import annotations

import contextlib
from collections.abc import Generator

import uvicorn
from starlette.types import ASGIApp


class EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves SIGTERM/SIGINT to the daemon's own shutdown sequence."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def embedded_server(app: ASGIApp, host: str, port: int) -> EmbeddedServer:
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        # uvicorn's own logging set-up would print its warnings in its own format; without
        # it they reach kvwatch's JSON handler like every other library's (kvwatch.logs).
        log_config=None,
        access_log=False,
        lifespan="off",
        server_header=False,
    )
    return EmbeddedServer(config)


def split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)
