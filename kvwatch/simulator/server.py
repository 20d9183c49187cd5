"""Running the simulator inside the caller's event loop (tests, the demo, game days)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Generator, Sequence
from typing import Any

import uvicorn

from kvwatch.simulator.app import build_app
from kvwatch.simulator.model import Simulation
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from kvwatch.simulator.traces import ReceivedTrace


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to its host.

    The simulator runs inside other programs' loops (pytest, ``kvwatch run``'s zero-config
    demo, the ``simulate`` command); uvicorn would otherwise take over SIGINT/SIGTERM for the
    whole process while it runs.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class RunningSimulator:
    """A simulator serving on a real socket. ``url_for(name)`` is what kvwatch's ``url`` takes."""

    def __init__(self, simulation: Simulation, host: str, port: int) -> None:
        self.simulation = simulation
        self.host = host
        self.port = port

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def url_for(self, name: str) -> str:
        self.simulation[name]  # unknown names fail here, not as a 404 later
        return f"{self.base_url}/{name}/v1"

    def root_url_for(self, name: str) -> str:
        """Where the engine-root routes (``/tokenize``, ``/apply-template``) live."""
        self.simulation[name]
        return f"{self.base_url}/{name}"

    @property
    def endpoints(self) -> list[SimEndpoint]:
        return self.simulation.endpoints

    def set_fault(self, name: str, fault: FaultMode | str) -> None:
        self.simulation.set_fault(name, fault)

    def stats(self) -> dict[str, dict[str, Any]]:
        return dict(self.simulation.stats())

    def traces(self, name: str) -> list[ReceivedTrace]:
        """The trace headers of ``name``'s latest requests, oldest first."""
        self.simulation[name]
        return self.simulation.traces.of(name)


# A simulated prefill or slow drip may sleep for minutes; on stop, uvicorn would wait for it.
# A test double should stop at once: requests still open after this are cut.
SHUTDOWN_GRACE_SECONDS = 1


class _QuietCancel(logging.Filter):
    """Drop uvicorn's traceback for a request cut by the shutdown grace: that is the intent."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError))


logging.getLogger("uvicorn.error").addFilter(_QuietCancel())


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on accepted sockets whose
    # proto says TCP. Without it Nagle holds each response's body until the client's delayed
    # ACK of its headers, and every request on a kept-alive connection took 40 ms extra.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


@contextlib.asynccontextmanager
async def run_simulator(
    endpoints: Sequence[SimEndpoint], host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[RunningSimulator]:
    """Serve ``endpoints`` on ``host:port`` (0 picks a free port) until the block exits."""
    simulation = Simulation(endpoints)
    # Binding here, not in uvicorn, makes the real port known before serving starts and
    # makes a port clash fail right at the caller.
    sock = _bind(host, port)
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(
        build_app(simulation),
        log_level="warning",
        access_log=False,
        lifespan="off",
        # A stream must not be cut while a slow prefill is still "running".
        timeout_keep_alive=30,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS,
    )
    server = _EmbeddedServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()  # re-raises why it could not start
                raise RuntimeError("simulator stopped before it started")
            await asyncio.sleep(0.01)
        yield RunningSimulator(simulation, host, bound_port)
    finally:
        server.should_exit = True
        await task
        sock.close()
