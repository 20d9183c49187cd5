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

from kvwatch import arenas, memtrace


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


async def test_kvwatch_memstats_alone_writes_the_allocators_figures_without_tracing(
    tmp_path: Path,
) -> None:
    """KVWATCH_MEMSTATS: no tracing; each SIGUSR2 writes a .memstats whose CPython figures
    count the small objects made between two signals, beside glibc's heaps."""
    trace = memtrace.start_from_env({memtrace.STATS_ENV: str(tmp_path / "kv-")})
    assert trace is not None and not tracemalloc.is_tracing()
    trace.install(asyncio.get_running_loop())
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        await asyncio.sleep(0.1)
        await asyncio.to_thread(wait_for_file, tmp_path / "kv-1.memstats")
        # 300,000 small strings (57-byte objects: CPython's 64-byte class), about 19 MB.
        grown = [f"{i:08d}" for i in range(300_000)]
        os.kill(os.getpid(), signal.SIGUSR2)
        await asyncio.sleep(0.1)
        await asyncio.to_thread(wait_for_file, tmp_path / "kv-2.memstats")
    finally:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR2)
    before = memtrace.read_stats((tmp_path / "kv-1.memstats").read_text())
    after = memtrace.read_stats((tmp_path / "kv-2.memstats").read_text())
    assert after.python_live - before.python_live >= len(grown) * 56
    assert after.python_arenas > before.python_arenas
    assert after.python_arena_bytes >= after.python_live + after.python_free - 2**20
    if arenas.heap() is not None:  # glibc: its heaps are in the file too
        assert after.c_heaps is not None and after.c_heaps > 0
        assert after.c_free is not None and after.c_mmapped is not None
    assert sorted(os.listdir(tmp_path)) == ["kv-1.memstats", "kv-2.memstats"]


def test_a_memstats_file_without_cpython_figures_is_refused_by_name() -> None:
    """read_stats on text that is not a .memstats names the figure it could not find."""
    with pytest.raises(ValueError, match="arenas allocated current"):
        memtrace.read_stats('# glibc malloc_info()\n<malloc version="1"></malloc>\n')
