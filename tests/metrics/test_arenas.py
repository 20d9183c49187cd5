"""kvwatch run caps glibc's malloc arenas, unless the operator chose a cap,
and reports what malloc holds."""

from __future__ import annotations

import asyncio
import os
import platform
import sys

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kvwatch import arenas
from kvwatch.metrics import MallocCollector, PythonBlocksCollector


def test_an_arena_cap_set_by_the_operator_is_left_alone() -> None:
    """MALLOC_ARENA_MAX in the environment: glibc applied it at start, kvwatch changes nothing."""
    assert arenas.limit_arenas({arenas.ENV: "8"}) is False
    assert arenas.limit_arenas({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}) is False


def test_an_mmap_threshold_set_by_the_operator_is_left_alone() -> None:
    """MALLOC_MMAP_THRESHOLD_ or its tunable: the operator's threshold stands."""
    assert arenas.fix_mmap_threshold({arenas.MMAP_ENV: "65536"}) is False
    tunables = {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0:glibc.malloc.mmap_threshold=1"}
    assert arenas.fix_mmap_threshold(tunables) is False


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the threshold is glibc's")
def test_with_the_fixed_threshold_a_large_buffer_goes_back_to_the_os_every_time() -> None:
    """glibc would serve the second 16 MB buffer from its heap and keep it there as free
    space; with the threshold fixed each one is mapped and unmapped."""
    assert arenas.fix_mmap_threshold({}) is True
    before = arenas.heap()
    for _ in range(3):
        buffer = bytearray(16 * 1024 * 1024)
        del buffer
    after = arenas.heap()
    assert before is not None and after is not None
    assert after.free - before.free < 4 * 1024 * 1024, (before, after)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the threshold is glibc's")
def test_with_the_fixed_threshold_a_prompt_sized_buffer_gets_a_mapping_of_its_own() -> None:
    """64 KiB buffers (a prompt or a body) that the heap's free chunks cannot hold are mapped,
    not cut from the heap's top."""
    assert arenas.fix_mmap_threshold({}) is True
    before = arenas.heap()
    assert before is not None
    buffers = [bytearray(64 * 1024) for _ in range(64)]
    during = arenas.heap()
    del buffers
    assert during is not None
    # glibc fills a request from its free chunks first; only the rest can be mapped.
    assert during.mmapped - before.mmapped >= 64 * 64 * 1024 - before.free, (before, during)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the cap is glibc's")
def test_on_glibc_the_cap_is_applied() -> None:
    """Without MALLOC_ARENA_MAX, mallopt accepts the cap of two arenas."""
    assert arenas.limit_arenas({}) is True


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallinfo2 is glibc's")
def test_on_glibc_the_heap_counts_an_allocation_while_it_lives_and_not_after() -> None:
    """Ten megabytes of malloc'd buffers show in allocated, and leave it when freed."""
    before = arenas.heap()
    assert before is not None
    buffers = [bytearray(4096) for _ in range(2560)]  # above pymalloc's 512 bytes: malloc's
    during = arenas.heap()
    del buffers
    after = arenas.heap()
    assert during is not None and after is not None
    assert during.allocated - before.allocated >= 10 * 1024 * 1024
    assert during.allocated - after.allocated >= 10 * 1024 * 1024


def test_the_malloc_gauge_has_one_child_per_state() -> None:
    """kvwatch_malloc_bytes carries allocated, free and mmapped from the heap reading."""
    registry = CollectorRegistry()
    registry.register(MallocCollector(lambda: arenas.Heap(allocated=3, free=2, mmapped=1)))
    assert registry.get_sample_value("kvwatch_malloc_bytes", {"state": "allocated"}) == 3
    assert registry.get_sample_value("kvwatch_malloc_bytes", {"state": "free"}) == 2
    assert registry.get_sample_value("kvwatch_malloc_bytes", {"state": "mmapped"}) == 1


def test_without_mallinfo2_the_malloc_gauge_is_absent() -> None:
    """A C library with no figures exports no kvwatch_malloc_bytes rather than zeros."""
    registry = CollectorRegistry()
    registry.register(MallocCollector(lambda: None))
    assert "kvwatch_malloc_bytes" not in generate_latest(registry).decode()


def test_the_python_blocks_gauge_follows_live_small_objects() -> None:
    """A hundred thousand small objects show in kvwatch_python_allocated_blocks while alive."""
    registry = CollectorRegistry()
    registry.register(PythonBlocksCollector(sys.getallocatedblocks))
    before = registry.get_sample_value("kvwatch_python_allocated_blocks")
    objects = [object() for _ in range(100_000)]
    during = registry.get_sample_value("kvwatch_python_allocated_blocks")
    del objects
    after = registry.get_sample_value("kvwatch_python_allocated_blocks")
    assert before is not None and during is not None and after is not None
    assert during - before >= 100_000
    assert during - after >= 99_000


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_a_trim_returns_the_free_pages_pinned_inside_the_heap() -> None:
    """80 MB freed below a few live buffers stays resident until the trim gives it back."""
    assert arenas.fix_mmap_threshold({}) is True  # 8 KiB buffers come from the heap
    buffers = [bytearray(8192) for _ in range(10_000)]
    pinned = buffers[::50]  # one live buffer every 400 KiB: the heap's top cannot shrink
    del buffers
    before = _resident_bytes()
    assert arenas.trim() is True
    after = _resident_bytes()
    assert before - after > 40 * 1024 * 1024, (before, after)
    assert len(pinned) == 200


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
async def test_the_trim_loop_trims_on_its_interval() -> None:
    """Each round of the loop calls the trim; cancelling it stops the loop."""
    calls = 0
    third = asyncio.Event()

    def counted() -> bool:
        nonlocal calls
        calls += 1
        if calls == 3:
            third.set()
        return True

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(arenas, "trim", counted)
        task = asyncio.create_task(arenas.trim_loop(every=0.01))
        await asyncio.wait_for(third.wait(), timeout=5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()
