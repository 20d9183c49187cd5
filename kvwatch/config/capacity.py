"""The capacity gate (DESIGN §1): a window larger than the KV pool that must hold it.

Pure comparisons, so the engines can apply the same rule to what an engine reports about
itself, and the daemon and ``check-config`` to what the configuration says.
"""

from __future__ import annotations

from kvwatch.config.model import Config


def exceeds_capacity(window: int, pool: int) -> bool:
    """True when a window of ``window`` tokens cannot be held by a pool of ``pool`` tokens."""
    return window > pool


def capacity_message(window: int, pool: int) -> str:
    return f"context_length {window} exceeds KV pool {pool} tokens; refusing to start"


def capacity_violations(config: Config) -> list[str]:
    """One ``<endpoint>: <message>`` line per endpoint that fails the gate, in config order.

    An endpoint that leaves either number out passes here: what its engine reports is
    checked at run time instead.
    """
    lines: list[str] = []
    for endpoint in config.endpoints:
        window, pool = endpoint.context_window, endpoint.kv_pool_tokens
        if window is not None and pool is not None and exceeds_capacity(window, pool):
            lines.append(f"{endpoint.name}: {capacity_message(window, pool)}")
    return lines
