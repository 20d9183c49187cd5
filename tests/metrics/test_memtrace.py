"""KVWATCH_TRACEMALLOC: tracing starts only when asked, and SIGUSR2 writes a snapshot."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvwatch import memtrace


@pytest.fixture
def tracing_stops() -> Iterator[None]:
    yield
    tracemalloc.stop()


def wait_for_file(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"no snapshot at {path}"
        time.sleep(0.05)


def test_without_the_variable_nothing_is_traced() -> None:
    """No KVWATCH_TRACEMALLOC (or an empty one): no tracing, no snapshots."""
    assert memtrace.start_from_env({}) is None
    assert memtrace.start_from_env({memtrace.ENV: ""}) is None
    assert not tracemalloc.is_tracing()


async def test_sigusr2_writes_a_numbered_snapshot_holding_the_live_allocations(
    tmp_path: Path, tracing_stops: None
) -> None:
    """Two signals, two loadable snapshots; the second holds a buffer allocated between them
    at this file's line, and the loop went on running while the child wrote."""
    trace = memtrace.start_from_env({memtrace.ENV: str(tmp_path / "snaps" / "kv-")})
    assert trace is not None and tracemalloc.is_tracing()
    trace.install(asyncio.get_running_loop())
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        await asyncio.sleep(0.1)  # the handler runs on the loop
        first = tmp_path / "snaps" / "kv-1.tracemalloc"
        await asyncio.to_thread(wait_for_file, first)
        grown = [bytearray(1024) for _ in range(2000)]
        os.kill(os.getpid(), signal.SIGUSR2)
        await asyncio.sleep(0.1)
        second = tmp_path / "snaps" / "kv-2.tracemalloc"
        await asyncio.to_thread(wait_for_file, second)
    finally:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR2)
    before = tracemalloc.Snapshot.load(str(first))
    after = tracemalloc.Snapshot.load(str(second))
    top = after.compare_to(before, "lineno")[0]
    assert top.traceback[0].filename == __file__
    assert top.size_diff >= len(grown) * 1024
    assert not list((tmp_path / "snaps").glob("*.partial"))
