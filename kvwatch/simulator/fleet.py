"""The demo fleet: one healthy endpoint and one per fault mode, small enough for quick cycles."""

from __future__ import annotations

from kvwatch.simulator.spec import FaultMode, SimEndpoint

DEMO_MODEL = "sim-1"

# Window and KV pool per fault. The KV faults need a pool smaller than the window (that gap is
# the incident); the others get a correctly sized pool so only their own fault shows.
_SIZES: dict[FaultMode, tuple[int, int]] = {
    FaultMode.HEALTHY: (8192, 8192),
    FaultMode.STALE_KV: (8192, 6144),
    FaultMode.TRUNCATE_HEAD: (8192, 6144),
    FaultMode.TRUNCATE_TAIL: (8192, 6144),
    FaultMode.ACCEPT_OVER_LIMIT: (4096, 4096),
    FaultMode.STREAM_ERROR_FRAME: (8192, 6144),
    FaultMode.WRONG_STATUS: (4096, 4096),
    FaultMode.WINDOW_NOT_SERVED: (8192, 6144),
    FaultMode.NO_RECALL: (4096, 4096),
    FaultMode.THROTTLED: (4096, 4096),
    FaultMode.SERVER_ERROR: (4096, 4096),
    FaultMode.BATCH_MIX: (4096, 4096),
    FaultMode.PREFIX_COLLISION: (4096, 4096),
    FaultMode.ABORT_REUSE: (4096, 4096),
}
# The demo's batch_mix endpoint mixes from 3 requests in flight, so every burst size of the
# default list (3, 7, 9, 17) shows the leak, not only those past the usual threshold of 8.
DEMO_BATCH_MIX_AT = 3
# The endpoints the demo runs the burst probe on: the healthy one passes, batch-mix leaks.
BURST_DEMO = frozenset({"healthy", "batch-mix"})
# A healthy endpoint started without prefix caching: its cache probe says cache_not_exercised.
CACHE_OFF = "prefix-cache-off"
# The endpoints the demo runs the cache probe on: the healthy one passes, the two cache faults
# are cache_corrupt, the one without a prefix cache is cache_not_exercised.
CACHE_DEMO = frozenset({"healthy", "prefix-collision", "abort-reuse", CACHE_OFF})


# A healthy endpoint whose vocabulary counts 4 % fewer tokens than the simulator's own:
# monitored as a gateway with no tokenize route (``tokenizer: usage``), it shows kvwatch
# calibrating its estimate and never paging on it.
ESTIMATED = "estimated"


def demo_fleet() -> list[SimEndpoint]:
    """Endpoints named after their fault (``stale-kv``, ``truncate-head``, ...), the healthy
    ``estimated`` one whose tokens kvwatch can only estimate, and the healthy one without a
    prefix cache."""
    return [
        SimEndpoint(
            name=fault.value.replace("_", "-"),
            model=DEMO_MODEL,
            window=window,
            kv_pool=kv_pool,
            fault=fault,
            batch_mix_at=DEMO_BATCH_MIX_AT,
        )
        for fault, (window, kv_pool) in _SIZES.items()
    ] + [
        SimEndpoint(name=ESTIMATED, model=DEMO_MODEL, window=8192, token_skew=-0.04),
        SimEndpoint(name=CACHE_OFF, model=DEMO_MODEL, window=4096, prefix_cache=False),
    ]


def scale_fleet(
    count: int, min_window: int = 2048, max_window: int = 8192, model: str = DEMO_MODEL
) -> list[SimEndpoint]:
    """``count`` healthy endpoints ``fleet-0000``... with windows spread evenly over
    ``[min_window, max_window]``: many virtual endpoints from one process, for scale tests."""
    if count <= 0:
        raise ValueError("a fleet needs at least one endpoint")
    if not 0 < min_window <= max_window:
        raise ValueError("fleet windows must satisfy 0 < min <= max")
    width = len(str(count - 1))
    span = max_window - min_window
    return [
        SimEndpoint(
            name=f"fleet-{i:0{max(4, width)}d}",
            model=model,
            window=min_window + (span * i // (count - 1) if count > 1 else 0),
        )
        for i in range(count)
    ]
