"""glibc's malloc tuned for a daemon that runs for months (issue 25).

Two arenas instead of up to eight per core, a fixed threshold above which an
allocation gets a mapping of its own, and the free pages inside the heap handed back to the
OS once a minute.

glibc gives each thread that allocates while another holds the main arena an arena of its
own, up to 8 x cores, and memory freed in an arena stays there, fragmented, for that arena
only. kvwatch allocates from many threads: database calls (``asyncio.to_thread``), the
database writer, the web UI's thread pool. Measured with ``python -m bench memory`` (1,000
endpoints, 50 probes/s, web reads and reloads, SQLite, 2 cores): RSS after warm-up rose
from 272 to 310 MB in 12 minutes with glibc's default and stayed between 243 and 264 MB with
two arenas, at the same probe rate. Allocation is not a bottleneck of kvwatch (the event
loop is), so contention on two arenas costs nothing measurable.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

log = structlog.get_logger("kvwatch.arenas")

ENV = "MALLOC_ARENA_MAX"
ARENAS = 2
MMAP_ENV = "MALLOC_MMAP_THRESHOLD_"
MMAP_THRESHOLD = 32 * 1024
# mallopt's parameter numbers (glibc's malloc.h).
_M_ARENA_MAX = -8
_M_MMAP_THRESHOLD = -3
# The same settings as glibc tunables (GLIBC_TUNABLES=glibc.malloc.arena_max=4:...).
_TUNABLES = "GLIBC_TUNABLES"
TRIM_EVERY = 60.0
# A trim holds each arena's lock while it walks that arena's free chunks: one that takes this
# long is stalling the threads that allocate, worth a line in the log. (Measured: a few ms;
# up to 0.16 s of wall time on 2 saturated cores, where the thread waits for a CPU.)
SLOW_TRIM_SECONDS = 1.0


def limit_arenas(environ: Mapping[str, str] = os.environ, arenas: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas at ``arenas``; call before kvwatch starts its threads.

    False, changing nothing, when ``MALLOC_ARENA_MAX`` or its tunable is set (the operator's
    value, which glibc has already applied, stands) or the C library is not glibc.
    """
    if _chosen(environ, ENV, "glibc.malloc.arena_max"):
        return False
    return _mallopt(_M_ARENA_MAX, arenas)


def fix_mmap_threshold(
    environ: Mapping[str, str] = os.environ, threshold: int = MMAP_THRESHOLD
) -> bool:
    """Give every allocation of ``threshold`` bytes or more a mapping of its own, returned
    to the OS as soon as it is freed.

    glibc starts at 128 KiB but raises its threshold to the size of any mapped chunk that
    is freed (up to 32 MiB). After the first /metrics body (14.5 MB at 1,000 endpoints) was
    freed, every later one came from the heap instead, and stayed there as free space,
    pinned by the small allocations made meanwhile: a process rendering that body 25 times
    beside other work kept 25 MB of malloc's ``free`` and 20 MB more RSS with glibc's
    default, none with this. Setting the threshold turns the raising off.

    32 KiB, not 1 MiB: prompts, request and response bodies and pages of 32 KiB to a few MB
    are made and freed on every probe, and from the heap they left free chunks between
    long-lived allocations that glibc could not give back. Measured with ``bench memory``
    (500 endpoints, 25 probes/s, web reads and reloads, SQLite, 2 cores, minutes 10 to 50):
    RSS rose +8.5 MB/h with 1 MiB and +2.7 MB/h with 32 KiB. glibc still fills such a
    request from a free chunk that fits; one that would have grown the heap costs an
    ``mmap``, a ``munmap`` and its page faults instead.

    False, changing nothing, when ``MALLOC_MMAP_THRESHOLD_`` or its tunable is set, or the
    C library is not glibc.
    """
    if _chosen(environ, MMAP_ENV, "glibc.malloc.mmap_threshold"):
        return False
    return _mallopt(_M_MMAP_THRESHOLD, threshold)


def trim() -> bool:
    """Hand the whole free pages inside malloc's heap back to the OS (``malloc_trim(0)``).

    A page freed in the middle of the heap, below memory still in use, stays resident:
    glibc gives back only the heap's top on its own. Over a long run that free space grew
    with fragmentation (+11 MB of ``free`` in 70 minutes at 1,000 endpoints, beside +12 MB of
    RSS). Since glibc 2.8 ``malloc_trim`` releases the whole free pages of every arena with
    ``madvise(MADV_DONTNEED)`` (malloc_trim(3)); they stay in malloc's free lists, so
    ``kvwatch_malloc_bytes{state="free"}`` does not drop, and come back zero-filled on reuse.
    Measured on a live run: about 380 such calls a minute, each under 0.2 ms. False when the
    C library is not glibc or nothing could be released.
    """
    malloc_trim = _malloc_trim()
    return False if malloc_trim is None else bool(malloc_trim(0))


async def trim_loop(every: float = TRIM_EVERY) -> None:
    """:func:`trim` every ``every`` seconds, off the event loop (ctypes drops the GIL for
    the call, so probing goes on while it walks the heap)."""
    if _malloc_trim() is None:
        return  # not glibc: nothing to trim
    while True:
        await asyncio.sleep(every)
        took = await asyncio.to_thread(_timed_trim)
        if took > SLOW_TRIM_SECONDS:
            log.warning("malloc_trim_slow", seconds=round(took, 3))


def _timed_trim() -> float:
    # Timed in the worker thread: the wait for a free worker (the pool is shared with the
    # database calls) is not the trim's.
    started = time.perf_counter()
    trim()
    return time.perf_counter() - started


def _malloc_trim() -> Callable[[int], int] | None:
    return _libc("malloc_trim", (ctypes.c_size_t,), ctypes.c_int)  # type: ignore[no-any-return]


@functools.cache
def _libc(name: str, argtypes: tuple[Any, ...], restype: Any) -> Any:
    # A function of the C library, looked up once (not on every scrape or trim); None where
    # the library has none (not glibc, or mallinfo2 before glibc 2.33).
    try:
        function = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = argtypes
    function.restype = restype
    return function


def _chosen(environ: Mapping[str, str], env: str, tunable: str) -> bool:
    # The operator's setting, by variable or tunable, which glibc applied at start.
    return env in environ or tunable + "=" in environ.get(_TUNABLES, "")


def _mallopt(param: int, value: int) -> bool:
    mallopt = _libc("mallopt", (ctypes.c_int, ctypes.c_int), ctypes.c_int)
    return False if mallopt is None else bool(mallopt(param, value))  # None: not glibc


@dataclass(frozen=True, slots=True)
class Heap:
    """What glibc's malloc holds, in bytes (``mallinfo2``, summed over its arenas).

    RSS minus these is mostly Python's own small-object arenas (which it maps itself),
    thread stacks and loaded libraries.
    """

    allocated: int  # in chunks the program holds
    free: int  # in free chunks malloc keeps: freed by the program, not returned to the OS
    # In chunks large enough to get a mapping of their own; None for an allocator that
    # maps none per allocation (jemalloc, kvwatch/jemalloc.py).
    mmapped: int | None


class _MallInfo2(ctypes.Structure):
    # glibc's struct mallinfo2 (malloc.h, glibc >= 2.33): ten size_t fields in this order.
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap() -> Heap | None:
    """glibc's malloc totals now, or None where there is no ``mallinfo2`` (not glibc, or
    older than 2.33)."""
    mallinfo2 = _libc("mallinfo2", (), _MallInfo2)
    if mallinfo2 is None:
        return None
    info = mallinfo2()
    return Heap(allocated=info.uordblks, free=info.fordblks, mmapped=info.hblkhd)
