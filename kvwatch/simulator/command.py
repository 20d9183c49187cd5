"""``kvwatch simulate``: serve faulty LLM endpoints on loopback for demos and game days."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
from collections.abc import Callable, Sequence
from typing import Any

import click

from kvwatch.simulator.fleet import demo_fleet, scale_fleet
from kvwatch.simulator.proxy import run_proxy
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import FaultMode, Flavour, SimEndpoint

_INT_KEYS = {"window", "kv_pool", "max_input_tokens", "batch_mix_at"}
_FLOAT_KEYS = {
    "prefill_tokens_per_second",
    "ttfb_delay",
    "decode_tokens_per_second",
    "token_skew",
    "token_skew_drift",
}
_BOOL_KEYS = {"prefix_cache"}
_ENDPOINT_KEYS = [f.name for f in dataclasses.fields(SimEndpoint)]


def parse_endpoint(text: str) -> SimEndpoint:
    """``name=x,window=8192,kv_pool=6144,fault=stale_kv`` → a :class:`SimEndpoint`."""
    values: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"{item!r}: expected key=value")
        if key not in _ENDPOINT_KEYS:
            raise ValueError(f"unknown key {key!r}; known keys: {', '.join(_ENDPOINT_KEYS)}")
        if key in values:
            raise ValueError(f"{key} given twice")
        values[key] = value.strip()
    if "name" not in values:
        raise ValueError("name is required")
    for key in _INT_KEYS & values.keys():
        try:
            values[key] = int(values[key].replace("_", ""))
        except ValueError:
            raise ValueError(f"{key} must be an integer, got {values[key]!r}") from None
    for key in _FLOAT_KEYS & values.keys():
        try:
            values[key] = float(values[key])
        except ValueError:
            raise ValueError(f"{key} must be a number, got {values[key]!r}") from None
    for key in _BOOL_KEYS & values.keys():
        if values[key] not in ("true", "false"):
            raise ValueError(f"{key} must be true or false, got {values[key]!r}")
        values[key] = values[key] == "true"
    if "tenant_keys" in values:  # tenant_keys=sk-a:sk-b, one key per tenant
        values["tenant_keys"] = tuple(values["tenant_keys"].split(":"))
    for key, enum_type in (("fault", FaultMode), ("flavour", Flavour)):
        if key in values and values[key] not in {m.value for m in enum_type}:
            known = ", ".join(m.value for m in enum_type)
            raise ValueError(f"{key} must be one of: {known}")
    return SimEndpoint(**values)


def parse_window_range(text: str) -> tuple[int, int]:
    """``2048-8192`` (or a single ``4096``) → (min, max) windows for ``--fleet``."""
    low, sep, high = text.replace("_", "").partition("-")
    try:
        lo, hi = int(low), int(high if sep else low)
    except ValueError:
        raise ValueError(f"{text!r}: expected MIN-MAX tokens, e.g. 2048-8192") from None
    if not 0 < lo <= hi:
        raise ValueError(f"{text!r}: expected 0 < MIN <= MAX")
    return lo, hi


def parse_listen(text: str) -> tuple[str, int]:
    """``127.0.0.1:8400`` or ``[::1]:8400`` → (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


class _EndpointParam(click.ParamType[SimEndpoint]):
    name = "endpoint"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, SimEndpoint):
            return value
        try:
            return parse_endpoint(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class _ListenParam(click.ParamType[tuple[str, int]]):
    name = "host:port"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        try:
            return parse_listen(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def describe(endpoint: SimEndpoint, url: str) -> str:
    pool = f"kv_pool={endpoint.pool_tokens}"
    return (
        f"{endpoint.name:<20} {url:<45} window={endpoint.window:<8} {pool:<15} "
        f"fault={endpoint.fault.value}"
    )


async def serve(
    endpoints: Sequence[SimEndpoint],
    host: str,
    port: int,
    echo: Callable[[str], None],
    stop: asyncio.Event | None = None,
    proxy: str | None = None,
    list_limit: int = 50,
) -> None:
    """Serve until SIGINT/SIGTERM (or until ``stop`` is set); in front of ``proxy`` if given."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        running = (
            run_simulator(endpoints, host=host, port=port)
            if proxy is None
            else run_proxy(proxy, endpoints, host=host, port=port)
        )
        async with running as sim:
            mode = "simulator" if proxy is None else f"proxy to {proxy}"
            echo(f"kvwatch {mode} on {sim.base_url} ({len(endpoints)} endpoints)")
            for endpoint in endpoints[:list_limit]:
                echo(describe(endpoint, sim.url_for(endpoint.name)))
            if len(endpoints) > list_limit:
                echo(f"... and {len(endpoints) - list_limit} more")
            echo(f"stats: {sim.base_url}/_sim/stats · Ctrl-C to stop")
            await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


@click.command("simulate")
@click.option(
    "--listen",
    type=_ListenParam(),
    default="127.0.0.1:8400",
    show_default=True,
    help="Address to serve every simulated endpoint on.",
)
@click.option(
    "--endpoint",
    "endpoints",
    type=_EndpointParam(),
    multiple=True,
    metavar="name=N,window=W,kv_pool=K,fault=F,...",
    help=(
        "A simulated endpoint (repeatable). Keys: "
        + ", ".join(_ENDPOINT_KEYS)
        + ". Faults: "
        + ", ".join(m.value for m in FaultMode)
        + "."
    ),
)
@click.option(
    "--demo",
    is_flag=True,
    help="Serve the demo fleet (one healthy endpoint, one per fault); the default without "
    "--endpoint, added to the given endpoints with it.",
)
@click.option(
    "--proxy",
    metavar="URL",
    help="Forward every endpoint to the real engine at URL (its root, e.g. llama-server's "
    "http://HOST:PORT) and inject each endpoint's fault on the way. Needs --endpoint.",
)
@click.option(
    "--fleet",
    type=click.IntRange(min=1),
    help="Also serve N healthy endpoints fleet-0000, fleet-0001, ... (scale tests).",
)
@click.option(
    "--fleet-window",
    default="2048-8192",
    show_default=True,
    metavar="MIN-MAX",
    help="Windows of the --fleet endpoints, spread evenly over MIN-MAX tokens.",
)
def simulate(
    listen: tuple[str, int],
    endpoints: tuple[SimEndpoint, ...],
    demo: bool,
    proxy: str | None,
    fleet: int | None,
    fleet_window: str,
) -> None:
    """Serve fake OpenAI-compatible LLM endpoints that fail like real ones.

    Each endpoint NAME answers at http://HOST:PORT/NAME/v1 (put that in kvwatch's `url`).
    Fault modes reproduce silent KV-cache failures: stale pages leaking other requests'
    data, truncation, limits not enforced, wrong rejections.
    """
    chosen = list(endpoints)
    if fleet is not None:
        try:
            chosen.extend(scale_fleet(fleet, *parse_window_range(fleet_window)))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--fleet-window") from exc
    if proxy is not None and (demo or not chosen):
        raise click.UsageError(
            "--proxy needs --endpoint (the demo fleet has simulator-only faults)"
        )
    if demo or not chosen:
        chosen.extend(demo_fleet())
    host, port = listen
    try:
        asyncio.run(serve(chosen, host, port, click.echo, proxy=proxy))
    except ValueError as exc:  # duplicate names, a fault proxy mode cannot act out
        raise click.UsageError(str(exc)) from exc
    except OSError as exc:
        raise click.ClickException(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from exc
